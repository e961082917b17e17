"""Run one strategy under a meter against vLLM's plan, attribute the bytes, and decide the verdict.

The verdict rule (documented in the README):
- expected = the bytes vLLM plans (each shared tensor once); allocated = what the meter measured;
- over-allocation fails when ``allocated - expected`` exceeds the tolerance: ``tolerance × expected``
  plus, with ``--kv-transfer``, one 2 MiB alignment unit per planned tensor (vllm-ascend's
  intentional padding, §1 of the allocation reference);
- under-allocation fails when ``expected - allocated`` exceeds ``tolerance × expected``;
- a planned layer that got no memory fails.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from kvaudit.accounting import Attribution, StorageRecorder, attribute
from kvaudit.deployment import Deployment
from kvaudit.errors import MeterUnavailable, StrategyFailed
from kvaudit.meters import Meter, MetaMeter
from kvaudit.results import (AuditResult, GroupRow, KVPlan, LayerRow, MemoryReading, OomPoint, TensorRow,
                             Verdict)
from kvaudit.strategies import ALIGNMENT, Strategy
from kvaudit.units import fmt_bytes

DEFAULT_TOLERANCE = 0.005
"""Relative tolerance: 0.5 % of the planned bytes."""


def projected_bytes(plan: KVPlan, strategy: Strategy, kv_transfer: bool) -> int:
    """Bytes the strategy would allocate for ``plan``, from a dry run on ``meta`` (no memory)."""
    meter = MetaMeter()
    meter.start()
    try:
        raw = _allocate(strategy, plan, meter.device(), kv_transfer)
    finally:
        reading = meter.stop()
    del raw
    return reading.allocated


def _allocate(strategy: Strategy, plan: KVPlan, device: Any, kv_transfer: bool) -> dict:
    try:
        return strategy.allocate(plan, device, kv_transfer)
    except (MemoryError, RuntimeError, TypeError, ValueError, AssertionError, AttributeError, KeyError) as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise StrategyFailed(f"strategy {strategy.name!r} raised {type(e).__name__}: {first}") from None


def _check_room(plan: KVPlan, strategy: Strategy, meter: Meter, kv_transfer: bool) -> None:
    """Refuse (exit 3) when the strategy's allocation would not fit where a host meter measures."""
    if meter.kind != "host":
        return
    room = meter.free_bytes()
    if room is None:
        return
    need = projected_bytes(plan, strategy, kv_transfer)
    if need <= room:
        return
    fit = max(1, int(plan.num_blocks * room / need * 0.95))
    raise MeterUnavailable(
        f"strategy {strategy.name!r} would allocate {fmt_bytes(need)} on the {meter.name} meter, more "
        f"than the {fmt_bytes(room)} this host can spare; audit a scaled plan with --num-blocks {fit} "
        f"(the plan has {plan.num_blocks}), or use --meter meta")


def _layer_order_key(name: str) -> tuple[int, str]:
    m = re.search(r"layers\.(\d+)\.", name)
    return (int(m.group(1)) if m else 1 << 30, name)


def run_audit(
    deployment: Deployment,
    plan: KVPlan,
    strategy: Strategy,
    meter: Meter,
    tolerance: float = DEFAULT_TOLERANCE,
) -> AuditResult:
    """Allocate with ``strategy`` on ``meter``'s device, measure, attribute, and judge."""
    kv_transfer = deployment.kv_transfer
    _check_room(plan, strategy, meter, kv_transfer)
    meter.start()
    recorder = StorageRecorder()
    try:
        with recorder:
            raw = _allocate(strategy, plan, meter.device(), kv_transfer)
    finally:
        reading = meter.stop()
    try:
        attr = attribute(raw)
        return _judge(deployment, plan, strategy, meter, tolerance, reading, attr, recorder, set(raw))
    finally:
        del raw
        meter.release()


