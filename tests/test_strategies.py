"""Each strategy against vLLM's plan, on meta (full scale) and cpu (scaled): the ratios of the
reference, the KV-transfer padding, the dense control, and parity with vLLM's own allocation."""

from __future__ import annotations

import pytest
import torch

from kvaudit.measure.audit import run_audit
from kvaudit.measure.meters import CpuMeter, MetaMeter
from kvaudit.results import Verdict
from kvaudit.strategies.builtin import ALIGNMENT, STRATEGIES, allocate_per_planned_tensor
from conftest import deployment, each_vllm, plan_for

pytestmark = [each_vllm, pytest.mark.fast]

RATIOS = {"vllm": 1.0, "ascend-0.11": 4.0, "ascend-0.12": 2.0, "ascend-0.16": 1.0}
# storages per planned tensor (K and V count twice), hence the 2 MiB paddings with --kv-transfer
STORAGES = {"vllm": None, "ascend-0.11": 5, "ascend-0.12": 3, "ascend-0.16": 1}


def _audit(name, meter, **kw):
    d = deployment(**kw)
    s = STRATEGIES[name]
    return run_audit(d, plan_for(d, s.platform), s, meter)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_qwen3_next_ratio_on_meta_full_scale(name):
    r = _audit(name, MetaMeter())
    assert r.ratio == pytest.approx(RATIOS[name], rel=0.005)
    assert r.verdict is (Verdict.PASS if RATIOS[name] == 1.0 else Verdict.FAIL)
    assert r.allocated_bytes == r.attributed_bytes  # nothing allocated that no layer uses


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_qwen3_next_ratio_on_cpu_scaled(name):
    r = _audit(name, CpuMeter(), num_blocks_override=16, max_model_len=1024)
    assert r.plan.num_blocks == 16
    assert r.ratio == pytest.approx(RATIOS[name], rel=0.005)
    assert r.allocated_bytes == r.attributed_bytes
    assert r.reading.peak >= r.allocated_bytes


@pytest.mark.parametrize("name", ["ascend-0.11", "ascend-0.12", "ascend-0.16"])
def test_kv_transfer_adds_exactly_the_alignment_padding(name):
    plain = _audit(name, MetaMeter(), num_blocks_override=16, max_model_len=1024)
    aligned = _audit(name, MetaMeter(), num_blocks_override=16, max_model_len=1024, kv_transfer=True)
    per_tensor = STORAGES[name] * ALIGNMENT  # reference: +10 MiB, +6 MiB, +2 MiB per KVCacheTensor
    assert aligned.allocated_bytes - plain.allocated_bytes == len(aligned.plan.tensors) * per_tensor
    assert aligned.padding_bytes == len(aligned.plan.tensors) * per_tensor
    assert aligned.alignment_allowance_bytes == len(aligned.plan.tensors) * ALIGNMENT


def test_kv_transfer_padding_is_real_on_cpu():
    r = _audit("ascend-0.16", CpuMeter(), num_blocks_override=16, max_model_len=1024, kv_transfer=True)
    assert r.allocated_bytes == r.expected_bytes + 12 * ALIGNMENT
    assert r.verdict is Verdict.PASS  # intentional padding is within the documented allowance


def test_kv_transfer_leaves_upstream_alone():
    r = _audit("vllm", MetaMeter(), kv_transfer=True)
    assert r.allocated_bytes == r.expected_bytes


@pytest.mark.parametrize("meter", [MetaMeter, CpuMeter])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_dense_control_every_strategy_allocates_exactly_the_plan(name, meter):
    kw = dict(num_blocks_override=64, max_model_len=512) if meter is CpuMeter else {}
    d = deployment("llama-3.1-8b", **kw)
    s = STRATEGIES[name]
    r = run_audit(d, plan_for(d, s.platform), s, meter())
    assert r.allocated_bytes == r.expected_bytes
    assert r.verdict is Verdict.PASS


def test_meta_count_for_vllm_equals_vllms_own_allocation():
    """vLLM's own allocation function for the plan: allocate_kv_cache (0.29+), or the model runner's
    _allocate_kv_cache_tensors (up to 0.28), counted here storage by storage."""
    from kvaudit.strategies.resolve import resolve_strategy

    d = deployment()
    plan = plan_for(d, "cuda")
    views = resolve_strategy("installed").allocate(plan, torch.device("meta"), False)
    storages = {}
    for v in views.values():
        st = v.untyped_storage()
        storages[st._cdata] = st.nbytes()
    assert sum(storages.values()) == _audit("vllm", MetaMeter()).allocated_bytes == plan.planned_bytes
    assert sum(v.nbytes for v in views.values()) > plan.planned_bytes  # summing views would double count


