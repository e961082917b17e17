"""Compare two saved audit reports: byte and ratio deltas per stage, strategy, KV-cache group and layer; regressions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import Any

from kvaudit import __version__
from kvaudit.errors import EXIT_FAIL, EXIT_PASS, UsageError
from kvaudit.escape import terminal_safe_tree
from kvaudit.jsonfile import read_json
from kvaudit.report.render import SCHEMA_VERSION as REPORT_SCHEMA_VERSION
from kvaudit.report.render import layers_text, short_layer, split_layer
from kvaudit.results import DEFAULT_TOLERANCE, Verdict, check_tolerance, exceeds_plan, tolerance_bytes
from kvaudit.units import fmt_bytes

SCHEMA_VERSION = 1
"""Version of the comparison's JSON (``kvaudit/compare.schema.json``)."""

_HOW = "compare reads what kvaudit audit --format json writes"
_QUIET_DEPLOYMENT_KEYS = ("config_path", "weights_source")
"""Deployment keys that name where a figure came from, not the figure: a path on the machine that ran the
audit differs between any two machines, so a difference there is not shown."""


# ---------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class SavedReport:
    """A report written by ``kvaudit audit --format json``: one stage, or ``{"stages": [...]}`` with ``--pp``."""

    path: str
    schema_version: int
    kvaudit_version: str | None
    stages: tuple[dict, ...]
    """One report per pipeline stage, as saved (a single-stage report is a one-stage tuple)."""
    multi_stage: bool
    """Saved as ``{"stages": [...]}`` (``--pp N`` without ``--pp-rank``)."""


def load_report(path: str | Path) -> SavedReport:
    """Read a saved audit report; anything else raises ``UsageError`` with a one-line message naming the file."""
    return parse_report(read_json(path, "kvaudit report", _HOW), str(path))


def parse_report(data: Any, name: str) -> SavedReport:
    """Check a decoded report (``name`` is how messages call it) and wrap it; ``UsageError`` when it is not one."""
    def bad(what: str) -> UsageError:
        return UsageError(f"{name}: not a kvaudit audit report: {what} ({_HOW})")

    data = terminal_safe_tree(data)  # (its names reach the terminal as text, never as a command to it)

    if not isinstance(data, dict):
        raise bad(f"the JSON is {_json_kind(data)}, not an object")
    if "schema_version" not in data:
        raise bad("no schema_version")
    version = data["schema_version"]
    if not _is_int(version):
        raise bad(f"schema_version {json.dumps(version)} is not an integer")
    if version > REPORT_SCHEMA_VERSION:
        raise UsageError(f"{name}: report schema_version {version} is newer than this kvaudit {__version__} reads "
                         f"(schema_version {REPORT_SCHEMA_VERSION}); compare it with the kvaudit that wrote it or a "
                         "newer one")
    if version < 1:
        raise bad(f"schema_version {version} is not one kvaudit writes")
    if "stages" in data:
        stages = data["stages"]
        if not isinstance(stages, list) or not stages:
            raise bad("stages is not a non-empty list")
        if all(isinstance(s, dict) and "plans" in s and "audits" not in s for s in stages):
            raise bad("it is the output of kvaudit plan (plans, nothing allocated), which has no audits to compare")
        for i, stage in enumerate(stages):
            _check_stage(stage, f"stages[{i}]", bad)
        multi = True
    elif "audits" in data:
        _check_stage(data, "the report", bad)
        stages, multi = [data], False
    elif "verdict" in data and "evidence" in data:
        raise bad("it is the output of kvaudit triage, which has no audits to compare")
    else:
        raise bad("no audits and no stages")
    if not any(s["audits"] for s in stages):
        raise bad("no strategy was audited (every one skipped): nothing to compare")
    stages = [{**s, "audits": [_recomputed(a) for a in s["audits"]]} for s in stages]
    ranks = [_pp_rank(s, i) for i, s in enumerate(stages)]
    if len(set(ranks)) != len(ranks):
        raise bad(f"two stages with the same pipeline_parallel_rank ({ranks})")
    kv = data.get("kvaudit_version", stages[0].get("kvaudit_version"))
    return SavedReport(path=name, schema_version=version, kvaudit_version=kv if isinstance(kv, str) else None,
                       stages=tuple(stages), multi_stage=multi)


