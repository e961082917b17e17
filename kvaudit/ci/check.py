"""``kvaudit check``: run a policy's matrix in one process, judge each cell against its expected outcome."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kvaudit import __version__
from kvaudit.ci.policy import Cell, Policy, PolicyError
from kvaudit.errors import KvauditError, UsageError
from kvaudit.results import Report, Verdict

SCHEMA_VERSION = 1

PASS, FAIL, NOT_AUDITED, ERROR = "pass", "fail", "not-audited", "error"
"""A cell's outcome: the verdict of its audit, not audited (with the reason), or an error (vLLM or
kvaudit refused the deployment: a policy to fix)."""


@dataclass(frozen=True)
class CellResult:
    """What one cell did, against what the policy expects of it."""

    cell: Cell
    outcome: str
    reason: str
    """The audit's reasons (FAIL), why it was not audited, or the error."""
    ratio: float | None
    expected_bytes: int | None
    allocated_bytes: int | None
    seconds: float
    """The cell's share of its deployment's planning and audit time (the strategies of one deployment
    share one plan, so the time is split evenly among them)."""
    report: int | None
    """Index of the report of the cell's deployment in ``CheckResult.reports``."""
    finding: str | None = None
    """The audit's verdict in a few words (``AuditResult.finding``): ``4.00×``, ``24 layers got 0 B``."""

    @property
    def as_expected(self) -> bool:
        """The outcome is the one the policy pins."""
        return self.outcome == self.cell.expect

    @property
    def junit(self) -> str:
        """What JUnit calls this cell: ``passed``; ``skipped`` when it fails or is not audited as pinned (as
        pytest reports an xfail); ``failure`` for an unexpected verdict; ``error`` when its deployment was
        refused or it could not be measured."""
        if self.as_expected:
            return "passed" if self.outcome == PASS else "skipped"
        return "failure" if self.outcome in (PASS, FAIL) else "error"


@dataclass(frozen=True)
class CheckResult:
    """The whole matrix: each cell's result, each deployment's report, and the exit code."""

    policy: str
    vllm_version: str | None
    results: tuple[CellResult, ...]
    reports: tuple[Report, ...]
    seconds: float

    @property
    def exit_code(self) -> int:
        """2 a cell's deployment was refused (fix the policy), else 1 a cell audited to another verdict
        than expected (an over-allocation, or a known-bad cell that now passes), else 3 a cell that should
        have been audited could not be, else 0."""
        off = [r for r in self.results if not r.as_expected]
        if any(r.outcome == ERROR for r in off):
            return 2
        if any(r.outcome in (PASS, FAIL) for r in off):
            return 1
        return 3 if off else 0

    def meter_of(self, r: CellResult) -> str:
        """The meter that measured cell ``r`` (the policy's, when nothing was measured)."""
        return self.reports[r.report].meter if r.report is not None else r.cell.meter

    def count(self, what: str) -> int:
        """Cells by ``pass``/``fail``/``not-audited``/``error``, or ``unexpected``/``expected-fail``."""
        if what == "unexpected":
            return sum(not r.as_expected for r in self.results)
        if what == "expected-fail":
            return sum(r.as_expected and r.outcome != PASS for r in self.results)
        return sum(r.outcome == what for r in self.results)


Progress = Callable[[int, int, str], None]
"""``progress(done, total, label)``: called before each deployment is planned and once at the end."""


