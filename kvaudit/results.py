"""Frozen records of a plan and of an audit, with the verdict; imports neither torch nor rich."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kvaudit.errors import NotAuditable, UsageError
from kvaudit.units import fmt_bytes


class Verdict(str, Enum):
    """An audit's outcome: the allocation matched the plan within tolerance, or it did not."""

    PASS = "PASS"
    FAIL = "FAIL"


DEFAULT_TOLERANCE = 0.005
"""Relative tolerance: 0.5 % of the planned bytes (``--tolerance``), for every command."""


OBSERVED_USE_TOLERANCE = 0.03
"""How far a device's observed use (a smi table, a report's "used 0.85 of the NPU") may be from a projection of it, as a
share of the device's memory: the runtime's context, the allocator's cached blocks and a snapshot's timing move it by
a few percent. ``kvaudit live`` and triage judge observed use with it."""


def valid_tolerance(tolerance: float) -> bool:
    """Whether a relative tolerance on the planned bytes is one kvaudit takes: a fraction in [0, 1)."""
    return 0.0 <= tolerance < 1.0


def check_tolerance(tolerance: float) -> None:
    """``--tolerance`` outside [0, 1) is bad input (exit 2)."""
    if not valid_tolerance(tolerance):
        raise UsageError(f"--tolerance must be in [0, 1), got {tolerance}")


def tolerance_bytes(expected: int, tolerance: float, allowance: int | float = 0) -> int:
    """The bytes a verdict allows above (or below) a plan of ``expected`` bytes: ``tolerance ×
    expected``, plus above it an ``allowance`` (vllm-ascend's 2 MiB KV-transfer alignment per tensor)."""
    return int(round(allowance)) + int(round(tolerance * expected))


def exceeds_plan(allocated: int, expected: int, tolerance_bytes: int) -> bool:
    """Over-allocation, as every verdict (audit, triage, check) judges it: more than the tolerance above
    the plan (``tolerance_bytes`` is set by ``kvaudit.measure.audit``: relative tolerance + alignment allowance)."""
    return allocated - expected > tolerance_bytes


@dataclass(frozen=True)
class GroupPlan:
    """One KV-cache group of vLLM's plan (``KVCacheGroupSpec``)."""

    index: int
    spec_type: str
    """``FullAttentionSpec``, ``MambaSpec``, ..."""
    block_size: int
    page_size_bytes: int
    layer_names: tuple[str, ...]


@dataclass(frozen=True)
class TensorPlan:
    """A planned tensor region and the layers that share it, as ``KVCacheTensor(size, shared_by)``.

    vLLM up to 0.28 plans these directly. From 0.29 one backing allocation holds every layer at
    ``offset + l·layer_stride``; the layers whose byte ranges coincide form one region here, which
    is the ``shared_by`` view every vllm-ascend release allocates from.
    """

    size: int
    shared_by: tuple[str, ...]