def _check_stage(stage: Any, where: str, bad: Any) -> None:
    if not isinstance(stage, dict):
        raise bad(f"{where} is {_json_kind(stage)}, not an object")
    audits = stage.get("audits")
    if not isinstance(audits, list):
        raise bad(f"{where} has no audits list")
    if not isinstance(stage.get("deployment", {}), dict):
        raise bad(f"{where}: deployment is not an object")
    names = set()
    for j, a in enumerate(audits):
        at = f"{where}, audits[{j}]"
        if not isinstance(a, dict) or not isinstance(a.get("strategy"), str):
            raise bad(f"{at} has no strategy name")
        at += f" ({a['strategy']})"
        if a["strategy"] in names:
            raise bad(f"{at}: the strategy appears twice")
        names.add(a["strategy"])
        _check_figures(a, at, bad)
        _check_optional(a, at, bad, _AUDIT_FIELDS)
        _check_optional(a.get("plan") or {}, f"{at}, plan", bad, {"tensors": list, "plan_format": str})
        if a.get("verdict") not in (Verdict.PASS.value, Verdict.FAIL.value):
            raise bad(f"{at}: verdict {json.dumps(a.get('verdict'))} is neither PASS nor FAIL")
        for key, ident, check in (("groups", "group", _is_int), ("layers", "layer", lambda v: isinstance(v, str))):
            rows = a.get(key)
            if not isinstance(rows, list):
                raise bad(f"{at} has no {key} list")
            seen = set()
            for k, row in enumerate(rows):
                if not isinstance(row, dict) or not check(row.get(ident)):
                    raise bad(f"{at}, {key}[{k}] has no {ident}")
                if row[ident] in seen:
                    raise bad(f"{at}: {ident} {row[ident]} appears twice")
                seen.add(row[ident])
                _check_figures(row, f"{at}, {ident} {row[ident]}", bad)
                _check_optional(row, f"{at}, {ident} {row[ident]}", bad, _ROW_FIELDS)
        _check_sums(a, at, bad)
    skipped = stage.get("skipped", [])
    if not isinstance(skipped, list) or not all(isinstance(s, dict) and isinstance(s.get("strategy"), str)
                                                for s in skipped):
        raise bad(f"{where}: skipped is not a list of strategies")


MAX_FIGURE = 1 << 50
"""Bytes no figure of a report reaches (1 PiB: a thousand times the largest device's memory)."""


def _check_sums(a: dict, at: str, bad: Any) -> None:
    """Figures no report of kvaudit's can hold are refused: an alignment allowance beyond one ``ALIGNMENT`` unit per
    planned tensor (``--kv-transfer``), a tolerance beyond the plan plus that allowance."""
    from kvaudit.strategies.strategy import ALIGNMENT

    tensors = len(_list(_dict(a.get("plan")).get("tensors"))) or len(a["layers"]) or 1
    allowance = a.get("alignment_allowance_bytes") or 0
    if allowance > ALIGNMENT * tensors:
        raise bad(f"{at}: alignment_allowance_bytes {allowance:,} is more than {fmt_bytes(ALIGNMENT)} for each of "
                  f"its {tensors:,} planned tensors")
    tol = a.get("tolerance_bytes")
    if tol is not None and not (_is_int(tol) and 0 <= tol <= tolerance_bytes(a["expected_bytes"], 1.0, allowance)):
        raise bad(f"{at}: tolerance_bytes {json.dumps(tol)[:24]} is not between 0 and the plan plus its allowance")


def _recomputed(a: dict) -> dict:
    """The audit with its totals and verdict recomputed from its layer rows, never believed over them: the planned
    bytes of the strategy and of each group at most their layers' (each row is a share of the plan), the allocated
    bytes at least their layers' (a total also holds bytes no layer was given), and a PASS that its own figures put
    beyond its tolerance (the audit's rule, ``exceeds_plan``) a FAIL."""
    def from_rows(total: dict, rows: list[dict]) -> dict:
        # (a layer's share of a storage is rounded to a byte: its rows may add up to a byte per row more or less)
        expected, allocated = (sum(r[k] for r in rows) for k in ("expected_bytes", "allocated_bytes"))
        return {**total, "expected_bytes": expected if expected < total["expected_bytes"] - len(rows)
                else total["expected_bytes"], "allocated_bytes": allocated
                if allocated > total["allocated_bytes"] + len(rows) else total["allocated_bytes"]}

    layers = a["layers"]
    if layers:
        a = from_rows(a, layers)
        a["groups"] = [from_rows(g, mine) if (mine := [r for r in layers if r.get("group") == g["group"]]) else g
                       for g in a["groups"]]
    else:
        a = dict(a)
    tol = a.get("tolerance_bytes")
    if tol is None:
        tol = tolerance_bytes(a["expected_bytes"], DEFAULT_TOLERANCE, a.get("alignment_allowance_bytes") or 0)
    if a["verdict"] == Verdict.PASS.value and exceeds_plan(a["allocated_bytes"], a["expected_bytes"], tol):
        a["verdict"] = Verdict.FAIL.value
    return a


_AUDIT_FIELDS = {"alignment_allowance_bytes": int, "leaked_bytes": int, "allocations": int, "num_blocks": int,
                 "block_size": int, "platform": str, "releases": str, "title": str, "meter": str, "plan": dict,
                 "device_oom": dict, "reasons": list}
"""Fields of an audit that compare reads besides its figures, and their JSON types (each may be absent or null)."""
_ROW_FIELDS = {"group": int, "spec": str, "planned_shares_with": list, "layers": int}
"""Likewise for a group's or layer's row."""


def _check_optional(row: dict, where: str, bad: Any, fields: dict[str, type]) -> None:
    """Each of ``fields`` that ``row`` holds is of its type (an integer also non-negative), or null."""
    if not isinstance(row, dict):
        raise bad(f"{where} is not an object")
    for key, kind in fields.items():
        v = row.get(key)
        if v is None:
            continue
        ok = (_is_int(v) and v >= 0) if kind is int else isinstance(v, kind)
        if kind is list and ok and key == "planned_shares_with":
            ok = all(isinstance(x, str) for x in v)
        if not ok:
            raise bad(f"{where}: {key} {json.dumps(v)[:40]} is not {_KIND_NAMES[kind]}")


