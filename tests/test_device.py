"""On a real GPU or NPU (tests marked ``cuda`` / ``npu``; skipped elsewhere): full-scale audits through the
real meter with no fake, a budget that makes the 4x strategy run out of memory on purpose, the leak check.

These need only torch and kvaudit: the plans come from vLLM where it is installed, else from the plan
file ``scripts/device-check prepare`` saved (``$KVAUDIT_DEVICE_PLANS``, default ``build/device-check``),
so they run on a device host without vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import ROOT, VLLM_VERSION
from kvaudit.errors import NotAuditable
from kvaudit.measure.audit import audit_all, run_audit
from kvaudit.measure.meters import MetaMeter, make_meter
from kvaudit.results import Verdict
from kvaudit.strategies.builtin import STRATEGIES, Strategy, allocate_per_planned_tensor

DEVICES = [pytest.param("cuda", marks=pytest.mark.cuda), pytest.param("npu", marks=pytest.mark.npu)]


def qwen3_next_plans():
    """Qwen3-Next TP 4 at 0.7 on a 64 GB Atlas A2 (3.45 GiB planned): the deployment and its plans."""
    if VLLM_VERSION is not None:
        from conftest import deployment, plan_for

        d = deployment()
        return d, {s.platform: plan_for(d, s.platform) for s in STRATEGIES.values()}
    from kvaudit.plan import planfile

    path = Path(os.environ.get("KVAUDIT_DEVICE_PLANS", ROOT / "build/device-check")) / "qwen3-next.plan.json"
    if not path.is_file():
        pytest.skip(f"vLLM is not installed and {path} does not exist (run scripts/device-check prepare)")
    stage = planfile.load(path).stages[0]
    return stage.deployment, stage.plans


def _runnable(plans) -> list[Strategy]:
    """The built-in strategies that can run here (vllm on a 0.29+ plan needs vLLM's own code)."""
    out = []
    for s in STRATEGIES.values():
        try:
            if s.prepare:
                s.prepare(plans[s.platform])
            out.append(s)
        except NotAuditable:
            pass
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_full_scale_bytes_equal_the_meta_accounting(device):
    """Every strategy at full scale: the bytes requested on the device equal the meta accounting exactly,
    the allocator's rounding stays under 2 MiB + 512 B per allocation, nothing leaks."""
    d, plans = qwen3_next_plans()
    meter = make_meter(device)
    for s in _runnable(plans):
        on_meta = run_audit(d, plans[s.platform], s, MetaMeter())
        on_device = run_audit(d, plans[s.platform], s, meter)
        assert on_device.allocated_bytes == on_meta.allocated_bytes, s.name
        assert 0 <= on_device.rounding_bytes < ((2 << 20) + 512) * on_device.allocations
        assert on_device.leaked_bytes == 0 and on_device.device_oom is None
        assert on_device.after_release.allocated == on_device.reading.before.allocated


@pytest.mark.parametrize("device", DEVICES)
def test_a_budget_that_makes_the_4x_strategy_run_out_on_purpose(device):
    """The caching allocator is capped (``set_per_process_memory_fraction``) at what is held now plus three
    times the plan: 1x and 2x fit, 4x runs out; the others are still audited, memory comes back."""
    d, plans = qwen3_next_plans()
    meter = make_meter(device)
    backend = meter.backend()
    backend.empty_cache()
    planned = plans["ascend-align128"].planned_bytes
    total = backend.mem_get_info(0)[1]
    backend.set_per_process_memory_fraction(min(1.0, (backend.memory_reserved(0) + 3 * planned) / total), 0)
    try:
        start = backend.memory_allocated(0)
        results = {r.strategy: r for r in audit_all(d, _runnable(plans), meter, plan_for=lambda s: plans[s.platform])}
    finally:
        backend.set_per_process_memory_fraction(1.0, 0)
    bad = results["ascend-0.11"]
    assert bad.device_oom is not None and bad.verdict is Verdict.FAIL and bad.layers == ()
    assert 1 < bad.device_oom.allocation <= bad.device_oom.allocations
    assert results["ascend-0.12"].device_oom is None and round(results["ascend-0.12"].ratio, 2) == 2.0
    assert results["ascend-0.16"].verdict is Verdict.PASS
    assert all(r.leaked_bytes == 0 for r in results.values())
    assert backend.memory_allocated(0) == start


_KEPT: list = []


def _leaky(plan, device, kv_transfer):
    raw = allocate_per_planned_tensor(plan, device)
    import torch

    _KEPT.append(torch.zeros(4 << 20, dtype=torch.int8, device=device))  # a buffer it never gives back
    return raw


@pytest.mark.parametrize("device", DEVICES)
def test_the_leak_check_on_the_device(device):
    d, plans = qwen3_next_plans()
    s = Strategy("leaky", "keeps a buffer", "ascend-contiguous", "test", _leaky)
    try:
        r = run_audit(d, plans["ascend-contiguous"], s, make_meter(device))
    finally:
        _KEPT.clear()
    assert r.verdict is Verdict.FAIL and r.leaked_bytes >= 4 << 20
    assert any(x.startswith("leaks") for x in r.reasons)
