"""The deployment being audited (model, TP, device, utilization) and the KV budget vLLM gives it.

vLLM's budget, on CUDA and on Ascend alike, is ``available = device memory × utilization − peak
non-KV memory``; the non-KV memory is the weights on one rank plus everything else the profile run
holds (activations, non-torch allocations such as communication buffers), the ``overhead`` here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvaudit.errors import UsageError, did_you_mean
from kvaudit.model.memory import Term
from kvaudit.model.spec import ModelSpec, load_model_spec
from kvaudit.units import MAX_BYTES
from kvaudit.versions import is_release


LIMITS = {"tp": 256, "pp": 128, "dp": 1024, "max_model_len": 1 << 28, "num_blocks": 1 << 30, "block_size": 1 << 16,
          "mm_items": 1 << 16, "max_num_seqs": 1 << 20, "max_num_batched_tokens": 1 << 28, "num_speculative_tokens": 64,
          "max_cudagraph_capture_size": 1 << 16}
"""The largest value kvaudit takes for each integer deployment option, far beyond any real deployment (TP 16-64
and PP 2-16 in public vllm-ascend and vLLM deployments; max_model_len as ``spec.AT_MOST``'s positions), so that
no option makes kvaudit build millions of objects. Byte options are bounded by ``units.MAX_BYTES``."""


@dataclass(frozen=True)
class Device:
    """A device kind and the total memory its runtime reports."""

    name: str
    title: str
    memory_bytes: int
    source: str
    platform: str = "cuda"
    """``cuda`` or ``ascend``: whose worker budgets the memory (``kvaudit.model.memory``)."""
    capability: tuple[int, int] = (9, 0)
    """The CUDA compute capability (vLLM picks kernels by it; Hopper unless named)."""


DEVICES: dict[str, Device] = {
    "atlas-a2-64g": Device(
        "atlas-a2-64g", "Atlas 800 A2 (Ascend 910B, 64 GB HBM)", 65_452_113_920,
        "vllm-ascend worker log 'total memory: 65452113920'; torch_npu reports 60.96 GiB total capacity", "ascend"),
    "atlas-a2-32g": Device(
        "atlas-a2-32g", "Atlas 300I A2 / 910B4 (32 GB HBM)", 31_662_800_896,
        "vllm-ascend worker log 'total memory: 31662800896' on a 32 GB card (29.49 GiB)", "ascend"),
    "h100-80g": Device(
        "h100-80g", "NVIDIA H100 80GB", round(79.19 * 2**30),
        "torch's CUDA out-of-memory message on H100 80GB cards, as pasted in public threads: 'GPU 0 has a "
        "total capacity of 79.19 GiB'; exact to 0.01 GiB"),
    "a100-80g": Device(
        "a100-80g", "NVIDIA A100 80GB", round(79.25 * 2**30),
        "torch's CUDA out-of-memory message on an A100 80GB, as pasted in levihsu/OOTDiffusion#235: '79.25 GiB total "
        "capacity'; exact to 0.01 GiB. vLLM gives A100s the smaller batch defaults whatever their memory "
        "(EngineArgs.get_batch_defaults checks the name)", capability=(8, 0)),
    "a100-40g": Device(
        "a100-40g", "NVIDIA A100 40GB", round(39.50 * 2**30),
        "torch's CUDA out-of-memory message on an A100 40GB, as pasted in TianheWu/CoSeR#10: 'a total capacity of "
        "39.50 GiB'; exact to 0.01 GiB", capability=(8, 0)),
    "h200-141g": Device(
        "h200-141g", "NVIDIA H200 141GB", round(139.81 * 2**30),
        "torch's CUDA out-of-memory message on H200 cards, as pasted in public threads: 'GPU 0 has a total "
        "capacity of 139.81 GiB'; exact to 0.01 GiB"),
    # The GPUs people own: torch's total as public reports print it (the new form, "GPU 0 has a total capacity of X
    # GiB", is cudaMemGetInfo's total, which vLLM's budget multiplies; the old form, "X GiB total capacity", is
    # totalGlobalMem and can differ). ECC mode, the driver and an attached display move it by up to 0.1 GiB.
    # Compute capability: NVIDIA's list, https://developer.nvidia.com/cuda-gpus, unless said otherwise.
    "l4-24g": Device(
        "l4-24g", "NVIDIA L4 24GB", round(22.03 * 2**30),
        "torch's CUDA out-of-memory message on an L4, ArcInstitute/evo2#190: 'GPU 0 has a total capacity of 22.03 "
        "GiB' (SageMaker g6 hosts print 21.96)", capability=(8, 9)),
    "l40s-48g": Device(
        "l40s-48g", "NVIDIA L40S 48GB", round(44.39 * 2**30),
        "vLLM's start-up log on 4x L40S (fixtures/startup-logs/cuda/awssamples-qwen3-coder-30b-4xl40s-tp4-v0.24.0.log, "
        "44.39 GiB); torch's message prints 44.42 on an L40S in stepfun-ai/Step-Video-T2V#8", capability=(8, 9)),
    "a10-24g": Device(
        "a10-24g", "NVIDIA A10 24GB", round(23.72 * 2**30),
        "vLLM's start-up check on an A10, kaito-project/kaito#1374: 'Free memory on device (21.37/23.72 GiB)' (one "
        "source; AWS's A10G prints 21.99)", capability=(8, 6)),
    "a6000-48g": Device(
        "a6000-48g", "NVIDIA RTX A6000 48GB", round(47.54 * 2**30),
        "torch's CUDA out-of-memory message on an RTX A6000 (ECC off), vllm-project/vllm#1201: '47.54 GiB total "
        "capacity' (the old form: totalGlobalMem)", capability=(8, 6)),
    "rtx3090-24g": Device(
        "rtx3090-24g", "NVIDIA GeForce RTX 3090 24GB", round(23.69 * 2**30),
        "torch's CUDA out-of-memory message beside an RTX 3090's nvidia-smi row, vllm-project/vllm#2140: 'GPU 0 has "
        "a total capacty of 23.69 GiB'", capability=(8, 6)),
    "rtx4090-24g": Device(
        "rtx4090-24g", "NVIDIA GeForce RTX 4090 24GB", round(23.64 * 2**30),
        "torch's CUDA out-of-memory message on a 4090, deepseek-ai/DeepSeek-V3#205: 'GPU 0 has a total capacity of "
        "23.64 GiB' (a card driving a display prints less)", capability=(8, 9)),
    "rtx5090-32g": Device(
        "rtx5090-32g", "NVIDIA GeForce RTX 5090 32GB", round(31.36 * 2**30),
        "torch's CUDA out-of-memory message on an RTX 5090, TrajectoryCrafter/TrajectoryCrafter#20: 'GPU 0 has a "
        "total capacity of 31.36 GiB' (Wan-Video/Wan2.1#465 prints 31.37)", capability=(12, 0)),
    "rtx-pro-6000-96g": Device(
        "rtx-pro-6000-96g", "NVIDIA RTX PRO 6000 Blackwell 96GB", round(95.01 * 2**30),
        "torch's CUDA out-of-memory message on RTX PRO 6000 Blackwell Server Edition cards (vLLM 0.27.1, driver "
        "610.43.02), quoted in the blog post 'Running a big LLM across multiple GPUs with vLLM' (S. Katara, S. Pathak, "
        "2026-08-18): 'a total capacity of 95.01 GiB'", capability=(12, 0)),
    "h20-96g": Device(
        "h20-96g", "NVIDIA H20 96GB", round(95.00 * 2**30),
        "torch's CUDA out-of-memory message on an H20 96G, modelscope/DiffSynth-Studio#1238: 'a total capacity of "
        "95.00 GiB' (one source); capability 9.0 from sglang's check_env on H20s, sgl-project/sglang#4572",
        capability=(9, 0)),
    "b200-192g": Device(
        "b200-192g", "NVIDIA B200", round(178.35 * 2**30),
        "torch's CUDA out-of-memory message on a B200, unslothai/unsloth#3411: 'GPU 0 has a total capacity of 178.35 "
        "GiB'", capability=(10, 0)),
    "gb200-186g": Device(
        "gb200-186g", "NVIDIA GB200", round(184.31 * 2**30),
        "torch's CUDA out-of-memory message on GB200s, vllm-project/vllm#43951 and #52511: 'a total capacity of "
        "184.31 GiB'", capability=(10, 0)),
    "gb10-128g": Device(
        "gb10-128g", "NVIDIA GB10 (DGX Spark) 128GB unified", round(121.69 * 2**30),
        "vLLM's start-up check on a DGX Spark, MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47: 'Free memory on "
        "device (110.37/121.69 GiB)' (unified memory: torch's own message prints about 119.7 GiB, and what is free "
        "depends on the host's use); vLLM keeps capability 12.1 on its small batch defaults", capability=(12, 1)),
}


def device_choice() -> str:
    """The device kinds, by platform, for an error that asks for one (docs/audit.md lists their memory)."""
    by: dict[str, list[str]] = {}
    for dev in DEVICES.values():
        by.setdefault(dev.platform, []).append(dev.name)
    names = {"cuda": "CUDA", "ascend": "Ascend"}
    return "; ".join(f"{names.get(p, p)}: {', '.join(kinds)}" for p, kinds in by.items())


@dataclass(frozen=True)
class Preset:
    """A shipped model config with a deployment that fits it."""

    name: str
    title: str
    config: str
    """Directory under ``fixtures/configs``."""
    tp: int
    max_model_len: int
    device: str
    description: str
    """The layer mix, from the public config (``kvaudit models`` shows vLLM's own count)."""


def _p(name: str, title: str, config: str, tp: int, max_model_len: int, device: str, description: str) -> Preset:
    return Preset(name, title, config, tp, max_model_len, device, description)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    _p("qwen3-next", "Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b-instruct", 4, 4096, "atlas-a2-64g",
       "hybrid GatedDeltaNet + full attention, as the vllm-ascend tutorial deploys it"),
    _p("llama-3.1-8b", "Llama-3.1-8B", "llama-3.1-8b", 1, 8192, "atlas-a2-64g", "dense control: full attention only"),
    _p("qwen2.5-7b", "Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct", 1, 32768, "atlas-a2-64g", "dense, full attention"),
    _p("qwen3-8b", "Qwen3-8B", "qwen3-8b", 1, 32768, "atlas-a2-64g", "dense, full attention"),
    _p("qwen3-30b-a3b", "Qwen3-30B-A3B", "qwen3-30b-a3b", 2, 32768, "atlas-a2-64g", "MoE, full attention"),
    _p("mixtral-8x7b", "Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b-instruct", 2, 32768, "atlas-a2-64g",
       "MoE, full attention"),
    _p("glm-4.5", "GLM-4.5", "glm-4.5", 8, 32768, "h200-141g", "MoE, full attention (one MTP layer)"),
    _p("minimax-m2", "MiniMax-M2", "minimax-m2", 8, 32768, "atlas-a2-64g", "MoE, full attention, FP8 weights"),
    _p("qwen3.5-27b", "Qwen3.5-27B", "qwen3.5-27b", 2, 32768, "atlas-a2-64g",
       "hybrid GatedDeltaNet + full attention (multimodal wrapper)"),
    _p("qwen3.5-397b-a17b", "Qwen3.5-397B-A17B", "qwen3.5-397b-a17b", 8, 32768, "h200-141g",
       "MoE hybrid GatedDeltaNet + full attention (multimodal wrapper)"),
    _p("gpt-oss-120b", "gpt-oss-120b", "gpt-oss-120b", 2, 32768, "atlas-a2-64g",
       "sliding window + full attention with sinks, MXFP4 experts"),
    _p("gemma-3-27b", "Gemma 3 27B it", "gemma-3-27b-it", 2, 32768, "atlas-a2-64g",
       "5 sliding-window : 1 full attention (multimodal wrapper)"),
    _p("deepseek-v3", "DeepSeek-V3 (R1 shares its config)", "deepseek-v3", 8, 32768, "h200-141g",
       "MLA, FP8 weights"),
    _p("kimi-k2", "Kimi-K2-Instruct", "kimi-k2-instruct", 8, 32768, "h200-141g", "MLA, FP8 weights"),
    _p("deepseek-v3.2", "DeepSeek-V3.2", "deepseek-v3.2-exp", 8, 32768, "h200-141g",
       "MLA + sparse-attention indexer cache, FP8 weights"),
    _p("nemotron-h-8b", "Nemotron-H-8B-Base-8K", "nemotron-h-8b", 1, 8192, "atlas-a2-64g", "Mamba2 + attention"),
    _p("nemotron-h-56b", "Nemotron-H-56B-Base-8K", "nemotron-h-56b", 4, 8192, "atlas-a2-64g", "Mamba2 + attention"),
    _p("granite-4.0-h-small", "Granite-4.0-H-Small", "granite-4.0-h-small", 2, 32768, "atlas-a2-64g",
       "Mamba2 + attention, MoE"),
    _p("falcon-h1-7b", "Falcon-H1-7B-Instruct", "falcon-h1-7b-instruct", 1, 32768, "atlas-a2-64g",
       "Mamba2 and attention in every layer"),
    _p("jamba-mini", "AI21 Jamba Mini (1.5 config)", "jamba-mini-1.7", 4, 32768, "atlas-a2-64g",
       "Mamba + attention (1:7), MoE"),
)}