_KIND_NAMES = {int: "a non-negative integer", str: "a string", list: "a list", dict: "an object"}


def _check_figures(row: dict, where: str, bad: Any) -> None:
    for key in ("expected_bytes", "allocated_bytes"):
        if not _is_int(row.get(key)) or row[key] < 0:
            raise bad(f"{where} has no {key} (a non-negative integer)")
        if row[key] > MAX_FIGURE:
            raise bad(f"{where}: {key} {row[key]:,} is beyond any device ({fmt_bytes(MAX_FIGURE)})")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _json_kind(v: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(v), "a number")


def _pp_rank(stage: dict, position: int) -> int:
    rank = stage.get("deployment", {}).get("pipeline_parallel_rank")
    return rank if _is_int(rank) else position


# ---------------------------------------------------------------------------------------------- the comparison


class Status(str, Enum):
    """How one row (a strategy's total, a KV-cache group, a layer) changed from the old report to the new."""

    REGRESSION = "regression"
    IMPROVED = "improved"
    SAME = "same"
    """No change beyond the tolerance (bytes may still differ, within it)."""
    ADDED = "added"
    """Only in the new report."""
    REMOVED = "removed"
    """Only in the old report."""
    NOT_AUDITED = "not audited"
    """A strategy neither report audited (both list it as skipped)."""


@dataclass(frozen=True)
class Figures:
    """One side of a row: the bytes vLLM planned (expected) and the bytes the allocator gave (allocated)."""

    expected: int
    allocated: int

    @property
    def ratio(self) -> float | None:
        """Allocated over expected bytes (``None`` when nothing was planned)."""
        return self.allocated / self.expected if self.expected else None

    @property
    def excess(self) -> int:
        """Allocated − expected: above the plan when positive, below it when negative."""
        return self.allocated - self.expected

    @property
    def over(self) -> int:
        """Over-allocation: bytes above the plan."""
        return max(0, self.excess)

    @property
    def under(self) -> int:
        """Under-allocation: bytes below the plan."""
        return max(0, -self.excess)

    def to_dict(self) -> dict:
        """JSON form."""
        return {"expected_bytes": self.expected, "allocated_bytes": self.allocated, "ratio": _round(self.ratio)}


@dataclass(frozen=True)
class RowDelta:
    """One row of a strategy in both reports: its total, one KV-cache group (by index) or one layer (by name)."""

    kind: str
    """``strategy`` (the total), ``group`` or ``layer``."""
    name: str
    """The strategy, the group index or the layer name."""
    spec: str | None
    """The KV-cache spec (``MambaSpec``, ``FullAttentionSpec``, ...) of a group or layer, as the new report has it."""
    group: int | None
    """The KV-cache group of a group or layer row."""
    old: Figures | None
    new: Figures | None
    tolerance_bytes: int | None
    """How far the new over- or under-allocation may exceed the old one: the audit's tolerance of the new
    expected bytes (with ``--kv-transfer``, its alignment allowance for over-allocation); ``None`` unless in both."""
    status: Status

    @property
    def label(self) -> str:
        """``total``, ``group 3`` or ``layer 3.self_attn.attn``."""
        return {"strategy": "total", "group": f"group {self.name}"}.get(self.kind, f"layer {short_layer(self.name)}")

    @property
    def delta_expected_bytes(self) -> int | None:
        """New − old expected bytes (the plan changed)."""
        return self.new.expected - self.old.expected if self.old and self.new else None

    @property
    def delta_allocated_bytes(self) -> int | None:
        """New − old allocated bytes."""
        return self.new.allocated - self.old.allocated if self.old and self.new else None

    @property
    def delta_excess_bytes(self) -> int | None:
        """New − old (allocated − expected): how much further from the plan the allocator is; what regressions
        are judged on."""
        return self.new.excess - self.old.excess if self.old and self.new else None

    @property
    def delta_ratio(self) -> float | None:
        """New − old ratio (allocated / expected)."""
        if not (self.old and self.new) or self.old.ratio is None or self.new.ratio is None:
            return None
        return self.new.ratio - self.old.ratio

    def to_dict(self) -> dict:
        """JSON form."""
        both = self.old is not None and self.new is not None
        out: dict[str, Any] = {self.kind: int(self.name) if self.kind == "group" else self.name}
        if self.kind == "layer":
            out["group"] = self.group
        if self.kind != "strategy":
            out["spec"] = self.spec
        out.update({
            "status": self.status.value,
            "old": self.old.to_dict() if self.old else None, "new": self.new.to_dict() if self.new else None,
            "delta": {"expected_bytes": self.delta_expected_bytes, "allocated_bytes": self.delta_allocated_bytes,
                      "over_plan_bytes": self.delta_excess_bytes, "ratio": _round(self.delta_ratio)} if both else None,
            "tolerance_bytes": self.tolerance_bytes})
        return out


