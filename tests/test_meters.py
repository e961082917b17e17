"""Meters: a contract test over every meter available here, the device meter through faithful
fakes of ``torch.npu`` and ``torch.cuda``, probes, and ``--meter auto``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from kvaudit.errors import MeterUnavailable, UsageError
from kvaudit.measure import meters
from kvaudit.measure.audit import run_audit
from kvaudit.measure.meters import CpuMeter, DeviceMeter, MetaMeter, make_meter, select_meter
from kvaudit.results import Verdict
from kvaudit.strategies.builtin import STRATEGIES
from conftest import deployment, plan_for
from fakes import FakeAllocatorBackend, install_fake_torch_npu

AVAILABLE = [n for n in meters.METER_NAMES if make_meter(n).probe() is None]


@pytest.mark.parametrize("name", AVAILABLE)
def test_meter_contract(name):
    """Every available meter measures a known allocation, releases, and names itself."""
    m = make_meter(name)
    assert m.name == name and m.describe().startswith(name)
    m.start()
    keep = [torch.zeros(3 << 20, dtype=torch.int8, device=m.device()),
            torch.zeros(1 << 20, dtype=torch.int8, device=m.device())]
    view = keep[0][5:]  # a view allocates nothing
    r = m.stop()
    assert r.allocated == (4 << 20) and r.peak >= r.allocated
    del keep, view
    m.release()


def test_meta_and_cpu_are_always_available():
    assert {"meta", "cpu"} <= set(AVAILABLE)


def test_cpu_meter_sees_peak_of_freed_temporaries():
    m = CpuMeter()
    m.start()
    tmp = torch.zeros(8 << 20, dtype=torch.int8)
    keep = torch.zeros(1 << 20, dtype=torch.int8)
    del tmp
    r = m.stop()
    assert r.allocated == 1 << 20 and r.peak == 9 << 20
    del keep


def test_npu_probe_explains_without_importing_torch_npu():
    reason = make_meter("npu").probe()
    assert reason is not None and "torch_npu" in reason
    assert "torch_npu" not in sys.modules


def test_npu_probe_when_torch_npu_is_broken(monkeypatch, tmp_path):
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text("raise ImportError('libhccl.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = make_meter("npu").probe()
    assert "failed to import" in reason and "libhccl.so" in reason


def test_cuda_probe_on_a_machine_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert make_meter("cuda").probe() == "torch.cuda.is_available() is False"


def test_meters_command_does_not_import_vllm():
    code = "import sys; from kvaudit.cli import main; main(['meters']); print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"
    assert "│ meta  │ available " in out and "│ cpu   │ available " in out


def test_auto_takes_npu_then_cuda_then_meta(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert select_meter("auto").name == "meta"
    install_fake_torch_npu(monkeypatch, FakeAllocatorBackend())
    assert select_meter("auto").name == "npu"


def test_unavailable_meter_by_name_is_exit_3():
    with pytest.raises(MeterUnavailable, match="torch_npu") as e:
        select_meter("npu")
    assert e.value.exit_code == 3


def test_unknown_meter_is_exit_2():
    with pytest.raises(UsageError) as e:
        select_meter("tpu")
    assert e.value.exit_code == 2


def test_device_index_beyond_the_devices(monkeypatch):
    install_fake_torch_npu(monkeypatch, FakeAllocatorBackend(count=1))
    assert "no npu device 3" in make_meter("npu", index=3).probe()


@pytest.mark.parametrize("device_type, held_before, tmp_block", [
    ("npu", 1536, (10 << 20) + 512),  # torch_npu pads every request by 32 B before rounding to 512 B
    ("cuda", 1024, 10 << 20),
])
def test_device_meter_reads_allocator_counters(monkeypatch, device_type, held_before, tmp_block):
    """reset, baseline, allocated/reserved/peak deltas and requested bytes through each allocator's fake."""
    fake = FakeAllocatorBackend(flavor=device_type)
    m = DeviceMeter(device_type, "cpu", lambda: fake)  # host memory stands in for the device's
    with fake.recording():
        base = torch.zeros(1000, dtype=torch.int8)  # held before the run: not counted
        m.start()
        keep = torch.zeros(3 * (1 << 20) + 1, dtype=torch.int8)
        tmp = torch.zeros(10 << 20, dtype=torch.int8)
        del tmp
        r = m.stop()
    assert r.requested == 3 * (1 << 20) + 1  # what the code asked for
    assert r.allocated == 3 * (1 << 20) + 512  # the block: rounded up to 512 B
    assert r.peak == r.allocated + tmp_block
    # one 20 MiB large-pool segment (kLargeBuffer, for 1-10 MiB requests) served both, split; it stays
    # reserved (beside the 2 MiB small segment held before) until empty_cache
    assert r.reserved == 20 << 20 and r.before.reserved == 2 << 20
    assert fake.calls[:2] == ["synchronize", "reset_peak_memory_stats"]
    assert r.before.allocated == held_before
    del keep, base
    after = m.release()
    assert "empty_cache" in fake.calls and fake.memory_reserved() == 0 and after.allocated == 0