def _judge(d: Deployment, plan: KVPlan, strategy: Strategy, meter: Meter, tolerance: float,
           reading: MemoryReading, attr: Attribution, recorder: StorageRecorder,
           got: set[str]) -> AuditResult:
    planned_layers = sorted(plan.layer_specs, key=_layer_order_key)
    expected = plan.planned_bytes
    allocated = reading.allocated
    allowance = ALIGNMENT * len(plan.tensors) if d.kv_transfer else 0
    tol_bytes = allowance + int(round(tolerance * expected))
    reasons: list[str] = []

    missing = [n for n in planned_layers if n not in got]
    if missing:
        reasons.append(f"{len(missing)} planned layer(s) got no memory, first {missing[0]}")
    extra = sorted(got - set(plan.layer_specs))
    if extra:
        reasons.append(f"memory for {len(extra)} layer(s) vLLM did not plan, first {extra[0]}")

    layers = []
    for name in planned_layers:
        ti = plan.tensor_of(name)
        layers.append(LayerRow(
            layer=name, group=plan.group_of(name).index, spec=plan.layer_specs[name], tensor=ti,
            expected=round(plan.planned_share(name)), allocated=round(attr.layer_bytes.get(name, Fraction(0))),
            storages=len(attr.layer_storages.get(name, ())),
            shares_with=tuple(sorted(attr.shares_with.get(name, ()), key=_layer_order_key)),
            planned_shares_with=tuple(n for n in plan.tensors[ti].shared_by if n != name)))
    groups = tuple(
        GroupRow(group=g.index, spec=g.spec_type, layers=len(g.layer_names),
                 expected=sum(r.expected for r in layers if r.group == g.index),
                 allocated=round(sum(attr.layer_bytes.get(n, Fraction(0)) for n in g.layer_names)))
        for g in plan.groups)
    tensors = []
    for i, t in enumerate(plan.tensors):
        keys = set().union(*(attr.layer_storages.get(n, frozenset()) for n in t.shared_by))
        tensors.append(TensorRow(
            tensor=i, expected=t.size,
            allocated=round(sum(attr.layer_bytes.get(n, Fraction(0)) for n in t.shared_by)),
            storages=len(keys), padding=sum(attr.storage_padding[k] for k in keys), shared_by=t.shared_by))
    split = [t for t in tensors if len(t.shared_by) > 1 and t.storages > 1]
    if split and any(t.allocated > t.expected for t in split):
        worst = max(split, key=lambda t: t.allocated / t.expected)
        reasons.append(f"{len(split)} of {len(tensors)} shared tensors split into private buffers (tensor "
                       f"{worst.tensor}: {worst.storages} storages for {len(worst.shared_by)} layers, "
                       f"{worst.allocated / worst.expected:.2f}× its size)")

    over, under = allocated - expected, expected - allocated
    if over > tol_bytes:
        reasons.insert(0, f"allocates {fmt_bytes(allocated)} for a plan of {fmt_bytes(expected)}: "
                          f"{allocated / expected:.2f}×, {fmt_bytes(over)} over a tolerance of {fmt_bytes(tol_bytes)}")
    elif under > int(round(tolerance * expected)):
        reasons.insert(0, f"allocates {fmt_bytes(allocated)}, {fmt_bytes(under)} less than the planned "
                          f"{fmt_bytes(expected)} (tolerance {tolerance:.2%})")
    failed = over > tol_bytes or under > int(round(tolerance * expected)) or bool(missing) or bool(extra)
    if not failed:
        reasons = []

    projected = d.non_kv_bytes + allocated
    return AuditResult(
        strategy=strategy.name, strategy_title=strategy.title, strategy_releases=strategy.releases,
        meter=meter.name, plan=plan,
        expected_bytes=expected, allocated_bytes=allocated, attributed_bytes=attr.total_bytes,
        padding_bytes=sum(attr.storage_padding.values()), allocations=len(recorder.events),
        tolerance_bytes=tol_bytes, alignment_allowance_bytes=allowance,
        verdict=Verdict.FAIL if failed else Verdict.PASS, reasons=tuple(reasons), reading=reading,
        projected_bytes=projected, projected_utilization=projected / d.device_memory_bytes,
        requested_utilization=d.gpu_memory_utilization, oom=_oom_point(d, plan, attr, recorder),
        groups=groups, tensors=tuple(tensors), layers=tuple(layers))


def _oom_point(d: Deployment, plan: KVPlan, attr: Attribution, recorder: StorageRecorder) -> OomPoint | None:
    """Walk the strategy's allocations in order on a device of the deployment's size."""
    free = d.device_memory_bytes - d.non_kv_bytes
    held = 0
    for i, ev in enumerate(recorder.events, start=1):
        if held + ev.nbytes > free:
            users = attr.storage_layers.get(ev.key, ())
            tensor = plan.tensor_of(users[0]) if users and users[0] in plan.layer_specs else None
            return OomPoint(allocation=i, request_bytes=ev.nbytes, allocated_before_bytes=held,
                            free_bytes=free, tensor=tensor, layers=users)
        held += ev.nbytes
    return None


def audit_all(deployment: Deployment, strategies: list[Strategy], meter: Meter,
              tolerance: float = DEFAULT_TOLERANCE) -> list[AuditResult]:
    """Plan once per platform rule with vLLM's planner, then audit every strategy in turn."""
    from kvaudit.plan import build_plan

    plans: dict[str, KVPlan] = {}
    results = []
    for s in strategies:
        if s.platform not in plans:
            plans[s.platform] = build_plan(deployment, s.platform)
        results.append(run_audit(deployment, plans[s.platform], s, meter, tolerance))
    return results


def exit_code(results: list[AuditResult]) -> int:
    """0 when every audited strategy passed, 1 when any failed."""
    return 0 if all(r.verdict is Verdict.PASS for r in results) else 1
