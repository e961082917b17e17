"""``--strategy installed``: the KV-cache allocation code installed in this environment.

- vllm-ascend installed (an Ascend host): ``NPUModelRunner``'s allocation method, read from the
  installed source and run on a runner stand-in, like a published release (``kvaudit.strategies.releases``);
- else vLLM 0.29+: its ``vllm.v1.worker.utils.allocate_kv_cache``, called as the model runner calls it;
- else vLLM up to 0.28: ``GPUModelRunner._allocate_kv_cache_tensors`` on a runner stand-in.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
from typing import Any

from kvaudit.errors import StrategyFailed
from kvaudit.plan.planner import load_vllm, vllm_version
from kvaudit.results import KVPlan
from kvaudit.strategies.releases import RUNNER_CLASS, RUNNER_MODULE, allocate_extracted, kv_budget_rule, platform_for
from kvaudit.strategies.runner_code import Extracted, extract_allocator, installed_tree
from kvaudit.strategies.strategy import RawTensors, Strategy

_ALLOCATE_KV_CACHE_PARAMS = ("kv_cache_config", "device", "layout")


def installed_strategy() -> Strategy:
    """The strategy for whatever allocator this environment has; none is exit 3."""
    if importlib.util.find_spec("vllm_ascend") is not None:
        return _vllm_ascend()
    version = vllm_version()
    if version is None:
        raise StrategyFailed("--strategy installed: no KV-cache allocator is installed here "
                             "(neither vllm-ascend nor vLLM)")
    utils = load_vllm().worker_utils
    found = (_allocate_kv_cache(utils.allocate_kv_cache, version) if hasattr(utils, "allocate_kv_cache")
             else _gpu_model_runner(version))
    return dataclasses.replace(
        found, releases=f"vLLM {version} (installed; no vllm-ascend)",
        note=f"--strategy installed: vllm-ascend is not installed here, so this audits upstream vLLM {version}'s "
             f"{found.title}")


def _vllm_ascend() -> Strategy:
    version = importlib.metadata.version("vllm-ascend")
    label = f"vllm-ascend {version} (installed)"
    tree = installed_tree("vllm_ascend", label)
    assert tree is not None
    code = extract_allocator(tree, RUNNER_MODULE, RUNNER_CLASS)
    return Strategy("installed", code.method, platform_for(version), label,
                    lambda plan, device, kv_transfer=False: allocate_extracted(code, plan, device, kv_transfer),
                    kv_budget=kv_budget_rule(tree, label))


def _allocate_kv_cache(fn: Any, version: str) -> Strategy:
    params = tuple(inspect.signature(fn).parameters)
    if params[:3] != _ALLOCATE_KV_CACHE_PARAMS:
        raise StrategyFailed(f"vLLM {version}: allocate_kv_cache({', '.join(params)}) has a signature kvaudit "
                             f"does not know (it calls allocate_kv_cache({', '.join(_ALLOCATE_KV_CACHE_PARAMS)}))")

    def allocate(plan: KVPlan, device: Any, kv_transfer: bool = False) -> RawTensors:
        if plan.plan_format != "layers":
            raise StrategyFailed(f"vLLM {version}'s allocate_kv_cache needs a 0.29+ plan, got {plan.plan_format}")
        from kvaudit.plan.planfile import vllm_objects

        config, layout = vllm_objects(plan, f"vLLM {version}'s allocate_kv_cache")
        return fn(config, device, layout)

    return Strategy("installed", "vllm.v1.worker.utils.allocate_kv_cache", "cuda",
                    f"vLLM {version} (installed)", allocate)


def _gpu_model_runner(version: str) -> Strategy:
    label = f"vLLM {version} (installed)"
    tree = installed_tree("vllm", label)
    assert tree is not None
    code: Extracted = extract_allocator(tree, "vllm.v1.worker.gpu_model_runner", "GPUModelRunner")

    def allocate(plan: KVPlan, device: Any, kv_transfer: bool = False) -> RawTensors:
        plan.require_live(label)
        return code.call(plan.shared_by_config(), {"device": device, "runner_only_attn_layers": set()})

    return Strategy("installed", code.method, "cuda", label, allocate)