def test_npu_meter_audits_through_the_fake_torch_npu(monkeypatch):
    d = deployment(num_blocks_override=64, max_model_len=1024)
    plans = {name: plan_for(d, STRATEGIES[name].platform) for name in ("ascend-0.11", "ascend-0.16")}
    fake = FakeAllocatorBackend()
    install_fake_torch_npu(monkeypatch, fake)  # after vLLM is imported: transformers probes torch_npu
    assert make_meter("npu").probe() is None
    assert "Ascend910B4 (fake)" in make_meter("npu").describe()
    m = DeviceMeter("npu", "cpu", meters._load_npu)  # the real loader; host memory stands in for the NPU's
    results = {}
    with fake.recording():
        for name, plan in plans.items():
            results[name] = run_audit(d, plan, STRATEGIES[name], m)
    assert results["ascend-0.16"].verdict is Verdict.PASS
    assert results["ascend-0.11"].ratio == pytest.approx(4.0, rel=0.005)
    assert results["ascend-0.16"].reading.requested == results["ascend-0.16"].expected_bytes
    assert fake.memory_allocated() == 0  # every strategy's memory was released


def test_host_meter_refuses_a_plan_that_does_not_fit(monkeypatch):
    monkeypatch.setattr(meters, "host_available_bytes", lambda: 1 << 30)
    d = deployment()
    s = STRATEGIES["ascend-0.11"]
    with pytest.raises(MeterUnavailable, match="--num-blocks"):
        run_audit(d, plan_for(d, s.platform), s, CpuMeter())


def test_meta_meter_counts_storages_not_views():
    m = MetaMeter()
    m.start()
    a = torch.zeros(4, 1024, dtype=torch.bfloat16, device="meta")
    views = [a[1:], a.view(torch.int8), a.t()]
    b = torch.zeros(8192, dtype=torch.int8, device="meta")
    r = m.stop()
    assert r.allocated == 2 * 8192
    del a, b, views


def test_cpu_measures_what_the_dispatcher_never_sees():
    """The cpu meter measures the host allocator, not storages created through torch's dispatcher: a
    ``torch.UntypedStorage(n)`` made in the window shows on ``cpu`` and not on ``meta`` (whose
    accounting is the storage recorder); a cpu meter replaced by that accounting fails here."""
    import torch

    from kvaudit.measure.meters import CpuMeter, MetaMeter

    n = 8 << 20
    readings = {}
    for meter in (CpuMeter(), MetaMeter()):
        meter.start()
        kept = torch.UntypedStorage(n)
        readings[meter.name] = meter.stop()
        del kept
    assert readings["cpu"].allocated >= n and readings["cpu"].peak >= n
    assert readings["meta"].allocated == 0


def test_meter_table_lists_every_meter_with_its_reason(monkeypatch):
    install_fake_torch_npu(monkeypatch, FakeAllocatorBackend())
    rows = {name: (ok, text) for name, ok, text in meters.meter_table()}
    assert list(rows) == ["npu", "cuda", "cpu", "meta"]
    assert rows["npu"] == (True, "npu: Ascend910B4 (fake) #0, 68,719,476,736 B total, allocator counters")
    assert rows["cuda"][0] is torch.cuda.is_available()
    assert rows["meta"][0] is True and rows["cpu"][0] is True


def test_device_meter_release_collects_a_cycle_that_still_holds_device_memory():
    """A strategy's tensor held in a reference cycle is freed by ``release`` (it collects while the device holds more
    than before the audit), so the leak check does not see it."""
    import gc

    fake = FakeAllocatorBackend(flavor="cuda")
    m = DeviceMeter("cuda", "cpu", lambda: fake)
    gc.disable()  # only release's collection may free the cycle
    try:
        with fake.recording():
            m.start()
            held = [torch.zeros(1 << 20, dtype=torch.int8)]
            held.append(held)
            assert m.stop().allocated == 1 << 20
            del held
            after = m.release()
    finally:
        gc.enable()
    assert after.allocated == 0 and fake.memory_allocated() == 0