@dataclass(frozen=True)
class StrategyDelta:
    """One strategy (matched by name) in both reports, or in one of them."""

    strategy: str
    status: Status
    total: RowDelta
    """The strategy's expected and allocated bytes, old and new."""
    old_verdict: str | None
    new_verdict: str | None
    groups: tuple[RowDelta, ...]
    layers: tuple[RowDelta, ...]
    notes: tuple[str, ...]
    """What else differs: the platform rule, block size, num_blocks, release, why it was not audited, ..."""

    @property
    def compared(self) -> bool:
        """Audited in both reports."""
        return self.total.old is not None and self.total.new is not None

    @property
    def verdict_change(self) -> str | None:
        """``PASS → FAIL`` or ``FAIL → PASS``; ``None`` when the verdict did not change."""
        if not self.compared or self.old_verdict == self.new_verdict:
            return None
        return f"{self.old_verdict} → {self.new_verdict}"

    def rows(self) -> tuple[RowDelta, ...]:
        """Total, groups, layers."""
        return (self.total, *self.groups, *self.layers)

    def changed(self, status: Status) -> tuple[RowDelta, ...]:
        """The rows with ``status``, the furthest from the old allocation first (groups, then layers, then
        the total: the group is where a reader looks first)."""
        order = {"group": 0, "layer": 1, "strategy": 2}
        rows = [r for r in self.rows() if r.status is status]
        return tuple(sorted(rows, key=lambda r: (order[r.kind], -abs(r.delta_excess_bytes or 0))))

    def headline(self) -> str:
        """Where the strategy regressed or improved most, for the summary:
        ``ascend-0.12 group 3: 4.00× → 4.05×, +48.00 MiB over plan``."""
        rows = self.changed(self.status) if self.status in (Status.REGRESSION, Status.IMPROVED) else ()
        if rows:
            r = rows[0]
            return (f"{self.strategy} {r.label}: {_ratio(r.old)} → {_ratio(r.new)}, "
                    f"{fmt_bytes(r.delta_excess_bytes or 0, signed=True)} over plan")
        return f"{self.strategy}: {self.verdict_change}" if self.verdict_change else self.strategy

    def to_dict(self) -> dict:
        """JSON form."""
        total = self.total.to_dict()
        for side, verdict in (("old", self.old_verdict), ("new", self.new_verdict)):
            if total[side] is not None:
                total[side]["verdict"] = verdict
        return {**total, "notes": list(self.notes),
                "groups": [g.to_dict() for g in self.groups], "layers": [r.to_dict() for r in self.layers]}


@dataclass(frozen=True)
class StageDelta:
    """One pipeline stage (matched by ``pipeline_parallel_rank``) in both reports, or in one of them."""

    pp_rank: int
    status: Status
    strategies: tuple[StrategyDelta, ...]
    notes: tuple[str, ...]
    """How the two stages' reports differ: vLLM, meter, model, deployment (``kv_transfer false → true``)."""

    def to_dict(self) -> dict:
        """JSON form."""
        return {"pp_rank": self.pp_rank, "status": self.status.value, "notes": list(self.notes),
                "strategies": [s.to_dict() for s in self.strategies]}


@dataclass(frozen=True)
class Comparison:
    """Two saved reports compared: per stage, strategy, group and layer."""

    old_path: str
    new_path: str
    tolerance: float
    stages: tuple[StageDelta, ...]
    notes: tuple[str, ...]
    """What differs between the two reports besides allocations (each stage's notes, once each)."""

    @property
    def strategies(self) -> tuple[tuple[int, StrategyDelta], ...]:
        """(pp_rank, strategy) of every stage."""
        return tuple((st.pp_rank, s) for st in self.stages for s in st.strategies)

    @property
    def regressions(self) -> tuple[tuple[int, StrategyDelta], ...]:
        """(pp_rank, strategy) of each strategy that regressed."""
        return tuple((rank, s) for rank, s in self.strategies if s.status is Status.REGRESSION)

    @property
    def exit_code(self) -> int:
        """1 when any strategy regressed, else 0."""
        return EXIT_FAIL if self.regressions else EXIT_PASS


def compare(old: SavedReport, new: SavedReport, tolerance: float = DEFAULT_TOLERANCE) -> Comparison:
    """Compare ``old`` with ``new``. A regression is, for a strategy, group or layer in both reports: the new
    over-allocation (allocated − expected) exceeds the old one, taken at the new plan's scale, by more than the
    audit's tolerance of the new expected bytes (plus, with ``--kv-transfer``, the audit's alignment allowance),
    or the new under-allocation the old one, or the strategy's verdict goes PASS → FAIL.
    An improvement is the reverse. Strategies, groups, layers or stages in one report only are listed as
    added or removed, never as regressions."""
    check_tolerance(tolerance)
    olds = {_pp_rank(s, i): s for i, s in enumerate(old.stages)}
    news = {_pp_rank(s, i): s for i, s in enumerate(new.stages)}
    stages = []
    for rank in sorted(set(olds) | set(news)):
        o, n = olds.get(rank), news.get(rank)
        if o is None or n is None:
            side = o if o is not None else n
            status = Status.REMOVED if n is None else Status.ADDED
            strategies = tuple(_one_sided(a, status) for a in side["audits"])
            stages.append(StageDelta(rank, status, strategies, ()))
            continue
        strategies = _strategies(o, n, tolerance)
        stages.append(StageDelta(rank, _overall(s.status for s in strategies), strategies, tuple(_report_notes(o, n))))
    notes = tuple(dict.fromkeys(note for st in stages for note in st.notes))
    return Comparison(old_path=old.path, new_path=new.path, tolerance=tolerance, stages=tuple(stages), notes=notes)