@dataclass(frozen=True)
class KVPlan:
    """vLLM's ``KVCacheConfig`` for one platform rule, in kvaudit's terms."""

    vllm_version: str
    platform: str
    """The block-size rule that shaped the specs (``cuda``, ``ascend-align128``, ``ascend-contiguous``)."""
    block_size: int
    num_blocks: int
    kv_budget_bytes: int
    """``available_memory`` given to the planner."""
    plan_format: str
    """``shared_by`` (vLLM <= 0.28) or ``layers`` (0.29+, one backing allocation)."""
    planned_bytes: int
    """Bytes vLLM plans to allocate: each shared tensor counted once."""
    groups: tuple[GroupPlan, ...]
    tensors: tuple[TensorPlan, ...]
    layer_specs: dict[str, str] = field(compare=False)
    """Layer name -> spec type name."""
    interleaved: bool = False
    """The plan interleaves layers within blocks (vLLM 0.29+ for specs of unequal page size, e.g.
    DeepSeek-V3.2's MLA + indexer): ``tensors`` is then the one backing allocation shared by every
    layer, and code written for ``shared_by`` regions cannot allocate it."""
    kv_cache_config: Any = field(default=None, repr=False, compare=False)
    """The vLLM ``KVCacheConfig`` object itself."""
    vllm_config: Any = field(default=None, repr=False, compare=False)
    """The vLLM config it was planned with (the layout lives in its cache config); ``None`` for a plan
    read from a file (``kvaudit.plan.planfile``)."""
    saved_vllm: Any = field(default=None, repr=False, compare=False)
    """For a plan read from a file: vLLM's ``KVCacheConfig`` and KV-cache layout as data, rebuilt into
    vLLM's own objects only where a strategy needs them and vLLM can be imported."""
    kv_budget_by: str = ""
    """Who handed vLLM's planner ``kv_budget_bytes`` instead of the deployment's KV budget: a release's
    worker that shrinks it first (``kvaudit.strategies.releases.kv_budget_rule``). Empty: the deployment's budget."""

    @property
    def name(self) -> str:
        """How reports name the plan: its platform rule, and its budget where a worker shrank it."""
        return f"{self.platform}, budget {fmt_bytes(self.kv_budget_bytes)}" if self.kv_budget_by else self.platform

    def group_of(self, layer: str) -> GroupPlan:
        """The group that holds ``layer``."""
        for g in self.groups:
            if layer in g.layer_names:
                return g
        raise KeyError(layer)

    def tensor_of(self, layer: str) -> int:
        """Index of the planned tensor region that holds ``layer``."""
        for i, t in enumerate(self.tensors):
            if layer in t.shared_by:
                return i
        raise KeyError(layer)

    def planned_share(self, layer: str) -> float:
        """The layer's share of its region: region size / number of layers planned to share it."""
        t = self.tensors[self.tensor_of(layer)]
        return t.size / len(t.shared_by)

    def shared_by_config(self) -> Any:
        """The plan as code written for ``KVCacheTensor(size, shared_by)`` reads it: vLLM's own
        config for a ``shared_by`` plan, else one with the ``shared_by`` regions and vLLM's groups."""
        self.require_regions("code written for KVCacheTensor(size, shared_by)")
        if self.plan_format == "shared_by":
            return self.kv_cache_config
        from types import SimpleNamespace

        return SimpleNamespace(
            num_blocks=self.num_blocks,
            kv_cache_tensors=[SimpleNamespace(size=t.size, shared_by=list(t.shared_by)) for t in self.tensors],
            kv_cache_groups=self.kv_cache_config.kv_cache_groups)

    def require_live(self, who: str) -> None:
        """Refuse (``NotAuditable``) a plan read from a file when ``who`` needs vLLM's live objects of
        the plan (its config, its model's layers), which a saved plan does not carry."""
        if self.vllm_config is None:
            raise NotAuditable(f"{who} needs the vLLM objects of a live plan (its VllmConfig and the built "
                               "model's layers), which a saved plan does not carry; audit it where vLLM plans "
                               "(without --plan)")

    def require_regions(self, who: str) -> None:
        """Refuse (``NotAuditable``) when the plan has no ``shared_by`` regions for ``who`` to allocate."""
        if self.interleaved:
            raise NotAuditable(f"{who} cannot allocate this plan: vLLM {self.vllm_version} interleaves its layers "
                               "within blocks (specs of unequal page size), so it has no shared_by regions")

    def to_dict(self) -> dict:
        """JSON form."""
        return {
            "vllm_version": self.vllm_version, "interleaved": self.interleaved, "platform": self.platform,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks, "kv_budget_bytes": self.kv_budget_bytes,
            "plan_format": self.plan_format, "planned_bytes": self.planned_bytes,
            "groups": [{"index": g.index, "spec": g.spec_type, "block_size": g.block_size,
                        "page_size_bytes": g.page_size_bytes, "layers": list(g.layer_names)}
                       for g in self.groups],
            "tensors": [{"index": i, "size_bytes": t.size, "shared_by": list(t.shared_by)}
                        for i, t in enumerate(self.tensors)],
            **({"kv_budget_by": self.kv_budget_by} if self.kv_budget_by else {}),
        }


