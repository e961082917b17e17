"""What changed vLLM's memory use between releases: defaults and profiling that a launch which worked on one release
meets on the next. Each change names the release that brought it, its public source, the cause triage gives it and
the fix. A report that names a working and a failing release is explained by the changes between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvaudit.model.memory import FULL_AND_PIECEWISE_FROM, GRAPH_ESTIMATE_FROM
from kvaudit.versions import version_key


@dataclass(frozen=True)
class Change:
    """One change of memory use, from ``release`` on."""

    release: str
    what: str
    cause: str
    """The triage cause it explains (``kvaudit.triage.causes.CAUSES``)."""
    fix: str
    source: str
    named_by: tuple[str, ...] = ()
    """What a report calls the change by (its switch, its log line), lower-cased: a report naming one has met it."""


CHANGES: tuple[Change, ...] = (
    Change("0.2.5", "the profile run counts all memory in use on the device as this engine's (free memory is read "
           "from the device, not from this process's allocations), so memory another process holds leaves less "
           "for the KV cache", "another-process",
           "give each engine its own device, or lower `--gpu-memory-utilization` by what the others hold",
           "vLLM PR #2031 (worker.py profile_num_available_blocks reads torch.cuda.mem_get_info)"),
    Change("0.2.7", "CUDA graphs are captured by default (`enforce_eager=False`), GPTQ models included; the graphs' "
           "memory comes on top of the KV cache", "default-changed",
           "`--enforce-eager`, or a lower `--gpu-memory-utilization` to leave the graphs room",
           "vLLM PR #1926 (CUDA graph support, v0.2.7 release notes)"),
    Change("0.6.4", "the profile run's peak is measured with the memory PyTorch and non-torch allocations held during "
           "it, so less is left for the KV cache than 0.6.3 planned", "default-changed",
           "a lower `--max-num-seqs` / `--max-num-batched-tokens` (a smaller profile batch), or a higher "
           "`--gpu-memory-utilization` where the device has room",
           "vLLM PR #9352 (more accurate memory profiling, vllm/utils.py memory_profiling)"),
    Change("0.8.0", "the V1 engine is the default: `vllm serve` schedules up to 1,024 sequences (V0: 256) and "
           "captures piecewise CUDA graphs for batch sizes up to 512, so the profile run, the sampler's warm-up and "
           "graph capture need more memory", "default-changed",
           "`--max-num-seqs 256` (V0's default), a lower `--gpu-memory-utilization`, or `--enforce-eager`; "
           "`VLLM_USE_V1=0` while V0 exists (to 0.10)",
           "vLLM PR #13726 (V1 on by default, v0.8.0), vllm/engine/arg_utils.py _set_default_args_v1"),
    Change(FULL_AND_PIECEWISE_FROM, "CUDA graphs are captured as FULL_AND_PIECEWISE by default: full decode graphs as well as the "
           "piecewise ones, so graph capture needs more memory", "default-changed",
           "`--compilation-config '{\"cudagraph_mode\": \"PIECEWISE\"}'`, `--enforce-eager`, or a lower "
           "`--gpu-memory-utilization`",
           "vLLM v0.11.0 release notes (\"turns on FULL_AND_PIECEWISE as the CUDA graph mode default\")"),
    Change(GRAPH_ESTIMATE_FROM, "the profile run estimates the CUDA graphs' memory and takes it from the KV budget "
           "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default), so the same utilization leaves a smaller KV "
           "cache", "default-changed",
           "the higher `--gpu-memory-utilization` vLLM's start-up log suggests, `--kv-cache-memory`, or "
           "`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0`",
           "vLLM PR #30515 (account for CUDA graphs during memory profiling); vllm/envs.py defaults "
           "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS to 1 from 0.20.0 (its comment says \"as of v0.21.0\")", ("vllm_memory_profiler_estimate_cudagraphs", "cuda graph memory profiling is enabled")),
    Change("0.25.0", "Model Runner V2 is the default for dense models, and its profile_cudagraph_memory() reserved "
           "nothing for CUDA graphs, so the KV cache took the whole budget and graph capture (or a later batch) ran "
           "out", "default-changed",
           "`VLLM_USE_V2_MODEL_RUNNER=0` (the previous runner), or a lower `--gpu-memory-utilization`",
           "vLLM PR #44443 (Model Runner V2 on by default for dense models, v0.25.0); vllm issue #49224; fixed by "
           "vLLM PR #53306 (reserve CUDA graph memory)", ("model runner v2", "vllm_use_v2_model_runner", "mrv2")),
)
"""The changes, oldest first."""


def between(works: str, fails: str) -> list[Change]:
    """The changes a launch meets going from the release it worked on to the one it failed on (none when the
    failing release is the older one)."""
    lo, hi = version_key(works), version_key(fails)
    return [c for c in CHANGES if lo < version_key(c.release) <= hi]


def since_before(fails: str) -> list[Change]:
    """The changes of the failing release itself (what "worked in the previous versions" points to)."""
    key = version_key(fails)
    return [c for c in CHANGES if version_key(c.release)[:2] == key[:2] and version_key(c.release) <= key]