def _overall(statuses: Any) -> Status:
    found = set(statuses)
    for s in (Status.REGRESSION, Status.IMPROVED):
        if s in found:
            return s
    return Status.SAME


def _strategies(o: dict, n: dict, tolerance: float) -> tuple[StrategyDelta, ...]:
    old_audits = {a["strategy"]: a for a in o["audits"]}
    new_audits = {a["strategy"]: a for a in n["audits"]}
    old_skipped = {s["strategy"]: s.get("reason", "") for s in o.get("skipped", [])}
    new_skipped = {s["strategy"]: s.get("reason", "") for s in n.get("skipped", [])}
    out = []
    for name in dict.fromkeys([*old_audits, *old_skipped, *new_audits, *new_skipped]):
        a, b = old_audits.get(name), new_audits.get(name)
        if a is not None and b is not None:
            out.append(_strategy(a, b, tolerance, (o.get("vllm_version"), n.get("vllm_version"))))
        elif a is not None:
            why = (f"not audited in the new report: {new_skipped[name]}" if name in new_skipped
                   else "not in the new report")
            out.append(_one_sided(a, Status.REMOVED, why))
        elif b is not None:
            why = (f"not audited in the old report: {old_skipped[name]}" if name in old_skipped
                   else "not in the old report")
            out.append(_one_sided(b, Status.ADDED, why))
        else:
            reasons = dict.fromkeys(r for r in (old_skipped.get(name), new_skipped.get(name)) if r is not None)
            total = RowDelta("strategy", name, None, None, None, None, None, Status.NOT_AUDITED)
            out.append(StrategyDelta(name, Status.NOT_AUDITED, total, None, None, (), (),
                                     tuple(f"not audited: {r}" for r in reasons)))
    return tuple(out)


def _one_sided(audit: dict, status: Status, why: str | None = None) -> StrategyDelta:
    """A strategy (or a whole stage's strategy) in one report only."""
    removed = status is Status.REMOVED

    def row(kind: str, name: str, spec: str | None, group: int | None, r: dict) -> RowDelta:
        f = _figures(r)
        return RowDelta(kind, name, spec, group, f if removed else None, None if removed else f, None, status)

    groups = tuple(row("group", str(g["group"]), g.get("spec"), g["group"], g) for g in audit["groups"])
    layers = tuple(row("layer", r["layer"], r.get("spec"), r.get("group"), r) for r in audit["layers"])
    verdict = audit["verdict"]
    return StrategyDelta(audit["strategy"], status, row("strategy", audit["strategy"], None, None, audit),
                         verdict if removed else None, None if removed else verdict, groups, layers,
                         (why,) if why else ())


def _figures(row: dict) -> Figures:
    return Figures(expected=row["expected_bytes"], allocated=row["allocated_bytes"])


def _status(old: Figures, new: Figures, tolerance: float, old_allowance: float, new_allowance: float
            ) -> tuple[Status, int]:
    """Regression when the new over-allocation exceeds the old one (at the new plan's scale, see ``_worse``) by
    more than the audit's tolerance of the new expected bytes (with the new report's alignment allowance, as the
    audit's over-allocation rule has it), or the new under-allocation the old one by more than the tolerance (no
    allowance, as the audit's under-allocation rule); improvement is the same test with old and new swapped.
    Returns the status and the tolerance of the regression test."""
    tol = tolerance_bytes(new.expected, tolerance, new_allowance)
    if _worse(old, new, tol, tolerance_bytes(new.expected, tolerance)):
        return Status.REGRESSION, tol
    if _worse(new, old, tolerance_bytes(old.expected, tolerance, old_allowance),
              tolerance_bytes(old.expected, tolerance)):
        return Status.IMPROVED, tol
    return Status.SAME, tol


def _worse(before: Figures, after: Figures, over_tolerance: int, under_tolerance: int) -> bool:
    """``after`` is further above (or below) its plan than ``before`` was, by more than the tolerance. The excess
    ``before`` had is taken at the scale of ``after``'s plan (× after / before expected bytes): an allocator that
    gives each plan the same multiple of it is not worse for a plan that grew; with equal plans this is the
    plain byte difference. The test is the verdict's own over-allocation rule, ``exceeds_plan``, with that
    excess as the plan."""
    def scaled(excess: int) -> int:
        return round(Fraction(excess * after.expected, before.expected)) if before.expected else excess

    return (exceeds_plan(after.over, scaled(before.over), over_tolerance)
            or exceeds_plan(after.under, scaled(before.under), under_tolerance))


def _allowances(audit: dict) -> tuple[float, dict[str, float], dict[int, float]]:
    """The audit's alignment allowance (``--kv-transfer``: one 2 MiB unit per planned tensor) for the strategy,
    per layer and per group: each tensor's unit split among the layers planned to share it, as the accounting
    splits the padding of a storage among the layers that use it; a group has its layers' shares."""
    total = audit.get("alignment_allowance_bytes") or 0
    tensors = _list(_dict(audit.get("plan")).get("tensors"))
    per_tensor = total / len(tensors) if tensors and isinstance(total, (int, float)) else 0
    layers: dict[str, float] = {}
    groups: dict[int, float] = {}
    for r in audit["layers"]:
        share = per_tensor / (1 + len(_list(r.get("planned_shares_with"))))
        layers[r["layer"]] = share
        groups[r.get("group")] = groups.get(r.get("group"), 0) + share
    return total, layers, groups


