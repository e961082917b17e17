"""Rendering: the golden table at a fixed width, the JSON contract and its schema, the summary line."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from kvaudit.cli import main
from kvaudit.cli.options import Detail, Format
from kvaudit.measure.audit import audit_all
from kvaudit.measure.meters import MetaMeter
from kvaudit.report import render as report
from kvaudit.results import Report
from kvaudit.strategies.builtin import STRATEGIES
from conftest import GOLDEN, ROOT, deployment, each_vllm

pytestmark = pytest.mark.fast

SCHEMA = json.loads((ROOT / "kvaudit" / "report.schema.json").read_text())


@pytest.fixture(scope="module")
def rep():
    d = deployment()
    return Report(d, tuple(audit_all(d, list(STRATEGIES.values()), MetaMeter())), "meta", "meta: accounting",
                  "0.33.0")


def _golden(name: str, text: str, update: bool) -> None:
    path = GOLDEN / name
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing {path}: run pytest --update-golden"
    want = path.read_text()
    first = next((i for i, (a, b) in enumerate(zip(text.splitlines(), want.splitlines())) if a != b),
                 min(len(text.splitlines()), len(want.splitlines())))
    same = text == want  # compared apart from the assert: pytest's diff of two long tables takes a minute
    assert same, (f"{name} differs from the golden file from line {first + 1}: "
                  f"{(text.splitlines()[first:first + 1] or ['<end>'])[0]!r} instead of "
                  f"{(want.splitlines()[first:first + 1] or ['<end>'])[0]!r}; if intended, run pytest --update-golden")


def test_golden_json_of_the_seed_case(capsys, update_golden):
    """Every field of ``--format json`` for the seed case (per strategy, group, tensor and layer: expected and
    allocated bytes, ratios, budgets, verdicts), the repository's own path written as ``ROOT``."""
    assert main(["qwen3-next", "--util", "0.7", "--meter", "meta", "--format", "json"]) == 1
    out = capsys.readouterr().out.replace(str(ROOT), "ROOT")
    _golden("qwen3-next-util0.7-meta.json", out, update_golden)


@each_vllm
def test_golden_table_at_width_120(monkeypatch, capsys, update_golden):
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["qwen3-next", "--util", "0.7", "--meter", "meta"]) == 1
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    _golden("qwen3-next-util0.7-meta.table.txt", out, update_golden)


@each_vllm
def test_golden_summary_of_the_dense_control(monkeypatch, capsys, update_golden):
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["llama-3.1-8b", "--util", "0.9", "--meter", "meta", "--detail", "summary"]) == 0
    _golden("llama-3.1-8b-util0.9-meta.summary.txt", capsys.readouterr().out, update_golden)


def test_json_round_trip_and_schema(rep):
    d = rep.deployment
    text = report.to_json(rep)
    doc = json.loads(text)
    jsonschema.validate(doc, SCHEMA)
    assert doc["schema_version"] == 1 and doc["meter"] == "meta" and doc["exit_code"] == 1
    assert doc["deployment"]["kv_budget_bytes"] == d.kv_budget_bytes
    by = {a["strategy"]: a for a in doc["audits"]}
    assert by["ascend-0.11"]["ratio"] == pytest.approx(4.0, rel=0.005) and by["ascend-0.11"]["verdict"] == "FAIL"
    assert by["vllm"]["verdict"] == "PASS" and len(by["vllm"]["layers"]) == 48
    assert all(len(t["shared_by"]) == 4 for t in doc["plan"]["tensors"])
    assert json.loads(json.dumps(doc)) == doc


