"""The memory one rank holds besides its weights and KV cache, term by term, as the emulated vLLM release budgets it.

vLLM's worker measures this on the device at start-up (``Worker.determine_available_memory``, which runs
``profile_run`` under ``vllm/utils/mem_utils.py``'s ``memory_profiling``)::

    KV budget = device memory × gpu_memory_utilization − weights − peak activation − non-torch − graph estimate

kvaudit has no device, so each measured term is modelled from the code vLLM runs to produce it, with
the constants named below, each set once from public start-up logs that print vLLM's own figures ("Non-KV
memory and start-up lines" in docs/audit.md names them; ``bench/startup.py`` measures the result). What vLLM
computes itself is asked of vLLM: the batch sizes and
sequence counts (its engine config), the CUDA-graph capture sizes (``VllmConfig._set_cudagraph_sizes``),
the model's dimensions per rank (``ModelConfig``).

- **peak activation**: what ``profile_run`` adds to the torch allocator's peak: the model's forward over
  ``max_num_batched_tokens`` dummy tokens (``_dummy_run``), then the sampler's dummy run over
  ``min(max_num_seqs, max_num_batched_tokens)`` rows of vocabulary-wide logits (``_dummy_sampler_run``).
- **non-torch**: memory the process holds outside torch's allocator, grown from vLLM's baseline snapshot to
  after profiling: workspaces, and with TP or PP peers the collective library's buffers (NCCL on CUDA, HCCL on
  Ascend, where vllm-ascend up to v0.14 counts all of the process's non-torch memory).
- **CUDA graphs**: vLLM ≥ ``GRAPH_ESTIMATE_FROM`` estimates the graphs' pool (``profile_cudagraph_memory``:
  the first capture of each mode plus one per-graph increment for each further graph) and subtracts it;
  older releases capture after the KV cache is allocated, so the graphs take memory beyond the budget.
  vllm-ascend does not subtract ACL-graph memory (``NPUWorker.determine_available_memory``).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

from kvaudit.errors import UsageError
from kvaudit.model.spec import EXPERT_COUNTS
from kvaudit.model.vllm_modules import module
from kvaudit.units import GiB, MiB
from kvaudit.versions import version_key

# --- constants set once from public logs (docs/audit.md, "Non-KV memory", names each source) ------

FORWARD_SCALE = 1.75
"""The profile forward's torch peak over the structural width of one decoder layer (``_forward_width``)."""
NON_TORCH_BYTES = {"cuda": 64 * MiB, "ascend": 1024 * MiB}
"""Non-torch memory of one rank with no peers, grown after vLLM's baseline snapshot (cuBLAS / attention
workspaces); on Ascend, vllm-ascend ≤ 0.14 counts the whole process's non-torch memory (``total - free -
allocated``), so this is larger there."""
COLLECTIVE_BYTES = {"cuda": 96 * MiB, "ascend": 256 * MiB}
"""Added once a rank has TP or PP peers: the collective library's buffers grown after the baseline (NCCL's on
first use; vLLM's symmetric-memory and custom all-reduce buffers are made with the communicator, before it)."""
MOE_COLLECTIVE_BYTES = {"cuda": 0, "ascend": 800 * MiB}
"""Added for an MoE model whose rank has peers on Ascend: vllm-ascend's ``mc2`` group (its own HCCL communicator
for MoE dispatch and combine, ``vllm_ascend/distributed/parallel_state.py``) allocates its buffers on first use,
in the profile run."""
BASIS = {
    "peak_activation": "vLLM's profile_run; FORWARD_SCALE from 2 public logs that print vLLM's peak, the sampler's "
                       "copies traced from Sampler.forward",
    "non_torch": {"cuda": "vLLM's memory_profiling; from 2 public logs that print it",
                  "ascend": "vllm-ascend's memory profile; from the development starts and 1 public 310P log"},
    "cuda_graphs": "vLLM's profile_cudagraph_memory; the per-graph increment from 2 public logs, 0.49-1.65x of vLLM's "
                   "own estimate in 4 more",
}
"""What each term follows (vLLM's code) and how many public logs set its constant (docs/audit.md, "Non-KV memory and
start-up lines", names them): the report shows it beside the term."""
GRAPH_ESTIMATE_SPREAD = (0.49, 1.65)
"""kvaudit's CUDA-graph term over vLLM's own estimate, lowest and highest, in the 4 public logs ``BASIS`` names: vLLM's
graph pool may be up to ``1 / 0.49`` of the term (``kvaudit live`` allows that much where the release does not budget
the pool)."""
GRAPH_BYTES_PER_LAYER = 384 * 1024
"""One CUDA graph's increment per decoder layer (its nodes and their private memory)."""
GRAPH_FIRST_SCALE = 1.0
"""The first capture of a mode over the activation width of its largest batch (the pool's buffers)."""