def _strategy(a: dict, b: dict, tolerance: float, vllm_versions: tuple[Any, Any]) -> StrategyDelta:
    name = b["strategy"]
    old_allowance, new_allowance = _allowances(a), _allowances(b)
    old_total, new_total = _figures(a), _figures(b)
    status, tol = _status(old_total, new_total, tolerance, old_allowance[0], new_allowance[0])
    total = RowDelta("strategy", name, None, None, old_total, new_total, tol, status)
    notes: list[str] = []
    groups = _rows("group", a["groups"], b["groups"], tolerance, old_allowance[2], new_allowance[2], notes)
    layers = _rows("layer", a["layers"], b["layers"], tolerance, old_allowance[1], new_allowance[1], notes)

    old_verdict, new_verdict = a["verdict"], b["verdict"]
    statuses = [r.status for r in (total, *groups, *layers)]
    if old_verdict == Verdict.PASS.value and new_verdict == Verdict.FAIL.value:
        statuses.append(Status.REGRESSION)
    elif old_verdict == Verdict.FAIL.value and new_verdict == Verdict.PASS.value:
        statuses.append(Status.IMPROVED)
    notes[:0] = _audit_notes(a, b, vllm_versions)
    return StrategyDelta(name, _overall(statuses), total, old_verdict, new_verdict, groups, layers, tuple(notes))


def _rows(kind: str, old_rows: list[dict], new_rows: list[dict], tolerance: float, old_allowance: dict,
          new_allowance: dict, notes: list[str]) -> tuple[RowDelta, ...]:
    """Group rows matched by index or layer rows matched by name."""
    olds = {r[kind]: r for r in old_rows}
    news = {r[kind]: r for r in new_rows}
    order = sorted if kind == "group" else (lambda keys: sorted(keys, key=_layer_order))
    out = []
    for k in order(set(olds) | set(news)):
        o, n = olds.get(k), news.get(k)
        spec = (n or o).get("spec")
        group = k if kind == "group" else (n or o).get("group")
        if o is None or n is None:
            f = _figures(o or n)
            status = Status.REMOVED if n is None else Status.ADDED
            out.append(RowDelta(kind, str(k), spec, group, f if n is None else None, f if o is None else None, None,
                                status))
            continue
        if kind == "group" and o.get("spec") != n.get("spec"):
            notes.append(f"group {k}: spec {o.get('spec')} → {n.get('spec')}")
        status, tol = _status(_figures(o), _figures(n), tolerance, old_allowance.get(k, 0), new_allowance.get(k, 0))
        out.append(RowDelta(kind, str(k), spec, group, _figures(o), _figures(n), tol, status))
    return tuple(out)


def _layer_order(name: str) -> tuple[int, str]:
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1]), name
    return 1 << 30, name


def _audit_notes(a: dict, b: dict, vllm_versions: tuple[Any, Any]) -> list[str]:
    """What differs in how the strategy was planned and run (a plan by another vLLM than the report's is named)."""
    notes = []
    pa, pb = _dict(a.get("plan")), _dict(b.get("plan"))
    planned_by = (pa.get("vllm_version"), pb.get("vllm_version"))
    for label, x, y in (("release", a.get("releases"), b.get("releases")),
                        ("platform rule", pa.get("platform"), pb.get("platform")),
                        ("planned by vLLM", *(planned_by if planned_by != vllm_versions else (None, None))),
                        ("plan format", pa.get("plan_format"), pb.get("plan_format")),
                        ("block size", pa.get("block_size"), pb.get("block_size")),
                        ("num_blocks", pa.get("num_blocks"), pb.get("num_blocks")),
                        ("KV-cache groups", len(_list(pa.get("groups"))), len(_list(pb.get("groups")))),
                        ("planned tensors", len(_list(pa.get("tensors"))), len(_list(pb.get("tensors")))),
                        ("storages", a.get("allocations"), b.get("allocations"))):
        if x != y:
            notes.append(f"{label} {_value(x)} → {_value(y)}")
    for label, side in (("old", a), ("new", b)):
        o = side.get("device_oom")
        if isinstance(o, dict):
            notes.append(f"{label}: ran out of device memory at allocation {o.get('allocation')} of "
                         f"{o.get('allocations')} (no group or layer rows)")
    la, lb = a.get("leaked_bytes") or 0, b.get("leaked_bytes") or 0
    if la != lb:
        notes.append(f"leaked {fmt_bytes(la)} → {fmt_bytes(lb)}")
    return notes


def _report_notes(o: dict, n: dict) -> list[str]:
    """What the user compared: the vLLM, kvaudit, meter, model and deployment of each side, where they differ."""
    notes = []
    for label, key in (("vLLM", "vllm_version"), ("kvaudit", "kvaudit_version"), ("meter", "meter"),
                       ("measured on", "meter_device"), ("model", "model")):
        if o.get(key) != n.get(key):
            notes.append(f"{label} {_value(o.get(key))} → {_value(n.get(key))}")
    do, dn = o.get("deployment") or {}, n.get("deployment") or {}
    for key in dict.fromkeys([*do, *dn]):
        if key in _QUIET_DEPLOYMENT_KEYS or do.get(key) == dn.get(key):
            continue
        x = _value(do[key], key) if key in do else "absent"
        y = _value(dn[key], key) if key in dn else "absent"
        if x == y:  # equal as shown (bytes at two decimals): show them exactly
            x, y = _exact(do.get(key)), _exact(dn.get(key))
        notes.append(f"{key} {x} → {y}")
    return notes


