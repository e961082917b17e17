"""The verdict, with scripted readings: exact, over, under, within tolerance, the alignment
allowance, a layer with no memory; and the out-of-memory projection."""

from __future__ import annotations

import pytest
import torch

from kvaudit.errors import ConfigError, StrategyFailed
from kvaudit.measure.audit import audit_all, dry_run, run_audit
from kvaudit.measure.meters import MetaMeter
from kvaudit.results import Report, Verdict
from kvaudit.strategies.builtin import ALIGNMENT, STRATEGIES, Strategy, allocate_per_planned_tensor
from conftest import FakeMeter, deployment, plan_for

pytestmark = pytest.mark.fast

UPSTREAM = STRATEGIES["vllm"]


def _run(allocated, tolerance=0.005, **kw):
    d = deployment(**kw)
    plan = plan_for(d, "cuda")
    meter = FakeMeter(allocated(plan.planned_bytes))
    r = run_audit(d, plan, UPSTREAM, meter, tolerance)
    assert meter.calls == ["start", "stop", "release"]
    return r


def test_exact_is_pass():
    r = _run(lambda e: e)
    assert r.verdict is Verdict.PASS and r.reasons == () and r.ratio == 1.0


def test_within_tolerance_is_pass():
    assert _run(lambda e: int(e * 1.004)).verdict is Verdict.PASS
    assert _run(lambda e: int(e * 0.996)).verdict is Verdict.PASS


def test_over_allocation_fails_and_says_by_how_much():
    r = _run(lambda e: int(e * 1.01))
    assert r.verdict is Verdict.FAIL and "1.01×" in r.reasons[0] and "over a tolerance" in r.reasons[0]


def test_under_allocation_fails():
    r = _run(lambda e: int(e * 0.98))
    assert r.verdict is Verdict.FAIL and "less than the planned" in r.reasons[0]


def test_zero_tolerance_is_exact():
    assert _run(lambda e: e + 1, tolerance=0.0).verdict is Verdict.FAIL
    assert _run(lambda e: e, tolerance=0.0).verdict is Verdict.PASS


def test_kv_transfer_allows_one_alignment_unit_per_planned_tensor():
    assert _run(lambda e: e + 12 * ALIGNMENT, tolerance=0.0, kv_transfer=True).verdict is Verdict.PASS
    assert _run(lambda e: e + 12 * ALIGNMENT + 1, tolerance=0.0, kv_transfer=True).verdict is Verdict.FAIL
    assert _run(lambda e: e + 12 * ALIGNMENT, tolerance=0.0).verdict is Verdict.FAIL


def test_a_layer_with_no_memory_fails_even_when_bytes_match():
    d = deployment()
    plan = plan_for(d, "cuda")

    def skip_one(plan, device, kv_transfer):
        raw = allocate_per_planned_tensor(plan, device)
        raw.pop("model.layers.3.self_attn.attn")
        return raw

    s = Strategy("skip", "drops a layer", "cuda", "test", skip_one)
    r = run_audit(d, plan, s, MetaMeter())
    assert r.verdict is Verdict.FAIL and any("got no memory" in x for x in r.reasons)


def test_a_strategy_that_raises_is_could_not_measure():
    def broken(plan, device, kv_transfer):
        raise TypeError("unexpected keyword 'kernel_block_sizes'")

    d = deployment()
    with pytest.raises(StrategyFailed, match="kernel_block_sizes") as e:
        run_audit(d, plan_for(d, "cuda"), Strategy("broken", "", "cuda", "", broken), MetaMeter())
    assert e.value.exit_code == 3


def test_projection_at_0_7_fits_and_at_0_9_the_buggy_release_runs_out():
    # issue #3368: 0.7 used far more than 0.7 of the NPU; 0.9 ran out of memory
    fits = {r.strategy: r for r in audit_all(deployment(), list(STRATEGIES.values()), MetaMeter())}
    assert fits["ascend-0.11"].oom is None and 0.8 < fits["ascend-0.11"].projected_utilization < 0.95
    assert fits["vllm"].projected_utilization == pytest.approx(0.7, abs=0.001)
    over = {r.strategy: r for r in audit_all(deployment(gpu_memory_utilization=0.9), list(STRATEGIES.values()),
                                             MetaMeter())}
    oom = over["ascend-0.11"].oom
    assert oom is not None and over["ascend-0.16"].oom is None and over["vllm"].oom is None
    assert oom.allocated_before_bytes <= oom.free_bytes < oom.allocated_before_bytes + oom.request_bytes
    assert oom.layers and oom.tensor == over["ascend-0.11"].plan.tensor_of(oom.layers[0])
    d9 = deployment(gpu_memory_utilization=0.9)
    assert Report(d9, tuple(over.values()), "meta", "meta", "x").exit_code == 1
    assert Report(d9, (over["vllm"],), "meta", "meta", "x").exit_code == 0


def test_rows_add_up_to_the_totals():
    r = run_audit(deployment(), plan_for(deployment(), "ascend-align128"), STRATEGIES["ascend-0.12"], MetaMeter())
    assert sum(t.allocated for t in r.tensors) == pytest.approx(r.allocated_bytes, abs=len(r.tensors))
    assert sum(g.allocated for g in r.groups) == pytest.approx(r.allocated_bytes, abs=len(r.groups))
    assert sum(g.expected for g in r.groups) == pytest.approx(r.expected_bytes, abs=len(r.layers))
    assert all(t.storages == 3 for t in r.tensors)


