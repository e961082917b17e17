"""scripts/device-check: what it can prove without a device runs here (a saved plan audited on meta as
the live audit, the results written), and its out-of-memory check runs against the fake allocator."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from fakes import FakeAllocatorBackend
from kvaudit.cli import main
from kvaudit.measure import meters
from kvaudit.measure.meters import DeviceMeter

GiB = 1 << 30


def _load_device_check():
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "scripts/device_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """What ``scripts/device-check prepare`` saves, for a scaled Qwen3-Next plan (no pytest site here)."""
    d = tmp_path_factory.mktemp("device-check")
    args = ["--preset", "qwen3-next", "--util", "0.7", "--num-blocks", "64", "--max-model-len", "1024"]
    assert main(["plan", *args, "--save", str(d / "qwen3-next.plan.json"), "--format", "json"]) == 0
    audited = _in_process(["audit", *args, "--format", "json"], d)
    assert audited.returncode == 1, audited.stderr
    (d / "qwen3-next.meta.json").write_text(audited.stdout)
    return d


def test_without_a_device_it_checks_what_it_can_and_writes_its_results(prepared, tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "scripts/device_check.py"), "--plans", str(prepared),
                        "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    res = json.loads((tmp_path / "results.json").read_text())
    assert p.returncode == 0, p.stderr
    assert res["checks"]["torch_compat"]["status"] == "pass"
    assert res["checks"]["device_tests"]["status"] == "skipped"
    assert {res["checks"][c]["status"] for c in ("smoke", "oom_on_purpose", "bench")} == {"skipped"}
    assert "| torch_compat | pass |" in (tmp_path / "results.md").read_text()


def test_a_changed_audit_fails_the_torch_check(prepared, tmp_path, monkeypatch):
    doc = json.loads((prepared / "qwen3-next.meta.json").read_text())
    doc["audits"][1]["allocated_bytes"] += 1
    (tmp_path / "qwen3-next.plan.json").write_bytes((prepared / "qwen3-next.plan.json").read_bytes())
    (tmp_path / "qwen3-next.meta.json").write_text(json.dumps(doc))
    dc = _load_device_check()
    monkeypatch.setattr(dc, "_kvaudit", _in_process)  # (the script's own run in a process is the test above)
    assert dc.check_torch_compat(prepared)["status"] == "pass"
    assert dc.check_torch_compat(tmp_path)["status"] == "fail"


def _in_process(args, plans):
    """``device_check._kvaudit`` run in this process: the same audit, its stdout, stderr and exit code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return subprocess.CompletedProcess(["kvaudit", *args], code, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("flavor", ["cuda", "npu"])
def test_the_out_of_memory_check_on_the_fake_allocator(prepared, flavor, monkeypatch):
    dc = _load_device_check()
    fake = FakeAllocatorBackend(total=4 * GiB, flavor=flavor)
    monkeypatch.setattr(meters, "make_meter", lambda name, index=0: DeviceMeter(name, "cpu", lambda: fake))
    with fake.recording():
        res = dc.check_oom_on_purpose(prepared, flavor)
    assert res["status"] == "pass" and res["oom"]["allocation"] > 1
    assert res["allocated_after"] == res["allocated_before"] and fake.fraction is None
    assert res["others"]["ascend-0.12"]["ratio"] == pytest.approx(2.0, rel=0.005)


def test_the_terms_check_reads_vllms_own_profile_and_sets_each_term_beside_it():
    """``compare_terms`` (the device check's ``terms``, run where vLLM and a CUDA device are): vLLM's own lines, read by
    kvaudit's log reader, against the deployment's terms. Here on a public start that prints vLLM's breakdown
    (fixtures/startup-logs/cuda/kolyangg-qwen3-30b-a3b-h100.log: Qwen3-30B-A3B on an H100, vLLM 0.10.2)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import startup

    dc = _load_device_check()
    key = "cuda/kolyangg-qwen3-30b-a3b-h100"
    entry = startup.cases()[key]
    d = startup.deployment(entry["inputs"], entry["case"])
    rows = {r["term"]: r for r in dc.compare_terms((ROOT / "fixtures/startup-logs" / f"{key}.log").read_text(), d)}
    assert [round(rows[t]["logged"] / GiB, 2) for t in ("peak_activation", "non_torch", "cuda_graphs", "kv_budget")] == [
        5.58, 0.07, 0.69, 8.68]
    assert round(rows["weights"]["logged"] / GiB, 4) == 56.9342
    assert rows["peak_activation"]["modelled"] == next(t.bytes for t in d.overhead_terms if t.key == "peak_activation")
    assert rows["kv_budget"]["ratio"] == round(d.kv_budget_bytes / rows["kv_budget"]["logged"], 3)
    assert dc.check_terms(None)["status"] == "skipped" and "CUDA host" in dc.check_terms(None)["reason"]
    assert dc.check_live(None)["status"] == "skipped" and "CUDA host" in dc.check_live(None)["reason"]
    # where vLLM logs its graph estimate (0.18+), that is the figure the term is set beside, not the pool it captured
    key = "cuda/tokenkaki-qwen3-8b-a100-40g"
    entry = startup.cases()[key]
    d = startup.deployment(entry["inputs"], entry["case"])
    rows = {r["term"]: r for r in dc.compare_terms((ROOT / "fixtures/startup-logs" / f"{key}.log").read_text(), d)}
    assert round(rows["cuda_graphs"]["logged"] / GiB, 2) == 2.35  # ("CUDA graph pool memory: 2.44 GiB (actual)")
