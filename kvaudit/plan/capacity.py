"""What a plan holds, as vLLM computes and logs it: KV-cache tokens and concurrency, Mamba state slots,
and the ``--kv-cache-memory`` that reproduces the plan (the highest utilization that fits, which runs
audits, is ``kvaudit.measure.utilization``).

Tokens and concurrency come from vLLM's own ``get_kv_cache_capacity`` (0.29+; older releases log
``max concurrency × max_model_len`` from ``get_max_concurrency_for_kv_cache_config``, which is what
is used there), so they equal the "GPU KV cache size: N tokens" and "Maximum concurrency for L
tokens per request: Cx" lines of a vLLM start-up log. For hybrid models that figure is not the pool:
a request takes blocks from every group, so ``num_blocks × block_size`` (the pool) is shown beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvaudit.results import KVPlan


@dataclass(frozen=True)
class Capacity:
    """One plan's capacity."""

    tokens: int
    """KV-cache tokens as vLLM logs them ("GPU KV cache size: N tokens")."""
    max_concurrency: float
    """Requests of ``max_model_len`` tokens that fit at once, as vLLM logs it."""
    max_model_len: int
    pool_tokens: int
    """``num_blocks × block_size``: the block pool in tokens (differs from ``tokens`` for hybrids)."""
    mamba_slots: int | None
    """Mamba cache blocks (one per decoding sequence), for models with Mamba-style layers."""
    max_num_seqs: int
    """vLLM's ``max_num_seqs`` for the deployment."""
    kv_cache_memory_bytes: int
    """The ``--kv-cache-memory`` that makes vLLM plan exactly this (the planned bytes)."""

    @property
    def mamba_slots_short(self) -> bool:
        """vLLM refuses to start with full decode CUDA graphs when max_num_seqs exceeds the Mamba
        slots ("max_num_seqs (X) exceeds available Mamba cache blocks (Y)", vllm/config/compilation.py)."""
        return self.mamba_slots is not None and self.max_num_seqs > self.mamba_slots

    def to_dict(self) -> dict:
        """JSON form."""
        return {"tokens": self.tokens, "max_concurrency": self.max_concurrency,
                "max_model_len": self.max_model_len, "pool_tokens": self.pool_tokens,
                "mamba_slots": self.mamba_slots, "max_num_seqs": self.max_num_seqs,
                "mamba_slots_short": self.mamba_slots_short, "kv_cache_memory_bytes": self.kv_cache_memory_bytes}


def capacity(plan: KVPlan) -> Capacity:
    """The plan's capacity, from vLLM's own functions on vLLM's own config objects."""
    from kvaudit.plan.planner import load_vllm

    v = load_vllm()
    utils = v.kv_cache_utils
    vc, cfg = plan.vllm_config, plan.kv_cache_config
    if hasattr(utils, "get_kv_cache_capacity"):
        tokens, concurrency = utils.get_kv_cache_capacity(vc, cfg)
    else:
        concurrency = utils.get_max_concurrency_for_kv_cache_config(vc, cfg)
        tokens = int(concurrency * vc.model_config.max_model_len)
    has_mamba = any(g.spec_type == "MambaSpec" for g in plan.groups)
    return Capacity(tokens=int(tokens), max_concurrency=float(concurrency),
                    max_model_len=vc.model_config.max_model_len, pool_tokens=plan.num_blocks * plan.block_size,
                    mamba_slots=plan.num_blocks if has_mamba else None,
                    max_num_seqs=vc.scheduler_config.max_num_seqs, kv_cache_memory_bytes=plan.planned_bytes)