def run_policy(policy: Policy, meter: str | None = None, device_index: int = 0,
               progress: Progress | None = None) -> CheckResult:
    """Plan each deployment of the matrix once with vLLM (imported once, in this process) and audit
    every strategy of its cells; ``meter`` overrides the policy's meters."""
    import kvaudit.measure.audit  # noqa: F401 - torch, before any cell (a missing torch is one line, not 84 cells)
    from kvaudit.measure.meters import select_meter
    from kvaudit.measure.utilization import audit_stage
    from kvaudit.model.deployment import load_model
    from kvaudit.model.options import DeploymentOptions
    from kvaudit.plan.planner import deploy, vllm_version
    from kvaudit.strategies.resolve import resolve_strategy

    start = time.perf_counter()
    strategies = {}
    for name in dict.fromkeys(c.strategy for c in policy.cells):
        try:
            strategies[name] = resolve_strategy(_against(name, policy.path.parent))
        except UsageError as e:
            raise PolicyError(f"{policy.path}:{policy.line_of_strategy(name)}: {e.message}") from None
    meters: dict[str, Any] = {}
    groups: dict[tuple, list[Cell]] = {}
    for c in policy.cells:
        groups.setdefault(c.deployment_key, []).append(c)
    results: list[CellResult] = []
    reports: list[Report] = []
    for n, cells in enumerate(groups.values()):
        first = cells[0]
        if progress:
            progress(n, len(groups), f"{first.label} ({len(cells)} strategies)")
        t0 = time.perf_counter()
        try:
            name = meter or first.meter
            if name not in meters:
                meters[name] = select_meter(name, device_index)
            m = meters[name]
            spec, preset = load_model(first.preset, first.config)
            options = DeploymentOptions.of(dict(first.options))
            ranks = [options.pp_rank] if options.pp_rank is not None else range(max(1, options.pp))
            stages = [deploy(spec, preset, options, rank) for rank in ranks]
        except KvauditError as e:
            results += _unmeasured(policy, cells, e, time.perf_counter() - t0)
            continue
        for dep in stages:
            t_stage = time.perf_counter()
            try:
                rep = audit_stage(dep, [strategies[c.strategy] for c in cells], m, first.tolerance, vllm_version())
            except KvauditError as e:
                results += _unmeasured(policy, cells, e, time.perf_counter() - t0)
                break
            reports.append(rep)
            share = (time.perf_counter() - (t0 if dep is stages[0] else t_stage)) / len(cells)
            by_name = {a.strategy: a for a in rep.audits}
            why_not = dict(rep.skipped)
            for c in cells:
                stage_cell = c if len(stages) == 1 else _at_stage(c, dep.pp_rank)
                audited_as = strategies[c.strategy].name  # vllm-ascend=. is audited as vllm-ascend=<folder name>
                a = by_name.get(audited_as)
                if a is None:
                    results.append(CellResult(stage_cell, NOT_AUDITED, why_not.get(audited_as, "not audited"),
                                              None, None, None, share, len(reports) - 1))
                else:
                    results.append(CellResult(stage_cell, PASS if a.verdict is Verdict.PASS else FAIL,
                                              "; ".join(a.reasons), a.ratio, a.expected_bytes, a.allocated_bytes,
                                              share, len(reports) - 1, a.finding))
    if progress:
        progress(len(groups), len(groups), "done")
    return CheckResult(policy=str(policy.path), vllm_version=vllm_version(), results=tuple(results),
                       reports=tuple(reports), seconds=time.perf_counter() - start)


def _against(strategy: str, folder: Path) -> str:
    """``vllm-ascend=PATH`` with a relative PATH names a checkout relative to the policy's folder."""
    if strategy.startswith("vllm-ascend=") and not strategy.startswith("vllm-ascend=="):
        path = Path(strategy.partition("=")[2])
        return f"vllm-ascend={path if path.is_absolute() else (folder / path).resolve()}"
    return strategy


def _unmeasured(policy: Policy, cells: list[Cell], e: KvauditError, seconds: float) -> list[CellResult]:
    """Cells whose deployment could not be audited: not audited when it could not be measured (exit 3: the
    meter is unavailable, a package or the host's memory is missing, a strategy broke), else an error
    naming the entry's line (vLLM or kvaudit refused the deployment)."""
    if e.exit_code == 3:
        return [CellResult(c, NOT_AUDITED, e.message, None, None, None, seconds / len(cells), None) for c in cells]
    return [CellResult(c, ERROR, f"{policy.path}:{c.line}: {e.message}", None, None, None, seconds / len(cells), None)
            for c in cells]


def _at_stage(c: Cell, pp_rank: int) -> Cell:
    from dataclasses import replace

    return replace(c, options=(*c.options, ("pp_rank", pp_rank)))


