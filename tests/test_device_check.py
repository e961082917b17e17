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
