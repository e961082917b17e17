"""What a command prints and writes: tables to stdout (at the terminal's width, never under 40 columns), notes to
stderr, the audit's reports in either format, its pages, and output files checked before any work and written
atomically."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator

from kvaudit.cli.options import Detail, Format

TABLE_WIDTH = 120
"""Table width when stdout is not a terminal and COLUMNS is unset."""


def note(text: str) -> None:
    """A line for the person running the command, on stderr (stdout holds only the output); a control character a
    name brought along is shown as its escape (``kvaudit.escape.terminal_safe``)."""
    from kvaudit.escape import terminal_safe

    print(terminal_safe(text), file=sys.stderr, flush=True)


MIN_WIDTH = 40
"""The narrowest width tables are drawn at: a smaller ``COLUMNS`` or terminal (``COLUMNS=0`` printed nothing, and
``COLUMNS=1`` a few hundred characters of a report) is taken as this."""


def width() -> int:
    """The width tables are drawn at: ``COLUMNS`` where it is a number, else the terminal's, else ``TABLE_WIDTH``;
    never below ``MIN_WIDTH``."""
    import shutil

    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit():
        return max(int(columns), MIN_WIDTH)
    if sys.stdout.isatty():
        return max(shutil.get_terminal_size((TABLE_WIDTH, 24)).columns, MIN_WIDTH)
    return TABLE_WIDTH


BUILDING = "importing torch and vLLM, then building the model on meta with vLLM's own code (seconds)"
"""The step before a command that plans has anything to say (``audit``, ``plan``)."""
READING = "reading the report, then planning its deployment with vLLM's own code (seconds)"
PRESETS_BUILT = "building each preset's model with vLLM's own code to read its layers (seconds)"
PROBING = "importing torch and asking each device library for its devices (seconds)"
TORCH = "importing torch to allocate the saved plans (seconds)"
STEPS = (BUILDING, READING, PRESETS_BUILT, PROBING, TORCH)
"""Every slow step's note: the lines that may come before a command's one-line error."""


@contextlib.contextmanager
def step(text: str) -> Iterator[None]:
    """A slow step (vLLM's import and a model built on meta, a report planned, a release fetched) announced before
    it runs: on a terminal, a rich status line that goes when the step ends; otherwise one plain line on stderr, so
    that a CI log shows what is running rather than nothing for seconds."""
    if sys.stderr.isatty():
        from rich.console import Console

        with Console(stderr=True).status(f"kvaudit: {text}"):
            yield
    else:
        note(f"kvaudit: {text}")
        yield


def console() -> Any:
    """A rich console on stdout, ``width()`` wide."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, width=width())


def show(renderables: list[Any], gap: bool = False) -> None:
    """Print rich renderables to stdout (a blank line after each with ``gap``)."""
    out = console()
    for renderable in renderables:
        out.print(renderable)
        if gap:
            out.print()


def render_reports(reports: list[Any], fmt: Format, detail: Detail) -> None:
    """One report per pipeline stage: the JSON report (``{"stages": [...]}`` for several), or the tables (the
    verdict lines follow with ``summarize``)."""
    from kvaudit.report import render as report

    if fmt is Format.json:
        sys.stdout.write((report.to_json(reports[0]) if len(reports) == 1 else report.stages_to_json(reports)) + "\n")
    else:
        show([r for rep in reports for r in report.render_tables(rep, detail.value)], gap=True)
    sys.stdout.flush()


def summarize(reports: list[Any]) -> None:
    """Each report's verdict line on stderr: the last lines a command prints, after any file it wrote."""
    from kvaudit.report import render as report

    for rep in reports:
        note(report.summary_line(rep))


def write_pages(a: Any, reports: list[Any], **page_options: Any) -> None:
    """``--html`` / ``--svg``: the report as a page and as an image, for a person without a terminal
    (``page_options``: the page's title, lead line and preface, as ``check`` sets them)."""
    if not (a.html or a.svg):
        page_hint(a)
        return
    from kvaudit.report import page

    detail = Detail(getattr(a, "detail", Detail.layers)).value
    for path, text in ((a.html, page.to_html(reports, detail=detail, **page_options) if a.html else ""),
                       (a.svg, page.to_svg(reports, detail=detail, **page_options) if a.svg else "")):
        if path:
            write(path, text)


def write_text_pages(a: Any, renderables: list[Any], title: str, lead: str) -> None:
    """``--html`` / ``--svg`` of a command whose report is its terminal output (``history``, ``compare``): that output
    as a page and as an image, under ``title`` and ``lead`` (its summary)."""
    if not (a.html or a.svg):
        return
    from kvaudit.report import page

    for path, text in ((a.html, page.to_html([], title, lead=lead, preface=renderables) if a.html else ""),
                       (a.svg, page.to_svg([], title, lead=lead, preface=renderables) if a.svg else "")):
        if path:
            write(path, text)


def page_hint(a: Any) -> None:
    """On a terminal, when no page was asked for, one line saying how to have the report as a page."""
    if sys.stdout.isatty() and sys.stderr.isatty() and not (getattr(a, "html", None) or getattr(a, "svg", None)) \
            and getattr(a, "fmt", "table") in ("table", Format.table):
        note("kvaudit: the same report as a page: --html report.html (bars and tables), or --svg report.svg")


def check_outputs(*paths: str | None) -> None:
    """Refuse, before any work, an output file that cannot be written (``kvaudit.outfile.check``)."""
    from kvaudit import outfile

    for path in paths:
        if path is not None:
            outfile.check(path)


def write(path: str, text: str) -> bool:
    """Write an output file atomically (``kvaudit.outfile.write``). A failure is one line on stderr naming the
    output, and ``False``: the command's verdict and exit code stand, and a previous file there is unchanged."""
    from kvaudit import outfile

    try:
        outfile.write(path, text)
    except OSError as e:
        note(f"kvaudit: could not write {path}: {e.strerror or e} (the verdict stands; nothing was written there, "
             "and a file already there is unchanged)")
        return False
    note(f"kvaudit: wrote {path}")
    return True
