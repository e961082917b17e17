"""Device meters at work, through the fake torch.npu: rounding apart from waste, a device too full to
measure, a real out-of-memory as a finding with the other strategies still audited, the leak check
(on a real GPU or NPU: tests/test_device.py)."""

from __future__ import annotations

import pytest
import torch

from kvaudit.cli import main
from kvaudit.errors import MeterUnavailable
from kvaudit.measure import meters
from kvaudit.measure.audit import audit_all, dry_run, run_audit
from kvaudit.measure.meters import DeviceMeter
from kvaudit.results import Verdict
from kvaudit.strategies.builtin import STRATEGIES, Strategy, allocate_per_planned_tensor
from conftest import deployment, plan_for
from fakes import FakeAllocatorBackend, install_fake_torch_npu

GiB = 1 << 30
SCALED = dict(num_blocks_override=64, max_model_len=1024)  # ascend-0.11 needs 1.13 GiB, the others < 0.6 GiB


@pytest.fixture
def npu(monkeypatch):
    """A fake 1 GiB NPU behind the real ``npu`` meter (host memory stands in for device memory)."""
    d = deployment(**SCALED)
    for s in STRATEGIES.values():
        plan_for(d, s.platform)  # plan before torch_npu appears: transformers probes for it
    fake = FakeAllocatorBackend(total=1 * GiB)
    install_fake_torch_npu(monkeypatch, fake)
    meter = DeviceMeter("npu", "cpu", meters._load_npu)
    with fake.recording():
        yield d, fake, meter


def test_out_of_memory_is_a_finding_and_the_others_still_run(npu):
    d, fake, meter = npu
    results = {r.strategy: r for r in audit_all(d, list(STRATEGIES.values()), meter)}
    bad = results["ascend-0.11"]
    o = bad.device_oom
    assert bad.verdict is Verdict.FAIL and o is not None
    # the failing allocation is named by the dry run: its tensor, its layers, how much was allocated by then
    dry = dry_run(bad.plan, STRATEGIES["ascend-0.11"], False)
    assert o.allocations == 60 and 1 < o.allocation <= 60
    assert o.layers == dry.layers[o.allocation - 1] and o.tensor == bad.plan.tensor_of(o.layers[0])
    assert o.allocated_before_bytes == sum(dry.sizes[:o.allocation - 1])
    assert o.request_bytes is not None and o.free_bytes is not None and o.needed_more_bytes > 0
    assert o.message.startswith("NPU out of memory. Tried to allocate")
    # the figures of torch_npu's message: the 24 MiB buffer is a 26 MiB segment (32 B pad), 18 MiB were free
    assert (o.allocation, o.request_bytes, o.segment_bytes, o.free_bytes) == (48, 24 << 20, 26 << 20, 18 << 20)
    assert o.needed_more_bytes == 8 << 20 and o.allocated_before_bytes == 912 << 20
    assert bad.reasons[0] == (
        "ran out of memory on the npu meter at allocation 48 of 60: 24.00 MiB (a 26.00 MiB segment for the caching "
        "allocator) for tensor 9 (model.layers.38.linear_attn), with 912.00 MiB already allocated; it needed 8.00 MiB "
        "more than the 18.00 MiB free (the allocator said: NPU out of memory. Tried to allocate 26.00 MiB (NPU 0; "
        "1024.00 MiB total capacity; 912.02 MiB already allocated; 912.02 MiB current active; 18.00 MiB free; "
        "1006.00 MiB reserved in total by PyTorch).If reserved memory is >> allocated memory try setting "
        "max_split_size_mb to avoid fragmentation.)")
    assert bad.leaked_bytes == 0 and bad.layers == ()
    assert bad.to_dict()["device_oom"] == o.to_dict() and o.to_dict()["allocation"] == 48  # in --format json
    # memory released, and the strategies after it were audited as usual
    assert fake.memory_allocated() == 0
    assert results["ascend-0.12"].ratio == pytest.approx(2.0, rel=0.005) and results["ascend-0.12"].device_oom is None
    assert results["ascend-0.16"].verdict is Verdict.PASS and results["vllm"].verdict is Verdict.PASS


def test_requested_bytes_are_judged_and_rounding_reported_apart(npu):
    d, fake, meter = npu
    s = STRATEGIES["ascend-0.16"]
    r = run_audit(d, plan_for(d, s.platform), s, meter)
    assert r.allocated_bytes == r.reading.requested == r.expected_bytes
    assert r.rounding_bytes == r.reading.allocated - r.reading.requested
    assert r.verdict is Verdict.PASS
    assert r.reading.before is not None and r.after_release is not None
    assert r.after_release.allocated == r.reading.before.allocated
    out = r.to_dict()  # --format json carries the allocator's counters before the run and after the release
    assert out["reading"]["before"] == {"allocated": r.reading.before.allocated, "reserved": r.reading.before.reserved}
    assert out["after_release"] == {"allocated": r.after_release.allocated, "reserved": r.after_release.reserved}


def test_a_device_already_too_full_is_exit_3(npu):
    d, fake, meter = npu
    hog = torch.zeros(900 << 20, dtype=torch.int8)  # someone else's 900 MiB on the "device"
    s = STRATEGIES["vllm"]
    with pytest.raises(MeterUnavailable, match="already too full to measure") as e:
        run_audit(d, plan_for(d, s.platform), s, meter)
    assert e.value.exit_code == 3 and "--num-blocks" in str(e.value)
    del hog


