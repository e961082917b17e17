"""The strategy type: a named KV-cache allocation algorithm, the platform rule its plans are made with,
and what it returns (layer name -> raw tensor, or a tuple of tensors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Union

from kvaudit.results import KVPlan

if TYPE_CHECKING:
    import torch

RawTensors = dict[str, Union["torch.Tensor", tuple["torch.Tensor", ...]]]
ALIGNMENT = 2 * 1024 * 1024
"""vllm-ascend's P/D (KV transfer) buffer alignment, ``alignment = 2 * 1024 * 1024``."""


@dataclass(frozen=True)
class KVBudget:
    """A release worker's own rule for the KV budget it hands vLLM's planner."""

    by: str
    """Whose code it runs (``vllm-ascend 0.30.0rc2's NPUWorker._scale_kv_cache_memory_for_multi_group``)."""
    scale: Callable[[int, Any, dict, bool], int]
    """``scale(available, vllm_config, kv_cache_spec, kv_transfer)``: the budget the planner gets for a
    deployment whose KV budget is ``available`` bytes."""


@dataclass(frozen=True)
class Strategy:
    """A named allocation algorithm and the platform rule its plans are made with."""

    name: str
    title: str
    platform: str
    """Key of ``kvaudit.plan.PLATFORMS``: the block-size rule of the release this strategy models."""
    releases: str
    allocate: Callable[[KVPlan, Any, bool], RawTensors]
    """``allocate(plan, device, kv_transfer)``."""
    note: str = ""
    """What a user must know about what this strategy audits (printed with the report)."""
    kv_budget: KVBudget | None = None
    """The KV budget the release's worker hands vLLM's planner, where it is not the deployment's
    (``kvaudit.releases.kv_budget_rule``): the strategy's plan is then made with it."""
    prepare: Callable[[KVPlan], None] | None = None
    """Loads what ``allocate`` needs for ``plan`` (vLLM's modules and objects) before the meter's window
    opens, so that imports are not measured as the strategy's allocation; raises ``NotAuditable`` when
    the strategy cannot run here."""
