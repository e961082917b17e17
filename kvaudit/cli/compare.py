"""``kvaudit compare OLD NEW``: two saved reports, per strategy, group and layer; exit 1 on a regression."""

from __future__ import annotations

import sys
from typing import Any

from kvaudit.cli.options import DETAIL, FORMAT, NEW, OLD, TOLERANCE, Detail, Format
from kvaudit.cli.output import note, show
from kvaudit.results import check_tolerance

NAME = "compare"
OPTIONS = (OLD, NEW, TOLERANCE, FORMAT, DETAIL)
HELP = "Diff two saved JSON reports per group and layer; exit 1 on a regression."
DESCRIPTION = ("Compare two saved reports (two vLLM or vllm-ascend versions, two platforms, with and "
               "without KV transfer): per strategy, group and layer, bytes and ratio deltas. Exit 1 on a "
               "regression beyond the tolerance.")


def run(a: Any) -> int:
    """``kvaudit compare OLD.json NEW.json``: per group and layer deltas; exit 1 on a regression."""
    from kvaudit.report import compare

    check_tolerance(a.tolerance)
    result = compare.compare(compare.load_report(a.old), compare.load_report(a.new), a.tolerance)
    if Format(a.fmt) is Format.json:
        sys.stdout.write(compare.to_json(result) + "\n")
    else:
        show(compare.render(result, Detail(a.detail).value))
    sys.stdout.flush()
    note(compare.summary_line(result))
    return result.exit_code
