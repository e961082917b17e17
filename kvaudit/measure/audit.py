"""Run one strategy under a meter against vLLM's plan, attribute the bytes, and decide the verdict.

The verdict rule (documented in docs/usage.md, "Verdict and tolerance"):
- expected = the bytes vLLM plans (each shared tensor once); allocated = what the meter measured;
- over-allocation fails when ``allocated - expected`` exceeds the tolerance: ``tolerance × expected``
  plus, with ``--kv-transfer``, one 2 MiB alignment unit per planned tensor (vllm-ascend's
  intentional padding: ``_align_memory`` in vllm_ascend/worker/model_runner_v1.py);
- under-allocation fails when ``expected - allocated`` exceeds ``tolerance × expected``;
- a planned layer that got no memory fails.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

from kvaudit.errors import ConfigError, KvauditError, MeterUnavailable, NotAuditable, StrategyFailed, first_line
from kvaudit.measure.accounting import Attribution, StorageRecorder, attribute
from kvaudit.measure.meters import Meter
from kvaudit.measure.oom import is_out_of_memory, parse_oom
from kvaudit.model.deployment import Deployment
from kvaudit.results import (DEFAULT_TOLERANCE, AuditResult, DeviceOom, GroupRow, KVPlan, LayerRow, MemoryReading,
                             OomPoint, Snapshot, TensorRow, Verdict, exceeds_plan, tolerance_bytes)
from kvaudit.strategies.strategy import ALIGNMENT, Strategy
from kvaudit.units import fmt_bytes


class _OutOfMemory(Exception):
    """The strategy's allocator ran out of memory: a finding, carried up with the error's first line."""


@dataclass(frozen=True)
class DryRun:
    """A strategy's allocations for a plan, in order, from a run on ``meta`` (no memory used)."""

    sizes: tuple[int, ...]
    layers: tuple[tuple[str, ...], ...]
    """The layers whose tensors live in each storage."""

    @property
    def total_bytes(self) -> int:
        """Bytes of every storage the strategy creates."""
        return sum(self.sizes)


def dry_run(plan: KVPlan, strategy: Strategy, kv_transfer: bool) -> DryRun:
    """Run ``strategy`` on ``meta``: what it allocates, in which order, for which layers."""
    import torch

    recorder = StorageRecorder()
    with recorder:
        raw = _allocate(strategy, plan, torch.device("meta"), kv_transfer)
    return _as_dry_run(recorder, attribute(raw))


def _as_dry_run(recorder: StorageRecorder, attr: Attribution) -> DryRun:
    """The allocations a recorded run made, while its storages are alive (their keys are addresses)."""
    return DryRun(tuple(e.nbytes for e in recorder.events),
                  tuple(attr.storage_layers.get(e.key, ()) for e in recorder.events))


def _allocate(strategy: Strategy, plan: KVPlan, device: Any, kv_transfer: bool) -> dict:
    """Run the strategy; an allocator out of memory becomes ``_OutOfMemory`` with the frames that
    held its partial allocation cleared, any other error exit 3."""
    try:
        return strategy.allocate(plan, device, kv_transfer)
    except KvauditError:
        raise
    except Exception as e:  # the strategy is foreign code: every error is reported, never a traceback
        if not is_out_of_memory(e):
            raise StrategyFailed(f"strategy {strategy.name!r} raised {type(e).__name__}: {first_line(e)}") from None
        message = first_line(e)
        traceback.clear_frames(e.__traceback__)  # free what the strategy had allocated
    raise _OutOfMemory(message)


def _check_room(plan: KVPlan, strategy: Strategy, meter: Meter, dry: DryRun) -> None:
    """Refuse (exit 3) what cannot be measured: a host that cannot hold the strategy's allocation
    (an out-of-memory there kills the process), or a device already too full for the plan itself."""
    room = meter.free_bytes()
    if room is None:
        return
    if meter.kind == "host" and dry.total_bytes > room:
        fit = max(1, int(plan.num_blocks * room / dry.total_bytes * 0.95))
        raise MeterUnavailable(
            f"strategy {strategy.name!r} would allocate {fmt_bytes(dry.total_bytes)} on the {meter.name} meter, "
            f"more than the {fmt_bytes(room)} this host can spare; audit a scaled plan with --num-blocks {fit} "
            f"(the plan has {plan.num_blocks}), or use --meter meta")
    if meter.kind == "device" and plan.planned_bytes > room:
        fit = max(1, int(plan.num_blocks * room / plan.planned_bytes * 0.95))
        raise MeterUnavailable(
            f"{meter.describe()}: only {fmt_bytes(room)} free, less than the {fmt_bytes(plan.planned_bytes)} "
            f"vLLM plans; the device is already too full to measure (free it, or audit a scaled plan with "
            f"--num-blocks {fit})")


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
    """Allocate with ``strategy`` on ``meter``'s device, measure, release, attribute, and judge."""
    kv_transfer = deployment.kv_transfer
    if strategy.prepare is not None:
        strategy.prepare(plan)  # imports and vLLM objects, before anything is measured
    # on meta the run itself is the dry run; elsewhere a dry run first sizes and names the allocations
    dry = None if meter.kind == "accounting" else dry_run(plan, strategy, kv_transfer)
    if dry is not None:
        _check_room(plan, strategy, meter, dry)
    meter.start()
    recorder = StorageRecorder()
    raw: dict = {}
    oom_message = None
    try:
        with recorder:
            raw = _allocate(strategy, plan, meter.device(), kv_transfer)
    except _OutOfMemory as e:
        oom_message = str(e)
    finally:
        reading = meter.stop()
    attr = attribute(raw)
    if dry is None:
        dry = _as_dry_run(recorder, attr)
    got = set(raw)
    raw = {}  # drop the strategy's tensors, then check that their memory comes back
    after = meter.release()
    leaked = recorder.live_bytes()
    if after is not None and reading.before is not None:
        leaked = max(leaked, after.allocated - reading.before.allocated)
    device_oom = _device_oom(plan, dry, recorder, oom_message) if oom_message else None
    return _judge(deployment, plan, strategy, meter, tolerance, reading, attr, dry, got, device_oom, leaked, after)