@dataclass(frozen=True)
class Snapshot:
    """A device allocator's absolute counters at one moment."""

    allocated: int
    reserved: int | None = None

    def to_dict(self) -> dict:
        """JSON form."""
        return {"allocated": self.allocated, "reserved": self.reserved}


@dataclass(frozen=True)
class MemoryReading:
    """What a meter saw across one strategy run, relative to the start of the run."""

    allocated: int
    """Bytes still allocated when the strategy returned (allocator-level, or storages on meta)."""
    peak: int
    """Highest allocated bytes during the run."""
    reserved: int | None = None
    """Bytes the caching allocator reserved from the device, where the meter has it."""
    requested: int | None = None
    """Bytes the code asked for, before allocator rounding, where the meter has it."""
    before: Snapshot | None = None
    """The device's counters before the strategy ran (device meters)."""

    def to_dict(self) -> dict:
        """JSON form."""
        return {"allocated": self.allocated, "peak": self.peak, "reserved": self.reserved,
                "requested": self.requested, "before": self.before.to_dict() if self.before else None}


@dataclass(frozen=True)
class LayerRow:
    """One layer: its planned share against the bytes attributed to it."""

    layer: str
    group: int
    spec: str
    tensor: int
    """Index of the planned tensor region."""
    expected: int
    """Planned share: region size / layers planned to share it."""
    allocated: int
    """Attributed bytes: each storage byte split among the layers whose views cover it."""
    storages: int
    """Distinct storages the layer's tensors live in."""
    shares_with: tuple[str, ...]
    """Layers whose views overlap this layer's bytes."""
    planned_shares_with: tuple[str, ...]


@dataclass(frozen=True)
class GroupRow:
    """One KV-cache group: sum of its layers' planned shares against their attributed bytes."""

    group: int
    spec: str
    layers: int
    expected: int
    allocated: int


@dataclass(frozen=True)
class TensorRow:
    """One planned tensor region: its size against the bytes attributed to its layers."""

    tensor: int
    expected: int
    allocated: int
    storages: int
    """Distinct storages its layers were given (1 is what vLLM plans)."""
    padding: int
    """Bytes of those storages that no layer view covers (alignment padding)."""
    shared_by: tuple[str, ...]


@dataclass(frozen=True)
class OomPoint:
    """Where a device of the deployment's size would run out of memory during the strategy."""

    allocation: int
    """1-based index of the failing allocation, in allocation order."""
    request_bytes: int
    allocated_before_bytes: int
    """KV bytes the strategy already held when the allocation failed."""
    free_bytes: int
    """Device memory left for the KV cache: device memory − non-KV memory."""
    tensor: int | None
    """Planned tensor region of the layers that got the failing storage."""
    layers: tuple[str, ...]

    def to_dict(self) -> dict:
        """JSON form."""
        return {"allocation": self.allocation, "request_bytes": self.request_bytes,
                "allocated_before_bytes": self.allocated_before_bytes, "free_bytes": self.free_bytes,
                "tensor": self.tensor, "layers": list(self.layers)}


@dataclass(frozen=True)
class DeviceOom:
    """A real out-of-memory error during a strategy: a finding, not a crash."""

    allocation: int
    """1-based index of the allocation that failed, in allocation order."""
    allocations: int
    """Allocations the strategy makes in all (from a dry run on ``meta``)."""
    request_bytes: int | None
    allocated_before_bytes: int
    """Bytes of the storages the strategy had created when it failed."""
    free_bytes: int | None
    """Free device memory the error reported, where it did."""
    tensor: int | None
    layers: tuple[str, ...]
    message: str
    """The error's first line."""
    segment_bytes: int | None = None
    """What the caching allocator tried to reserve from the device, from its message ("Tried to allocate"
    prints the segment: the request padded and rounded, 2 MiB-rounded or a 2 / 20 MiB pool segment)."""

    @property
    def needed_more_bytes(self) -> int | None:
        """How much more the failing allocation needed than was free (the segment the allocator asked the
        device for, where the message says it)."""
        if self.request_bytes is None or self.free_bytes is None:
            return None
        return max(0, max(self.request_bytes, self.segment_bytes or 0) - self.free_bytes)

    def to_dict(self) -> dict:
        """JSON form."""
        return {"allocation": self.allocation, "allocations": self.allocations, "request_bytes": self.request_bytes,
                "allocated_before_bytes": self.allocated_before_bytes, "free_bytes": self.free_bytes,
                "needed_more_bytes": self.needed_more_bytes, "segment_bytes": self.segment_bytes,
                "tensor": self.tensor, "layers": list(self.layers), "message": self.message}