_MODEL_NAMES: tuple[tuple[str, str, bool], ...] = (
    # (pattern on the normalised model name, preset, whether the preset *is* that model): first match wins.
    # A family match (False) shares the preset's layer kinds, so the allocators treat it alike, not its sizes.
    (r"qwen3-coder-next", "qwen3-next", False),
    (r"qwen3-next", "qwen3-next", True),  # one size: Qwen3-Next-80B-A3B (Instruct, Thinking)
    (r"qwen3\.5-397b-a17b", "qwen3.5-397b-a17b", True),
    (r"qwen3\.5-27b", "qwen3.5-27b", True),
    (r"qwen3\.5-.*a\d+b", "qwen3.5-397b-a17b", False),
    (r"qwen3\.5", "qwen3.5-27b", False),
    (r"qwen3-30b-a3b", "qwen3-30b-a3b", True),
    (r"qwen3-.*a\d+b", "qwen3-30b-a3b", False),
    (r"qwen3-8b", "qwen3-8b", True),
    (r"qwen3", "qwen3-8b", False),
    (r"qwen2\.5-7b", "qwen2.5-7b", True),
    (r"qwen2|qwq|deepseek-r1-(?:.*-)?(?:distill-(?:.*-)?qwen|qwen-(?:.*-)?distill)", "qwen2.5-7b", False),
    (r"llama-3\.1-8b|llama-3-1-8b", "llama-3.1-8b", True),
    (r"llama", "llama-3.1-8b", False),
    (r"mixtral-8x7b", "mixtral-8x7b", True),
    (r"mixtral", "mixtral-8x7b", False),
    (r"deepseek-v3\.2", "deepseek-v3.2", True),
    (r"deepseek-v3|deepseek-r1(?!.*distill)", "deepseek-v3", True),  # (R1's distilled models are their bases')
    (r"kimi-k2", "kimi-k2", True),
    (r"gemma-3-27b", "gemma-3-27b", True),
    (r"gemma-3", "gemma-3-27b", False),
    (r"gpt-oss-120b", "gpt-oss-120b", True),
    (r"gpt-oss", "gpt-oss-120b", False),
    (r"glm-4\.5$|glm-4\.5-fp8", "glm-4.5", True),
    (r"glm-4\.[56]", "glm-4.5", False),
    (r"minimax-m2", "minimax-m2", True),
    (r"nemotron-h-8b", "nemotron-h-8b", True),
    (r"nemotron-h-56b", "nemotron-h-56b", True),
    (r"nemotron-h", "nemotron-h-8b", False),
    (r"granite-4\.0-h-small", "granite-4.0-h-small", True),
    (r"granite-4\.0-h", "granite-4.0-h-small", False),
    (r"falcon-h1-7b", "falcon-h1-7b", True),
    (r"falcon-h1", "falcon-h1-7b", False),
    (r"jamba-(?:1\.[57]-)?mini", "jamba-mini", True),
    (r"jamba", "jamba-mini", False),
)


