"""The strategy type: a named KV-cache allocation algorithm, the platform rule its plans are made with,
and what it returns (layer name -> raw tensor, or a tuple of tensors). ``KVBudget`` (a release worker's own
KV budget rule) is the planner's and is re-exported here for plugin authors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Union

from kvaudit.plan.planner import KVBudget
from kvaudit.results import KVPlan

if TYPE_CHECKING:
    import torch

RawTensors = dict[str, Union["torch.Tensor", tuple["torch.Tensor", ...]]]
ALIGNMENT = 2 * 1024 * 1024
"""vllm-ascend's P/D (KV transfer) buffer alignment, ``alignment = 2 * 1024 * 1024``."""


@dataclass(frozen=True)
class Strategy:
    """A named allocation algorithm and the platform rule its plans are made with."""

    name: str
    title: str
    platform: str
    """Key of ``kvaudit.plan.planner.PLATFORMS``: the block-size rule of the release this strategy models."""
    releases: str
    allocate: Callable[[KVPlan, Any, bool], RawTensors]
    """``allocate(plan, device, kv_transfer)``."""
    note: str = ""
    """What a user must know about what this strategy audits (printed with the report)."""
    kv_budget: KVBudget | None = None
    """The KV budget the release's worker hands vLLM's planner, where it is not the deployment's
    (``kvaudit.strategies.releases.kv_budget_rule``): the strategy's plan is then made with it."""
    prepare: Callable[[KVPlan], None] | None = None
    """Loads what ``allocate`` needs for ``plan`` (vLLM's modules and objects) before the meter's window
    opens, so that imports are not measured as the strategy's allocation; raises ``NotAuditable`` when
    the strategy cannot run here."""