@dataclass(frozen=True)
class AuditResult:
    """One strategy run under one meter against one plan, with its verdict."""

    strategy: str
    strategy_title: str
    strategy_releases: str
    meter: str
    plan: KVPlan = field(repr=False)
    expected_bytes: int
    allocated_bytes: int
    """As the meter measured it: the bytes the code requested where the meter tells them apart from
    the allocator's rounding, else what the allocator handed out."""
    attributed_bytes: int
    """Bytes of the storages that the layers' tensors live in."""
    padding_bytes: int
    allocations: int
    """Storages the strategy created (``torch.zeros`` calls and the like)."""
    tolerance_bytes: int
    """Allowed excess: alignment allowance + relative tolerance × expected."""
    alignment_allowance_bytes: int
    verdict: Verdict
    reasons: tuple[str, ...]
    reading: MemoryReading
    projected_bytes: int
    """Non-KV memory plus the KV bytes the strategy allocates (from its dry run on ``meta``)."""
    projected_utilization: float
    requested_utilization: float
    oom: OomPoint | None
    """Where a device of the deployment's size would run out of memory (a projection)."""
    groups: tuple[GroupRow, ...]
    tensors: tuple[TensorRow, ...]
    layers: tuple[LayerRow, ...]
    device_oom: DeviceOom | None = None
    """The out-of-memory error the measuring device raised during the strategy, if it did."""
    rounding_bytes: int | None = None
    """Allocator rounding: what it handed out minus what the code requested, where known."""
    leaked_bytes: int = 0
    """Bytes still allocated after the strategy's tensors were dropped and caches emptied."""
    after_release: Snapshot | None = None
    """The device's counters once the strategy's memory was released (device meters)."""

    @property
    def ratio(self) -> float:
        """Allocated over expected bytes."""
        return self.allocated_bytes / self.expected_bytes if self.expected_bytes else float("inf")

    @property
    def finding(self) -> str:
        """The verdict in a few words, for a summary line or a grid cell: the ratio (``4.00×``), where the device ran
        out of memory, or, for a FAIL whose total is as planned (a ratio of 1.00× beside FAIL would read as a
        contradiction), what failed: ``24 layers got 0 B``, a split shared tensor, a leak."""
        if self.device_oom:
            return "out of memory"
        ratio = f"{self.ratio:.2f}×"
        if self.verdict is Verdict.PASS or self.over_allocated or self.allocated_bytes < self.expected_bytes:
            return ratio + (" leaks" if self.leaked_bytes else "")
        empty = sum(1 for r in self.layers if r.expected and not r.allocated)
        if empty:
            return f"{empty} layer{'s' if empty != 1 else ''} got 0 B"
        split = sum(1 for t in self.tensors if t.storages > 1)
        if split:
            return f"{split} shared tensor{'s' if split != 1 else ''} split"
        return ratio + (" leaks" if self.leaked_bytes else "")

    @property
    def over_allocated(self) -> bool:
        """The verdict's over-allocation rule: allocated bytes exceed the plan by more than the tolerance."""
        return exceeds_plan(self.allocated_bytes, self.expected_bytes, self.tolerance_bytes)

    @property
    def unattributed_bytes(self) -> int:
        """Bytes the meter saw that no layer's tensors live in."""
        return self.allocated_bytes - self.attributed_bytes

    def to_dict(self) -> dict:
        """JSON form (the ``audits[]`` entry of the report)."""
        return {
            "strategy": self.strategy, "title": self.strategy_title, "releases": self.strategy_releases,
            "meter": self.meter,
            "platform": self.plan.platform, "block_size": self.plan.block_size,
            "num_blocks": self.plan.num_blocks,
            "expected_bytes": self.expected_bytes, "allocated_bytes": self.allocated_bytes,
            "ratio": round(self.ratio, 6), "verdict": self.verdict.value, "reasons": list(self.reasons),
            "attributed_bytes": self.attributed_bytes, "unattributed_bytes": self.unattributed_bytes,
            "padding_bytes": self.padding_bytes, "allocations": self.allocations,
            "tolerance_bytes": self.tolerance_bytes,
            "alignment_allowance_bytes": self.alignment_allowance_bytes,
            "reading": self.reading.to_dict(), "rounding_bytes": self.rounding_bytes,
            "leaked_bytes": self.leaked_bytes,
            "after_release": self.after_release.to_dict() if self.after_release else None,
            "device_oom": self.device_oom.to_dict() if self.device_oom else None,
            "projected_bytes": self.projected_bytes,
            "projected_utilization": round(self.projected_utilization, 6),
            "requested_utilization": self.requested_utilization,
            "oom": self.oom.to_dict() if self.oom else None,
            "plan": self.plan.to_dict(),
            "groups": [{"group": g.group, "spec": g.spec, "layers": g.layers, "expected_bytes": g.expected,
                        "allocated_bytes": g.allocated} for g in self.groups],
            "tensors": [{"tensor": t.tensor, "expected_bytes": t.expected, "allocated_bytes": t.allocated,
                         "storages": t.storages, "padding_bytes": t.padding, "shared_by": list(t.shared_by)}
                        for t in self.tensors],
            "layers": [{"layer": r.layer, "group": r.group, "spec": r.spec, "tensor": r.tensor,
                        "expected_bytes": r.expected, "allocated_bytes": r.allocated,
                        "storages": r.storages, "shares_with": list(r.shares_with),
                        "planned_shares_with": list(r.planned_shares_with)} for r in self.layers],
        }