def preset_for_model(model: str) -> tuple[str, bool] | None:
    """The preset a model name (a hub id, a local path, a name in prose) refers to, and whether it is
    that very model (``True``) or one of its family with the same layer kinds (``False``)."""
    import re

    name = re.sub(r"[^a-z0-9.]+", "-", Path(model.strip().rstrip("/")).name.lower()).strip("-")
    name = re.sub(r"-(instruct|chat|base|thinking|it|hf|fp8|bf16|awq|gptq|w8a8|int[48])(?=-|$)", "", name)
    name = re.sub(r"^meta-", "", name)
    for pattern, preset, exact in _MODEL_NAMES:
        if re.search(pattern, name):
            return preset, exact
    return None


def fixtures_dir() -> Path:
    """The shipped configs: inside the wheel, or ``fixtures/configs`` in a source checkout."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "_fixtures" / "configs"
    return packaged if packaged.is_dir() else package.parent / "fixtures" / "configs"


def get_preset(name: str) -> Preset:
    """Look a preset up by name; an unknown name is a usage error."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown preset {name!r}{did_you_mean(name, PRESETS)} (known: {', '.join(PRESETS)})") from None


def load_preset_spec(preset: Preset) -> ModelSpec:
    """The preset's ``ModelSpec``, read from its shipped ``config.json``."""
    return load_model_spec(fixtures_dir() / preset.config, name=preset.title)


