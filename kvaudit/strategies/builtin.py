"""KV-cache allocation strategies: upstream vLLM's and each vllm-ascend release's, restated faithfully.

A strategy takes a ``KVPlan`` and a torch device and returns what the model runner's
``_allocate_kv_cache_tensors`` returns: layer name -> raw int8 tensor, or ``(k, v)`` for an
attention layer that got separate K and V buffers. The algorithms restate vllm-ascend's
``NPUModelRunner`` allocation in ``vllm_ascend/worker/model_runner_v1.py`` before PR #3760 (one
buffer per layer), after it (vllm-ascend PR #3760, 0.12.0rc1) and after PR #6887 (0.16.0rc1: one
buffer per shared tensor), and upstream vLLM's ``allocate_kv_cache`` (``vllm/v1/worker/utils.py``);
the parity tests run each release's own code against them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvaudit.results import KVPlan
from kvaudit.strategies.strategy import ALIGNMENT, RawTensors, Strategy  # noqa: F401  (plugins import Strategy from here)

if TYPE_CHECKING:
    import torch


def _zeros(n: int, device: Any) -> "torch.Tensor":
    import torch

    return torch.zeros(n, dtype=torch.int8, device=device)


def _ascend_buffer(n: int, device: Any, kv_transfer: bool) -> "torch.Tensor":
    """vllm-ascend's buffer: plain ``zeros(n)``; with KV transfer ``zeros(n + 2 MiB)`` cut at a
    2 MiB-aligned address to ``n`` bytes (``_align_memory``), which keeps ``n + 2 MiB`` alive."""
    if not kv_transfer:
        return _zeros(n, device)
    raw = _zeros(n + ALIGNMENT, device)
    ptr = raw.data_ptr()
    offset = (ptr + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT - ptr
    return raw[offset:][:n]


def _is_linear(name: str) -> bool:
    return "linear_attn" in name


def _is_softmax_attn(name: str) -> bool:
    return "attn" in name and "linear_attn" not in name


def _share_kv_pair(raw: RawTensors, t: Any, device: Any, kv_transfer: bool) -> None:
    """PR #3760 on: one K and one V half-size buffer, shared by every softmax-attention layer of ``t``."""
    kv = (_ascend_buffer(t.size // 2, device, kv_transfer), _ascend_buffer(t.size // 2, device, kv_transfer))
    for inner in t.shared_by:
        if _is_softmax_attn(inner):
            raw[inner] = kv


def allocate_per_planned_tensor(plan: KVPlan, device: Any, kv_transfer: bool = False) -> RawTensors:
    """Upstream vLLM 0.11-0.28 ``_allocate_kv_cache_tensors``: one ``zeros(size)`` per planned
    tensor, mapped to every layer in its ``shared_by``."""
    raw: RawTensors = {}
    for t in plan.tensors:
        buf = _zeros(t.size, device)
        for name in t.shared_by:
            raw[name] = buf
    return raw


def allocate_vllm(plan: KVPlan, device: Any, kv_transfer: bool = False) -> RawTensors:
    """Upstream vLLM: the installed vLLM's own ``allocate_kv_cache`` for 0.29+ plans (one backing
    allocation); the per-tensor loop of 0.11-0.28 for ``shared_by`` plans. No KV-transfer padding."""
    if plan.plan_format == "layers":
        from kvaudit.plan.planner import load_vllm

        config, layout = _vllm_objects(plan)
        return load_vllm().worker_utils.allocate_kv_cache(config, device, layout)
    return allocate_per_planned_tensor(plan, device)


def _vllm_objects(plan: KVPlan) -> tuple[Any, Any]:
    """vLLM's ``KVCacheConfig`` and layout for ``allocate_kv_cache``: live, or rebuilt from a saved plan
    (which imports vLLM)."""
    from kvaudit.plan.planfile import vllm_objects

    return vllm_objects(plan, "the vllm strategy (vLLM's allocate_kv_cache)")


def _prepare_vllm(plan: KVPlan) -> None:
    if plan.plan_format == "layers":
        _vllm_objects(plan)


def allocate_ascend_0_11(plan: KVPlan, device: Any, kv_transfer: bool = False) -> RawTensors:
    """vllm-ascend up to v0.11.0 (before PR #3760): every layer of a shared tensor gets its own
    buffer; attention gets K and V halves, each linear-attention layer a full-size buffer."""
    plan.require_regions("vllm-ascend's allocator (0.11)")
    raw: RawTensors = {}
    for t in plan.tensors:
        for name in t.shared_by:
            if _is_linear(name):
                for inner in t.shared_by:
                    if _is_softmax_attn(inner) or inner in raw:
                        continue
                    raw[inner] = _ascend_buffer(t.size, device, kv_transfer)
            elif "attn" in name:  # no "already allocated" guard in this release
                raw[name] = (_ascend_buffer(t.size // 2, device, kv_transfer),
                             _ascend_buffer(t.size // 2, device, kv_transfer))
    return raw


def allocate_ascend_0_12(plan: KVPlan, device: Any, kv_transfer: bool = False) -> RawTensors:
    """vllm-ascend v0.12.0rc1 .. v0.15 (PR #3760): the linear-attention layers of a tensor share one
    buffer, the attention layers share one K/V pair, but the two do not alias each other."""
    plan.require_regions("vllm-ascend's allocator (0.12)")
    raw: RawTensors = {}
    for t in plan.tensors:
        for name in t.shared_by:
            if _is_linear(name) and name not in raw:
                buf = _ascend_buffer(t.size, device, kv_transfer)
                for inner in t.shared_by:
                    if _is_linear(inner):
                        raw[inner] = buf
            elif "attn" in name and name not in raw:
                _share_kv_pair(raw, t, device, kv_transfer)
    return raw


def allocate_ascend_0_16(plan: KVPlan, device: Any, kv_transfer: bool = False) -> RawTensors:
    """vllm-ascend v0.16.0rc1 on (PR #6887): one buffer per tensor that holds a mamba layer, or
    once any tensor mixed attention and mamba, shared by every layer of the tensor; K/V halves
    only for attention-only tensors seen before any hybrid one."""
    plan.require_regions("vllm-ascend's allocator (0.16)")
    raw: RawTensors = {}
    hybrid_with_attn_and_mamba = False
    for t in plan.tensors:
        kinds = [plan.layer_specs[name] for name in t.shared_by]
        use_mamba = any("Mamba" in k for k in kinds)
        use_attn = any("Mamba" not in k for k in kinds)  # every other vLLM spec is an AttentionSpec
        hybrid_with_attn_and_mamba |= use_mamba and use_attn
        for name in t.shared_by:
            if name in raw:
                continue
            if _is_linear(name) or hybrid_with_attn_and_mamba:
                buf = _ascend_buffer(t.size, device, kv_transfer)
                for inner in t.shared_by:
                    raw[inner] = buf
            elif "attn" in name and not use_mamba:
                _share_kv_pair(raw, t, device, kv_transfer)
    return raw


STRATEGIES: dict[str, Strategy] = {
    "vllm": Strategy("vllm", "the installed vLLM's allocate_kv_cache", "cuda", "vLLM (upstream)",
                     allocate_vllm, prepare=_prepare_vllm),
    "ascend-0.11": Strategy("ascend-0.11", "before PR #3760", "ascend-align128",
                            "vllm-ascend ≤ 0.11.0", allocate_ascend_0_11),
    "ascend-0.12": Strategy("ascend-0.12", "PR #3760", "ascend-align128",
                            "vllm-ascend 0.12–0.15", allocate_ascend_0_12),
    "ascend-0.16": Strategy("ascend-0.16", "PR #6887 contiguous layout", "ascend-contiguous",
                            "vllm-ascend ≥ 0.16", allocate_ascend_0_16),
}