@dataclass(frozen=True)
class Report:
    """Everything one kvaudit run reports: the deployment, each strategy's audit, and what measured."""

    deployment: Any = field(repr=False)
    """The ``kvaudit.model.deployment.Deployment`` audited."""
    audits: tuple[AuditResult, ...]
    meter: str
    meter_device: str
    """What the meter measured on, e.g. ``cuda: NVIDIA H200 #0, 150,112,731,136 B total, ...``."""
    vllm_version: str | None
    skipped: tuple[tuple[str, str], ...] = ()
    """(strategy, reason) for each strategy that cannot allocate this plan at all."""
    capacity: dict = field(default_factory=dict)
    """Platform rule -> ``kvaudit.plan.capacity.Capacity`` of that rule's plan."""
    safe_utilization: dict = field(default_factory=dict)
    """Strategy -> the highest ``gpu_memory_utilization`` at which its allocation fits the device."""

    @property
    def exit_code(self) -> int:
        """0 when every strategy was audited and passed, 1 when any failed, else 3 when any could not run."""
        if any(r.verdict is not Verdict.PASS for r in self.audits):
            return 1
        return 3 if self.skipped else 0


@dataclass(frozen=True)
class PlanStage:
    """``kvaudit plan`` for one pipeline stage: its plans (one per platform rule), their capacity,
    and per strategy the highest safe utilization."""

    deployment: Any = field(repr=False)
    """The ``kvaudit.model.deployment.Deployment`` planned."""
    plans: dict[str, KVPlan]
    capacity: dict[str, Any]
    strategies: dict[str, str]
    """Strategy -> the platform rule its plan uses."""
    safe_utilization: dict[str, float | None]
    refused: dict[str, str]
    """Strategy -> why vLLM cannot plan it (not audited)."""

    def to_dict(self) -> dict:
        """JSON form."""
        return {"deployment": self.deployment.to_dict(),
                "plans": [{**plan.to_dict(), "capacity": self.capacity[name].to_dict(),
                           "strategies": [s for s, pl in self.strategies.items() if pl == name]}
                          for name, plan in self.plans.items()],
                "highest_safe_utilization": dict(self.safe_utilization), "not_planned": dict(self.refused)}
