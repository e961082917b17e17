"""``kvaudit compare OLD NEW``: two saved reports, per strategy, group and layer; exit 1 on a regression."""

from __future__ import annotations

import sys
from typing import Any

from kvaudit.cli.options import DETAIL, FORMAT, HTML, NEW, OLD, SVG, TOLERANCE, Detail, Format
from kvaudit.cli.output import check_outputs, note, page_hint, show, write_text_pages
from kvaudit.results import check_tolerance

NAME = "compare"
OPTIONS = (OLD, NEW, TOLERANCE, FORMAT, DETAIL, HTML, SVG)
HELP = "Diff two saved JSON reports per group and layer; exit 1 on a regression."
DESCRIPTION = ("Compare two saved reports (two vLLM or vllm-ascend versions, two platforms, with and "
               "without KV transfer): per strategy, group and layer, bytes and ratio deltas. Exit 1 on a "
               "regression beyond the tolerance.")


def run(a: Any) -> int:
    """``kvaudit compare OLD.json NEW.json``: per group and layer deltas; exit 1 on a regression."""
    from kvaudit.report import compare

    check_tolerance(a.tolerance)
    check_outputs(a.html, a.svg)
    result = compare.compare(compare.load_report(a.old), compare.load_report(a.new), a.tolerance)
    if Format(a.fmt) is Format.json:
        sys.stdout.write(compare.to_json(result) + "\n")
    else:
        show(compare.render(result, Detail(a.detail).value))
        page_hint(a)
    sys.stdout.flush()
    if a.html or a.svg:
        write_text_pages(a, compare.render(result, Detail(a.detail).value),
                         f"kvaudit compare: {result.old_path} → {result.new_path}", compare.summary_line(result))
    note(compare.summary_line(result))
    return result.exit_code