def test_meta_audit_uses_no_memory():
    """A meta audit that accounts for over 10 GiB allocates, as the cpu meter measures the host, almost
    nothing (the bookkeeping of a few hundred tensor objects)."""
    from kvaudit.measure.meters import CpuMeter

    d = deployment()
    plan = plan_for(d, "ascend-align128")
    host = CpuMeter()
    host.start()
    r = run_audit(d, plan, STRATEGIES["ascend-0.11"], MetaMeter())
    used = host.stop()
    assert r.allocated_bytes > 10 << 30 and r.meter == "meta"
    assert used.peak < 64 << 20


def test_the_kv_transfer_allowance_excuses_padding_not_missing_bytes():
    """The alignment allowance is for excess (vllm-ascend's 2 MiB padding); an allocation short of the
    plan by more than the tolerance fails with or without KV transfer."""
    assert _run(lambda e: e - 12 * ALIGNMENT, tolerance=0.0, kv_transfer=True).verdict is Verdict.FAIL
    assert _run(lambda e: e - 1, tolerance=0.0, kv_transfer=True).verdict is Verdict.FAIL


def test_with_kv_transfer_the_rows_still_add_up_to_what_was_allocated():
    """The 2 MiB alignment padding each buffer carries is attributed to its layers: layer, group and
    tensor rows sum to the allocated bytes, padding included."""
    d = deployment(kv_transfer=True)
    r = run_audit(d, plan_for(d, "ascend-contiguous"), STRATEGIES["ascend-0.16"], MetaMeter())
    assert r.allocated_bytes == r.expected_bytes + 12 * ALIGNMENT and r.verdict is Verdict.PASS
    assert sum(x.allocated for x in r.layers) == pytest.approx(r.allocated_bytes, abs=len(r.layers))
    assert sum(g.allocated for g in r.groups) == pytest.approx(r.allocated_bytes, abs=len(r.groups))
    assert sum(t.allocated for t in r.tensors) == pytest.approx(r.allocated_bytes, abs=len(r.tensors))


def test_the_json_exit_code_of_a_passing_run_is_0():
    d = deployment()
    passing = run_audit(d, plan_for(d, "cuda"), UPSTREAM, MetaMeter())
    from kvaudit.report import render as json_report

    report = Report(d, (passing,), "meta", "meta", "x")
    assert report.exit_code == 0 and json_report.to_dict(report)["exit_code"] == 0


def test_memory_for_layers_vllm_did_not_plan_fails_and_names_the_first():
    d = deployment()
    plan = plan_for(d, "cuda")

    def extra_layers(plan, device, kv_transfer):
        raw = allocate_per_planned_tensor(plan, device)
        for name in ("zz.extra.b", "zz.extra.a"):
            raw[name] = torch.empty(4096, dtype=torch.int8, device=device)
        return raw

    r = run_audit(d, plan, Strategy("extra", "allocates two layers more", "cuda", "test", extra_layers), MetaMeter())
    assert r.verdict is Verdict.FAIL
    assert "memory for 2 layer(s) vLLM did not plan, first zz.extra.a" in r.reasons


def test_bytes_no_view_covers_are_padding_from_the_storages_first_byte():
    """A storage of 10,000 B whose one view covers bytes 4,096-8,191: the 5,904 B before and after it are padding,
    attributed to the layer that uses the storage."""
    from kvaudit.measure.accounting import attribute

    storage = torch.empty(10_000, dtype=torch.int8)
    a = attribute({"layer.a": storage[4096:8192]})
    (key,) = a.storage_bytes
    assert a.storage_bytes[key] == 10_000 and a.storage_padding[key] == 4096 + (10_000 - 8192)
    assert a.layer_bytes["layer.a"] == 10_000 and a.storage_layers[key] == ("layer.a",)


def test_a_refused_strategy_is_skipped_with_its_reason_and_the_others_audited():
    d = deployment()

    def refuse(s):
        if s.name == "ascend-0.11":
            raise ConfigError("vLLM's planner refuses this strategy's rule")
        return plan_for(d, s.platform)

    skipped: list[tuple[str, str]] = []
    chosen = [STRATEGIES["ascend-0.11"], STRATEGIES["ascend-0.16"]]
    results = audit_all(d, chosen, MetaMeter(), skipped=skipped, plan_for=refuse)
    assert [r.strategy for r in results] == ["ascend-0.16"]
    assert skipped == [("ascend-0.11", "vLLM's planner refuses this strategy's rule")]
    with pytest.raises(ConfigError, match="refuses"):  # every strategy refused: the deployment is the bad input
        audit_all(d, chosen[:1], MetaMeter(), skipped=[], plan_for=refuse)


def test_the_dry_run_allocates_as_the_deployment_transfers_kv():
    d = deployment(num_blocks_override=64, max_model_len=1024)
    s = STRATEGIES["ascend-0.16"]
    plan = plan_for(d, s.platform)
    plain, padded = dry_run(plan, s, False), dry_run(plan, s, True)
    assert len(plain.sizes) == len(padded.sizes) == 12
    assert [b - a for a, b in zip(plain.sizes, padded.sizes)] == [2 << 20] * 12  # one 2 MiB alignment unit each