def _value(v: Any, key: str = "") -> str:
    if key.endswith("_bytes") and _is_int(v):
        return fmt_bytes(v)
    if isinstance(v, str):
        return v
    return json.dumps(v)


def _list(v: Any) -> list:
    return v if isinstance(v, list) else []


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _exact(v: Any) -> str:
    return f"{v:,} B" if _is_int(v) else json.dumps(v)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _ratio(f: Figures | None) -> str:
    return "—" if f is None or f.ratio is None else f"{f.ratio:.2f}×"


# ---------------------------------------------------------------------------------------------- output


def _where(c: Comparison, rank: int) -> str:
    return f"stage {rank} " if len(c.stages) > 1 or any(st.pp_rank for st in c.stages) else ""


def summary_line(c: Comparison) -> str:
    """One line for stderr: ``kvaudit compare: REGRESSION in 2 of 4 strategies (...)`` or ``... no regression ...``."""
    compared = [(rank, s) for rank, s in c.strategies if s.compared]
    count = f"{len(compared)} strateg{'y' if len(compared) == 1 else 'ies'}"
    if c.regressions:
        head = (f"REGRESSION in {len(c.regressions)} of {count} ("
                + ", ".join(_where(c, rank) + s.headline() for rank, s in c.regressions) + ")")
    elif not compared:
        head = "no regression: no strategy was audited in both reports"
    else:
        improved = [(rank, s) for rank, s in compared if s.status is Status.IMPROVED]
        head = f"no regression in {count} (tolerance {c.tolerance:.2%})"
        if improved:
            head += "; improved: " + ", ".join(_where(c, rank) + s.headline() for rank, s in improved)
    tail = []
    for status, word in ((Status.REMOVED, "only in the old report"), (Status.ADDED, "only in the new report")):
        names: list[str] = []
        for st in c.stages:
            if st.status is status:
                names.append(f"stage {st.pp_rank}")
            else:
                names += [_where(c, st.pp_rank) + s.strategy for s in st.strategies if s.status is status]
        if names:
            tail.append(f"{word}: {', '.join(names)}")
    shown = len(c.notes) if len(c.notes) <= 4 else 3  # the rest are listed above the tables and in the JSON
    tail += list(c.notes[:shown])
    if len(c.notes) > shown:
        tail.append(f"{len(c.notes) - shown} more differences between the reports")
    return "kvaudit compare: " + "; ".join([head, *tail])


def to_dict(c: Comparison) -> dict:
    """The comparison as JSON data (schema in ``kvaudit/compare.schema.json``)."""
    return {
        "schema_version": SCHEMA_VERSION, "kvaudit_version": __version__,
        "old": c.old_path, "new": c.new_path, "tolerance": c.tolerance,
        "notes": list(c.notes),
        "stages": [st.to_dict() for st in c.stages],
        "regressions": [{"pp_rank": rank, "strategy": s.strategy,
                         "where": [r.label for r in s.changed(Status.REGRESSION)]
                         + ([f"verdict {s.verdict_change}"] if s.old_verdict == Verdict.PASS.value
                            and s.new_verdict == Verdict.FAIL.value else [])}
                        for rank, s in c.regressions],
        "summary": summary_line(c),
        "exit_code": c.exit_code,
    }


def to_json(c: Comparison) -> str:
    """The comparison as JSON text."""
    return json.dumps(to_dict(c), indent=2)


_STYLE = {Status.REGRESSION: "bold red", Status.IMPROVED: "bold green", Status.SAME: "dim",
          Status.ADDED: "cyan", Status.REMOVED: "cyan", Status.NOT_AUDITED: "yellow"}