def _device_oom(plan: KVPlan, dry: DryRun, recorder: StorageRecorder, message: str) -> DeviceOom:
    """Where the device ran out: the next allocation after those that succeeded, named by the dry run."""
    done = len(recorder.events)
    layers = dry.layers[done] if done < len(dry.layers) else ()
    parsed = parse_oom(message)  # the message rounds to 2 decimals: the dry run's size is exact
    request = dry.sizes[done] if done < len(dry.sizes) else (parsed.tried if parsed else None)
    return DeviceOom(allocation=done + 1, allocations=len(dry.sizes), request_bytes=request,
                     allocated_before_bytes=sum(e.nbytes for e in recorder.events),
                     free_bytes=parsed.free if parsed else None, segment_bytes=parsed.tried if parsed else None,
                     tensor=plan.tensor_of(layers[0]) if layers and layers[0] in plan.layer_specs else None,
                     layers=layers, message=message)


def _judge(d: Deployment, plan: KVPlan, strategy: Strategy, meter: Meter, tolerance: float,
           reading: MemoryReading, attr: Attribution, dry: DryRun, got: set[str], device_oom: DeviceOom | None,
           leaked: int, after: Snapshot | None) -> AuditResult:
    planned_layers = sorted(plan.layer_specs, key=_layer_order_key)
    expected = plan.planned_bytes
    # what the code asked for, where the meter tells it apart from the allocator's rounding
    allocated = reading.requested if reading.requested is not None else reading.allocated
    rounding = reading.allocated - reading.requested if reading.requested is not None else None
    allowance = ALIGNMENT * len(plan.tensors) if d.kv_transfer else 0
    tol_bytes = tolerance_bytes(expected, tolerance, allowance)
    reasons: list[str] = []

    if device_oom is None:
        missing = [n for n in planned_layers if n not in got]
        if missing:
            reasons.append(f"{len(missing)} planned layer(s) got no memory, first {missing[0]}")
    extra = sorted(got - set(plan.layer_specs))
    if extra:
        reasons.append(f"memory for {len(extra)} layer(s) vLLM did not plan, first {extra[0]}")

    layers, groups, tensors = _rows(plan, attr, planned_layers) if device_oom is None else ((), (), ())
    region_allowance = ALIGNMENT if d.kv_transfer else 0
    split = [t for t in tensors if len(t.shared_by) > 1 and t.storages > 1
             and t.allocated - t.expected > region_allowance + tolerance * t.expected]
    if split:
        worst = max(split, key=lambda t: t.allocated / t.expected)
        reasons.append(f"{len(split)} of {len(tensors)} shared tensors split into private buffers (tensor "
                       f"{worst.tensor}: planned as one storage its {len(worst.shared_by)} layers share, given "
                       f"{worst.storages} storages with {worst.allocated / worst.expected:.2f}× its bytes)")

    over, under = allocated - expected, expected - allocated
    if device_oom is not None:
        reasons.insert(0, _oom_reason(device_oom, meter))
    elif exceeds_plan(allocated, expected, tol_bytes):
        reasons.insert(0, f"allocates {fmt_bytes(allocated)} for a plan of {fmt_bytes(expected)}: "
                          f"{allocated / expected:.2f}×, {fmt_bytes(over)} over a tolerance of {fmt_bytes(tol_bytes)}")
    elif under > tolerance_bytes(expected, tolerance):
        reasons.insert(0, f"allocates {fmt_bytes(allocated)}, {fmt_bytes(under)} less than the planned "
                          f"{fmt_bytes(expected)} (tolerance {tolerance:.2%})")
    if leaked > 0:
        reasons.append(f"leaks {fmt_bytes(leaked)} ({leaked:,} B): still allocated after its tensors were "
                       "released")
    verdict = Verdict.FAIL if reasons else Verdict.PASS
    if plan.kv_budget_by and verdict is Verdict.FAIL and expected:
        reasons.append(f"{plan.kv_budget_by} gave vLLM's planner {fmt_bytes(plan.kv_budget_bytes)} of the "
                       f"deployment's {fmt_bytes(d.kv_budget_bytes)} KV budget "
                       f"(×{plan.kv_budget_bytes / d.kv_budget_bytes:.4f}) to make room for its buffers: they fit, "
                       f"but hold {plan.num_blocks:,} blocks where the planned sharing would fit "
                       f"{allocated / expected:.2f}× as many in the same memory")

    projected = d.non_kv_bytes + dry.total_bytes
    return AuditResult(
        strategy=strategy.name, strategy_title=strategy.title, strategy_releases=strategy.releases,
        meter=meter.name, plan=plan,
        expected_bytes=expected, allocated_bytes=allocated, attributed_bytes=attr.total_bytes,
        padding_bytes=sum(attr.storage_padding.values()), allocations=len(dry.sizes),
        tolerance_bytes=tol_bytes, alignment_allowance_bytes=allowance,
        verdict=verdict, reasons=tuple(reasons), reading=reading,
        projected_bytes=projected, projected_utilization=projected / d.device_memory_bytes,
        requested_utilization=d.gpu_memory_utilization, oom=_oom_point(d, plan, dry),
        groups=groups, tensors=tensors, layers=layers, device_oom=device_oom, rounding_bytes=rounding,
        leaked_bytes=leaked, after_release=after)