# --- release eras (vLLM's own code, read per release; docs/audit.md, "Non-KV memory", cites them) -------------------

SAMPLER_COPIES = (("0.12.0", 3.5), ("0.17.0", 7.0), (None, 3.5))
"""The sampler dummy run's peak in float32 copies of its ``[rows, vocabulary]`` logits, by era (first release
not in it, copies): top-k/top-p by FlashInfer or, from 0.17, vLLM's in-place Triton kernel (bf16 logits 0.5,
their float32 copy 1, probabilities 1, the Gumbel noise 1: 3.5); 0.12-0.16 sort in PyTorch by default (values 1,
int64 indices 2, masks and the scatter: 7). vLLM 0.11's image ships FlashInfer (3.5)."""
FULL_AND_PIECEWISE_FROM = "0.11.0"
"""The first vLLM release whose default ``cudagraph_mode`` is FULL_AND_PIECEWISE (FULL graphs for decode batches as well
as the PIECEWISE ones: the v0.11.0 release notes); before it V1 captured PIECEWISE graphs only."""
GRAPH_ESTIMATE_LOGGED_FROM = "0.18.0"
"""The first vLLM release that estimates the graphs' memory and logs it ("Estimated CUDA graph memory: X GiB
total", PR #30515), subtracted or not."""
GRAPH_ESTIMATE_FROM = "0.20.0"
"""The first vLLM release that subtracts its CUDA-graph estimate from the KV budget by default
(``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to 1 from 0.20.0; the estimate came with PR #30515 in
0.18.0, off by default; vLLM's own log line says "default since v0.21.0"). vllm-ascend subtracts no graph memory
(only v0.21.0rc1 and v0.22.1rc1 did, PR #9865, reverted by #11562)."""


UTILIZATION_DEFAULTS = (("0.20.0", 0.9), (None, 0.92))
"""vLLM's default ``gpu_memory_utilization`` by era (first release not in it, default): ``CacheConfig`` in
``vllm/config/cache.py`` declares 0.9 up to 0.19.1 and 0.92 from 0.20.0 (read in both sdists); ``EngineArgs`` and
so ``--gpu-memory-utilization`` take it from there. The one place kvaudit states it."""


def budget_eras() -> tuple[str, ...]:
    """The first release of each era of the KV budget this module models (the sampler's copies, the graph estimate
    subtracted), newest last: where a server's num_gpu_blocks differs from its own release's plan, the era whose
    formula gives its figure tells which budget it ran."""
    starts = {first for first, _ in SAMPLER_COPIES if first} | {GRAPH_ESTIMATE_FROM}
    return ("0.10.0", *sorted(starts, key=version_key))


def default_gpu_memory_utilization(release: str | None) -> float:
    """vLLM's default ``gpu_memory_utilization`` in ``release`` (the newest era's where the release is unknown or is
    not a version: a report's "72b启动失败")."""
    known = release is not None and len(version_key(str(release))) > 1
    return float(_era(UTILIZATION_DEFAULTS, str(release)) if known else UTILIZATION_DEFAULTS[-1][1])


def default_utilization_text() -> str:
    """vLLM's default utilization in words, every era: ``0.92 (0.9 before vLLM 0.20.0)``."""
    (first, old), (_, new) = UTILIZATION_DEFAULTS
    return f"{new:g} ({old:g} before vLLM {first})"


def _era(eras: tuple, release: str) -> object:
    key = version_key(release)
    return next(value for end, value in eras if end is None or key < version_key(end))


@dataclass(frozen=True)
class Term:
    """One part of the non-KV memory: its bytes and where the figure comes from."""

    key: str
    """``peak_activation``, ``non_torch``, ``cuda_graphs`` or ``overhead`` (``--overhead``)."""
    bytes: int
    source: str
    budgeted: bool = True
    """Whether the emulated release subtracts it from the KV budget; a graph pool it does not subtract is
    device memory in use beyond ``device memory × utilization``."""

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "bytes": self.bytes, "source": self.source, "budgeted": self.budgeted}


TITLES = {"peak_activation": "peak activation", "non_torch": "non-torch", "cuda_graphs": "CUDA graphs",
          "overhead": "other non-KV (--overhead)"}


