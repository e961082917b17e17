"""What a command prints and writes: tables to stdout (at the terminal's width), notes to stderr, the audit's
reports in either format, its pages, and output files checked before any work."""

from __future__ import annotations

import os
import sys
from typing import Any

from kvaudit.cli.options import Detail, Format
from kvaudit.errors import UsageError

TABLE_WIDTH = 120
"""Table width when stdout is not a terminal and COLUMNS is unset."""


def note(text: str) -> None:
    """A line for the person running the command, on stderr (stdout holds only the output)."""
    print(text, file=sys.stderr, flush=True)


def console() -> Any:
    """A rich console on stdout: the terminal's width, else ``COLUMNS``, else ``TABLE_WIDTH``."""
    from rich.console import Console

    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else TABLE_WIDTH
    return Console(highlight=False, soft_wrap=False, width=width)


def show(renderables: list[Any], gap: bool = False) -> None:
    """Print rich renderables to stdout (a blank line after each with ``gap``)."""
    out = console()
    for renderable in renderables:
        out.print(renderable)
        if gap:
            out.print()


def render_reports(reports: list[Any], fmt: Format, detail: Detail) -> None:
    """One report per pipeline stage: the JSON report (``{"stages": [...]}`` for several), or the tables."""
    from kvaudit.report import render as report

    if fmt is Format.json:
        sys.stdout.write((report.to_json(reports[0]) if len(reports) == 1 else report.stages_to_json(reports)) + "\n")
    else:
        show([r for rep in reports for r in report.render_tables(rep, detail.value)], gap=True)
    sys.stdout.flush()
    for rep in reports:
        note(report.summary_line(rep))


def write_pages(a: Any, reports: list[Any], **page_options: Any) -> None:
    """``--html`` / ``--svg``: the report as a page and as an image, for a person without a terminal
    (``page_options``: the page's title, lead line and preface, as ``check`` sets them)."""
    if not (a.html or a.svg):
        return
    from kvaudit.report import page

    detail = Detail(getattr(a, "detail", Detail.layers)).value
    for path, text in ((a.html, page.to_html(reports, detail=detail, **page_options) if a.html else ""),
                       (a.svg, page.to_svg(reports, detail=detail, **page_options) if a.svg else "")):
        if path:
            write(path, text)


def check_outputs(*paths: str | None) -> None:
    """Refuse, before any work, an output file that cannot be written: a folder, a missing folder, a file
    or folder without write permission, a read-only file system (a file is made in its folder and removed)."""
    import tempfile
    from pathlib import Path

    for path in paths:
        if path is None:
            continue
        p = Path(path).expanduser()
        if p.is_dir():
            raise UsageError(f"{path} is a directory, not a file to write")
        if not p.parent.is_dir():
            raise UsageError(f"cannot write {path}: folder {p.parent} does not exist")
        try:
            if p.exists():
                if not os.access(p, os.W_OK):
                    raise PermissionError(13, "Permission denied")
            else:
                fd, probe = tempfile.mkstemp(dir=p.parent, prefix=".kvaudit-write-check-")
                os.close(fd)
                os.unlink(probe)
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror or e}") from None


def write(path: str, text: str) -> None:
    """Write an output file; a failure is one line, exit 2."""
    from pathlib import Path

    try:
        Path(path).expanduser().write_text(text, encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    note(f"kvaudit: wrote {path}")