def progress_to_stderr() -> Progress:
    """A rich progress bar on a terminal, else one plain line per deployment."""
    if not sys.stderr.isatty():
        def plain(done: int, total: int, label: str) -> None:
            if done < total:
                print(f"kvaudit check: [{done + 1}/{total}] {label}", file=sys.stderr, flush=True)
        return plain
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("kvaudit check"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
    task: list[Any] = []

    def rich_bar(done: int, total: int, label: str) -> None:
        if not task:
            bar.start()
            task.append(bar.add_task(label, total=total))
        bar.update(task[0], completed=done, description=label)
        if done >= total:
            bar.stop()
    return rich_bar


def _status(r: CellResult) -> str:
    if r.as_expected:
        return "ok" if r.outcome == PASS else f"ok (expected {r.cell.expect})"
    return f"UNEXPECTED (expected {r.cell.expect})"


def render(result: CheckResult) -> list[Any]:
    """The matrix as a grid of deployments × strategies, each cell's outcome and finding (red where it is not what
    the policy expects), then a line for each cell with something to say: a failure, a cell not audited, an error,
    an outcome other than the policy's; the counts are the summary line's."""
    from rich.markup import escape as e
    from rich.table import Table
    from rich.text import Text

    from kvaudit.report.render import meter_label
    from kvaudit.report.tables import fitted

    meters = sorted({result.reports[r.report].meter for r in result.results if r.report is not None})
    strategies = list(dict.fromkeys(r.cell.strategy for r in result.results))
    by_label: dict[str, dict[str, CellResult]] = {}
    for r in result.results:
        by_label.setdefault(r.cell.label, {})[r.cell.strategy] = r
    grid = Table(title=e(f"kvaudit check {result.policy}: planned by vLLM {result.vllm_version}; meter "
                         f"{', '.join(meter_label(m) for m in meters) or 'none'}"), title_justify="left",
                 caption="green: as the policy expects; red and !: not (why below)", caption_justify="left")
    grid.add_column("deployment", overflow="fold")
    for name in strategies:
        grid.add_column(e(name), justify="left", overflow="fold")
    for label, cells in by_label.items():
        grid.add_row(e(label), *(_mark(cells[name]) if name in cells else Text("") for name in strategies))
    out: list[Any] = [fitted(grid, wrap=("deployment", *(e(name) for name in strategies)))]
    for r in result.results:
        if not (r.outcome == PASS and r.as_expected):
            out.append(Text.assemble("• ", (f"{r.cell.label} · {r.cell.strategy}: ", "bold"),
                                     (_status(r), "green" if r.as_expected else "bold red"), ": ",
                                     r.cell.why if r.as_expected and r.cell.why else r.reason))
    return out


def _mark(r: CellResult) -> Any:
    """A cell of the grid: the outcome, and for a failure what failed (``FAIL 4.00×``, ``FAIL 24 layers got 0 B``);
    a PASS is within the tolerance of the plan."""
    from rich.text import Text

    word = {PASS: "PASS", FAIL: "FAIL", NOT_AUDITED: "not audited", ERROR: "ERROR"}.get(r.outcome, r.outcome.upper())
    said = "" if r.outcome == PASS else r.finding or (f"{r.ratio:.2f}×" if r.ratio is not None else "")
    return Text(" ".join(filter(None, [word, said, "" if r.as_expected else "!"])),
                style="green" if r.as_expected else "bold red")


def summary_line(result: CheckResult) -> str:
    """One line for stderr: the counts and the exit code's reason."""
    n = len(result.results)
    head = {0: "OK", 1: "FAIL", 2: "ERROR", 3: "NOT MEASURED"}[result.exit_code]
    meters = sorted({rep.meter for rep in result.reports})
    measured = (f"meter {', '.join(meters)}" + (" (accounting only, not a device measurement)"
                                                 if meters == ["meta"] else "")) if meters else "nothing measured"
    return (f"kvaudit check: {head}: {n - result.count('unexpected')} of {n} cells as expected "
            f"({result.count(PASS)} pass, {result.count(FAIL)} fail of which "
            f"{sum(r.as_expected for r in result.results if r.outcome == FAIL)} expected, "
            f"{result.count(NOT_AUDITED)} not audited, {result.count(ERROR)} errors); {measured}; planned by vLLM "
            f"{result.vllm_version}; {len(result.reports)} deployments in {result.seconds:.1f} s")


def to_dict(result: CheckResult) -> dict[str, Any]:
    """The whole matrix as data: every cell, and the full report of every deployment."""
    from kvaudit.report import render as report

    return {
        "schema_version": SCHEMA_VERSION, "kvaudit_version": __version__, "policy": result.policy,
        "vllm_version": result.vllm_version, "seconds": round(result.seconds, 3),
        "cells": [{"model": r.cell.model, "options": dict(r.cell.options), "strategy": r.cell.strategy,
                   "meter": result.meter_of(r),
                   "tolerance": r.cell.tolerance, "expect": r.cell.expect, "why": r.cell.why, "line": r.cell.line,
                   "outcome": r.outcome, "as_expected": r.as_expected, "ratio": r.ratio,
                   "expected_bytes": r.expected_bytes, "allocated_bytes": r.allocated_bytes, "reason": r.reason,
                   "seconds": round(r.seconds, 3), "report": r.report} for r in result.results],
        "counts": {k: result.count(k) for k in (PASS, FAIL, NOT_AUDITED, ERROR, "unexpected", "expected-fail")},
        "reports": [report.to_dict(rep) for rep in result.reports],
        "exit_code": result.exit_code,
    }


def to_json(result: CheckResult) -> str:
    """``--format json``."""
    return json.dumps(to_dict(result), indent=2)


def to_junit(result: CheckResult) -> str:
    """JUnit XML: one test case per cell (classname the deployment, name the strategy). A cell not as
    expected is a ``failure`` (an ``error`` when its deployment was refused or it could not be measured),
    carrying the reasons; a cell that fails or is not audited as the policy expects is ``skipped`` with
    its expectation, as pytest reports an xfail."""
    import xml.etree.ElementTree as ET

    from kvaudit.escape import xml_safe
    from kvaudit.report.render import meter_label
    from kvaudit.units import fmt_bytes

    kinds = [r.junit for r in result.results]
    counts = {"tests": str(len(kinds)), "failures": str(kinds.count("failure")), "errors": str(kinds.count("error")),
              "skipped": str(kinds.count("skipped")), "time": f"{result.seconds:.3f}"}
    suites = ET.Element("testsuites", name="kvaudit check", **counts)
    suite = ET.SubElement(suites, "testsuite", name=f"kvaudit check {result.policy}", **counts)
    props = ET.SubElement(suite, "properties")
    for name, value in (("kvaudit_version", __version__), ("vllm_version", str(result.vllm_version)),
                        ("meters", ", ".join(sorted({meter_label(rep.meter) for rep in result.reports})))):
        ET.SubElement(props, "property", name=name, value=value)
    for r in result.results:
        case = ET.SubElement(suite, "testcase", classname=f"kvaudit.{r.cell.label}", name=r.cell.strategy,
                             time=f"{r.seconds:.3f}")
        meter = result.meter_of(r)
        figures = (f"allocated {fmt_bytes(r.allocated_bytes)} ({r.allocated_bytes:,} B) of {fmt_bytes(r.expected_bytes)} "
                   f"({r.expected_bytes:,} B) planned, {r.ratio:.2f}×"
                   if r.ratio is not None else "not measured")
        detail = (f"{r.cell.label}, strategy {r.cell.strategy}: {r.outcome.upper()}, expected "
                  f"{r.cell.expect}; {figures}; meter {meter_label(meter)}; planned by vLLM {result.vllm_version}; "
                  f"tolerance {r.cell.tolerance:.2%}; policy line {r.cell.line}"
                  + (f"\n{r.reason}" if r.reason else "") + (f"\nwhy: {r.cell.why}" if r.cell.why else ""))
        if r.junit == "skipped":
            ET.SubElement(case, "skipped", type="expected-" + r.outcome,
                          message=f"expected {r.cell.expect}: {r.reason or r.cell.why}"[:500]).text = detail
        elif r.junit == "failure":
            message = (f"over-allocation: {r.reason}" if r.outcome == FAIL else
                       f"expected {r.cell.expect} but it passed: update the policy ({r.cell.why or 'no why given'})")
            ET.SubElement(case, "failure", type="unexpected-" + r.outcome, message=message[:500]).text = detail
        elif r.junit == "error":
            ET.SubElement(case, "error", type=r.outcome, message=r.reason[:500]).text = detail
        ET.SubElement(case, "system-out").text = detail
    ET.indent(suites)  # ElementTree writes control characters as they are, which no XML parser reads back
    return '<?xml version="1.0" encoding="utf-8"?>\n' + xml_safe(ET.tostring(suites, encoding="unicode")) + "\n"
