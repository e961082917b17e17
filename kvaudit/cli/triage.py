"""``kvaudit triage REPORT``: a pasted out-of-memory report read, its deployment audited, a report to paste back."""

from __future__ import annotations

import sys
from typing import Any

from kvaudit.cli.options import REPORT, TITLE, TOLERANCE, TRIAGE_CONFIG, TRIAGE_FORMAT
from kvaudit.cli.output import READING, note, show, step
from kvaudit.errors import MissingDependency
from kvaudit.results import check_tolerance

NAME = "triage"
OPTIONS = (REPORT, TRIAGE_CONFIG, TITLE, TOLERANCE, TRIAGE_FORMAT)
HELP = "From a pasted OOM report to a root-cause report."
DESCRIPTION = ("Read a pasted vLLM / vllm-ascend report (logs, traceback, smi tables, versions), reconstruct "
               "the deployment, audit the reported release's allocator and the fixed one, and write a report "
               "to paste into the issue.")


def run(a: Any) -> int:
    """Triage a pasted report; the report goes to stdout, the verdict line to stderr."""
    from kvaudit.triage.conclude import check_report, triage
    from kvaudit.triage.evidence import read_report

    check_tolerance(a.tolerance)
    text = read_report(a.report)
    check_report(text, a.title)  # (bad input is told before the slow step)
    with step(READING):
        t = triage(text, a.config, a.title, a.tolerance)
    if a.fmt is None and _on_terminal():  # read by a person: rendered, not its escapes (\#3368, torch\_npu)
        from rich.markdown import Markdown

        show([Markdown(t.to_markdown())])
    else:
        sys.stdout.write(t.to_json() + "\n" if a.fmt == "json" else t.to_markdown())
    sys.stdout.flush()
    note(f"kvaudit triage: {t.verdict}" + (f" ({t.factor:.2f}×)" if t.factor else ""))
    if t.not_audited:
        note(f"kvaudit: the audit step did not run: {t.not_audited}")
        return MissingDependency.exit_code
    return 0


def _on_terminal() -> bool:
    """Whether stdout is a terminal (a person reads it), not a pipe or a file (a program or an issue comment)."""
    return sys.stdout.isatty()
