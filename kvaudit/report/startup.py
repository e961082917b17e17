"""The start-up lines the emulated vLLM (or vllm-ascend) release would log for a deployment, in its wording.

A user diffs them against a real log. The wording and the definition of "KV cache size: N tokens" are each
release's own (``vllm/v1/core/kv_cache_utils.py``, ``vllm/v1/worker/gpu_model_runner.py``,
``vllm/v1/worker/gpu_worker.py``; vllm-ascend's ``worker_v1.py`` and ``model_runner_v1.py``); each era's first
release is one of the constants below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvaudit.model.deployment import Deployment
from kvaudit.model.memory import GRAPH_ESTIMATE_LOGGED_FROM
from kvaudit.results import KVPlan
from kvaudit.versions import version_key

if TYPE_CHECKING:
    from kvaudit.plan.capacity import Capacity

TOKENS_AS_CONCURRENCY_FROM = "0.20.1"
"""The first vLLM release whose "GPU KV cache size: N tokens" is ``int(max concurrency × max_model_len)``
(``_report_kv_cache_config``, after issue #40691; read in the 0.20.0, 0.20.1, 0.20.2 and 0.21.0 sdists: the patch
release 0.20.1 brought it); before it, ``num_blocks // len(kv_cache_groups) × block_size``.
For hybrid and sliding-window models the two differ severalfold."""
ONE_CAPACITY_LINE_FROM = "0.28.0"
"""The first vLLM release that logs size and concurrency in one line (``update_kv_cache_capacity``)."""
DEVICE_NAME_FROM = "0.30.0"
"""From here the line names the device type ("NPU KV cache size" on Ascend, ``_kv_cache_device_name``)."""
FORMAT_GIB_FROM = "0.14.0"
"""The first vLLM release that prints "Model loading took" and "Available KV cache memory" by ``format_gib``
(``round(b / GiB, 2)``, trailing zeros dropped); before it ``%.4f`` and ``%.2f``."""
LOADING_MEMORY_WORD_FROM = "0.12.0"
"""From here "Model loading took X GiB memory and ..." (0.11: "X GiB and ...")."""
PER_GROUP_CONCURRENCY_FROM = "0.27.0"
"""The first vLLM release whose "Maximum concurrency" counts each group's blocks per request on its own pages (PR
#48317, ``get_max_concurrency_for_kv_cache_config``); before it, every group's memory per request over group 0's
page times the largest group's layers. The two differ for hybrid models."""
ASCEND_GIB_BUDGET_FROM = "0.15.0"
"""vllm-ascend's worker logs "Available memory: A, total memory: T" in bytes up to v0.14 (which pins vLLM 0.14.1)
and "Available KV cache memory: X GiB" from v0.15 (PR #6625, vLLM's memory profiler)."""


def _at_least(release: str, first: str) -> bool:
    return version_key(release) >= version_key(first)


def _gib(b: float, release: str, digits: int) -> str:
    return f"{round(b / (1 << 30), 2)}" if _at_least(release, FORMAT_GIB_FROM) else f"{b / (1 << 30):.{digits}f}"


def max_concurrency(plan: KVPlan, cap: Capacity, release: str) -> float:
    """"Maximum concurrency for L tokens per request" as ``release`` computes it from vLLM's plan: the planning
    vLLM's own figure (``capacity``) where its formula is the release's, or where the plan's vLLM objects are not
    at hand (a saved plan); otherwise the release's formula, restated."""
    cfg, vc = plan.kv_cache_config, plan.vllm_config
    same = _at_least(release, PER_GROUP_CONCURRENCY_FROM) == _at_least(plan.vllm_version or "0", PER_GROUP_CONCURRENCY_FROM)
    if same or cfg is None or vc is None:
        return cap.max_concurrency
    groups = [g.kv_cache_spec for g in cfg.kv_cache_groups]
    if _at_least(release, PER_GROUP_CONCURRENCY_FROM):
        per_request = sum(-(-s.max_memory_usage_bytes(vc) // s.page_size_bytes) for s in groups)
    else:
        layers = max(len(g.layer_names) for g in cfg.kv_cache_groups)
        per_request = -(-layers * sum(s.max_memory_usage_bytes(vc) for s in groups) // (groups[0].page_size_bytes * layers))
    return cfg.num_blocks / per_request


def kv_cache_tokens(plan: KVPlan, cap: Capacity, release: str) -> int:
    """"KV cache size: N tokens" by the definition of ``release``."""
    if _at_least(release, TOKENS_AS_CONCURRENCY_FROM):
        return int(max_concurrency(plan, cap, release) * cap.max_model_len)
    return plan.num_blocks // max(len(plan.groups), 1) * min(g.block_size for g in plan.groups)


def lines(d: Deployment, plan: KVPlan, cap: Capacity) -> list[str]:
    """What the emulated release logs at start-up for the deployment, in its wording (the model-loading time,
    which kvaudit cannot know, as ``...``)."""
    release = d.vllm_version or "0"
    out: list[str] = []
    if d.platform == "ascend":
        out.append(f"Loading model weights took {d.weights_bytes / (1 << 30):.4f} GB")
        if not _at_least(release, ASCEND_GIB_BUDGET_FROM):
            out.append(f"Available memory: {d.kv_budget_bytes}, total memory: {d.device_memory_bytes}")
        else:
            out.append(f"Available KV cache memory: {d.kv_budget_bytes / (1 << 30):.2f} GiB")
    else:
        memory = " memory" if _at_least(release, LOADING_MEMORY_WORD_FROM) else ""
        out.append(f"Model loading took {_gib(d.weights_bytes, release, 4)} GiB{memory} and ... seconds")
        graphs = next((t for t in d.overhead_terms if t.key == "cuda_graphs"), None)
        if graphs is not None and _at_least(release, GRAPH_ESTIMATE_LOGGED_FROM):
            out.append(f"Estimated CUDA graph memory: {graphs.bytes / (1 << 30):.2f} GiB total")
        out.append(f"Available KV cache memory: {_gib(d.kv_budget_bytes, release, 2)} GiB")
    one_line = _at_least(release, ONE_CAPACITY_LINE_FROM)
    device = "NPU" if d.platform == "ascend" and _at_least(release, DEVICE_NAME_FROM) else "GPU"
    tokens = f"{device} KV cache size: {kv_cache_tokens(plan, cap, release):,} tokens"
    conc = f"Maximum concurrency for {cap.max_model_len:,} tokens per request: {max_concurrency(plan, cap, release):.2f}x"
    if one_line:
        out.append(f"{tokens}, {conc}")
    else:
        out += [tokens, conc]
    return out


def own_plans(d: Deployment, plans: dict[str, KVPlan]) -> list[str]:
    """The plans (by rule name) the deployment's own platform makes: ``cuda`` on CUDA, the ``ascend-*`` rules on
    Ascend; the start-up lines are those plans'."""
    return [name for name in plans if (name == "cuda") == (d.platform == "cuda")]


def report_dict(d: Deployment, plan: KVPlan, cap: Capacity) -> dict[str, Any]:
    """The lines and the figures they carry, for JSON."""
    return {"plan": plan.name, "vllm_version": d.vllm_version, "lines": lines(d, plan, cap),
            "kv_cache_tokens": kv_cache_tokens(plan, cap, d.vllm_version or "0"),
            "max_concurrency": max_concurrency(plan, cap, d.vllm_version or "0"), "num_blocks": plan.num_blocks}
