"""The one adapter to vLLM's own KV-cache planner: options -> deployment, deployment + platform rule -> ``KVPlan``.

Every plan comes from the installed vLLM: its ``ModelConfig``/``VllmConfig`` (dtype, max model
length, TP/PP checks), its model built on ``meta`` (``kvaudit.model.vllm_model``: layer names, specs,
weights), its hybrid block-size alignment (CUDA) and its ``get_kv_cache_configs``. The only code
here that is not vLLM's is the Ascend block-size rule, which lives in vllm-ascend
(``vllm_ascend/patch/platform/patch_mamba_config.py``, PRs #4025 and #6887) and cannot be imported
without an NPU; it is restated here.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import dataclasses
import math
import os
import shutil
import sys
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from kvaudit.errors import ConfigError, KvauditError, NotAuditable, UsageError
from kvaudit.model.deployment import (DEVICES, SERVE_DEFAULTS, USAGE_CONTEXTS, Deployment, Preset,
                                      check_deployment, device_choice)
from kvaudit.model.memory import default_gpu_memory_utilization
from kvaudit.model.options import DeploymentOptions
from kvaudit.model.vllm_modules import CACHE_DIRS, module, quiet_vllm, require_vllm, vllm_version
from kvaudit.model.spec import ModelSpec, check_config, with_overrides
from kvaudit.results import GroupPlan, KVPlan, TensorPlan
from kvaudit.units import fmt_bytes
from kvaudit.versions import version_key


@dataclass(frozen=True)
class KVBudget:
    """A release worker's own rule for the KV budget it hands vLLM's planner."""

    by: str
    """Whose code it runs (``vllm-ascend 0.30.0rc2's NPUWorker._scale_kv_cache_memory_for_multi_group``)."""
    scale: Callable[[int, Any, dict, bool], int]
    """``scale(available, vllm_config, kv_cache_spec, kv_transfer)``: the budget the planner gets for a
    deployment whose KV budget is ``available`` bytes."""


@dataclass(frozen=True)
class PlatformRule:
    """How a platform sizes attention blocks and pads pages before vLLM plans."""

    name: str
    title: str
    apply: Callable[[Any, Any, Deployment], None]
    """``apply(vllm, vllm_config, deployment)`` sets ``cache_config.block_size`` and the paddings."""
    attention_page_padded: bool = False
    """Whether attention specs get ``page_size_padded = mamba padded page`` (vllm-ascend #6887)."""


class _Vllm:
    """The vLLM modules the adapter uses, imported once."""

    def __init__(self) -> None:
        require_vllm()
        self.config = module("vllm.config")
        self.iface = module("vllm.v1.kv_cache_interface")
        try:
            self.planning = module("vllm.v1.core.kv_cache_planning")
        except ImportError:  # vLLM <= 0.32
            self.planning = module("vllm.v1.core.kv_cache_utils")
        self.kv_cache_utils = module("vllm.v1.core.kv_cache_utils")
        self.flash_attn = module("vllm.v1.attention.backends.flash_attn")
        self.backend_utils = module("vllm.v1.attention.backends.utils")
        self.platform_iface = module("vllm.platforms.interface")
        self.worker_utils = module("vllm.v1.worker.utils")
        self.version = vllm_version() or "unknown"


_VLLM: _Vllm | None = None


def load_vllm() -> _Vllm:
    """Import the vLLM modules the planner needs (the slow part: 5-10 s cold)."""
    global _VLLM
    if _VLLM is None:
        _VLLM = _Vllm()
    return _VLLM


# --- platform rules -----------------------------------------------------------------------------
# Each rule reads the layer specs vLLM's model gave for the default block size (``base``) and
# sets the cache config the final specs are asked with.


def _is_mamba(spec: Any) -> bool:
    return isinstance(spec, load_vllm().iface.MambaSpec)


def _attention_specs(specs: dict[str, Any]) -> list[Any]:
    return [s for s in specs.values() if hasattr(s, "num_kv_heads") and not _is_mamba(s)]


def _mamba_specs(specs: dict[str, Any]) -> list[Any]:
    return [s for s in specs.values() if _is_mamba(s)]


def _attn_page_1_token(base: dict[str, Any]) -> int:
    """Bytes per token of the first attention layer (K and V), as its spec computes them."""
    attn = _attention_specs(base)
    if not attn:
        raise ConfigError("the model has no attention layer to align the hybrid block size to")
    return dataclasses.replace(attn[0], block_size=1, page_size_padded=None).page_size_bytes


def _mamba_page(base: dict[str, Any]) -> int:
    return max(dataclasses.replace(s, page_size_padded=None).page_size_bytes for s in _mamba_specs(base))


def _hybrid(base: dict[str, Any]) -> bool:
    """Attention and Mamba-style layers both: the models whose block size vLLM aligns (``is_hybrid``); an
    attention-free model (Mamba-1, Mamba2) keeps vLLM's own Mamba block size."""
    return bool(_mamba_specs(base)) and bool(_attention_specs(base))


def _cuda_rule(v: _Vllm, vc: Any, d: Deployment, base: dict[str, Any]) -> None:
    """Upstream vLLM on CUDA with FlashAttention: vLLM's own ``_align_hybrid_block_size``, for hybrids."""
    if _hybrid(base):
        v.platform_iface.Platform._align_hybrid_block_size(vc, v.flash_attn.FlashAttentionBackend)


def _ascend_align_rule(align: int) -> Callable[[_Vllm, Any, Deployment, dict[str, Any]], None]:
    """vllm-ascend's patched ``verify_and_update_config`` up to v0.15 (``patch_mamba_config.py``):
    upstream's hybrid formula with a 64-token (to v0.11.0rc1) or 128-token (v0.11.0rc2 .. v0.15,
    vllm-ascend #4025) alignment; attention-only models get ``NPUPlatform``'s block size 128."""
    return lambda v, vc, d, base: _ascend_align(vc, d, base, align)


def _ascend_align(vc: Any, d: Deployment, base: dict[str, Any], align: int) -> None:
    cc = vc.cache_config
    if not _mamba_specs(base):
        cc.block_size = d.block_size or 128  # NPUPlatform.check_and_update_config when block_size is unset
        return
    if not _hybrid(base):
        return
    attn_1 = _attn_page_1_token(base)
    mamba_page = _mamba_page(base)
    block = align * math.ceil(mamba_page / (align * attn_1))
    if cc.block_size is None or cc.block_size < block:
        cc.block_size = block
    attn_page = cc.block_size * attn_1
    if cc.mamba_cache_mode == "align":
        cc.mamba_block_size = cc.block_size
    cc.mamba_page_size_padded = attn_page if attn_page != mamba_page else None


def _ascend_contiguous_rule(v: _Vllm, vc: Any, d: Deployment, base: dict[str, Any]) -> None:
    """vllm-ascend #6887 (v0.16.0rc1 on): K page = ssm state, page = 2K + conv."""
    cc = vc.cache_config
    mamba = _mamba_specs(base)
    if not mamba:
        cc.block_size = d.block_size or 128
        return
    if not _hybrid(base):
        return
    kernel = 128
    k_tok = _attn_page_1_token(base) // 2
    sizes = [math.prod(s) * dt.itemsize for s, dt in zip(mamba[0].shapes, mamba[0].dtypes)]
    ssm_page, conv_page = max(sizes), min(sizes)
    block = kernel * math.ceil(ssm_page / (kernel * k_tok))
    if k_tok * block != ssm_page:
        raise NotAuditable(f"vllm-ascend's contiguous hybrid layout (#6887) needs the K page ({k_tok} B/token × "
                           f"{block}) to equal the largest mamba state ({ssm_page} B); {d.model.name} does not fit "
                           "it (vllm-ascend v0.16+ asserts this at start-up)")
    if cc.block_size is None or cc.block_size < block:
        cc.block_size = block
    cc.mamba_block_size = cc.block_size if cc.mamba_cache_mode == "align" else d.max_model_len
    cc.mamba_page_size_padded = cc.block_size * 2 * k_tok + conv_page


PLATFORMS: dict[str, PlatformRule] = {
    "cuda": PlatformRule("cuda", "vLLM on CUDA (FlashAttention block alignment)", _cuda_rule),
    "ascend-align64": PlatformRule(
        "ascend-align64", "vllm-ascend up to v0.11.0rc1 (block alignment 64)", _ascend_align_rule(64)),
    "ascend-align128": PlatformRule(
        "ascend-align128", "vllm-ascend v0.11.0rc2 .. v0.15 (block alignment 128)", _ascend_align_rule(128)),
    "ascend-contiguous": PlatformRule(
        "ascend-contiguous", "vllm-ascend v0.16+ (#6887 contiguous layout: page = 2K + conv)",
        _ascend_contiguous_rule, attention_page_padded=True),
}


# --- vLLM's engine config and model ------------------------------------------------------------------

_MODEL_DIRS: dict[Path, Path] = {}


def _model_dir(config_path: Path) -> Path:
    """A directory whose ``config.json`` is the given file, as vLLM's ``ModelConfig`` wants."""
    if config_path.name == "config.json":
        return config_path.parent
    if config_path not in _MODEL_DIRS:
        tmp = Path(tempfile.mkdtemp(prefix="kvaudit-model-"))
        atexit.register(shutil.rmtree, tmp, True)
        shutil.copyfile(config_path, tmp / "config.json")
        _MODEL_DIRS[config_path] = tmp
    return _MODEL_DIRS[config_path]


def remove_temp_dirs() -> None:
    """Remove the model directories made for config files and the distributed group's file store (also done
    at exit)."""
    for tmp in [*_MODEL_DIRS.values(), *CACHE_DIRS]:
        shutil.rmtree(tmp, ignore_errors=True)
    _MODEL_DIRS.clear()
    CACHE_DIRS.clear()
    vllm_model = sys.modules.get("kvaudit.model.vllm_model")
    if vllm_model is not None:
        vllm_model.remove_temp_files()


def _build_key(d: Deployment) -> str:
    """Every input of a build: the deployment's options, and whether vLLM's max-model-len check is lifted
    (``VLLM_ALLOW_LONG_MAX_MODEL_LEN``, as triage lifts it for a deployment that ran): a build made past that check
    is not the refusal the same deployment gets without it."""
    from kvaudit.model.vllm_model import cache_key

    return cache_key(os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"), str(d.model.config_path),
                     d.model.trust_remote_code, d.tp, d.pp, d.pp_rank, d.dp, d.enable_expert_parallel, d.requested_dtype, d.max_model_len,
                     d.quantization, d.kv_cache_dtype, d.num_speculative_tokens, d.hf_overrides,
                     d.max_num_seqs, d.block_size, d.enable_prefix_caching, d.mamba_cache_mode,
                     d.max_num_batched_tokens, d.enforce_eager, d.usage_context, d.device_memory_bytes, d.device,
                     mxfp4_backend(d), emulated_release(d), d.max_cudagraph_capture_size, d.limit_mm_per_prompt,
                     d.skip_mm_profiling, d.language_model_only)


LARGEST_TIER_FROM, LARGEST_TIER_BYTES = "0.28.0", 160 << 30
"""vLLM 0.28 added a batch-defaults tier for devices of 160 GiB or more (``EngineArgs.get_batch_defaults``: 16,384
tokens and sequences); the tiers below it are the same in every release from 0.11."""


@contextlib.contextmanager
def _as_device(d: Deployment) -> Iterator[None]:
    """vLLM's platform, asked for the device's memory and name while it picks defaults by them
    (``EngineArgs.get_batch_defaults``), answers with the deployment's device, not this host's."""
    current_platform = module("vllm.platforms").current_platform
    cls = type(current_platform)
    dev = DEVICES.get(d.device)
    memory = d.device_memory_bytes
    if version_key(emulated_release(d)) < version_key(LARGEST_TIER_FROM):
        memory = min(memory, LARGEST_TIER_BYTES - 1)  # to an older vLLM such a device is one of ≥ 70 GiB
    with contextlib.ExitStack() as stack:
        answers = {"get_device_total_memory": classmethod(lambda c, device_id=0: memory),
                   "get_device_name": classmethod(lambda c, device_id=0: dev.title if dev else "")}
        if dev is not None:  # (vLLM asks whether the device is a GB10, capability 12.1: its small batch tier)
            answers["is_device_capability"] = classmethod(lambda c, capability, device_id=0: _same_capability(
                dev.capability, capability))
        for name, answer in answers.items():
            old = cls.__dict__.get(name)
            setattr(cls, name, answer)
            stack.callback(lambda name=name, old=old: setattr(cls, name, old) if old is not None else delattr(cls, name))
        yield


def _graph_mode(mode: Any) -> str | None:
    """``cudagraph_mode`` as vLLM names it (``vllm.config.CUDAGraphMode``: NONE, PIECEWISE, FULL, FULL_DECODE_ONLY,
    FULL_AND_PIECEWISE; case as vLLM's parser takes it), or a one-line refusal naming the choice."""
    if mode is None:
        return None
    load_vllm()
    CUDAGraphMode = module("vllm.config").CUDAGraphMode
    name = str(mode).upper()
    if name not in CUDAGraphMode.__members__:
        raise UsageError(f"--compilation-config: cudagraph_mode {mode!r} is not one of vLLM's "
                         f"({', '.join(CUDAGraphMode.__members__)})")
    return name


def _same_capability(device: tuple[int, int], asked: tuple[int, int] | int) -> bool:
    """vLLM's ``Platform.is_device_capability``: ``(major, minor)``, or the integer ``major × 10 + minor``."""
    return device == asked if isinstance(asked, tuple) else device[0] * 10 + device[1] == asked


def _engine_args(d: Deployment) -> dict[str, Any]:
    """The deployment as ``vllm serve``'s arguments (``EngineArgs``): only what the options set, so that vLLM's own
    defaults decide the rest."""
    args: dict[str, Any] = dict(
        model=str(_model_dir(d.model.config_path)), dtype=d.requested_dtype, max_model_len=d.max_model_len,
        quantization=d.quantization, hf_overrides=dict(d.hf_overrides or {}), kv_cache_dtype=d.kv_cache_dtype,
        tensor_parallel_size=d.tp, pipeline_parallel_size=d.pp, data_parallel_size=d.dp,
        enable_expert_parallel=d.enable_expert_parallel, enforce_eager=d.enforce_eager,
        skip_tokenizer_init=True, trust_remote_code=d.model.trust_remote_code)
    for key in ("block_size", "enable_prefix_caching", "mamba_cache_mode", "max_num_seqs", "max_num_batched_tokens",
                "max_cudagraph_capture_size"):
        if getattr(d, key) is not None:
            args[key] = getattr(d, key)
    for key in MULTIMODAL_FLAGS:  # (vLLM's engine arguments of the same names)
        if getattr(d, key):
            args[key] = getattr(d, key)
    if d.num_speculative_tokens:
        args["speculative_config"] = {"method": "mtp", "num_speculative_tokens": d.num_speculative_tokens}
    return args


def engine_config(d: Deployment) -> Any:
    """vLLM's ``VllmConfig`` for the deployment as ``vllm serve`` makes it (``--usage-context llm``: as the
    ``LLM`` class does): vLLM's own ``EngineArgs.create_engine_config``, its defaults for what the options
    leave unset picked for the deployment's device. vLLM's refusal (TP vs heads, max model len vs RoPE,
    quantization, dtype) is a one-line ConfigError."""
    from kvaudit.model.vllm_model import stand_ins

    load_vllm()
    EngineArgs = module("vllm.engine.arg_utils").EngineArgs
    UsageContext = module("vllm.usage.usage_lib").UsageContext
    patched = stand_ins()  # (imports vLLM's model modules: outside the try, whose errors are the config's)
    try:
        with quiet_vllm(), patched, _as_device(d):
            context = UsageContext[USAGE_CONTEXTS[d.usage_context]]
            vc = EngineArgs(**_engine_args(d)).create_engine_config(usage_context=context)
            wanted = _hybrid_prefix_caching(d, vc)
            if wanted is not None:  # the emulated release's default for hybrids, where the installed vLLM's differs
                vc = EngineArgs(**_engine_args(d), enable_prefix_caching=wanted).create_engine_config(
                    usage_context=context)
    except (KvauditError, MemoryError):
        raise
    except Exception as e:  # vLLM's and transformers' config code on the user's config: pydantic's and
        # huggingface_hub's validation errors, ValueError, and what their arithmetic raises on odd values
        removed = _removed(d)
        if removed:
            raise ConfigError(removed) from None
        if not d.model.trust_remote_code and ("custom code" in str(e) or "trust_remote_code" in str(e)):
            auto = (d.model.raw.get("auto_map") or {}).get("AutoConfig")
            raise ConfigError(f"{d.model.name}'s config is code in its folder" + (f" ({auto})" if auto else "")
                              + ", which vLLM runs only with --trust-remote-code: give it if you trust that code") from None
        raise ConfigError(f"vLLM rejected {d.model.config_path} for this deployment: {_why(e)}") from None
    # With no accelerator vLLM's UnspecifiedPlatform turns the hybrid KV-cache manager off; every
    # platform kvaudit audits (CUDA, Ascend) keeps it on.
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    if version_key(emulated_release(d)) < version_key(IN_FLIGHT_BATCHES_FROM):
        _one_batch_in_flight(vc)
    return vc


IN_FLIGHT_BATCHES_FROM = "0.26.0"
"""The first vLLM release that sizes a sliding-window (or chunked-local) group's blocks per request for every batch in
flight: ``window − 1 + max_in_flight_tokens``, where ``VllmConfig.max_in_flight_tokens`` is ``max_concurrent_batches ×
max_num_batched_tokens`` (two batches under async scheduling, vllm/config/vllm.py). Up to 0.25 the spec's
``max_admission_blocks_per_request`` takes one, ``window − 1 + max_num_batched_tokens`` (vllm/v1/kv_cache_interface.py
of each sdist): a request of an older release reserves one batch of blocks fewer per sliding group, which its logged
tokens and concurrency show."""

_ONE_BATCH: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
"""The ``VllmConfig`` s of deployments that emulate a release before ``IN_FLIGHT_BATCHES_FROM``, and the copies made
of them for each platform rule (``_config_for_plan``), by ``id``; an entry leaves with its config, so none is kept
alive and no ``id`` is reused. (An attribute on the config itself would not do: vLLM re-validates a config's fields
when a multimodal model copies it.)"""


def _one_batch_in_flight(vc: Any) -> None:
    """Make ``vc`` answer ``max_in_flight_tokens`` as the emulated release sized it, one ``max_num_batched_tokens``, for
    every vLLM function that later reads it (the planner's check, ``get_kv_cache_capacity``'s tokens and concurrency).
    A vLLM without the property (before 0.26) already takes one batch."""
    cls = type(vc)
    own = cls.__dict__.get("max_in_flight_tokens")
    if not isinstance(own, property):
        return
    if own.fget.__name__ != "_emulated_in_flight_tokens":
        def _emulated_in_flight_tokens(self: Any, _own: property = own) -> int:
            if _ONE_BATCH.get(id(self)) is self:
                return self.scheduler_config.max_num_batched_tokens
            return _own.fget(self)
        cls.max_in_flight_tokens = property(_emulated_in_flight_tokens)
    _ONE_BATCH[id(vc)] = vc


def _removed(d: Deployment) -> str:
    """Where vLLM refused an architecture it no longer serves natively, the message that says so, as
    vLLM's registry records it (``_PREVIOUSLY_SUPPORTED_MODELS``: the last release that served it;
    ``_OOT_SUPPORTED_MODELS``: the plugin that serves it now); else nothing. Said after vLLM refused, not before:
    vLLM may still serve such a model through its Transformers backend."""
    registry = module("vllm.model_executor.models.registry")
    archs = [a for a in d.model.raw.get("architectures") or () if isinstance(a, str)]
    if not archs or any(a in registry.ModelRegistry.get_supported_archs() for a in archs):
        return ""
    last = getattr(registry, "_PREVIOUSLY_SUPPORTED_MODELS", {}).get(archs[0])
    if last:
        return (f"vLLM {vllm_version()} no longer serves {archs[0]}; vLLM {last} was the last release to serve it "
                "(plan with that vLLM: --vllm-python)")
    plugin = getattr(registry, "_OOT_SUPPORTED_MODELS", {}).get(archs[0])
    if plugin:
        return f"vLLM {vllm_version()} serves {archs[0]} only through a plugin ({plugin}): plan where it is installed"
    return ""


MARLIN_MXFP4_BEFORE = "0.12.0"
"""vLLM releases before this one ship without the ``triton_kernels`` package (vendored from 0.12), so on Hopper
their MXFP4 MoE layers fall back to Marlin (``get_mxfp4_backend``, ``quantization/mxfp4.py``)."""


def mxfp4_backend(d: Deployment) -> str:
    """The MXFP4 MoE kernel vLLM picks for the deployment (gpt-oss): Triton on Hopper, Marlin outside capabilities
    9.0-11.0 (an A100; consumer Blackwell and a GB10, capability 12.x: ``get_mxfp4_backend`` of 0.13 runs OpenAI's
    Triton kernels only for 9.0 <= capability < 11.0, and 0.33's oracle ranks Marlin first for the 12.x family) and,
    on Hopper, in releases before ``MARLIN_MXFP4_BEFORE``. Marlin pads the expert widths (intermediate to 128, hidden
    to 256), which "Model loading took" counts. (A B200's FlashInfer MXFP4 kernels are planned as Triton's.)"""
    dev = DEVICES.get(d.device)
    old = version_key(emulated_release(d)) < version_key(MARLIN_MXFP4_BEFORE)
    triton = dev is None or (9, 0) <= dev.capability < (11, 0)
    return "TRITON" if triton and not old else "MARLIN"


HYBRID_PREFIX_CACHING_FROM = "0.28.0"
"""The first vLLM release that turns prefix caching on by default for hybrid (Mamba / GDN) models, in ``align``
mode (PR #50991, ``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``); before it hybrids run
without prefix caching unless asked (vllm-ascend up to v0.25 pins such a vLLM)."""


def _hybrid_prefix_caching(d: Deployment, vc: Any) -> bool | None:
    """The prefix-caching default of the emulated release for a hybrid model where it is not the installed vLLM's
    (off before ``HYBRID_PREFIX_CACHING_FROM``, on from it); ``None`` where they agree or an option set it."""
    if d.enable_prefix_caching is not None or not vc.model_config.is_hybrid:
        return None
    wanted = version_key(emulated_release(d)) >= version_key(HYBRID_PREFIX_CACHING_FROM)
    return wanted if bool(vc.cache_config.enable_prefix_caching) != wanted else None


def model_for(d: Deployment) -> Any:
    """vLLM's model for the deployment's rank, built on ``meta`` (cached per process)."""
    from kvaudit.model import vllm_model

    key = _build_key(d)
    built = vllm_model.built_model(key)
    if built is None:
        vc = engine_config(d)
        token = vllm_model.MXFP4_BACKEND.set(mxfp4_backend(d))
        dev = DEVICES.get(d.device)
        capability = vllm_model.DEVICE_CAPABILITY.set(dev.capability if dev and d.platform == "cuda" else (9, 0))
        try:
            with quiet_vllm():
                built = vllm_model.build_model(vc, key, d.pp_rank)
        finally:
            vllm_model.DEVICE_CAPABILITY.reset(capability)
            vllm_model.MXFP4_BACKEND.reset(token)
    return built


def _config_for_plan(vc: Any, d: Deployment) -> Any:
    """A copy of the build config with a cache config of its own, for one platform rule."""
    vcp = copy.copy(vc)
    object.__setattr__(vcp, "cache_config", copy.deepcopy(vc.cache_config))
    vcp.cache_config.num_gpu_blocks_override = d.num_blocks_override
    if _ONE_BATCH.get(id(vc)) is vc:  # (the copy sizes a request as the release it emulates)
        _one_batch_in_flight(vcp)
    return vcp


def _layer_specs(v: _Vllm, built: Any, vc: Any, d: Deployment, rule: PlatformRule) -> dict[str, Any]:
    """One ``KVCacheSpec`` per layer, from vLLM's own layers, after the platform rule set the cache config."""
    if d.block_size is not None:
        vc.cache_config.block_size = d.block_size
    base = built.kv_cache_specs(vc)
    if not base:
        raise ConfigError(f"{d.model.name}: vLLM's model registers no layer that holds KV cache on this rank")
    rule.apply(v, vc, d, base)
    specs = built.kv_cache_specs(vc)
    padded = vc.cache_config.mamba_page_size_padded
    if rule.attention_page_padded and padded:
        specs = {name: dataclasses.replace(s, page_size_padded=padded)
                 if not _is_mamba(s) and hasattr(s, "page_size_padded") and s.page_size_bytes < padded else s
                 for name, s in specs.items()}
    return specs


def plan_key(strategy: Any) -> tuple[str, str]:
    """Strategies with the same key allocate the same plan of a deployment: the platform rule, and whose
    budget code (if any) gives vLLM's planner its budget."""
    return strategy.platform, strategy.kv_budget.by if strategy.kv_budget else ""


def plan_for(d: Deployment, strategy: Any) -> KVPlan:
    """The plan a strategy allocates: vLLM's, under the strategy's platform rule, with the KV budget its
    release's worker hands the planner (``Strategy.kv_budget``; the deployment's own with
    ``--kv-cache-memory``, which that worker takes as given)."""
    return build_plan(d, strategy.platform, strategy.kv_budget if d.kv_cache_memory_bytes is None else None)


def build_plan(d: Deployment, platform: str, kv_budget: KVBudget | None = None) -> KVPlan:
    """Plan the KV cache for ``d`` with vLLM's own model specs and planner under the platform's rule; with
    ``kv_budget`` (a release worker's rule), with the budget it hands the planner instead of the deployment's.

    With pipeline parallelism the planner is given every stage's specs and budget at once, as vLLM's engine
    gives it every worker's: each stage is sized by its own budget, then all take the smallest stage's
    ``num_blocks`` (``get_kv_cache_configs``); the plan is the audited stage's."""
    rule = PLATFORMS[platform]
    v = load_vllm()
    stages = [_stage_inputs(v, s, rule, kv_budget) for s in _pp_stages(d)]
    vc, specs, budget = stages[d.pp_rank]
    with quiet_vllm():
        groups: list[Any] = []
        try:
            empty = next(((name, spec) for name, spec in specs.items() if spec.page_size_bytes <= 0), None)
            if empty is not None:  # (vLLM's planner would divide by it: a block size not set as vLLM sets it)
                name, spec = empty
                per = getattr(spec, "tokens_per_state", 0)
                raise NotAuditable(
                    f"{name}'s {type(spec).__name__} holds 0 bytes a block at block size {spec.block_size} under the "
                    f"{rule.name} rule" + (f" (one state per {per} tokens)" if per else "") + f": kvaudit does not "
                    f"set {d.model.name}'s block size as vLLM's attention backend does")
            if hasattr(v.planning, "get_global_kv_cache_groups"):
                groups = v.planning.get_global_kv_cache_groups(vc, [st[1] for st in stages])
                cfg = v.planning.get_kv_cache_configs(vc, [st[1] for st in stages], [st[2] for st in stages],
                                                      groups)[d.pp_rank]
            else:
                cfg = v.planning.get_kv_cache_configs(vc, [st[1] for st in stages], [st[2] for st in stages])[d.pp_rank]
        except NotImplementedError as e:  # e.g. MLA pages that cannot be padded to this platform's block size
            raise NotAuditable(f"vLLM {v.version}'s planner cannot plan {d.model.name} under the {rule.name} rule: "
                               f"{_first_line(e)}") from None
        except ValueError as e:
            per_block = max((g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in groups), default=0)
            need = f" (one block of every group needs {per_block:,} B)" if per_block else ""
            raise ConfigError(
                f"vLLM's planner refused the budget of {budget:,} B{need}: {_first_line(e)}") from None
        except (ArithmeticError, AssertionError, TypeError, KeyError) as e:  # vLLM's invariants, on odd specs
            raise ConfigError(f"vLLM {v.version}'s planner could not plan {d.model.name}: {_why(e)}{_at(e)}") from None
    if cfg.num_blocks < 1:
        raise ConfigError(f"the KV budget {budget} B holds no block of every group")
    plan = _to_plan(cfg, vc, d, rule, specs, v.version)
    if kv_budget is not None and budget != d.kv_budget_bytes:
        plan = dataclasses.replace(plan, kv_budget_bytes=budget, kv_budget_by=kv_budget.by)
    return plan


@dataclass(frozen=True)
class RequestNeed:
    """What vLLM's start-up check asks of a KV budget (``check_enough_kv_cache_memory``): the bytes one request of
    ``max_model_len`` tokens takes in every KV-cache layer of the rank, and the longest request the budget holds."""

    max_model_len: int
    bytes: int
    """``max_memory_usage_bytes`` over the rank's layer specs: the "N GiB KV cache is needed" of vLLM's refusal."""
    budget: int
    """The KV budget set against it."""
    fits_max_model_len: int
    """vLLM's ``estimate_max_model_len`` for the budget (the length its refusal suggests; 0 where no token fits);
    ``max_model_len`` itself where the budget holds a whole request."""

    @property
    def fits(self) -> bool:
        """Whether the budget holds one request of ``max_model_len`` tokens (vLLM starts)."""
        return self.bytes <= self.budget


def request_need(d: Deployment, platform: str = "cuda", budget: int | None = None) -> RequestNeed:
    """What one request of ``d.max_model_len`` needs of the KV cache on ``d``'s rank, by vLLM's own functions on the
    rank's layer specs under the platform's rule, against ``budget`` (default: the deployment's KV budget). No plan
    is made: a budget too small for one request is what vLLM refuses before planning."""
    v = load_vllm()
    vc, specs, own = _stage_inputs(v, d, PLATFORMS[platform], None)
    budget = own if budget is None else budget
    with quiet_vllm():
        need = v.planning.max_memory_usage_bytes(vc, specs.values())
        fits = d.max_model_len if need <= budget else (
            v.planning.estimate_max_model_len(vc, specs, budget) if budget > 0 else 0)
    return RequestNeed(d.max_model_len, need, budget, fits)


def _pp_stages(d: Deployment) -> list[Deployment]:
    """Every pipeline stage of ``d``'s deployment, ``d`` itself at its rank: each weighed as vLLM builds it (the
    embedding on the first, the LM head on the last), unless ``--weights`` gave every stage the same."""
    stages = []
    for rank in range(d.pp):
        s = d if rank == d.pp_rank else dataclasses.replace(d, pp_rank=rank)
        if s is not d and d.weights_source != "--weights":
            s = dataclasses.replace(s, weights_bytes=model_for(s).weights_bytes)
        if s is not d and not any(t.key == "overhead" for t in d.overhead_terms):  # the sampler: last stage only
            s = dataclasses.replace(s, **_non_kv(s, model_for(s).vllm_config, None))
        stages.append(s)
    return stages


def _stage_inputs(v: _Vllm, d: Deployment, rule: PlatformRule, kv_budget: KVBudget | None) -> tuple[Any, dict, int]:
    """What the planner needs of one stage: its config (with the KV-cache layout resolved), its layers' specs
    under the platform rule, and its KV budget (the release worker's, with ``kv_budget``)."""
    built = model_for(d)
    with quiet_vllm():
        vc = _config_for_plan(built.vllm_config, d)
        specs = _layer_specs(v, built, vc, d, rule)
        if hasattr(v.backend_utils, "resolve_kv_cache_layout"):  # vLLM 0.29+: the engine resolves it first
            layers = vc.compilation_config.static_forward_context
            backends = list(dict.fromkeys(layers[name].get_attn_backend() for name in specs))
            layouts = [lay.name for lay in v.backend_utils.get_supported_kv_cache_layouts(backends)]
            try:
                v.backend_utils.resolve_kv_cache_layout(vc, [layouts], specs.values())
            except (ArithmeticError, AssertionError, TypeError, KeyError) as e:  # vLLM's invariants on the specs
                raise ConfigError(f"vLLM {v.version} could not size the KV-cache pages of {d.model.name}: "
                                  f"{_why(e)}{_at(e)}") from None
        budget = d.kv_budget_bytes if kv_budget is None else kv_budget.scale(d.kv_budget_bytes, vc, specs,
                                                                             d.kv_transfer)
    return vc, specs, budget


def _why(e: BaseException) -> str:
    """The reason in one line, naming the exception where its type is the only hint (``ZeroDivisionError``)."""
    line = _first_line(e)
    if line == type(e).__name__ or isinstance(e, (ValueError, TypeError)):
        return line
    return f"{type(e).__name__}: {line}"


def _at(e: BaseException) -> str:
    """Where in vLLM an exception with no message of its own (a bare ``assert``) was raised: `` at file.py:line``."""
    import traceback

    if str(e).strip():
        return ""
    frames = traceback.extract_tb(e.__traceback__)
    return f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def _first_line(e: BaseException) -> str:
    """The reason in one line; for pydantic's validation errors (vLLM's configs), the first error's message."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            return str(first.get("msg", "")).removeprefix("Value error, ").splitlines()[0][:400]
        except Exception:  # not pydantic's errors() after all
            pass
    lines = (str(e).strip() or type(e).__name__).splitlines()
    text = " ".join(lines[:2]) if lines[0].rstrip().endswith(":") else lines[0]  # "Validation error for field 'x':"
    return " ".join(text.split())[:400]


def _to_plan(cfg: Any, vc: Any, d: Deployment, rule: PlatformRule, specs: dict[str, Any],
             version: str) -> KVPlan:
    groups = tuple(
        GroupPlan(index=i, spec_type=type(g.kv_cache_spec).__name__, block_size=g.kv_cache_spec.block_size,
                  page_size_bytes=g.kv_cache_spec.page_size_bytes, layer_names=tuple(g.layer_names))
        for i, g in enumerate(cfg.kv_cache_groups))
    tensors = cfg.kv_cache_tensors
    interleaved = False
    if tensors and hasattr(tensors[0], "shared_by"):
        fmt = "shared_by"
        regions = tuple(TensorPlan(size=t.size, shared_by=tuple(t.shared_by)) for t in tensors)
        planned = sum(t.size for t in tensors)
    else:
        fmt = "layers"
        page = {name: g.page_size_bytes for g in groups for name in g.layer_names}
        planned = max(t.size for t in tensors) if tensors else 0
        try:
            regions = shared_by_view(tensors, cfg.num_blocks, page)
        except NotAuditable:
            interleaved = True
            regions = (TensorPlan(size=planned, shared_by=tuple(name for t in tensors for name in t.layers)),)
    return KVPlan(interleaved=interleaved, vllm_version=version, platform=rule.name, block_size=vc.cache_config.block_size,
                  num_blocks=cfg.num_blocks, kv_budget_bytes=d.kv_budget_bytes, plan_format=fmt,
                  planned_bytes=planned, groups=groups, tensors=regions,
                  layer_specs={name: type(s).__name__ for name, s in specs.items()},
                  kv_cache_config=cfg, vllm_config=vc)


def shared_by_view(tensors: Any, num_blocks: int, page_size: dict[str, int]) -> tuple[TensorPlan, ...]:
    """The ``shared_by`` regions of a 0.29+ plan: layers whose byte ranges in the backing coincide.

    Layer ``layers[l]`` of a ``KVCacheTensor`` spans ``[offset + l·layer_stride, ... + (N-1)·
    block_stride + page)``. Layers with the same span share one region; spans that overlap without
    coinciding (block-outermost layouts) have no faithful ``shared_by`` view and are refused.
    """
    spans: dict[tuple[int, int], list[str]] = {}
    for t in tensors:
        for l, name in enumerate(t.layers):
            start = t.offset + l * t.layer_stride
            end = start + (num_blocks - 1) * t.block_stride + page_size[name]
            spans.setdefault((start, end), []).append(name)
    ordered = sorted(spans.items())
    for ((_, end), _a), ((start, _), _b) in zip(ordered, ordered[1:]):
        if start < end:
            raise NotAuditable(
                "this plan interleaves layers within blocks (block-outermost layout); it has no "
                "shared_by view for strategies written for KVCacheTensor(size, shared_by)")
    return tuple(TensorPlan(size=e - s, shared_by=tuple(names)) for (s, e), names in ordered)


# --- the deployment, as vLLM resolves it ------------------------------------------------------------

def deploy(spec: ModelSpec, preset: Preset | None, options: DeploymentOptions | Mapping[str, Any],
           pp_rank: int = 0) -> Deployment:
    """The deployment the options describe (a ``DeploymentOptions`` record, or a mapping of vLLM's flag names:
    ``tp``, ``util``, ``kv_cache_dtype``, ...; sizes as text such as ``80GiB``), with the preset's TP, length and
    device where they leave them unset; resolved by vLLM (``make_deployment``). The one place the command line,
    policy files (``kvaudit check``) and markers turn options into a deployment."""
    import json

    from kvaudit.units import parse_size

    o = DeploymentOptions.of(options)

    def size(key: str, allow_zero: bool = False) -> int | None:
        value = getattr(o, key)
        flag = "--" + key.replace("_", "-")
        return parse_size(str(value), flag, allow_zero=allow_zero) if value is not None else None

    def json_object(key: str, example: str) -> dict | None:
        value = getattr(o, key)
        flag = "--" + key.replace("_", "-")
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise UsageError(f"{flag} is not valid JSON: {e.msg} (column {e.colno})") from None
        if value is not None and not isinstance(value, dict):
            raise UsageError(f"{flag} must be a JSON object, e.g. '{example}'")
        return value

    overrides = json_object("hf_overrides", '{"max_position_embeddings": 65536}')
    device_memory = size("device_memory")
    if device_memory is not None and not o.device:
        raise UsageError(f"--device-memory {o.device_memory} gives a size but not the kind of device, whose rules "
                         f"plan it: add --device ({device_choice()})")
    compilation = json_object("compilation_config", '{"cudagraph_mode": "PIECEWISE"}')
    unmodelled = sorted(set(compilation or {}) - {"cudagraph_mode"})
    if unmodelled:
        raise UsageError(f"--compilation-config: kvaudit takes cudagraph_mode only; {', '.join(unmodelled)} would "
                         "change nothing in its plan (use --max-cudagraph-capture-size for the capture sizes)")
    limits = json_object("limit_mm_per_prompt", '{"image": 0, "video": 0}')
    if o.limit_mm_per_prompt is not None and not limits:
        raise UsageError("--limit-mm-per-prompt names no modality, so it would change nothing (e.g. "
                         "'{\"image\": 0, \"video\": 0}')")
    tp = o.tp
    util = o.util if o.util is not None else default_gpu_memory_utilization(o.vllm_version or vllm_version())
    return make_deployment(
        spec, tp=tp if tp is not None else (preset.tp if preset else 1), gpu_memory_utilization=util,
        max_model_len=o.max_model_len or (preset.max_model_len if preset else None),
        device=o.device or (preset.device if preset else "atlas-a2-64g"),
        device_memory_bytes=device_memory, dtype=o.dtype, weights_bytes=size("weights"),
        overhead_bytes=size("overhead", allow_zero=True), vllm_release=o.vllm_version,
        kv_cache_memory_bytes=size("kv_cache_memory"), kv_transfer=bool(o.kv_transfer),
        num_blocks_override=o.num_blocks, pp=o.pp, pp_rank=pp_rank, dp=o.dp,
        enable_expert_parallel=bool(o.enable_expert_parallel),
        kv_cache_dtype=o.kv_cache_dtype, quantization=o.quantization,
        block_size=o.block_size, enable_prefix_caching=o.enable_prefix_caching,
        mamba_cache_mode=o.mamba_cache_mode, max_num_seqs=o.max_num_seqs,
        num_speculative_tokens=o.num_speculative_tokens, hf_overrides=overrides,
        max_num_batched_tokens=o.max_num_batched_tokens, enforce_eager=bool(o.enforce_eager),
        max_cudagraph_capture_size=o.max_cudagraph_capture_size,
        cudagraph_mode=(compilation or {}).get("cudagraph_mode"), usage_context=o.usage_context or "serve",
        limit_mm_per_prompt=limits,
        skip_mm_profiling=bool(o.skip_mm_profiling), language_model_only=bool(o.language_model_only))


def make_deployment(
    model: ModelSpec,
    *,
    tp: int,
    gpu_memory_utilization: float,
    max_model_len: int | None = None,
    device: str = "atlas-a2-64g",
    device_memory_bytes: int | None = None,
    dtype: str = "auto",
    weights_bytes: int | None = None,
    overhead_bytes: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    kv_transfer: bool = False,
    num_blocks_override: int | None = None,
    pp: int = 1,
    pp_rank: int = 0,
    dp: int = 1,
    enable_expert_parallel: bool = False,
    kv_cache_dtype: str = "auto",
    quantization: str | None = None,
    block_size: int | None = None,
    enable_prefix_caching: bool | None = None,
    mamba_cache_mode: str | None = None,
    max_num_seqs: int | None = None,
    num_speculative_tokens: int = 0,
    hf_overrides: dict | None = None,
    max_num_batched_tokens: int | None = None,
    max_cudagraph_capture_size: int | None = None,
    cudagraph_mode: str | None = None,
    enforce_eager: bool = False,
    usage_context: str = "serve",
    limit_mm_per_prompt: dict | None = None,
    skip_mm_profiling: bool = False,
    language_model_only: bool = False,
    vllm_release: str | None = None,
    allow_no_kv_budget: bool = False,
) -> Deployment:
    """Validate the options, let vLLM resolve them (dtype, max model len, TP and PP against the model)
    and build its model for this rank to weigh it; impossible numbers are one-line errors. A deployment that leaves
    no KV budget is refused too, unless ``allow_no_kv_budget`` (triage: what vLLM itself refused to start)."""
    if device not in DEVICES:
        raise UsageError(f"unknown --device {device!r}: {device_choice()}")
    mem = device_memory_bytes if device_memory_bytes is not None else DEVICES[device].memory_bytes
    d = Deployment(model=model, tp=tp, dtype=dtype, max_model_len=max_model_len,  # type: ignore[arg-type]
                   device=device, device_memory_bytes=mem, device_memory_given=device_memory_bytes is not None,
                   gpu_memory_utilization=gpu_memory_utilization, weights_bytes=weights_bytes or 0,
                   weights_source="--weights", overhead_bytes=overhead_bytes or 0,
                   kv_cache_memory_bytes=kv_cache_memory_bytes, kv_transfer=kv_transfer,
                   num_blocks_override=num_blocks_override, pp=pp, pp_rank=pp_rank, dp=dp,
                   enable_expert_parallel=enable_expert_parallel, requested_dtype=dtype,
                   kv_cache_dtype=kv_cache_dtype, quantization=quantization, block_size=block_size,
                   enable_prefix_caching=enable_prefix_caching, mamba_cache_mode=mamba_cache_mode,
                   max_num_seqs=max_num_seqs, num_speculative_tokens=num_speculative_tokens,
                   hf_overrides=hf_overrides, max_num_batched_tokens=max_num_batched_tokens,
                   max_cudagraph_capture_size=max_cudagraph_capture_size, cudagraph_mode=_graph_mode(cudagraph_mode),
                   enforce_eager=enforce_eager, usage_context=usage_context, limit_mm_per_prompt=limit_mm_per_prompt,
                   skip_mm_profiling=skip_mm_profiling, language_model_only=language_model_only,
                   platform=DEVICES[device].platform, vllm_version=vllm_release)
    if weights_bytes is not None and weights_bytes <= 0:
        raise UsageError(f"--weights must be positive, got {weights_bytes}")
    check_deployment(d)
    if hf_overrides:  # the config vLLM plans is the one with the overrides applied: checked as the file was
        check_config(with_overrides(model.raw, hf_overrides), f"{model.config_path} with --hf-overrides")
    built = model_for(d)
    mc = built.vllm_config.model_config
    _check_multimodal_options(d, mc)
    _check_expert_parallel(d, mc)
    resolved: dict[str, Any] = dict(dtype=str(mc.dtype).removeprefix("torch."), max_model_len=mc.max_model_len,
                                    architecture=built.architecture)
    if weights_bytes is None:
        resolved.update(weights_bytes=built.weights_bytes, weights_source=(
            f"parameters and buffers of vLLM's {built.architecture} built for rank 0 of TP {tp}"
            + (f", stage {pp_rank} of PP {pp}" if pp > 1 else "")
            + (f", rank 0 of DP {dp}" if dp > 1 else "")
            + (f": experts whole over {dp * tp} ranks (expert parallel)" if enable_expert_parallel else
               f": experts by width over {dp * tp} ranks" if dp > 1 and mc.get_num_experts() else "")
            + f" ({resolved['dtype']}, quantization {mc.quantization or 'none'}"
            + (f", quantized after loading by {built.online}" if built.online else "") + ")"))
    resolved.update(_serve_defaults(d, built.vllm_config))
    resolved.update(_non_kv(d, built.vllm_config, overhead_bytes))
    d = dataclasses.replace(d, **resolved)
    from kvaudit.model import vllm_model

    vllm_model.remember(_build_key(d), built)  # the same build, under the options as vLLM resolved them
    if d.kv_budget_bytes <= 0 and not allow_no_kv_budget:
        need = d.non_kv_bytes / d.device_memory_bytes
        raise ConfigError(
            f"no memory left for the KV cache: weights {fmt_bytes(d.weights_bytes)} + other non-KV memory "
            f"{fmt_bytes(d.overhead_bytes)} exceed {gpu_memory_utilization} × "
            f"{fmt_bytes(mem)} = {fmt_bytes(int(mem * gpu_memory_utilization))}; "
            f"--util must exceed {need:.3f}, or raise --tp")
    return d


MULTIMODAL_FLAGS = {"limit_mm_per_prompt": "--limit-mm-per-prompt", "skip_mm_profiling": "--skip-mm-profiling",
                    "language_model_only": "--language-model-only"}


def _check_multimodal_options(d: Deployment, mc: Any) -> None:
    """Refuse a multimodal option that would change nothing: on a text-only model, or a modality limit the model
    does not take (vLLM's processing info for the model lists its modalities; vLLM itself ignores the others)."""
    given = [flag for key, flag in MULTIMODAL_FLAGS.items() if getattr(d, key)]
    if not given:
        return
    if not mc.is_multimodal_model:
        raise UsageError(f"{', '.join(given)}: {d.model.name} ({mc.architecture}) takes text only, so "
                         f"{'they' if len(given) > 1 else 'it'} would change nothing")
    if d.limit_mm_per_prompt:
        from kvaudit.model.memory import mm_limits

        taken = mm_limits(mc, supported=True)
        other = sorted(set(d.limit_mm_per_prompt) - set(taken)) if taken is not None else []
        if other:
            raise UsageError(f"--limit-mm-per-prompt: {mc.architecture} takes {', '.join(sorted(taken))}; a limit on "
                             f"{', '.join(other)} would change nothing")


def _check_expert_parallel(d: Deployment, mc: Any) -> None:
    """Refuse ``--enable-expert-parallel`` where it would change nothing: on one rank (vLLM's
    ``FusedMoEParallelConfig.make`` uses EP only when DP × TP > 1). A model without routed experts vLLM refuses itself
    (``ModelConfig``: "Number of experts in the model must be greater than 0 ...")."""
    if d.enable_expert_parallel and d.dp * d.tp == 1:
        raise UsageError("--enable-expert-parallel with DP 1 and TP 1: one rank holds every expert either way, so it "
                         "would change nothing (vLLM splits experts over DP × TP ranks)")


def emulated_release(d: Deployment) -> str:
    """The vLLM release whose budget and start-up lines the deployment follows: ``--vllm-version``, else the
    installed vLLM."""
    return d.vllm_version or vllm_version() or "0"


def _non_kv(d: Deployment, vc: Any, overhead_bytes: int | None) -> dict[str, Any]:
    """The non-KV terms (``kvaudit.model.memory``) for the release emulated, or the one ``--overhead`` gives."""
    from kvaudit.model import memory

    release = emulated_release(d)
    if overhead_bytes is not None:
        terms: tuple[memory.Term, ...] = (memory.Term("overhead", overhead_bytes, "--overhead"),)
    else:
        terms = memory.non_kv_terms(vc, d.platform, release, last_stage=d.pp_rank == d.pp - 1,
                                    max_capture=d.max_cudagraph_capture_size, mode=d.cudagraph_mode)
    encoder = memory.mm_encoder_profile(vc) if overhead_bytes is None else None
    return {"overhead_terms": terms, "overhead_bytes": sum(t.bytes for t in terms if t.budgeted),
            "vllm_version": release, "unmodelled": (encoder,) if encoder else ()}


def _serve_defaults(d: Deployment, vc: Any) -> dict[str, Any]:
    """The scheduler and cache settings the options left to vLLM (max_num_seqs, max_num_batched_tokens, prefix
    caching, Mamba cache mode), as vLLM's engine config resolved them, and ``defaults``: each one's source, for
    the report."""
    got = {"max_num_seqs": vc.scheduler_config.max_num_seqs,
           "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
           "enable_prefix_caching": vc.cache_config.enable_prefix_caching,
           "mamba_cache_mode": getattr(vc.cache_config, "mamba_cache_mode", None)}
    dev = DEVICES.get(d.device)
    release = emulated_release(d)
    batch = (f"vLLM {release}'s default for {SERVE_DEFAULTS[d.usage_context]} on a device of "
             f"{fmt_bytes(d.device_memory_bytes)}" + (f" ({dev.title})" if dev else "") + " (EngineArgs.get_batch_defaults)")
    model = f"vLLM {release}'s default for this model (EngineArgs.create_engine_config)"
    if vc.model_config.is_hybrid:
        model = (f"vLLM {release}'s default for a hybrid model: prefix caching off before {HYBRID_PREFIX_CACHING_FROM}, "
                 "on from it (PR #50991)")
    out: dict[str, Any] = {key: value for key, value in got.items() if getattr(d, key) is None and value is not None}
    out["defaults"] = {key: batch if key.startswith("max_num") else model for key in out}
    return out


_KIND_NAMES = {"FullAttentionSpec": "full attention", "SlidingWindowSpec": "sliding window",
               "MLAAttentionSpec": "MLA", "ChunkedLocalAttentionSpec": "chunked local"}


def layer_mix(d: Deployment) -> str:
    """The KV-cache layers of the deployment's rank by kind, e.g. ``36 GDN + 12 full attention``."""
    counts: dict[str, int] = {}
    for name, spec in model_for(d).kv_cache_specs().items():
        kind = type(spec).__name__
        if _is_mamba(spec):
            kind = _mamba_kind(spec)
        elif kind == "MLAAttentionSpec" and "indexer" in name:
            kind = "indexer"
        else:
            kind = _KIND_NAMES.get(kind, kind)
        counts[kind] = counts.get(kind, 0) + 1
    return " + ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _mamba_kind(spec: Any) -> str:
    backend = str(getattr(spec.mamba_type, "name", spec.mamba_type)).upper()
    for key, label in (("GDN", "GDN"), ("MAMBA2", "Mamba2"), ("MAMBA1", "Mamba"), ("SHORT_CONV", "short conv"),
                       ("LINEAR", "linear attention")):
        if key in backend:
            return label
    return backend.lower()
