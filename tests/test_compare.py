"""kvaudit.report.compare: two saved reports (fixtures/reports/compare/, made by the real CLI) diffed per stage, strategy,
KV-cache group and layer; regressions, improvements, the tolerance boundary, added and removed strategies,
multi-stage reports, and every kind of bad input."""

from __future__ import annotations

import ast
import copy
import json
import re
import subprocess
import sys

import jsonschema
import pytest
from conftest import ROOT

from kvaudit.errors import UsageError
from kvaudit.report import compare as C
from kvaudit.results import DEFAULT_TOLERANCE

REPORTS = ROOT / "fixtures" / "reports" / "compare"
BASE = REPORTS / "qwen3-next-util0.7-meta.json"                      # vLLM 0.33.0, the four strategies
VLLM_023 = REPORTS / "qwen3-next-util0.7-meta-vllm0.23.0.json"       # the same, planned by vLLM 0.23.0
KV_TRANSFER = REPORTS / "qwen3-next-util0.7-meta-kv-transfer.json"   # the same with --kv-transfer
SUBSET = REPORTS / "qwen3-next-util0.7-meta-ascend-0.16-vllm.json"    # -s ascend-0.16 -s vllm
PP2 = REPORTS / "qwen3-next-util0.7-meta-pp2.json"                   # --pp 2 -s ascend-0.12 -s ascend-0.16
SCHEMA = json.loads((ROOT / "kvaudit" / "compare.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

MiB = 1 << 20
LAYER = "model.layers.5.linear_attn"  # group 1 (MambaSpec), planned tensor 1 with layers 4, 6 and 7


def data(path) -> dict:
    return json.loads(path.read_text())


def saved(d: dict, name: str = "edited.json") -> C.SavedReport:
    return C.parse_report(d, name)


def audit_of(d: dict, strategy: str, stage: int | None = None) -> dict:
    report = d["stages"][stage] if stage is not None else d
    return next(a for a in report["audits"] if a["strategy"] == strategy)


def plant(d: dict, strategy: str, layer: str, extra: int, stage: int | None = None, *, group_only: bool = False,
          total_only: bool = False) -> dict:
    """A copy of report ``d`` whose ``strategy`` gave ``layer`` ``extra`` more bytes (its group and the strategy's
    total too, as the accounting sums them), or only the group's or only the total's figure."""
    d = copy.deepcopy(d)
    a = audit_of(d, strategy, stage)
    row = next(r for r in a["layers"] if r["layer"] == layer)
    if not group_only and not total_only:
        row["allocated_bytes"] += extra
    if not total_only:
        next(g for g in a["groups"] if g["group"] == row["group"])["allocated_bytes"] += extra
    if not group_only:
        a["allocated_bytes"] += extra
    return d


def strategy(c: C.Comparison, name: str, rank: int = 0) -> C.StrategyDelta:
    return next(s for r, s in c.strategies if s.strategy == name and r == rank)


def row(s: C.StrategyDelta, label: str) -> C.RowDelta:
    return next(r for r in s.rows() if r.label == label)


def statuses(s: C.StrategyDelta) -> dict[str, C.Status]:
    """Rows whose status is not SAME, by label."""
    return {r.label: r.status for r in s.rows() if r.status is not C.Status.SAME}


# ------------------------------------------------------------------------------------------ identical reports


@pytest.mark.parametrize("path", [BASE, VLLM_023, KV_TRANSFER, SUBSET, PP2], ids=lambda p: p.stem)
def test_a_report_against_itself_has_no_regression_and_every_delta_is_zero(path):
    r = C.load_report(path)
    c = C.compare(r, r)
    assert c.exit_code == 0 and c.regressions == () and c.notes == ()
    assert {s.status for _, s in c.strategies} == {C.Status.SAME}
    rows = [x for _, s in c.strategies for x in s.rows()]
    assert len(rows) == sum(1 + len(a["groups"]) + len(a["layers"]) for st in r.stages for a in st["audits"])
    for x in rows:
        assert x.status is C.Status.SAME
        assert (x.delta_expected_bytes, x.delta_allocated_bytes, x.delta_excess_bytes, x.delta_ratio) == (0, 0, 0, 0)
    assert C.summary_line(c).startswith(f"kvaudit compare: no regression in {len(c.strategies)} strategies")
    assert "improved" not in C.summary_line(c)


# ------------------------------------------------------------------------------------------ planted regressions


def test_a_planted_regression_is_found_at_its_group_and_layer_with_its_byte_delta():
    base = data(BASE)
    extra = 10 * MiB  # above a layer's (386,335 B) and a group's (4,636,017 B) tolerance, below the total's
    c = C.compare(saved(base, str(BASE)), saved(plant(base, "ascend-0.16", LAYER, extra), "new.json"))
    assert c.exit_code == 1
    s = strategy(c, "ascend-0.16")
    assert s.status is C.Status.REGRESSION
    assert statuses(s) == {"group 1": C.Status.REGRESSION, "layer 5.linear_attn": C.Status.REGRESSION}
    for label in ("group 1", "layer 5.linear_attn", "total"):
        x = row(s, label)
        assert (x.delta_allocated_bytes, x.delta_excess_bytes, x.delta_expected_bytes) == (extra, extra, 0), label
    assert row(s, "total").status is C.Status.SAME  # 10 MiB is within 0.5 % of the 3.45 GiB plan
    assert row(s, "layer 5.linear_attn").tolerance_bytes == 386_335
    assert row(s, "group 1").tolerance_bytes == 4_636_017
    assert row(s, "group 1").delta_ratio == pytest.approx(extra / 927_203_328)
    assert all(other.status is C.Status.SAME for _, other in c.strategies if other is not s)
    assert C.summary_line(c) == ("kvaudit compare: REGRESSION in 1 of 4 strategies (ascend-0.16 group 1: 1.00× → "
                                 "1.01×, +10.00 MiB over plan)")
    doc = json.loads(C.to_json(c))
    assert doc["regressions"] == [{"pp_rank": 0, "strategy": "ascend-0.16", "where": ["group 1", "layer 5.linear_attn"]}]


def test_the_same_change_the_other_way_is_an_improvement_and_exits_0():
    base = data(BASE)
    c = C.compare(saved(plant(base, "ascend-0.16", LAYER, 10 * MiB), "old.json"), saved(base, str(BASE)))
    assert c.exit_code == 0
    s = strategy(c, "ascend-0.16")
    assert s.status is C.Status.IMPROVED
    assert statuses(s) == {"group 1": C.Status.IMPROVED, "layer 5.linear_attn": C.Status.IMPROVED}
    assert row(s, "layer 5.linear_attn").delta_allocated_bytes == -10 * MiB
    assert C.summary_line(c) == ("kvaudit compare: no regression in 4 strategies (tolerance 0.50%); improved: "
                                 "ascend-0.16 group 1: 1.01× → 1.00×, -10.00 MiB over plan")


def test_under_allocation_that_grows_is_a_regression_too():
    base = data(BASE)
    c = C.compare(saved(base), saved(plant(base, "ascend-0.16", LAYER, -10 * MiB)))
    s = strategy(c, "ascend-0.16")
    assert statuses(s) == {"group 1": C.Status.REGRESSION, "layer 5.linear_attn": C.Status.REGRESSION}
    assert row(s, "group 1").delta_excess_bytes == -10 * MiB and c.exit_code == 1


def test_a_verdict_that_goes_from_pass_to_fail_is_a_regression_even_within_the_tolerance():
    base = data(BASE)
    new = copy.deepcopy(base)
    audit_of(new, "ascend-0.16")["verdict"] = "FAIL"  # e.g. a leak: the bytes stayed the same
    c = C.compare(saved(base), saved(new))
    s = strategy(c, "ascend-0.16")
    assert s.status is C.Status.REGRESSION and statuses(s) == {} and c.exit_code == 1
    assert s.verdict_change == "PASS → FAIL"
    assert "ascend-0.16: PASS → FAIL" in C.summary_line(c)
    assert json.loads(C.to_json(c))["regressions"][0]["where"] == ["verdict PASS → FAIL"]
    back = C.compare(saved(new), saved(base))
    assert strategy(back, "ascend-0.16").status is C.Status.IMPROVED and back.exit_code == 0


# ------------------------------------------------------------------------------------------ the tolerance boundary


LAYER_TOLERANCE = 386_335     # round(0.005 × 77,266,944): a layer's share of the ascend-0.16 plan
GROUP_TOLERANCE = 4_636_017    # round(0.005 × 927,203,328)
TOTAL_TOLERANCE = 18_544_067   # round(0.005 × 3,708,813,312): the audit's own tolerance_bytes in the report


def test_the_tolerances_are_the_audits():
    assert audit_of(data(BASE), "ascend-0.16")["tolerance_bytes"] == TOTAL_TOLERANCE
    s = strategy(C.compare(C.load_report(BASE), C.load_report(BASE)), "ascend-0.16")
    assert (row(s, "total").tolerance_bytes, row(s, "group 0").tolerance_bytes,
            row(s, "layer 0.linear_attn").tolerance_bytes) == (TOTAL_TOLERANCE, GROUP_TOLERANCE, LAYER_TOLERANCE)
    assert DEFAULT_TOLERANCE == 0.005


@pytest.mark.parametrize("extra, label, kw", [
    (LAYER_TOLERANCE, "layer 5.linear_attn", {}),
    (GROUP_TOLERANCE, "group 1", {"group_only": True}),
    (TOTAL_TOLERANCE, "total", {"total_only": True}),
])
def test_just_within_the_tolerance_is_the_same_and_one_byte_more_a_regression(extra, label, kw):
    base = data(BASE)
    within = C.compare(saved(base), saved(plant(base, "ascend-0.16", LAYER, extra, **kw)))
    assert row(strategy(within, "ascend-0.16"), label).status is C.Status.SAME
    assert within.exit_code == 0
    beyond = C.compare(saved(base), saved(plant(base, "ascend-0.16", LAYER, extra + 1, **kw)))
    assert row(strategy(beyond, "ascend-0.16"), label).status is C.Status.REGRESSION
    assert beyond.exit_code == 1
    # and the same boundary the other way: an improvement only beyond the tolerance
    assert row(strategy(C.compare(saved(plant(base, "ascend-0.16", LAYER, extra, **kw)), saved(base)), "ascend-0.16"),
               label).status is C.Status.SAME
    assert row(strategy(C.compare(saved(plant(base, "ascend-0.16", LAYER, extra + 1, **kw)), saved(base)),
                        "ascend-0.16"), label).status is C.Status.IMPROVED


def test_the_tolerance_is_of_the_new_expected_bytes():
    base = data(BASE)
    new = copy.deepcopy(base)
    r = next(x for x in audit_of(new, "ascend-0.16")["layers"] if x["layer"] == LAYER)
    r["expected_bytes"] *= 2            # a plan twice as large for this layer: 0.5 % of it is 772,669 B
    r["allocated_bytes"] = r["expected_bytes"] + 500_000  # beyond 0.5 % of the old plan (386,335 B), within the new
    x = row(strategy(C.compare(saved(base), saved(new)), "ascend-0.16"), "layer 5.linear_attn")
    assert (x.tolerance_bytes, x.delta_excess_bytes, x.status) == (772_669, 500_000, C.Status.SAME)
    r["allocated_bytes"] = r["expected_bytes"] + 772_670
    assert row(strategy(C.compare(saved(base), saved(new)), "ascend-0.16"), "layer 5.linear_attn").status \
        is C.Status.REGRESSION


def test_the_tolerance_argument_moves_the_boundary():
    base = data(BASE)
    new = saved(plant(base, "ascend-0.16", LAYER, 1 * MiB))  # 1,048,576 B on a 77,266,944 B layer share
    share = 1 * MiB / 77_266_944
    assert row(strategy(C.compare(saved(base), new, share * 1.001), "ascend-0.16"), "layer 5.linear_attn").status \
        is C.Status.SAME
    assert row(strategy(C.compare(saved(base), new, share * 0.999), "ascend-0.16"), "layer 5.linear_attn").status \
        is C.Status.REGRESSION
    for bad in (-0.1, 1.0, 2.0):
        with pytest.raises(UsageError, match="tolerance"):
            C.compare(saved(base), new, bad)


# ------------------------------------------------------------------------------------------ real pairs


def test_real_pair_without_and_with_kv_transfer():
    c = C.compare(C.load_report(BASE), C.load_report(KV_TRANSFER))
    assert c.notes == ("kv_transfer false → true",)
    assert c.exit_code == 1
    assert [s.strategy for _, s in c.regressions] == ["ascend-0.11", "ascend-0.12"]
    # ascend-0.11: every layer's own buffer gets 2 MiB of padding; a group of 12 layers 24 MiB, where the audit's
    # allowance is 6 MiB (a quarter of each tensor's 2 MiB unit per layer) and 0.5 % is 4.42 MiB
    s = strategy(c, "ascend-0.11")
    assert [(row(s, f"group {g}").delta_allocated_bytes, row(s, f"group {g}").tolerance_bytes) for g in range(4)] == \
        [(24 * MiB, 6 * MiB + GROUP_TOLERANCE)] * 3 + [(48 * MiB, 6 * MiB + GROUP_TOLERANCE)]
    assert {row(s, f"group {g}").status for g in range(4)} == {C.Status.REGRESSION}
    # ascend-0.12: each attention layer's K and V buffers and each linear buffer get 2 MiB of padding: 6 MiB
    # per planned tensor where the audit allows one 2 MiB unit
    s = strategy(c, "ascend-0.12")
    assert row(s, "total").delta_allocated_bytes == 72 * MiB and row(s, "total").status is C.Status.REGRESSION
    assert row(s, "total").tolerance_bytes == 24 * MiB + 18_544_067  # the new audit's allowance + 0.5 %
    assert row(s, "group 3").delta_allocated_bytes == 48 * MiB and row(s, "group 3").status is C.Status.REGRESSION
    assert row(s, "group 0").delta_allocated_bytes == 8 * MiB and row(s, "group 0").status is C.Status.SAME
    assert row(s, "layer 3.self_attn.attn").delta_allocated_bytes == 4 * MiB
    assert row(s, "layer 3.self_attn.attn").status is C.Status.REGRESSION
    assert row(s, "layer 0.linear_attn").status is C.Status.SAME
    # ascend-0.16 gains exactly the audit's alignment allowance (one 2 MiB unit per planned tensor): not a regression
    fixed = strategy(c, "ascend-0.16")
    assert fixed.status is C.Status.SAME and statuses(fixed) == {}
    assert row(fixed, "total").delta_allocated_bytes == 24 * MiB
    assert row(fixed, "group 0").delta_allocated_bytes == 6 * MiB
    assert row(fixed, "layer 0.linear_attn").delta_allocated_bytes == 512 * 1024
    # upstream vLLM has no P/D branch: nothing moves
    assert all(x.delta_allocated_bytes == 0 for x in strategy(c, "vllm").rows())
    assert C.summary_line(c) == (
        "kvaudit compare: REGRESSION in 2 of 4 strategies (ascend-0.11 group 3: 4.00× → 4.05×, +48.00 MiB over plan, "
        "ascend-0.12 group 3: 4.00× → 4.05×, +48.00 MiB over plan); kv_transfer false → true")
    # and back: the padding that goes away is an improvement, the allowance that goes away is not
    back = C.compare(C.load_report(KV_TRANSFER), C.load_report(BASE))
    assert back.exit_code == 0
    assert {s.strategy: s.status for _, s in back.strategies} == {
        "vllm": C.Status.SAME, "ascend-0.11": C.Status.IMPROVED, "ascend-0.12": C.Status.IMPROVED,
        "ascend-0.16": C.Status.SAME}


def test_real_pair_vllm_0_23_against_0_33():
    c = C.compare(C.load_report(VLLM_023), C.load_report(BASE))
    assert c.notes == ("vLLM 0.23.0 → 0.33.0",) and c.exit_code == 0
    s = strategy(c, "vllm")
    # 0.33 plans one backing allocation; the accounting splits its bytes among the layers' views
    assert [row(s, f"group {g}").delta_allocated_bytes for g in range(4)] == [-12_288, -12_288, -12_288, 36_864]
    assert row(s, "total").delta_allocated_bytes == 0
    assert s.status is C.Status.SAME
    assert s.notes == ("plan format shared_by → layers", "storages 12 → 1")
    for name in ("ascend-0.11", "ascend-0.12", "ascend-0.16"):
        assert all(x.delta_allocated_bytes == 0 and x.delta_expected_bytes == 0 for x in strategy(c, name).rows())
    # with no tolerance at all, those few KiB are the regression, in the groups where they are
    strict = C.compare(C.load_report(VLLM_023), C.load_report(BASE), 0.0)
    assert strict.exit_code == 1 and [x.strategy for _, x in strict.regressions] == ["vllm"]
    assert statuses(strategy(strict, "vllm"))["group 3"] is C.Status.REGRESSION
    assert "vllm group 3: 1.00× → 1.00×, +36.00 KiB over plan" in C.summary_line(strict)


# ------------------------------------------------------------------------------------------ added and removed


def test_strategies_only_in_one_report_are_listed_not_regressions():
    c = C.compare(C.load_report(BASE), C.load_report(SUBSET))
    assert c.exit_code == 0
    got = {s.strategy: s.status for _, s in c.strategies}
    assert got == {"vllm": C.Status.SAME, "ascend-0.11": C.Status.REMOVED, "ascend-0.12": C.Status.REMOVED,
                   "ascend-0.16": C.Status.SAME}
    gone = strategy(c, "ascend-0.11")
    assert gone.notes == ("not in the new report",) and gone.total.new is None
    assert gone.total.old.allocated == 14_835_253_248 and all(x.status is C.Status.REMOVED for x in gone.rows())
    assert C.summary_line(c) == ("kvaudit compare: no regression in 2 strategies (tolerance 0.50%); only in the old "
                                 "report: ascend-0.11, ascend-0.12")
    back = C.compare(C.load_report(SUBSET), C.load_report(BASE))
    assert {s.strategy: s.status for _, s in back.strategies}["ascend-0.12"] is C.Status.ADDED
    assert "only in the new report: ascend-0.11, ascend-0.12" in C.summary_line(back) and back.exit_code == 0


def test_a_strategy_not_audited_in_one_report_says_why():
    base = data(BASE)
    new = copy.deepcopy(base)
    new["audits"] = [a for a in new["audits"] if a["strategy"] != "ascend-0.12"]
    new["skipped"] = [{"strategy": "ascend-0.12", "reason": "the plan interleaves its layers"}]
    c = C.compare(saved(base), saved(new))
    s = strategy(c, "ascend-0.12")
    assert s.status is C.Status.REMOVED and c.exit_code == 0
    assert s.notes == ("not audited in the new report: the plan interleaves its layers",)
    both = C.compare(saved(new), saved(new))
    assert strategy(both, "ascend-0.12").status is C.Status.NOT_AUDITED and both.exit_code == 0
    back = strategy(C.compare(saved(new), saved(base)), "ascend-0.12")  # audited again: added, with why it was not
    assert back.status is C.Status.ADDED and back.notes == (
        "not audited in the old report: the plan interleaves its layers",)
    assert back.total.old is None and back.total.new.allocated == audit_of(base, "ascend-0.12")["allocated_bytes"]
    assert all(x.status is C.Status.ADDED and x.old is None for x in back.rows())


def test_groups_and_layers_only_in_one_report_are_listed_not_regressions():
    base = data(BASE)
    new = copy.deepcopy(base)
    a = audit_of(new, "ascend-0.16")
    gone = next(r for r in a["layers"] if r["layer"] == LAYER)
    a["layers"] = [r for r in a["layers"] if r["layer"] != LAYER]
    for row_ in (a, next(g for g in a["groups"] if g["group"] == gone["group"])):  # (a report without the layer)
        row_["expected_bytes"] -= gone["expected_bytes"]
        row_["allocated_bytes"] -= gone["allocated_bytes"]
    a["groups"].append({"group": 4, "spec": "MambaSpec", "layers": 0, "expected_bytes": 1, "allocated_bytes": 99})
    s = strategy(C.compare(saved(base), saved(new)), "ascend-0.16")
    assert statuses(s) == {"layer 5.linear_attn": C.Status.REMOVED, "group 4": C.Status.ADDED}
    assert s.status is C.Status.SAME


# ------------------------------------------------------------------------------------------ multi-stage reports


def test_multi_stage_reports_are_matched_by_pipeline_rank():
    pp2 = data(PP2)
    c = C.compare(saved(pp2), saved(plant(pp2, "ascend-0.12", "model.layers.27.self_attn.attn", 64 * MiB, stage=1)))
    assert [st.pp_rank for st in c.stages] == [0, 1]
    assert [st.status for st in c.stages] == [C.Status.SAME, C.Status.REGRESSION]
    assert [(rank, s.strategy) for rank, s in c.regressions] == [(1, "ascend-0.12")]
    s = strategy(c, "ascend-0.12", rank=1)
    assert statuses(s) == {"group 3": C.Status.REGRESSION, "layer 27.self_attn.attn": C.Status.REGRESSION}
    assert row(s, "layer 27.self_attn.attn").delta_allocated_bytes == 64 * MiB
    assert C.summary_line(c).startswith("kvaudit compare: REGRESSION in 1 of 4 strategies (stage 1 ascend-0.12 group 3:")
    assert json.loads(C.to_json(c))["regressions"] == [
        {"pp_rank": 1, "strategy": "ascend-0.12", "where": ["group 3", "layer 27.self_attn.attn"]}]


def test_stages_are_matched_by_rank_not_by_position():
    pp2 = data(PP2)
    stage1 = pp2["stages"][1]  # what --pp 2 --pp-rank 1 writes: one report, for rank 1
    assert stage1["deployment"]["pipeline_parallel_rank"] == 1
    c = C.compare(saved(stage1), saved(pp2))
    assert [(st.pp_rank, st.status) for st in c.stages] == [(0, C.Status.ADDED), (1, C.Status.SAME)]
    assert all(x.status is C.Status.SAME and x.delta_allocated_bytes == 0 for x in strategy(c, "ascend-0.12", 1).rows())
    shuffled = {**pp2, "stages": pp2["stages"][::-1]}
    c = C.compare(saved(shuffled), saved(pp2))
    assert {x.status for _, s in c.strategies for x in s.rows()} == {C.Status.SAME} and c.notes == ()


def test_a_single_stage_report_against_a_pipeline_one():
    c = C.compare(C.load_report(BASE), C.load_report(PP2))
    assert [(st.pp_rank, st.status) for st in c.stages] == [(0, C.Status.SAME), (1, C.Status.ADDED)]
    assert "pipeline_parallel_size 1 → 2" in c.notes
    assert "kv_budget_bytes 3.45 GiB → 21.90 GiB" in c.notes
    # stage 0's plan is 6.3× larger and ascend-0.12 still gives it 2.00×: the excess is judged at the new plan's
    # scale, so more bytes for a larger plan at the same ratio are not a regression
    s = strategy(c, "ascend-0.12")
    assert row(s, "total").delta_allocated_bytes > 10 * (1 << 30) and s.status is C.Status.SAME
    assert row(s, "total").delta_ratio == pytest.approx(0, abs=1e-4)
    assert c.exit_code == 0
    line = C.summary_line(c)
    assert "only in the new report: stage 1" in line and "only in the old report: stage 0 vllm, stage 0 ascend-0.11" in line
    added = [s for rank, s in c.strategies if rank == 1]
    assert [s.strategy for s in added] == ["ascend-0.12", "ascend-0.16"]  # the new report's stage 1 strategies
    assert all(s.status is C.Status.ADDED and s.total.old is None and s.total.new.allocated > 0 for s in added)
    back = C.compare(C.load_report(PP2), C.load_report(BASE))
    assert [(st.pp_rank, st.status) for st in back.stages][1] == (1, C.Status.REMOVED)
    assert all(s.total.new is None and s.total.old.allocated > 0 for rank, s in back.strategies if rank == 1)


# ------------------------------------------------------------------------------------------ bad input


def _write(tmp_path, name: str, content: bytes | str):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def _report_with(edit) -> str:
    d = data(BASE)
    edit(d)
    return json.dumps(d)


BAD = {
    "empty": ("", "empty file"),
    "not-json": ("{not json", "not JSON"),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not JSON"),
    "a-list": ("[1, 2]", "the JSON is a list"),
    "no-schema-version": ('{"audits": []}', "no schema_version"),
    "schema-version-string": ('{"schema_version": "1", "audits": []}', "is not an integer"),
    "schema-version-newer": ('{"schema_version": 2, "audits": []}', "newer than this kvaudit"),
    "schema-version-zero": ('{"schema_version": 0, "audits": []}', "not one kvaudit writes"),
    "no-audits": ('{"schema_version": 1, "model": "x"}', "no audits and no stages"),
    "plan-output": ('{"schema_version": 1, "stages": [{"deployment": {}, "plans": []}]}', "kvaudit plan"),
    "triage-output": ('{"schema_version": 1, "verdict": "allocation-matches-plan", "evidence": []}', "kvaudit triage"),
    "empty-stages": ('{"schema_version": 1, "stages": []}', "stages is not a non-empty list"),
    "audit-no-allocated": (_report_with(lambda d: d["audits"][1].pop("allocated_bytes")),
                           "audits[1] (ascend-0.11) has no allocated_bytes"),
    "group-no-expected": (_report_with(lambda d: d["audits"][0]["groups"][2].pop("expected_bytes")),
                          "group 2 has no expected_bytes"),
    "layer-bytes-a-string": (_report_with(lambda d: d["audits"][0]["layers"][0].update(allocated_bytes="1 GiB")),
                             "layer model.layers.0.linear_attn has no allocated_bytes"),
    "layer-no-name": (_report_with(lambda d: d["audits"][0]["layers"][0].pop("layer")), "layers[0] has no layer"),
    "no-groups": (_report_with(lambda d: d["audits"][0].pop("groups")), "has no groups list"),
    "verdict": (_report_with(lambda d: d["audits"][0].update(verdict="OK")), "neither PASS nor FAIL"),
    "strategy-twice": (_report_with(lambda d: d["audits"].append(d["audits"][0])), "the strategy appears twice"),
    "stage-twice": (json.dumps({"schema_version": 1, "stages": [data(BASE), data(BASE)]}),
                    "two stages with the same pipeline_parallel_rank"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_a_usage_error_naming_the_file(tmp_path, case):
    content, why = BAD[case]
    path = _write(tmp_path, f"{case}.json", content)
    with pytest.raises(UsageError) as e:
        C.load_report(path)
    assert str(path) in e.value.message and why in e.value.message
    assert "\n" not in e.value.message and e.value.exit_code == 2


def test_a_missing_file_or_a_directory_is_a_usage_error_naming_it(tmp_path):
    for path, why in ((tmp_path / "nowhere.json", "no such file"), (tmp_path, "a directory")):
        with pytest.raises(UsageError) as e:
            C.load_report(path)
        assert e.value.message.startswith(f"{path}: {why}") and e.value.exit_code == 2


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path, monkeypatch):
    import kvaudit.jsonfile

    path = _write(tmp_path, "big.json", BASE.read_text())
    monkeypatch.setattr(kvaudit.jsonfile, "MAX_BYTES", path.stat().st_size - 1)
    with pytest.raises(UsageError) as e:
        C.load_report(path)
    assert e.value.message.startswith(f"{path}: larger than {path.stat().st_size - 1:,} B, not a kvaudit report")
    monkeypatch.setattr(kvaudit.jsonfile, "MAX_BYTES", path.stat().st_size)
    assert C.load_report(path)


# ------------------------------------------------------------------------------------------ output


def _text(renderables, width: int = 200) -> str:
    from rich.console import Console

    con = Console(width=width, record=True, file=open("/dev/null", "w"))
    for r in renderables:
        con.print(r)
    return con.export_text()


def test_render_returns_tables_and_prints_nothing(capsys):
    c = C.compare(C.load_report(BASE), C.load_report(KV_TRANSFER))
    groups = C.render(c)
    assert capsys.readouterr() == ("", "")
    text = _text(groups)
    assert "kv_transfer false → true" in text
    line = next(x for x in text.splitlines() if "ascend-0.12" in x and "all: FAIL" in x)
    for cell in ("3.45 GiB", "6.91 → 6.98 GiB", "+72.00 MiB", "2.00 → 2.02×", "+0.02", "regression"):
        assert cell in line, cell
    assert any("3 FullAttentionSpec" in x and "+48.00 MiB" in x and "regression" in x for x in text.splitlines())
    assert "0.linear_attn" not in text
    assert text.rstrip().endswith(C.summary_line(c))
    summary = _text(C.render(c, "summary"))
    assert "FullAttentionSpec" not in summary and "all: FAIL" in summary
    layers = _text(C.render(c, "layers"))
    assert any("3, 7, 11, …, 47 (12) self_attn.attn" in x and "+4.00 MiB" in x and "regression" in x
               for x in layers.splitlines())
    rows = [x for x in layers[layers.index("Per layer"):].splitlines() if "│" in x and "(" in x]
    assert len(rows) == 6  # three strategies' changed layers, 48 each, in two runs of equal figures
    assert sum(int(re.search(r"\((\d+)\) ", x).group(1)) for x in rows) == sum(
        1 for s in C.to_dict(c)["stages"][0]["strategies"] for r in s["layers"] if r["delta"]["allocated_bytes"])
    assert "48 layer rows with the same figures in both reports are not shown" in layers  # vllm's, unchanged
    with pytest.raises(UsageError):
        C.render(c, "tensors")


def test_render_shows_added_and_removed_strategies_and_stages():
    text = _text(C.render(C.compare(C.load_report(BASE), C.load_report(PP2))))
    assert "Stage 1 per strategy and KV-cache group (old → new) · stage only in the new report" in text
    assert any("ascend-0.11" in x and "removed" in x for x in text.splitlines())
    assert any(x.count("added") and "ascend-0.16" in x for x in text.splitlines())


def test_what_differs_besides_the_allocations_is_named():
    base = data(BASE)
    new = copy.deepcopy(base)
    new.update(vllm_version="0.34.0", meter="cuda", meter_device="cuda: NVIDIA H200 #0, 150,112,731,136 B total, "
                                                                   "allocator counters")
    new["deployment"].update(device="h200-141g", device_memory_bytes=150_112_731_136, kv_transfer=True,
                             config_path="/elsewhere/config.json")
    c = C.compare(saved(base), saved(new))
    assert c.notes == ("vLLM 0.33.0 → 0.34.0", "meter meta → cuda",
                       "measured on meta: accounting of the storages requested (no memory allocated, no device "
                       "measured) → cuda: NVIDIA H200 #0, 150,112,731,136 B total, allocator counters",
                       "device atlas-a2-64g → h200-141g", "device_memory_bytes 60.96 GiB → 139.80 GiB",
                       "kv_transfer false → true")  # the config's path is where it was read, not a difference
    assert C.summary_line(c) == ("kvaudit compare: no regression in 4 strategies (tolerance 0.50%); vLLM 0.33.0 → "
                                 "0.34.0; meter meta → cuda; " + c.notes[2] + "; 3 more differences between the reports")
    text = _text(C.render(C.compare(C.load_report(VLLM_023), C.load_report(BASE))))
    assert "• every strategy: plan format shared_by → layers\n• vllm: storages 12 → 1" in text


def test_json_has_a_schema_version_and_follows_its_schema():
    for old, new, tol in ((BASE, KV_TRANSFER, DEFAULT_TOLERANCE), (VLLM_023, BASE, 0.0), (BASE, PP2, DEFAULT_TOLERANCE),
                          (BASE, SUBSET, DEFAULT_TOLERANCE)):
        c = C.compare(C.load_report(old), C.load_report(new), tol)
        doc = json.loads(C.to_json(c))
        VALIDATOR.validate(doc)
        assert doc["schema_version"] == C.SCHEMA_VERSION == 1
        assert doc["exit_code"] == c.exit_code and doc["summary"] == C.summary_line(c)
        assert (doc["old"], doc["new"], doc["tolerance"]) == (str(old), str(new), tol)
    doc = json.loads(C.to_json(C.compare(C.load_report(BASE), C.load_report(KV_TRANSFER))))
    s = next(x for x in doc["stages"][0]["strategies"] if x["strategy"] == "ascend-0.12")
    assert (s["status"], s["old"]["verdict"], s["new"]["verdict"]) == ("regression", "FAIL", "FAIL")
    assert s["delta"] == {"expected_bytes": 0, "allocated_bytes": 72 * MiB, "over_plan_bytes": 72 * MiB,
                          "ratio": pytest.approx(72 * MiB / 3_708_813_312, abs=1e-6)}
    g3 = s["groups"][3]
    assert (g3["group"], g3["spec"], g3["status"], g3["delta"]["allocated_bytes"]) == (3, "FullAttentionSpec",
                                                                                        "regression", 48 * MiB)
    layer = next(x for x in s["layers"] if x["layer"] == "model.layers.3.self_attn.attn")
    assert (layer["group"], layer["status"], layer["delta"]["over_plan_bytes"]) == (3, "regression", 4 * MiB)
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate({**doc, "exit_code": 3})


def test_it_imports_neither_torch_nor_vllm():
    code = (f"import sys, json; from kvaudit.report import compare as C; "
            f"c = C.compare(C.load_report({str(BASE)!r}), C.load_report({str(KV_TRANSFER)!r})); "
            "C.to_json(c); C.summary_line(c); C.render(c, 'layers'); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_the_module_says_what_it_is_in_one_line():
    doc = ast.get_docstring(ast.parse((ROOT / "kvaudit" / "report" / "compare.py").read_text()))
    assert doc and "\n" not in doc.strip()


# ------------------------------------------------------------------------------------------ figures never believed


def test_an_alignment_allowance_beyond_one_unit_per_tensor_is_refused():
    """An allowance of 10^15 B once hid an 8x regression."""
    new = copy.deepcopy(data(BASE))
    audit_of(new, "ascend-0.16")["alignment_allowance_bytes"] = 10 ** 15
    with pytest.raises(UsageError, match="alignment_allowance_bytes 1,000,000,000,000,000 is more than 2.00 MiB"):
        saved(new)


@pytest.mark.parametrize("key, value, match", [
    ("expected_bytes", 2 ** 60, "beyond any device"), ("tolerance_bytes", 10 ** 15, "tolerance_bytes"),
    ("tolerance_bytes", -1, "tolerance_bytes")])
def test_figures_out_of_range_are_refused(key, value, match):
    new = copy.deepcopy(data(BASE))
    audit_of(new, "ascend-0.16")[key] = value
    with pytest.raises(UsageError, match=match):
        saved(new)


def test_totals_and_verdict_are_recomputed_from_the_rows():
    """A report whose total and verdict say nothing changed while its layers allocate 8x is a regression."""
    base = data(BASE)
    new = copy.deepcopy(base)
    a = audit_of(new, "ascend-0.16")
    for r in a["layers"]:
        r["allocated_bytes"] = 8 * r["expected_bytes"]
    c = C.compare(saved(base), saved(new))
    s = strategy(c, "ascend-0.16")
    assert a["verdict"] == "PASS" and s.new_verdict == "FAIL" and s.status is C.Status.REGRESSION
    assert row(s, "total").new.allocated == 8 * a["expected_bytes"] and c.exit_code == 1
    a2 = copy.deepcopy(a)  # a total claiming a larger plan than its rows hides nothing either
    a2["expected_bytes"] *= 8
    assert C._recomputed(a2)["expected_bytes"] == a["expected_bytes"]


def test_a_report_with_no_audits_is_refused():
    new = copy.deepcopy(data(BASE))
    new["skipped"] = [{"strategy": x["strategy"], "reason": "edited"} for x in new["audits"]]
    new["audits"] = []
    with pytest.raises(UsageError, match="no strategy was audited"):
        saved(new)


def test_html_and_svg_pages_of_a_comparison(tmp_path, capsys):
    from kvaudit.cli import main

    html, svg = tmp_path / "c.html", tmp_path / "c.svg"
    assert main(["compare", str(BASE), str(KV_TRANSFER), "--html", str(html), "--svg", str(svg)]) == 1
    err = capsys.readouterr().err
    assert f"wrote {html}" in err and f"wrote {svg}" in err and err.splitlines()[-1].startswith("kvaudit compare: ")
    page = html.read_text()
    assert "<title>kvaudit compare: " in page and "REGRESSION in 2 of 4 strategies" in page and "regression" in page
    assert "self_attn.attn" in page and svg.read_text().startswith("<svg ")


def test_a_terminal_is_told_how_to_get_a_page_and_a_pipe_is_not():
    import os
    import pty

    leader, follower = pty.openpty()
    argv = [sys.executable, "-m", "kvaudit", "compare", str(BASE), str(BASE)]
    env = dict(os.environ, COLUMNS="100")
    p = subprocess.run(argv, stdout=follower, stderr=follower, env=env, timeout=120)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # (the terminal's other end is closed: all was read)
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert p.returncode == 0 and b"the same report as a page: --html report.html" in seen, seen[-400:]
    piped = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert piped.returncode == 0 and "as a page" not in piped.stdout + piped.stderr
