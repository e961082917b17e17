"""A tiny KV-cache allocator package, written against vLLM's ``KVCacheConfig`` as a hardware plugin's
model runner is: each function returns layer name -> int8 tensor, as ``_allocate_kv_cache_tensors`` does."""

from __future__ import annotations

import torch


def _zeros(n: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int8, device=device)


def allocate_padded(kv_cache_config, device, pad_bytes: int = 0) -> dict[str, torch.Tensor]:
    """As ``allocate``, with ``pad_bytes`` more on the first buffer (a workspace tail; negative trims it)."""
    kv: dict[str, torch.Tensor] = {}
    backing = None
    for i, t in enumerate(kv_cache_config.kv_cache_tensors):
        if hasattr(t, "shared_by"):  # vLLM <= 0.28: KVCacheTensor(size, shared_by), one buffer per tensor
            buf, names = _zeros(t.size + (pad_bytes if i == 0 else 0), device), t.shared_by
        else:  # vLLM 0.29+: every KVCacheTensor places its layers in one backing allocation of t.size bytes
            if backing is None:
                backing = _zeros(t.size + pad_bytes, device)
            buf, names = backing, t.layers
        for name in names:
            kv[name] = buf
    return kv


def allocate(kv_cache_config, device) -> dict[str, torch.Tensor]:
    """One buffer per planned tensor, shared by every layer vLLM planned into it (vLLM's own way)."""
    return allocate_padded(kv_cache_config, device)


def allocate_per_layer(kv_cache_config, device) -> dict[str, torch.Tensor]:
    """vllm-ascend <= 0.11's way: every layer gets a buffer of its own (num_blocks pages), even where
    vLLM planned one tensor shared by several layers: 4x the plan on Qwen3-Next, right on dense models."""
    kv: dict[str, torch.Tensor] = {}
    for group in kv_cache_config.kv_cache_groups:
        for name in group.layer_names:
            spec = group.kv_cache_spec
            spec = getattr(spec, "kv_cache_specs", {}).get(name, spec)  # UniformTypeKVCacheSpecs
            kv[name] = _zeros(kv_cache_config.num_blocks * spec.page_size_bytes, device)
    return kv