def load_model(preset: str | None, config: str | None, revision: str | None = None,
               trust_remote_code: bool = False) -> tuple[ModelSpec, Preset | None]:
    """The model spec of a preset or of a model as vLLM takes one (a Hub id at ``revision``, a model folder, a
    config.json: ``kvaudit.model.hub.locate``), exactly one of the two, and the preset if one was named."""
    from kvaudit.model.hub import locate, names_hub_model

    if (config is None) == (preset is None):
        raise UsageError("give exactly one of --model (a Hub id, a model folder or a config.json) or --preset NAME "
                         "(or run kvaudit MODEL)")
    p = get_preset(preset) if preset else None
    if p:
        if revision is not None:
            raise UsageError(f"--revision names a Hub revision; {preset} is a shipped preset")
        return load_preset_spec(p), p
    name = (config + (f"@{revision}" if revision else "")) if names_hub_model(config) else None
    return load_model_spec(locate(config, revision, trust_remote_code), name=name,
                           trust_remote_code=trust_remote_code), None


@dataclass(frozen=True)
class Deployment:
    """One rank of a vLLM deployment and the KV budget that follows from it.

    The option fields carry vLLM's names; ``dtype``, ``max_model_len`` and ``weights_bytes`` are the
    values vLLM resolved for them (``kvaudit.plan.planner.make_deployment``)."""

    model: ModelSpec = field(repr=False)
    tp: int
    dtype: str
    """The model dtype vLLM resolved (``--dtype auto`` follows vLLM's rule: float32 configs run in 16 bits)."""
    max_model_len: int
    device: str
    device_memory_bytes: int
    gpu_memory_utilization: float
    weights_bytes: int
    """Weights on one rank: the parameters and buffers of vLLM's model built for this rank (or ``--weights``)."""
    weights_source: str
    overhead_bytes: int
    """Non-KV memory beside the weights that the budget subtracts: the sum of the budgeted ``overhead_terms``."""
    kv_cache_memory_bytes: int | None
    """``--kv-cache-memory``: the KV budget given directly, as vLLM's flag of that name."""
    kv_transfer: bool
    num_blocks_override: int | None
    pp: int = 1
    pp_rank: int = 0
    dp: int = 1
    """vLLM's ``--data-parallel-size``: engines side by side, each with its own KV cache (the plan is one DP rank's)."""
    enable_expert_parallel: bool = False
    requested_dtype: str = "auto"
    architecture: str = ""
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    """vLLM's ``--quantization``; ``None`` takes the config's ``quantization_config``."""
    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    mamba_cache_mode: str | None = None
    max_num_seqs: int | None = None
    num_speculative_tokens: int = 0
    hf_overrides: dict | None = field(default=None, hash=False)
    max_num_batched_tokens: int | None = None
    max_cudagraph_capture_size: int | None = None
    """vLLM's ``--max-cudagraph-capture-size``: the largest batch CUDA graphs are captured for (default: vLLM's,
    ``min(2 × max_num_seqs, 512)``)."""
    enforce_eager: bool = False
    cudagraph_mode: str | None = None
    """``--compilation-config``'s ``cudagraph_mode`` (vLLM's ``CUDAGraphMode`` name); ``None``: vLLM's default."""
    limit_mm_per_prompt: dict | None = field(default=None, hash=False)
    """vLLM's ``--limit-mm-per-prompt`` (a multimodal model's items per prompt, by modality)."""
    skip_mm_profiling: bool = False
    language_model_only: bool = False
    usage_context: str = "serve"
    """Whose defaults vLLM gives what the options leave unset: ``serve`` (``vllm serve``) or ``llm`` (the ``LLM`` class)."""
    defaults: dict | None = field(default=None, hash=False)
    """The settings vLLM chose for this deployment because no option set them (``max_num_seqs``,
    ``max_num_batched_tokens``, prefix caching, ...), each with where the value came from."""
    platform: str = "ascend"
    """``cuda`` or ``ascend``: the device's platform, whose worker budgets the memory."""
    device_memory_given: bool = False
    """``--device-memory`` replaced the kind's own memory: the size is the user's, the kind's rules still plan it."""
    vllm_version: str | None = None
    """The vLLM release whose budget formula, defaults and start-up lines are emulated (``--vllm-version``; unset:
    the installed vLLM; for vllm-ascend, the vLLM its release pins); the installed vLLM plans either way."""
    overhead_terms: tuple[Term, ...] = field(default=(), hash=False)
    """``kvaudit.model.memory.Term`` s: peak activation, non-torch, CUDA graphs (or the one ``--overhead``)."""
    unmodelled: tuple[str, ...] = field(default=(), hash=False)
    """Memory the emulated release's profile holds that no term models (``kvaudit.model.memory.mm_encoder_profile``):
    each makes the KV budget an upper bound."""

    @property
    def unbudgeted_bytes(self) -> int:
        """Memory the rank uses beyond ``device memory × utilization``: terms the emulated release does not
        subtract (CUDA graphs before vLLM 0.20)."""
        return sum(t.bytes for t in self.overhead_terms if not t.budgeted)

    @property
    def non_kv_bytes(self) -> int:
        """Memory the rank holds besides the KV cache: weights, the budgeted terms, and graphs the emulated
        release captures beyond its budget."""
        return self.weights_bytes + self.overhead_bytes + self.unbudgeted_bytes

    @property
    def kv_budget_bytes(self) -> int:
        """``available_memory`` handed to vLLM's planner: device memory × utilization − weights − the terms the
        emulated release subtracts (``--kv-cache-memory`` gives it directly)."""
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes
        return int(self.device_memory_bytes * self.gpu_memory_utilization) - self.weights_bytes - self.overhead_bytes

    def to_dict(self) -> dict:
        """JSON form; byte figures are ints."""
        return {
            "model": self.model.name, "config_path": str(self.model.config_path),
            "model_type": self.model.model_type, "architecture": self.architecture,
            "tensor_parallel_size": self.tp, "pipeline_parallel_size": self.pp, "pipeline_parallel_rank": self.pp_rank,
            "data_parallel_size": self.dp, "enable_expert_parallel": self.enable_expert_parallel,
            "dtype": self.dtype, "kv_cache_dtype": self.kv_cache_dtype, "quantization": self.quantization,
            "max_model_len": self.max_model_len, "device": self.device,
            "device_memory_bytes": self.device_memory_bytes, "device_memory_given": self.device_memory_given,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "weights_bytes": self.weights_bytes, "weights_source": self.weights_source,
            "overhead_bytes": self.overhead_bytes, "non_kv_bytes": self.non_kv_bytes,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "kv_budget_bytes": self.kv_budget_bytes, "kv_transfer": self.kv_transfer,
            "num_blocks_override": self.num_blocks_override, "block_size": self.block_size,
            "enable_prefix_caching": self.enable_prefix_caching, "mamba_cache_mode": self.mamba_cache_mode,
            "max_num_seqs": self.max_num_seqs, "num_speculative_tokens": self.num_speculative_tokens,
            "hf_overrides": self.hf_overrides, "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_cudagraph_capture_size": self.max_cudagraph_capture_size, "cudagraph_mode": self.cudagraph_mode,
            "enforce_eager": self.enforce_eager, "limit_mm_per_prompt": self.limit_mm_per_prompt,
            "skip_mm_profiling": self.skip_mm_profiling, "language_model_only": self.language_model_only,
            "usage_context": self.usage_context, "defaults": self.defaults,
            "platform": self.platform, "vllm_version": self.vllm_version,
            "overhead_terms": [t.to_dict() for t in self.overhead_terms], "unbudgeted_bytes": self.unbudgeted_bytes,
            "unmodelled": list(self.unmodelled),
        }


KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
MAMBA_CACHE_MODES = ("none", "align", "all")
USAGE_CONTEXTS = {"serve": "OPENAI_API_SERVER", "llm": "LLM_CLASS"}
"""``--usage-context``: whose defaults vLLM gives what the options leave unset, by vLLM's ``UsageContext`` names:
``vllm serve`` (the OpenAI-compatible server) or the ``LLM`` class (vLLM's ``EngineArgs.get_batch_defaults``)."""
SERVE_DEFAULTS = {"serve": "vllm serve", "llm": "the LLM class"}
DEVICE_PLATFORMS = ("cuda", "ascend")
"""Whose worker budgets a device's memory (``kvaudit.plan.planner.PLATFORMS`` are the block-size rules, not these)."""
"""How the report names each usage context."""


def check_deployment(d: Deployment) -> None:
    """Refuse, in one line (exit 2), a deployment no vLLM could run: each option in its range (``LIMITS``,
    ``units.MAX_BYTES``), the PP split against the model's layers. The command line, policy files, triage
    (all through ``kvaudit.plan.planner.make_deployment``) and saved plans (``kvaudit.plan.planfile``) pass through here."""
    if not (isinstance(d.gpu_memory_utilization, (int, float)) and 0.0 < d.gpu_memory_utilization <= 1.0):
        raise UsageError(f"--util must be in (0, 1], got {d.gpu_memory_utilization}")
    for what, n, key in (("--tp", d.tp, "tp"), ("--pp", d.pp, "pp"), ("--dp", d.dp, "dp"), ("--max-model-len", d.max_model_len, "max_model_len"),
                         ("--num-blocks", d.num_blocks_override, "num_blocks"), ("--block-size", d.block_size, "block_size"),
                         ("--max-num-seqs", d.max_num_seqs, "max_num_seqs"),
                         ("--max-num-batched-tokens", d.max_num_batched_tokens, "max_num_batched_tokens"),
                         ("--max-cudagraph-capture-size", d.max_cudagraph_capture_size, "max_cudagraph_capture_size")):
        if n is not None and n < 1:
            raise UsageError(f"{what} must be at least 1, got {n}")
        if n is not None and n > LIMITS[key]:
            raise UsageError(f"{what} {n:,} is beyond any real deployment (kvaudit takes at most {LIMITS[key]:,})")
    if not 0 <= d.pp_rank < d.pp:
        raise UsageError(f"--pp-rank must be in [0, {d.pp}), got {d.pp_rank}")
    if d.num_speculative_tokens < 0:
        raise UsageError(f"--num-speculative-tokens must not be negative, got {d.num_speculative_tokens}")
    if d.num_speculative_tokens > LIMITS["num_speculative_tokens"]:
        raise UsageError(f"--num-speculative-tokens {d.num_speculative_tokens:,} is beyond any real deployment "
                         f"(kvaudit takes at most {LIMITS['num_speculative_tokens']})")
    if d.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise UsageError(f"unknown --kv-cache-dtype {d.kv_cache_dtype!r} (use {', '.join(KV_CACHE_DTYPES)})")
    if d.usage_context not in USAGE_CONTEXTS:
        raise UsageError(f"unknown --usage-context {d.usage_context!r} (use {', '.join(USAGE_CONTEXTS)})")
    if d.platform not in DEVICE_PLATFORMS:
        raise UsageError(f"unknown platform {d.platform!r} (use {', '.join(DEVICE_PLATFORMS)})")
    if d.vllm_version is not None and not is_release(d.vllm_version):
        raise UsageError(f"--vllm-version {d.vllm_version!r} is not a vLLM release (e.g. 0.11.0)")
    if d.mamba_cache_mode is not None and d.mamba_cache_mode not in MAMBA_CACHE_MODES:
        raise UsageError(f"unknown --mamba-cache-mode {d.mamba_cache_mode!r} (use {', '.join(MAMBA_CACHE_MODES)})")
    for what, v in (("--device-memory", d.device_memory_bytes), ("--kv-cache-memory", d.kv_cache_memory_bytes)):
        if v is not None and v <= 0:
            raise UsageError(f"{what} must be positive, got {v}")
        if v is not None and v > MAX_BYTES:
            raise UsageError(f"{what} {v:,} B is more than kvaudit takes (1 PiB, {MAX_BYTES:,} B)")
    for what, v in (("--overhead", d.overhead_bytes), ("--weights", d.weights_bytes)):
        if v < 0:
            raise UsageError(f"{what} must not be negative, got {v}")
        if v > MAX_BYTES:
            raise UsageError(f"{what} {v:,} B is more than kvaudit takes (1 PiB, {MAX_BYTES:,} B)")
    for modality, limit in (d.limit_mm_per_prompt or {}).items():
        count = limit.get("count", 0) if isinstance(limit, dict) else limit  # (vLLM's default count for an object)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= LIMITS["mm_items"]:
            raise UsageError(f"--limit-mm-per-prompt: {modality!r} must be a count of items from 0 to "
                             f"{LIMITS['mm_items']:,} (or vLLM's object with a 'count'), got {json.dumps(limit)[:60]}")
    d.model.check_parallel(d.tp, d.pp)