def test_a_device_with_room_for_no_block_suggests_one(npu):
    d, fake, meter = npu
    hog = torch.zeros(1023 << 20, dtype=torch.int8)  # 1 MiB left: a hundredth of one block of this plan
    s = STRATEGIES["vllm"]
    plan = plan_for(d, s.platform)
    with pytest.raises(MeterUnavailable) as e:
        run_audit(d, plan, s, meter)
    assert str(e.value).endswith("(free it, or audit a scaled plan with --num-blocks 1)")
    del hog


def test_the_scaled_plan_suggested_fits_the_room_there_is():
    """What a host or a device can hold, against what the audit would allocate: refused only beyond it, and the
    ``--num-blocks`` suggested is 95 % of the blocks that fit (at least one)."""
    from types import SimpleNamespace

    from kvaudit.measure.audit import _check_room
    from kvaudit.units import fmt_bytes

    plan = SimpleNamespace(num_blocks=100, planned_bytes=4000 << 20)
    strategy = SimpleNamespace(name="ascend-0.11")

    def meter(kind, room):
        return SimpleNamespace(kind=kind, name="cpu", free_bytes=lambda: room, describe=lambda: "npu:0")

    dry = SimpleNamespace(total_bytes=2000 << 20)
    _check_room(plan, strategy, meter("host", 2000 << 20), dry)  # exactly the room: measured
    _check_room(plan, strategy, meter("device", 4000 << 20), dry)
    for kind, room, fit in (("host", 1000 << 20, 47), ("host", 1 << 20, 1), ("device", 1000 << 20, 23)):
        with pytest.raises(MeterUnavailable) as e:
            _check_room(plan, strategy, meter(kind, room), dry)
        if kind == "host":
            assert str(e.value) == (
                f"strategy 'ascend-0.11' would allocate {fmt_bytes(2000 << 20)} on the cpu meter, more than the "
                f"{fmt_bytes(room)} this host can spare; audit a scaled plan with --num-blocks {fit} (the plan has "
                "100), or use --meter meta")
        else:
            assert str(e.value) == (
                f"npu:0: only {fmt_bytes(room)} free, less than the {fmt_bytes(4000 << 20)} vLLM plans; the device is "
                f"already too full to measure (free it, or audit a scaled plan with --num-blocks {fit})")


_KEPT: list = []


def _leaky(plan, device, kv_transfer):
    raw = allocate_per_planned_tensor(plan, device)
    _KEPT.append(torch.zeros(4 << 20, dtype=torch.int8, device=device))  # a buffer it never gives back
    return raw


def test_a_strategy_that_keeps_memory_fails_the_leak_check(npu):
    d, fake, meter = npu
    s = Strategy("leaky", "keeps a buffer", "cuda", "test", _leaky)
    try:
        r = run_audit(d, plan_for(d, "cuda"), s, meter)
    finally:
        _KEPT.clear()
    assert r.verdict is Verdict.FAIL and r.leaked_bytes >= 4 << 20
    assert any("leaks 4.00 MiB" in x for x in r.reasons)


def test_meta_meter_leak_check_needs_no_device():
    from kvaudit.measure.meters import MetaMeter

    d = deployment()
    s = Strategy("leaky", "keeps a buffer", "cuda", "test", _leaky)
    try:
        r = run_audit(d, plan_for(d, "cuda"), s, MetaMeter())
    finally:
        _KEPT.clear()
    assert r.leaked_bytes == 4 << 20 and r.verdict is Verdict.FAIL
    assert r.reasons[-1] == "leaks 4.00 MiB (4,194,304 B): still allocated after its tensors were released"


def test_out_of_memory_through_the_cli(npu, capsys, monkeypatch):
    d, fake, meter = npu
    monkeypatch.setattr(meters, "make_meter", lambda name, index=0: DeviceMeter("npu", "cpu", meters._load_npu))
    code = main(["qwen3-next", "--util", "0.7", "--num-blocks", "64", "--max-model-len", "1024", "--meter", "npu",
                 "--detail", "groups"])
    out, err = capsys.readouterr()
    assert code == 1
    # torch_npu pads each 24 MiB buffer by 32 B, so each reserves a 26 MiB segment: out at 48 of 60
    assert "measured on npu: Ascend910B4 (fake) #0" in out and "OOM at 48/60" in out
    assert "(a 26.00 MiB segment" in out
    assert "no per-layer rows: the strategy ran out of memory" in out
    assert "ascend-0.11 out of memory" in err.splitlines()[-1]
    assert fake.memory_allocated() == 0


@pytest.mark.parametrize("flavor", ["cuda", "npu"])
def test_the_device_checks_pass_on_each_fake_allocator(flavor, monkeypatch):
    """tests/test_device.py's checks, run here against the fake of each allocator (a scaled plan): they
    pass where the allocator behaves as its real one, so on a device a failure is the device's."""
    import test_device

    d = deployment(**SCALED)
    plans = {s.platform: plan_for(d, s.platform) for s in STRATEGIES.values()}
    fake = FakeAllocatorBackend(total=4 * GiB, flavor=flavor)
    monkeypatch.setattr(test_device, "qwen3_next_plans", lambda: (d, plans))
    monkeypatch.setattr(test_device, "make_meter", lambda name, index=0: DeviceMeter(name, "cpu", lambda: fake))
    with fake.recording():
        test_device.test_full_scale_bytes_equal_the_meta_accounting(flavor)
        test_device.test_a_budget_that_makes_the_4x_strategy_run_out_on_purpose(flavor)
        assert fake.fraction is None  # the cap is lifted afterwards
        test_device.test_the_leak_check_on_the_device(flavor)