def _dims(vc: Any) -> dict[str, int]:
    """The model's per-rank widths from vLLM's ``ModelConfig`` (heads and layers as vLLM divides them)."""
    mc, pc = vc.model_config, vc.parallel_config
    cfg = mc.hf_text_config
    tp, dp = pc.tensor_parallel_size, pc.data_parallel_size
    # vLLM's FusedMoEParallelConfig.make: experts split by width over DP × TP ranks, or whole with expert parallelism
    expert_split = 1 if pc.enable_expert_parallel and dp * tp > 1 else dp * tp

    def get(*names: str) -> int:
        for n in names:
            v = getattr(cfg, n, None)
            if isinstance(v, int) and v > 0:
                return v
        return 0

    experts = get(*EXPERT_COUNTS)
    return {
        "hidden": mc.get_hidden_size(), "vocab": mc.get_vocab_size(), "layers": max(1, mc.get_num_layers(pc)),
        "q": mc.get_num_attention_heads(pc) * mc.get_head_size(), "kv": mc.get_num_kv_heads(pc) * mc.get_head_size(),
        "dense": -(-get("intermediate_size", "ffn_hidden_size") // tp),
        "experts": experts, "topk": get("num_experts_per_tok", "experts_per_token", "moe_topk") if experts else 0,
        "moe": -(-get("moe_intermediate_size", "expert_intermediate_size", "intermediate_size") // expert_split)
        if experts else 0,
        "gathered": dp,  # an MoE layer's tokens per token of the rank's batch: the DP group's, all-gathered

        "shared": -(-(get("shared_expert_intermediate_size") or get("n_shared_experts") * get("moe_intermediate_size"))
                    // tp) if experts else 0,
    }


def _forward_width(dims: dict[str, int]) -> int:
    """Values per token live at a decoder layer's widest point: the residual stream (hidden states, residual,
    normed input) plus the wider of attention (q, k, v and the output) and the MLP (the dense gate-up and
    activation; for MoE, the fused-experts workspaces vLLM's ``fused_experts`` allocates per routed token:
    ``max(2N, hidden)`` and ``N``, with N the expert width on this rank, for the tokens of every DP rank, which vLLM's
    default all-to-all, ``allgather_reducescatter``, gathers before the experts run)."""
    attn = dims["q"] * 2 + dims["kv"] * 2
    mlp = 3 * dims["dense"]
    if dims["experts"]:
        n = dims["moe"]
        mlp = max(mlp, dims["gathered"] * dims["topk"] * (max(2 * n, dims["hidden"]) + n)
                  + 3 * dims["shared"])  # (dense layers too)
    return 3 * dims["hidden"] + max(attn, mlp)


def _dtype_bytes(vc: Any) -> int:
    import torch

    return torch.empty((), dtype=vc.model_config.dtype, device="meta").element_size()


def peak_activation(vc: Any, platform: str, release: str, last_stage: bool = True) -> Term:
    """The profile run's peak beside the weights: the forward over ``max_num_batched_tokens`` tokens, then the
    sampler over its dummy rows with the forward's hidden states held. The two add up: the forward's widest buffers
    are vLLM's workspaces (fused-MoE, attention), which its workspace manager keeps allocated for the run, so they
    are still held when the sampler runs. Only the last PP stage samples."""
    dims, b = _dims(vc), _dtype_bytes(vc)
    tokens = vc.scheduler_config.max_num_batched_tokens
    rows = min(vc.scheduler_config.max_num_seqs, tokens)
    forward = int(FORWARD_SCALE * tokens * _forward_width(dims) * b)
    if not last_stage:
        return Term("peak_activation", forward, f"profile run: forward of {tokens:,} tokens ≈ {forward / GiB:.2f} GiB "
                                                f"(the sampler runs on the last PP stage) [{BASIS['peak_activation']}]")
    if platform == "ascend":  # vllm-ascend's _dummy_sampler_run computes the logits and samples nothing
        copies, what = b / 4, "logits"
    else:
        copies, what = float(_era(SAMPLER_COPIES, release)), "sampler"  # type: ignore[arg-type]
    sampler = tokens * dims["hidden"] * b + int(copies * rows * dims["vocab"] * 4)
    return Term("peak_activation", forward + sampler,
                f"profile run: forward of {tokens:,} tokens ≈ {forward / GiB:.2f} GiB + {what} over {rows:,} × "
                f"{dims['vocab']:,} logits ≈ {sampler / GiB:.2f} GiB [{BASIS['peak_activation']}]")


def non_torch(vc: Any, platform: str) -> Term:
    """Memory outside torch's allocator: workspaces, plus the collectives' buffers once the rank has peers (and on
    Ascend the MoE communication group's, for an MoE model)."""
    pc = vc.parallel_config
    peers = pc.tensor_parallel_size > 1 or pc.pipeline_parallel_size > 1 or pc.data_parallel_size > 1
    moe = peers and _dims(vc)["experts"] > 0 and MOE_COLLECTIVE_BYTES[platform] > 0
    lib = "HCCL" if platform == "ascend" else "NCCL"
    total = NON_TORCH_BYTES[platform] + (COLLECTIVE_BYTES[platform] if peers else 0) + (
        MOE_COLLECTIVE_BYTES[platform] if moe else 0)
    return Term("non_torch", total, "workspaces" + (
        f" + {lib} buffers (TP {pc.tensor_parallel_size}, PP {pc.pipeline_parallel_size}"
        + (f", DP {pc.data_parallel_size}" if pc.data_parallel_size > 1 else "") + ")" if peers else " (no peers)")
        + (" + the MoE (mc2) group's HCCL buffers" if moe else "") + f" [{BASIS['non_torch'][platform]}]")


def capture_sizes(vc: Any, max_capture: int | None = None) -> list[int]:
    """The batch sizes vLLM captures CUDA graphs for, by vLLM's own ``VllmConfig._set_cudagraph_sizes`` as a CUDA
    host runs it (this host's platform turns graphs off), up to ``--max-cudagraph-capture-size`` where given."""
    CUDAGraphMode = module("vllm.config").CUDAGraphMode
    if vc.model_config.enforce_eager:
        return []
    cc = vc.compilation_config
    if cc.cudagraph_mode not in (None, CUDAGraphMode.NONE) and cc.cudagraph_capture_sizes:
        return list(cc.cudagraph_capture_sizes)
    probe, cc2 = copy.copy(vc), copy.copy(cc)
    probe.compilation_config = cc2
    cc2.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    cc2.cudagraph_capture_sizes = None
    cc2.max_cudagraph_capture_size = max_capture
    probe._set_cudagraph_sizes()
    return list(cc2.cudagraph_capture_sizes or [])


def cuda_graphs(vc: Any, release: str, max_capture: int | None = None, mode: str | None = None) -> Term | None:
    """vLLM's CUDA-graph estimate as ``profile_cudagraph_memory`` forms it (per mode: the first capture plus one
    increment per further graph; FULL and PIECEWISE overlay in one pool). ``mode`` is ``cudagraph_mode``
    (``vllm/config/compilation.py`` ``CUDAGraphMode``; unset, the release's default: FULL_AND_PIECEWISE from
    ``FULL_AND_PIECEWISE_FROM``, PIECEWISE before): FULL graphs for decode batches up to ``max_num_seqs``
    (FULL_DECODE_ONLY, FULL_AND_PIECEWISE) or for every capture size (FULL), PIECEWISE for every capture size
    (PIECEWISE, FULL_AND_PIECEWISE); ``None`` with NONE or ``--enforce-eager``."""
    sizes = capture_sizes(vc, max_capture)
    default = "FULL_AND_PIECEWISE" if version_key(release) >= version_key(FULL_AND_PIECEWISE_FROM) else "PIECEWISE"
    mode = mode or default
    if not sizes:
        return None
    dims, b = _dims(vc), _dtype_bytes(vc)
    decode = [s for s in sizes if s <= vc.scheduler_config.max_num_seqs]
    full = {"FULL": sizes, "FULL_DECODE_ONLY": decode, "FULL_AND_PIECEWISE": decode}.get(mode, [])
    piecewise = sizes if mode in ("PIECEWISE", "FULL_AND_PIECEWISE") else []
    captured = full + piecewise
    if not captured:  # (NONE)
        return None
    first = int(GRAPH_FIRST_SCALE * max(captured) * _forward_width(dims) * b)
    per_graph = max(GRAPH_BYTES_PER_LAYER * dims["layers"], 1 << 20)
    total = first + per_graph * sum(len(graphs) - 1 for graphs in (full, piecewise) if graphs)
    budgeted, why = subtracts_graph_estimate(release)
    said = f" ({mode})" if mode != default else ""
    return Term("cuda_graphs", total,
                f"{len(full)} FULL + {len(piecewise)} PIECEWISE graphs{said} up to batch {max(captured)}: first capture "
                f"{first / GiB:.2f} GiB + {per_graph / MiB:.1f} MiB per further graph; " + why
                + f" [{BASIS['cuda_graphs']}]", budgeted)


GRAPH_ESTIMATE_SWITCH = "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"
"""vLLM's switch for subtracting its CUDA-graph estimate (``vllm/envs.py``: ``bool(int(...))``, default 0 in 0.18-0.19
and 1 from 0.20). Set where kvaudit runs, as where vLLM serves, it decides for every release that has the estimate."""


def subtracts_graph_estimate(release: str) -> tuple[bool, str]:
    """Whether vLLM ``release`` subtracts its CUDA-graph estimate from the KV budget, and the words that say why: the
    release's default, or ``GRAPH_ESTIMATE_SWITCH`` where it is set and the release has the estimate."""
    said = os.environ.get(GRAPH_ESTIMATE_SWITCH)
    if said is not None and version_key(release) >= version_key(GRAPH_ESTIMATE_LOGGED_FROM):
        try:
            on = bool(int(said))
        except ValueError:
            raise UsageError(f"{GRAPH_ESTIMATE_SWITCH}={said!r} is not an integer (vLLM reads it as int: 0 or 1)") from None
        return on, (f"vLLM {release} subtracts its estimate ({GRAPH_ESTIMATE_SWITCH}={said} here)" if on else
                    f"vLLM {release} does not subtract it ({GRAPH_ESTIMATE_SWITCH}={said} here): used beyond the budget")
    if version_key(release) >= version_key(GRAPH_ESTIMATE_FROM):
        return True, f"vLLM {release} subtracts its estimate"
    return False, f"vLLM {release} does not subtract it (before {GRAPH_ESTIMATE_FROM}): used beyond the budget"


def mm_limits(mc: Any, supported: bool = False) -> dict[str, Any] | None:
    """A multimodal model's items per prompt by modality, as vLLM's processing info for the model answers
    (``allowed_mm_limits``, with ``--limit-mm-per-prompt`` applied; ``supported``: the model's own
    ``supported_mm_limits``), or ``None`` where that info cannot be made without the model's tokenizer or processor
    files (Kimi-K2.5's asks its tokenizer), which a config alone does not have."""
    MULTIMODAL_REGISTRY = module("vllm.multimodal").MULTIMODAL_REGISTRY
    try:
        info = MULTIMODAL_REGISTRY.get_processing_info(mc)
        return dict(info.supported_mm_limits if supported else info.allowed_mm_limits)
    except (ValueError, OSError, TypeError, AttributeError):  # (vLLM's and transformers' refusals without the files)
        return None


def mm_encoder_profile(vc: Any) -> str | None:
    """What vLLM's ``profile_run`` holds for a multimodal model's encoder, which no term models, or ``None`` where it
    profiles none. vLLM runs the encoder over its largest item of each batch's worth (``MultiModalBudget``: the modality
    with the most tokens per item, as its HF processor computes them) and caches the outputs while the forward runs; the
    sizes need the model's processor files, which a config alone does not have. It skips the profile with
    ``--skip-mm-profiling``, and a modality whose limit is 0 (``--limit-mm-per-prompt``, ``--language-model-only``) is not
    profiled: ``allowed_mm_limits`` of vLLM's processing info for the model answers which are."""
    mc = vc.model_config
    mm = mc.multimodal_config
    if not mc.is_multimodal_model or mm is None or mm.skip_mm_profiling:
        return None
    limits = mm_limits(mc)
    profiled = sorted(m for m, n in limits.items() if n > 0) if limits is not None else ["its modalities"]
    if not profiled:
        return None
    return (f"the multimodal encoder's profile ({', '.join(profiled)}: vLLM runs the encoder on its largest item and "
            "caches the outputs during the profile run; the sizes come from the model's processor, which kvaudit does "
            "not load): the KV budget is an upper bound. --skip-mm-profiling or --limit-mm-per-prompt with 0 for each "
            "modality, where the server sets them, remove it; --overhead gives the whole non-KV memory")


def non_kv_terms(vc: Any, platform: str, release: str, last_stage: bool = True,
                 max_capture: int | None = None, mode: str | None = None) -> tuple[Term, ...]:
    """Every modelled term for the deployment ``vc`` describes, on ``cuda`` or ``ascend``, as ``release`` budgets
    it. ACL graphs on Ascend are not modelled: vllm-ascend does not subtract them."""
    terms = [peak_activation(vc, platform, release, last_stage), non_torch(vc, platform)]
    if platform == "cuda":
        graphs = cuda_graphs(vc, release, max_capture, mode)
        if graphs is not None:
            terms.append(graphs)
    return tuple(terms)