def _rows(plan: KVPlan, attr: Attribution, planned_layers: list[str]) -> tuple[tuple, tuple, tuple]:
    """Per-layer, per-group and per-tensor rows: planned shares against attributed bytes."""
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
    return tuple(layers), groups, tuple(tensors)


def _oom_reason(o: DeviceOom, meter: Meter) -> str:
    where = f"tensor {o.tensor} ({', '.join(o.layers)})" if o.tensor is not None else "a storage no layer uses"
    need = (f"; it needed {fmt_bytes(o.needed_more_bytes)} more than the {fmt_bytes(o.free_bytes)} free"
            if o.needed_more_bytes is not None and o.free_bytes is not None else "")
    request = fmt_bytes(o.request_bytes) if o.request_bytes is not None else "an allocation"
    if o.segment_bytes and o.request_bytes is not None and o.segment_bytes != o.request_bytes:
        request += f" (a {fmt_bytes(o.segment_bytes)} segment for the caching allocator)"
    said = o.message.split(" If reserved memory")[0].split(" Including non-PyTorch memory")[0]
    return (f"ran out of memory on the {meter.name} meter at allocation {o.allocation} of {o.allocations}: "
            f"{request} for {where}, with {fmt_bytes(o.allocated_before_bytes)} already allocated{need} "
            f"(the allocator said: {said})")


def _oom_point(d: Deployment, plan: KVPlan, dry: DryRun) -> OomPoint | None:
    """Walk the strategy's allocations in order on a device of the deployment's size."""
    free = d.device_memory_bytes - d.non_kv_bytes
    held = 0
    for i, (size, users) in enumerate(zip(dry.sizes, dry.layers), start=1):
        if held + size > free:
            tensor = plan.tensor_of(users[0]) if users and users[0] in plan.layer_specs else None
            return OomPoint(allocation=i, request_bytes=size, allocated_before_bytes=held,
                            free_bytes=free, tensor=tensor, layers=users)
        held += size
    return None


def audit_all(deployment: Deployment, strategies: list[Strategy], meter: Meter,
              tolerance: float = DEFAULT_TOLERANCE,
              skipped: list[tuple[str, str]] | None = None,
              plan_for: Callable[[Strategy], KVPlan] | None = None) -> list[AuditResult]:
    """Plan once per platform rule and worker budget rule with vLLM's planner (or take each strategy's plan
    from ``plan_for``: a saved plan), then audit every strategy in turn. A strategy that cannot allocate the
    plan at all (``NotAuditable``), whose own code raises (``StrategyFailed``) or whose platform rule vLLM's planner
    refuses is listed in ``skipped`` with its reason when a list is given, so that the others are still audited;
    without a list it stops the run, as it does when every strategy's plan is refused."""
    plans: dict[tuple[str, str], KVPlan] = {}

    def planned(s: Strategy) -> KVPlan:
        from kvaudit.plan import planner as plan

        key = plan.plan_key(s)
        if key not in plans:
            plans[key] = plan.plan_for(deployment, s)
        return plans[key]

    results = []
    refused: list[ConfigError] = []
    for s in strategies:
        try:
            plan = (plan_for or planned)(s)
        except ConfigError as e:  # vLLM's planner refuses this strategy's platform rule or budget rule
            if skipped is None:
                raise
            refused.append(e)
            skipped.append((s.name, e.message))
            continue
        except (NotAuditable, StrategyFailed) as e:
            if skipped is None:
                raise
            skipped.append((s.name, e.message))
            continue
        try:
            results.append(run_audit(deployment, plan, s, meter, tolerance))
        except (NotAuditable, StrategyFailed) as e:
            if skipped is None:
                raise
            skipped.append((s.name, e.message))
    if refused and len(refused) == len(strategies):
        raise refused[0]  # the deployment itself, not one strategy: bad input
    return results
