"""Per strategy, the highest ``gpu_memory_utilization`` whose allocation still fits the device: vLLM plans
each candidate and the strategy allocates it on ``meta`` (a dry-run audit); ``kvaudit plan``'s stage, which
reports it beside each plan's capacity; and an audit's stage (``audit_stage``), the one assembly of a ``Report``
that ``audit``, ``audit --plan`` and ``check`` share."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from kvaudit.model.deployment import Deployment
from kvaudit.plan.capacity import Capacity, capacity
from kvaudit.results import KVPlan, PlanStage, Report


def projected_bytes(d: Deployment, strategy: Any) -> int:
    """Device memory a deployment would use with ``strategy``'s allocation of vLLM's plan: the non-KV
    memory plus every storage the strategy creates (planned by vLLM, allocated on ``meta``)."""
    from kvaudit.measure.audit import dry_run
    from kvaudit.plan.planner import plan_for

    return d.non_kv_bytes + dry_run(plan_for(d, strategy), strategy, d.kv_transfer).total_bytes


def highest_safe_utilization(d: Deployment, strategy: Any, step: float = 0.001,
                             ratio: float | None = None) -> float | None:
    """The highest ``gpu_memory_utilization`` (to ``step``) at which the strategy's allocation of
    vLLM's plan still fits the device beside the non-KV memory; ``None`` when none from ``step`` up does.

    Each candidate is planned by vLLM and allocated by the strategy on ``meta`` (no memory used).
    ``ratio`` (allocated / planned bytes at the deployment's own utilization, where an audit measured it)
    only chooses where the search starts.
    """
    from kvaudit.errors import KvauditError
    from kvaudit.measure.audit import dry_run
    from kvaudit.plan.planner import plan_for

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


def audit_stage(d: Deployment, strategies: list[Any], meter: Any, tolerance: float, vllm_version: str | None,
                broken: list[tuple[str, str]] | tuple = (), saved: PlanStage | None = None,
                plan_for: Any = None) -> Report:
    """One pipeline stage's report: every strategy audited under ``meter`` against vLLM's plan (or the saved plan
    ``plan_for`` gives it), each plan's capacity and each strategy's highest safe utilization (computed here, or
    ``saved``'s: the stage read from a plan file), and the strategies not audited with why (``broken``: those
    that could not even be loaded)."""
    from kvaudit.measure.audit import audit_all

    skipped: list[tuple[str, str]] = list(broken)
    audits = tuple(audit_all(d, strategies, meter, tolerance, skipped, plan_for=plan_for))
    if saved is None:
        caps, safe = for_report(d, list(audits), strategies)
    else:
        caps = {r.plan.name: saved.capacity[r.plan.name] for r in audits}
        safe = {r.strategy: saved.safe_utilization[r.strategy] for r in audits if r.strategy in saved.safe_utilization}
    return Report(deployment=d, audits=audits, meter=meter.name, meter_device=meter.describe(),
                  vllm_version=vllm_version, skipped=tuple(skipped), capacity=caps, safe_utilization=safe)


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
    from kvaudit.plan.planner import plan_for

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
