"""``kvaudit check POLICY``: a policy file's matrix run in one process, each cell judged against its expected
outcome; tables or JSON, with JUnit XML and pages."""

from __future__ import annotations

import sys
from typing import Any

from kvaudit.cli.options import DEVICE_INDEX, FORMAT, HTML, JUNIT, POLICY, POLICY_METER, SVG, Format
from kvaudit.cli.output import check_outputs, note, show, write, write_pages

NAME = "check"
OPTIONS = (POLICY, POLICY_METER, DEVICE_INDEX, FORMAT, JUNIT, HTML, SVG)
HELP = "Run a policy file's matrix of models, deployments and strategies: a CI gate."
DESCRIPTION = ("Run the matrix a policy file describes (models or config paths × TP × PP × "
               "utilization × kv-cache dtype × strategies, on one meter, with a tolerance and the expected "
               "outcome of each cell) in one process. Exit 0 every cell as expected, 1 any cell not, "
               "2 a bad policy or a deployment vLLM refuses, 3 a cell could not be measured.")


def run(a: Any) -> int:
    """``kvaudit check``: the policy's matrix, rendered, with JUnit / JSON / pages as asked."""
    from kvaudit.ci import check
    from kvaudit.ci.policy import load_policy
    from kvaudit.strategies.builtin import STRATEGIES

    check_outputs(a.junit, a.html, a.svg)
    policy = load_policy(a.policy, tuple(STRATEGIES))
    result = check.run_policy(policy, meter=a.meter, device_index=a.device_index, progress=check.progress_to_stderr())
    table = check.render(result)  # the terminal's, and the pages' preface
    if Format(a.fmt) is Format.json:
        sys.stdout.write(check.to_json(result) + "\n")
    else:
        show(table)
    sys.stdout.flush()
    if a.junit:
        write(a.junit, check.to_junit(result))
    write_pages(a, list(result.reports), title=f"kvaudit check {a.policy}",
                lead=check.summary_line(result).removeprefix("kvaudit check: "), preface=table)
    note(check.summary_line(result))
    return result.exit_code