def test_schema_rejects_a_report_without_its_contract(rep):
    doc = report.to_dict(rep)
    del doc["audits"][0]["verdict"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


@pytest.mark.parametrize("detail", list(Detail))
def test_every_detail_renders(rep, detail):
    from rich.console import Console

    console = Console(width=120, record=True, file=open("/dev/null", "w"))
    for r in report.render_tables(rep, detail.value):
        console.print(r)
    text = console.export_text()
    assert "meter" in text and "meta (accounting" in text
    assert ("Per layer: layers with the same figures on one row" in text) is (detail is Detail.layers)  # per-layer rows
    assert ("planned to be shared by" in text) is (detail is not Detail.summary)  # per-tensor rows


def test_every_format_has_a_renderer(monkeypatch, capsys):
    for fmt in Format:
        assert main(["qwen3-next", "--util", "0.7", "--meter", "meta", "--strategy", "vllm",
                     "--format", fmt.value, "--detail", "summary"]) == 0
        out = capsys.readouterr().out
        assert out.strip()
        if fmt is Format.json:
            json.loads(out)


def test_summary_line_names_meter_and_vllm(rep):
    line = report.summary_line(rep)
    assert "\n" not in line and line.startswith("kvaudit: FAIL: 2 of 4")
    assert "ascend-0.11 4.00×" in line and "meter meta (accounting only" in line and "vLLM 0.33.0" in line
    passing = report.summary_line(Report(rep.deployment, tuple(r for r in rep.audits if r.verdict.value == "PASS"),
                                         "cpu", "cpu", "0.33.0"))
    assert passing.startswith("kvaudit: PASS") and "meter cpu" in passing


def test_meta_pass_never_reads_as_a_device_pass(rep):
    one = Report(rep.deployment, rep.audits[:1], "meta", "meta", "x")
    assert re.search(r"meta.*not a device measurement", report.summary_line(one))
    assert "no device measured" in report.meter_label("meta")


def test_stages_json_holds_each_stage_report_and_the_worst_exit_code(rep):
    passing = Report(rep.deployment, tuple(r for r in rep.audits if r.verdict.value == "PASS"), "meta",
                     "meta: accounting", "0.33.0")
    text = report.stages_to_json([passing, rep])
    doc = json.loads(text)
    assert text.startswith('{\n  "schema_version": 1,')
    assert doc["schema_version"] == 1 and doc["kvaudit_version"] == report.__version__
    assert [s["exit_code"] for s in doc["stages"]] == [0, 1] and doc["exit_code"] == 1
    for stage in doc["stages"]:
        jsonschema.validate(stage, SCHEMA)


@each_vllm
def test_plan_json_names_the_planning_vllm():
    from kvaudit.measure.utilization import plan_stage

    stage = plan_stage(deployment(), [STRATEGIES["ascend-0.16"]])
    text = report.plan_to_json([stage], "9.9.9")
    doc = json.loads(text)
    assert text.startswith('{\n  "schema_version": 1,')
    assert doc["vllm_version"] == "9.9.9" and doc["kvaudit_version"] == report.__version__
    (st,) = doc["stages"]
    assert [p["platform"] for p in st["plans"]] == ["ascend-contiguous"] and st["not_planned"] == {}
    assert st["highest_safe_utilization"] == {"ascend-0.16": 1.0}


def test_every_meter_is_labelled_for_what_it_measured():
    assert {m: report.meter_label(m) for m in ("meta", "cpu", "cuda", "npu", "other")} == {
        "meta": "meta (accounting of the storages requested; no memory allocated, no device measured)",
        "cpu": "cpu (real host allocations counted by torch.profiler; not a device measurement)",
        "cuda": "cuda (torch.cuda caching-allocator counters)",
        "npu": "npu (torch_npu caching-allocator counters)",
        "other": "other"}


def test_summary_line_of_a_device_run_and_of_skipped_strategies(rep):
    device = Report(rep.deployment, rep.audits, "npu", "npu: Ascend910B4 #0", "0.33.0",
                    skipped=(("vllm", "needs vLLM"),))
    line = report.summary_line(device)
    assert line == ("kvaudit: FAIL: 2 of 4 strategies do not allocate what vLLM planned (ascend-0.11 4.00×, "
                    "ascend-0.12 2.00×); meter npu; planned by vLLM 0.33.0; 1 not audited (vllm: the report says why)")


def test_what_a_plan_or_a_tolerance_cannot_do_is_said_whole():
    import dataclasses

    from kvaudit.errors import NotAuditable, UsageError
    from kvaudit.results import check_tolerance
    from conftest import deployment, plan_for

    with pytest.raises(UsageError) as e:
        check_tolerance(1.0)
    assert str(e.value) == "--tolerance must be in [0, 1), got 1.0"
    saved = dataclasses.replace(plan_for(deployment(), "cuda"), vllm_config=None)  # as a plan file reads
    with pytest.raises(NotAuditable) as e:
        saved.require_live("strategy 'installed'")
    assert str(e.value) == ("strategy 'installed' needs the vLLM objects of a live plan (its VllmConfig and the built "
                            "model's layers), which a saved plan does not carry; audit it where vLLM plans (without "
                            "--plan)")


def test_collapsed_layer_rows_carry_the_figures_of_the_json(rep):
    """The per-layer table has one row per run of layers with the same figures (``layer_runs``): every layer of the
    JSON in exactly one row, that row's figures its own, and the rows' counts × bytes the JSON's totals."""
    from rich.console import Console

    from kvaudit.units import fmt_bytes

    doc = report.to_dict(rep)
    for r, a in zip(rep.audits, doc["audits"]):
        runs = report.layer_runs(r.layers)
        assert sorted(x.layer for run in runs for x in run) == sorted(row["layer"] for row in a["layers"])
        by_name = {row["layer"]: row for row in a["layers"]}
        for run in runs:
            assert {(by_name[x.layer]["expected_bytes"], by_name[x.layer]["allocated_bytes"], by_name[x.layer]["group"],
                     by_name[x.layer]["spec"]) for x in run} == {(run[0].expected, run[0].allocated, run[0].group,
                                                                  run[0].spec)}
        assert sum(len(run) * run[0].allocated for run in runs) == sum(row["allocated_bytes"] for row in a["layers"])
        console = Console(width=200, record=True, file=None, color_system=None)
        with console.capture() as cap:
            for renderable in report.render_tables(Report(rep.deployment, (r,), rep.meter, rep.meter_device,
                                                          rep.vllm_version), "layers"):
                console.print(renderable)
        lines = cap.get().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("Per layer:"))
        end = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
        rows = [line for line in lines[start:end] if line.startswith("│")]
        assert len(rows) == len(runs) < len(r.layers), (r.strategy, rows)
        for line, run in zip(rows, runs):
            cells = [c.strip() for c in line.strip("│").split("│")]
            assert cells[1:5] == [str(run[0].group), run[0].spec, fmt_bytes(run[0].expected),
                                  fmt_bytes(run[0].allocated)], (line, run[0])
            assert cells[0] == (report.short_layer(run[0].layer) if len(run) == 1 else report.layers_text(
                [x.layer for x in run])), line