def test_restated_upstream_loop_allocates_what_vllm_allocates():
    # vLLM 0.11-0.28's one-buffer-per-KVCacheTensor loop, over the shared_by view of a 0.29+ plan
    plan = plan_for(deployment(), "cuda")
    raw = allocate_per_planned_tensor(plan, torch.device("meta"))
    total = sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in raw.values()}.values())
    assert total == plan.planned_bytes
    assert set(raw) == set(plan.layer_specs)


def test_buggy_release_gives_every_layer_its_own_buffer():
    r = _audit("ascend-0.11", MetaMeter())
    assert r.allocations == 60  # 12 tensors × (K + V + 3 linear-attention buffers)
    assert all(row.shares_with == () for row in r.layers)
    assert all(len(row.planned_shares_with) == 3 for row in r.layers)


def test_pr_3760_shares_linear_layers_but_not_attention():
    r = _audit("ascend-0.12", MetaMeter())
    assert r.allocations == 36
    by_layer = {row.layer: row for row in r.layers}
    assert by_layer["model.layers.0.linear_attn"].shares_with == ("model.layers.1.linear_attn",
                                                                   "model.layers.2.linear_attn")
    assert by_layer["model.layers.3.self_attn.attn"].shares_with == ()
    groups = {g.spec: g for g in r.groups}
    assert groups["FullAttentionSpec"].allocated == pytest.approx(4 * groups["FullAttentionSpec"].expected, rel=1e-3)


def test_pr_6887_and_upstream_share_as_planned():
    for name in ("vllm", "ascend-0.16"):
        r = _audit(name, MetaMeter())
        assert all(set(row.shares_with) == set(row.planned_shares_with) for row in r.layers)


def _synthetic(tensors):
    """A plan of (size, {layer: spec type}) tensors, as vLLM's KVCacheTensor(size, shared_by) lists them."""
    from kvaudit.results import GroupPlan, KVPlan, TensorPlan

    specs = {name: kind for _, layers in tensors for name, kind in layers.items()}
    return KVPlan(vllm_version="synthetic", platform="ascend-contiguous", block_size=16, num_blocks=4,
                  kv_budget_bytes=0, plan_format="shared_by", planned_bytes=sum(size for size, _ in tensors),
                  groups=tuple(GroupPlan(i, kind, 16, 64, (name,)) for i, (name, kind) in enumerate(specs.items())),
                  tensors=tuple(TensorPlan(size, tuple(layers)) for size, layers in tensors), layer_specs=specs)


HYBRID = (4096, {"model.layers.0.linear_attn": "MambaSpec", "model.layers.3.self_attn.attn": "FullAttentionSpec"})
MTP = (2048, {"mtp.layers.0.self_attn.attn": "FullAttentionSpec"})
SLIDING_HYBRID = (4096, {"model.layers.0.mixer": "MambaSpec", "model.layers.1.self_attn.attn": "SlidingWindowSpec"})


def test_pr_6887_keeps_one_format_once_a_tensor_mixed_attention_and_mamba():
    """vllm-ascend 0.16's ``hybrid_with_attn_and_mamba`` stays set for the rest of the loop: an
    attention-only tensor after a hybrid one (the MTP layer, its comment says) gets one shared buffer,
    not K/V halves; before any hybrid tensor it gets K/V halves."""
    allocate = STRATEGIES["ascend-0.16"].allocate
    after = allocate(_synthetic([HYBRID, MTP]), torch.device("meta"), False)
    assert isinstance(after["mtp.layers.0.self_attn.attn"], torch.Tensor)
    assert after["mtp.layers.0.self_attn.attn"].numel() == 2048
    assert after["model.layers.0.linear_attn"] is after["model.layers.3.self_attn.attn"]
    before = allocate(_synthetic([MTP, HYBRID]), torch.device("meta"), False)
    k, v = before["mtp.layers.0.self_attn.attn"]
    assert k.numel() == v.numel() == 1024


def test_pr_6887_counts_every_attention_spec_as_attention():
    """The release asks ``isinstance(spec, AttentionSpec)``: a sliding-window layer is attention too, so
    a tensor it shares with a Mamba layer is hybrid, and the attention-only tensor after it is one buffer."""
    raw = STRATEGIES["ascend-0.16"].allocate(_synthetic([SLIDING_HYBRID, MTP]), torch.device("meta"), False)
    assert isinstance(raw["mtp.layers.0.self_attn.attn"], torch.Tensor)
    assert raw["model.layers.0.mixer"] is raw["model.layers.1.self_attn.attn"]