def render(c: Comparison, detail: str = "groups") -> list[Any]:
    """Rich renderables, top to bottom: what was compared, then per stage a table of each strategy's total and
    groups (``detail="groups"``; only totals with ``"summary"``), with ``"layers"`` a table of the layers whose
    figures differ, the strategies' notes, and the summary line."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from kvaudit.report.tables import fitted

    if detail not in ("summary", "groups", "layers"):
        raise UsageError(f"--detail must be summary, groups or layers, got {detail!r}")
    head = (f"[bold]kvaudit compare[/] · old [bold]{escape(c.old_path)}[/] → new [bold]{escape(c.new_path)}[/]\n"
            f"regression: further from vLLM's plan than before by more than {c.tolerance:.2%} of the new expected "
            "bytes (with --kv-transfer, plus the audit's alignment allowance), or PASS → FAIL")
    out: list[Any] = [Text.from_markup(head + "".join(f"\n• {escape(n)}" for n in c.notes))]

    def table(title: str, what: str, caption: str | None = None) -> Any:
        t = Table(title=title, title_justify="left", caption=caption, caption_justify="left", show_edge=False,
                  pad_edge=False)
        for col in ("strategy", what, "expected", "allocated", "Δ bytes", "ratio", "Δ ratio", "status"):
            t.add_column(col, justify="left" if col in ("strategy", what, "status") else "right",
                         no_wrap=col not in ("strategy", what))
        return t

    def shown(t: Any, what: str, narrow: Any = None) -> Any:
        return fitted(t, wrap=("strategy", what), narrow=narrow)

    def grid(st: StageDelta) -> Any:
        """The verdicts of each strategy, old → new, for a terminal too narrow for the figures' table."""
        g = Table(title=f"{prefix}verdicts (old → new)" if where else "Verdicts (old → new)", title_justify="left",
                  show_edge=False, pad_edge=False, caption="(each group's and layer's figures: a wider terminal, "
                  "--format json, --html or --svg)", caption_justify="left")
        for col in ("strategy", "verdict", "ratio", "status"):
            g.add_column(col, overflow="fold")
        for s in st.strategies:
            verdict = (f"{s.old_verdict} → {s.new_verdict}" if s.compared and s.old_verdict != s.new_verdict
                       else s.new_verdict or s.old_verdict or "—")
            cells = _cells(s.total, "", s.strategy, s.status)
            g.add_row(cells[0], verdict, cells[5], cells[7])
        return fitted(g, wrap=("strategy", "verdict", "ratio", "status"))

    for st in c.stages:
        where = _where(c, st.pp_rank)
        prefix = where[:1].upper() + where[1:]
        title = f"{prefix}per strategy and KV-cache group" if where else "Per strategy and KV-cache group"
        title += " (old → new)"
        if st.status in (Status.ADDED, Status.REMOVED):
            title = f"{title} · stage only in the {'new' if st.status is Status.ADDED else 'old'} report"
        t = table(title, "group")
        compared = [s for s in st.strategies if s.compared]
        common = [n for n in (compared[0].notes if len(compared) > 1 else ()) if all(n in s.notes for s in compared)]
        notes = [f"every strategy: {escape(n)}" for n in common]
        for s in st.strategies:
            verdict = (f"{s.old_verdict} → {s.new_verdict}" if s.compared and s.old_verdict != s.new_verdict
                       else s.new_verdict or s.old_verdict or "")
            t.add_row(*_cells(s.total, f"all: {verdict}" if verdict else "all", s.strategy, s.status), style="bold")
            if detail != "summary":
                for g in s.groups:
                    t.add_row(*_cells(g, f"{g.name} {g.spec or ''}".strip(), "", g.status))
            notes += [f"[bold]{escape(s.strategy)}[/]: {escape(n)}" for n in s.notes if n not in common]
        narrow = grid(st)
        out.append(shown(t, "group", narrow))
        if detail == "layers":
            rows = [(s, r) for s in st.strategies for r in s.layers
                    if r.status is not Status.SAME or r.delta_allocated_bytes or r.delta_expected_bytes]
            hidden = sum(len(s.layers) for s in st.strategies) - len(rows)
            lt = table(f"{prefix}per layer (old → new; layers with the same figures on one row)" if where
                       else "Per layer (old → new; layers with the same figures on one row)", "layers",
                       f"{hidden} layer rows with the same figures in both reports are not shown" if hidden else None)
            runs: dict[tuple, list[str]] = {}
            for s, r in rows:
                cells = _cells(r, "", s.strategy, r.status)
                runs.setdefault((s.strategy, split_layer(r.name)[1], *cells), []).append(r.name)
            for (strategy, _, *cells), names in runs.items():
                cells[1] = escape(short_layer(names[0]) if len(names) == 1 else layers_text(names))
                lt.add_row(*cells)
            out.append(shown(lt, "layers", Text("")))
        if notes:
            out.append(Text.from_markup("\n".join(f"• {n}" for n in notes)))
    out.append(Text(summary_line(c)))
    return out


def _cells(r: RowDelta, what: str, strategy: str, status: Status) -> list[str]:
    """The cells of one row: old → new where they differ, one figure where they do not or only one side has it."""
    from rich.markup import escape

    def pair(x: str | None, y: str | None, unit: str = "") -> str:
        if x is None or y is None:
            return x or y or "—"
        if x == y:
            return x
        a, b = x.rsplit(" ", 1) if " " in x else (x, ""), y.rsplit(" ", 1) if " " in y else (y, "")
        if a[1] and a[1] == b[1]:  # one unit for both: 884.25 → 890.25 MiB
            return f"{a[0]} → {b[0]} {a[1]}"
        return f"{x} → {y}"

    def figure(f: Figures | None, attr: str) -> str | None:
        return None if f is None else fmt_bytes(getattr(f, attr))

    def ratio(f: Figures | None) -> str | None:
        return None if f is None or f.ratio is None else f"{f.ratio:.2f} ×"

    d_alloc, d_ratio = r.delta_allocated_bytes, r.delta_ratio
    return [escape(strategy), escape(what),
            pair(figure(r.old, "expected"), figure(r.new, "expected")),
            pair(figure(r.old, "allocated"), figure(r.new, "allocated")),
            "—" if d_alloc is None else fmt_bytes(d_alloc, signed=True),
            pair(ratio(r.old), ratio(r.new)).replace(" ×", "×"),
            "—" if d_ratio is None else f"{d_ratio:+.2f}" if round(d_ratio, 2) else "0.00",
            f"[{_STYLE[status]}]{status.value}[/]"]
