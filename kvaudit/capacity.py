"""What a plan holds, as vLLM computes and logs it: KV-cache tokens and concurrency, Mamba state slots,
the ``--kv-cache-memory`` that reproduces the plan, and per strategy the highest utilization that fits.

Tokens and concurrency come from vLLM's own ``get_kv_cache_capacity`` (0.29+; older releases log
``max concurrency × max_model_len`` from ``get_max_concurrency_for_kv_cache_config``, which is what
is used there), so they equal the "GPU KV cache size: N tokens" and "Maximum concurrency for L
tokens per request: Cx" lines of a vLLM start-up log. For hybrid models that figure is not the pool:
a request takes blocks from every group, so ``num_blocks × block_size`` (the pool) is shown beside it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kvaudit.deployment import Deployment
from kvaudit.results import KVPlan, PlanStage


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
    from kvaudit.plan import load_vllm

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


def projected_bytes(d: Deployment, strategy: Any) -> int:
    """Device memory a deployment would use with ``strategy``'s allocation of vLLM's plan: the non-KV
    memory plus every storage the strategy creates (planned by vLLM, allocated on ``meta``)."""
    from kvaudit.audit import dry_run
    from kvaudit.plan import plan_for

    return d.non_kv_bytes + dry_run(plan_for(d, strategy), strategy, d.kv_transfer).total_bytes


def highest_safe_utilization(d: Deployment, strategy: Any, step: float = 0.001,
                             ratio: float | None = None) -> float | None:
    """The highest ``gpu_memory_utilization`` (to ``step``) at which the strategy's allocation of
    vLLM's plan still fits the device beside the non-KV memory; ``None`` when none from ``step`` up does.

    Each candidate is planned by vLLM and allocated by the strategy on ``meta`` (no memory used).
    ``ratio`` (allocated / planned bytes at the deployment's own utilization, where an audit measured it)
    only chooses where the search starts.
    """
    from kvaudit.audit import dry_run
    from kvaudit.errors import KvauditError
    from kvaudit.plan import plan_for

    def fits(util: float) -> bool:
        du = dataclasses.replace(d, gpu_memory_utilization=util, kv_cache_memory_bytes=None)
        if du.kv_budget_bytes <= 0:
            return True  # nothing to allocate: vLLM would refuse to start, not run out
        try:
            return projected_bytes(du, strategy) <= d.device_memory_bytes
        except KvauditError:
            return True

    if fits(1.0):
        return 1.0
    # Start where a constant ratio r of allocated to planned bytes would put the edge:
    # non-KV + r·(u·M − non-KV) = M, then walk the grid to the exact edge (each step planned by vLLM).
    m, nk = d.device_memory_bytes, d.non_kv_bytes
    if ratio is None:
        plan = plan_for(dataclasses.replace(d, kv_cache_memory_bytes=None), strategy)
        ratio = dry_run(plan, strategy, d.kv_transfer).total_bytes / max(1, plan.planned_bytes)
    ratio = max(1.0, ratio)
    k = min(int(round(1 / step)) - 1, max(1, math.floor((m + (ratio - 1) * nk) / (ratio * m) / step)))
    while k > 0 and not fits(k * step):
        k -= 1
    if k == 0:
        return None
    while fits((k + 1) * step):
        k += 1
    return round(k * step, 6)


def for_report(d: Deployment, results: list[Any],
               strategies: list[Any]) -> tuple[dict[str, Capacity], dict[str, float | None]]:
    """Capacity of each audited plan (by its name), and the highest safe utilization per strategy."""
    caps = {r.plan.name: capacity(r.plan) for r in results}
    by_name = {s.name: s for s in strategies}
    safe = {r.strategy: highest_safe_utilization(d, by_name[r.strategy],
                                                 ratio=r.allocated_bytes / max(1, r.expected_bytes))
            for r in results if d.kv_cache_memory_bytes is None and d.num_blocks_override is None}
    return caps, safe


def plan_stage(d: Deployment, strategies: list[Any], broken: list[tuple[str, str]] | None = None) -> PlanStage:
    """``kvaudit plan`` for one deployment rank: vLLM's plan per platform rule, its capacity, and per
    strategy the highest safe utilization; a strategy vLLM cannot plan, or whose code fails (``broken``: those
    that could not even be loaded), is listed with the reason."""
    from kvaudit.errors import NotAuditable, StrategyFailed
    from kvaudit.plan import plan_for

    plans: dict[str, KVPlan] = {}
    planned: dict[str, str] = {}
    safe: dict[str, float | None] = {}
    refused: dict[str, str] = dict(broken or [])
    for s in strategies:
        try:
            plan = plan_for(d, s)
            plans.setdefault(plan.name, plan)
            planned[s.name] = plan.name
            if d.kv_cache_memory_bytes is None and d.num_blocks_override is None:
                safe[s.name] = highest_safe_utilization(d, s)
        except (NotAuditable, StrategyFailed) as e:
            refused[s.name] = e.message
    return PlanStage(deployment=d, plans=plans, capacity={k: capacity(v) for k, v in plans.items()},
                     strategies=planned, safe_utilization=safe, refused=refused)
