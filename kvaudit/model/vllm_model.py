"""vLLM's own model, built on the ``meta`` device: the layers it registers, their KV-cache specs, its weights.

The model runner asks every attention-like layer of the built model for ``get_kv_cache_spec``
(``vllm/v1/worker/gpu/attn_utils.py``); kvaudit does the same on a model that vLLM's own
``initialize_model`` builds from the config with no weights and no device. Layer names, spec
classes (full, sliding-window, MLA, sparse indexer, Mamba / GDN state), heads per rank and the
weight bytes per rank (quantized layers included) are therefore vLLM's own.

Building on a host with no accelerator needs stand-ins for the few places where vLLM asks the
platform which kernel to run. Each stand-in answers as vLLM does on a CUDA Hopper GPU (compute
capability 9.0; FlashAttention 3 with sinks and fp8 KV cache, FlashMLA, Triton MoE, Humming for the
int4 / NVFP4 / DeepSeek-V4 MXFP4 MoE oracles, the linear-kernel tables CUDA lists, no SM100-only fused
GEMM, CUDA streams a model only holds); none of them changes a parameter shape or a KV-cache spec. They
are applied only while a model is built or asked for its specs, and undone afterwards.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import copy
import importlib
import importlib.util
import inspect
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from kvaudit.errors import ConfigError, KvauditError, first_line
from kvaudit.model.vllm_modules import module


DEVICE_CAPABILITY: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar("DEVICE_CAPABILITY", default=(9, 0))
"""The compute capability of the deployment's device (``kvaudit.model.deployment.DEVICES``; Hopper's where the kind has
none of its own): the platform answers it, and vLLM's attention-backend choice follows it while the model is built."""
MXFP4_BACKEND: contextvars.ContextVar[str] = contextvars.ContextVar("MXFP4_BACKEND", default="TRITON")
"""The MXFP4 MoE kernel vLLM picks for the deployment's device and release (``kvaudit.plan.planner.mxfp4_backend``):
vLLM rounds the expert sizes up for it while it builds the layers (``maybe_roundup_sizes``), so the weights
built here are the ones that kernel holds after loading."""


@dataclass
class BuiltModel:
    """A model vLLM built on ``meta`` for one deployment rank, and what the runner reads from it."""

    vllm_config: Any = field(repr=False)
    """The ``VllmConfig`` it was built under; its static forward context holds the layers."""
    architecture: str
    weights_bytes: int
    """Bytes of every parameter and buffer on this rank (each storage once)."""
    online: str = ""
    """vLLM's online-quantization methods whose post-loading step quantized the weights counted (``ONLINE_PACKAGE``)."""
    _tp: int = 1
    _pp: int = 1
    _pp_rank: int = 0
    _dp: int = 1

    def kv_cache_specs(self, vllm_config: Any | None = None) -> dict[str, Any]:
        """``{layer name: KVCacheSpec}`` as the model runner's ``get_kv_cache_spec`` returns them, for
        the cache settings of ``vllm_config`` (a copy of the build config with its own cache config)."""
        vc = vllm_config or self.vllm_config
        v = _modules()
        try:
            with _stand_ins(v), _parallel_view(v, self._tp, self._pp, self._pp_rank, self._dp), \
                    v.config.set_current_vllm_config(vc):
                return dict(v.attn_utils.get_kv_cache_spec(vc))
        except (KvauditError, MemoryError):
            raise
        except Exception as e:  # vLLM's layers on the user's config
            raise ConfigError(f"vLLM's {self.architecture} could not give its KV-cache specs for this deployment: "
                              f"{type(e).__name__}: {first_line(e, 300)}") from None


class _Modules:
    """The vLLM modules the build uses, imported once."""

    def __init__(self) -> None:
        self.torch = importlib.import_module("torch")
        self.config = module("vllm.config")
        self.ps = module("vllm.distributed.parallel_state")
        self.loader = module("vllm.model_executor.model_loader.utils")
        self.torch_utils = module("vllm.utils.torch_utils")
        self.platforms = module("vllm.platforms")
        self.backends = module("vllm.v1.attention.backends.registry")
        self.attn_utils = module("vllm.v1.worker.gpu.attn_utils")
        self.registry = module("vllm.model_executor.models.registry")


_MODULES: _Modules | None = None


def _modules() -> _Modules:
    global _MODULES
    if _MODULES is None:
        _MODULES = _Modules()
    return _MODULES




# --- stand-ins for the platform's kernel choices ------------------------------------------------


def _attention_backend() -> Callable[..., str]:
    """What vLLM's CUDA platform picks on the deployment's device (``DEVICE_CAPABILITY``), as
    ``CudaPlatform.get_valid_backends`` does for that capability: vLLM's priorities (``_get_backend_priorities`` in
    ``vllm/platforms/cuda.py``), the first backend whose own ``validate_configuration`` passes (on Hopper: FlashAttention
    3, FlashMLA, FlashMLA-sparse); a backend whose kernel package this host lacks (FlashInfer) is passed over, as vLLM
    passes over one that fails to import, so the next one's KV layout plans it."""

    def pick(selected_backend: Any, attn_selector_config: Any, num_heads: Any = None) -> str:
        if selected_backend is not None:
            return selected_backend.get_path()
        c = attn_selector_config
        priorities, capability, why = _cuda_platform()._get_backend_priorities, _capability(), []
        known = dict(c._asdict(), num_heads=num_heads, device_capability=capability)  # (what each release's takes)
        for backend in priorities(**{k: known[k] for k in inspect.signature(priorities).parameters if k in known}):
            try:  # (vLLM's get_valid_backends, with any failure of a kernel this host lacks counted as its ImportError)
                reasons = backend.get_class().validate_configuration(device_capability=capability, **c._asdict())
            except Exception as err:  # noqa: BLE001 - torch without CUDA asserts where vLLM's host has one
                reasons = [f"not importable on this host ({type(err).__name__}: {first_line(err, 60)})"]
            if not reasons:
                return backend.get_path()
            why.append(f"{backend.name}: {', '.join(reasons)}")
        raise ConfigError(f"no attention backend of vLLM's is valid on a device of capability "
                          f"{'.'.join(map(str, DEVICE_CAPABILITY.get()))} for this model: " + "; ".join(why)[:600])

    return pick


_CUDA_EXTENSIONS = ("vllm._C", "vllm._C_stable_libtorch", "vllm._qutlass_C")
"""The compiled extensions ``vllm/platforms/cuda.py`` imports to register vLLM's CUDA ops (0.23 imports ``vllm._C``
too), which need libcuda."""


def _cuda_platform() -> Any:
    """vLLM's CUDA platform module, for its backend priorities (``_get_backend_priorities``), imported on a host
    without CUDA: each op-registering extension that cannot load here is stood in for while it imports (no op of
    theirs is called here), and removed again."""
    if "vllm.platforms.cuda" in sys.modules:
        return sys.modules["vllm.platforms.cuda"]
    stood_in = []
    for name in _CUDA_EXTENSIONS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - libcuda missing: an ImportError or an OSError, by torch's version
            sys.modules[name] = _module(name)
            stood_in.append(name)
    try:
        return module("vllm.platforms.cuda")
    finally:
        for name in stood_in:
            sys.modules.pop(name, None)


def _fresh_backend_choice() -> None:
    """Forget vLLM's cached attention-backend choices (``vllm/v1/attention/selector.py`` caches them by the layer's
    settings, not the device): a build for another device kind in this process chooses again."""
    selector = _optional("vllm.v1.attention.selector")
    cached = getattr(selector, "_cached_get_attn_backend", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()


def _capability() -> Any:
    DeviceCapability = module("vllm.platforms.interface").DeviceCapability
    major, minor = DEVICE_CAPABILITY.get()
    return DeviceCapability(major=major, minor=minor)


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    missing = object()
    if isinstance(obj, dict):  # an entry of a mapping (sys.modules)
        old = obj.get(name, missing)
        obj[name] = value
        try:
            yield
        finally:
            if old is missing:
                obj.pop(name, None)
            else:
                obj[name] = old
        return
    old = obj.__dict__.get(name, missing) if isinstance(obj, type) else getattr(obj, name, missing)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(obj, name)
        else:
            setattr(obj, name, old)


def _stand_in_list(v: _Modules) -> list[tuple[Any, str, Any]]:
    torch = v.torch
    platform_cls = type(v.platforms.current_platform)
    out: list[tuple[Any, str, Any]] = []
    if platform_cls.__name__ == "UnspecifiedPlatform":
        out += [
            (platform_cls, "get_attn_backend_cls", staticmethod(_attention_backend())),
            (platform_cls, "current_device", staticmethod(lambda: torch.device("meta"))),
            (platform_cls, "device_type", "meta"),
            (platform_cls, "get_device_capability", classmethod(lambda cls, device_id=0: _capability())),
            # Triton MLA (the MLA backend below Hopper) sizes its split-KV decode workspace by the SM count while the
            # layer is built; that workspace lives on meta and no figure kvaudit counts depends on it: an H100's 132.
            (platform_cls, "num_compute_units", classmethod(lambda cls, device_id=0: 132)),
        ]
        prefill = _optional("vllm.v1.attention.backends.mla.prefill.registry")
        if prefill is not None and hasattr(prefill.MLAPrefillBackendEnum, "CPU"):
            out.append((platform_cls, "get_mla_prefill_backend_cls",
                        staticmethod(lambda *_a, **_k: prefill.MLAPrefillBackendEnum.CPU.get_class())))
    supported = lambda *_a, **_k: (True, None)  # noqa: E731
    fa = _optional("vllm.v1.attention.backends.flash_attn")
    if fa is not None:  # FlashAttention 3 on Hopper: sinks and fp8 KV cache (unbound where its import failed)
        hopper = lambda *_a, **_k: DEVICE_CAPABILITY.get()[0] == 9  # noqa: E731
        out.append((fa, "flash_attn_supports_sinks", hopper))
        if hasattr(fa, "flash_attn_supports_kv_cache_dtype"):
            out.append((fa, "flash_attn_supports_kv_cache_dtype", hopper))
    for mod, name, value in (
        # FlashInfer ships with vLLM's CUDA wheels: the sparse MLA backend of consumer Blackwell (capability 12.x) asks
        # for its decode API, which a CUDA host has and this lean install lacks
        ("vllm.utils.flashinfer", "has_flashinfer_sparse_mla_sm120", lambda *_a, **_k: True),
        ("vllm.v1.attention.backends.mla.flashmla", "is_flashmla_dense_supported", supported),
        ("vllm.v1.attention.backends.mla.flashmla", "is_flashmla_sparse_supported", supported),
        ("vllm.v1.attention.ops.flashmla", "is_flashmla_dense_supported", supported),
        ("vllm.v1.attention.ops.flashmla", "is_flashmla_sparse_supported", supported),
    ):
        m = _optional(mod)
        if m is not None and hasattr(m, name):
            out.append((m, name, value))
    moe = _optional("vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method")
    oracle = _optional("vllm.model_executor.layers.fused_moe.oracle.unquantized")
    if moe is not None and oracle is not None and hasattr(moe, "select_unquantized_moe_backend"):
        triton = oracle.UnquantizedMoeBackend.TRITON
        out.append((moe, "select_unquantized_moe_backend", lambda *_a, **_k: (triton, None)))
    for name in ("vllm.model_executor.layers.fused_moe.config", "vllm.model_executor.layers.fused_moe.layer"):
        # FusedMoEConfig.__post_init__ (fused_moe/config.py; FusedMoE.__init__ in fused_moe/layer.py before it)
        # refuses a non-gated MoE (Nemotron-3-Nano's relu2 experts: is_act_and_mul=False) unless
        # current_platform.is_cuda_alike(). That check is the only is_cuda_alike() in either module; the module
        # sees a platform that answers it as CUDA does and is the real platform otherwise. The expert weights
        # are sized by the activation (one up shard instead of gate+up), not by the platform.
        m = _optional(name)
        if m is not None and hasattr(m, "current_platform"):
            out.append((m, "current_platform", _PlatformAnswering(m.current_platform, is_cuda_alike=True)))
    mx = _optional("vllm.model_executor.layers.quantization.mxfp4")
    mx_oracle = _optional("vllm.model_executor.layers.fused_moe.oracle.mxfp4")
    if mx is not None and mx_oracle is not None and hasattr(mx, "select_mxfp4_moe_backend"):
        backends = mx_oracle.Mxfp4MoeBackend
        out.append((mx, "select_mxfp4_moe_backend", lambda *_a, **_k: (getattr(backends, MXFP4_BACKEND.get()), None)))
    out += _quantized_moe_stand_ins()
    kernels = _optional("vllm.model_executor.kernels.linear")
    if kernels is not None:  # the linear-kernel tables: what they list for CUDA
        PlatformEnum = module("vllm.platforms.interface").PlatformEnum
        for name, table in vars(kernels).items():
            if name.startswith("_POSSIBLE_") and isinstance(table, dict) and PlatformEnum.CUDA in table:
                out.append((kernels, name, {**table, PlatformEnum.UNSPECIFIED: table[PlatformEnum.CUDA]}))
    if kernels is not None and hasattr(kernels, "choose_scaled_mm_linear_kernel"):
        out.append((kernels, "choose_scaled_mm_linear_kernel", _cuda_kernel_choice(kernels.choose_scaled_mm_linear_kernel)))
    if kernels is not None and hasattr(kernels, "choose_mp_linear_kernel") and hasattr(kernels, "_POSSIBLE_KERNELS"):
        out.append((kernels, "choose_mp_linear_kernel", _cuda_mp_kernel_choice(kernels.choose_mp_linear_kernel,
                                                                              kernels._POSSIBLE_KERNELS)))
    act = _optional("vllm.model_executor.layers.activation")
    if act is not None and hasattr(act, "GeluAndMulSparse"):
        # vllm/model_executor/layers/activation.py GeluAndMulSparse.__init__ (Gemma 3n's sparse MLP activation)
        # computes its threshold with a scalar tensor and .item(): under the build's default device that tensor
        # is on meta and .item() fails. On a GPU it is computed on the device and read back; the constructor,
        # run on the CPU, stores the same Python float. The op holds no parameter or buffer.
        cls = act.GeluAndMulSparse
        out.append((cls, "__init__", _on_cpu(cls.__init__)))
    gemm_rs_ar = "vllm.model_executor.kernels.linear.cute_dsl.gemm_rs_ar"
    if _absent("cutlass") and gemm_rs_ar not in sys.modules:
        # vllm/model_executor/kernels/linear/cute_dsl/gemm_rs_ar.py maybe_init_gemm_rs_ar, which Kimi-Linear /
        # Kimi-K3 (vllm/models/kimi_k3/nvidia/model.py) and DeepSeek-V4.1 import as they build, to decide
        # whether row-parallel projections use the fused GEMM + reduce-scatter/all-reduce kernel. The module
        # imports the CUTLASS DSL (nvidia-cutlass-dsl[cu13], some 95 MB of CUDA-only wheels) and cuda-python at
        # its top, to compile that kernel; the kernel is SM100-only, so on Hopper the function answers False
        # ("the device is not SM100-family"). While a model is built the module is this stand-in holding only
        # that function (any other name fails to import, as the real module does here); the projections'
        # weights are the same either way.
        out.append((sys.modules, gemm_rs_ar, _module(gemm_rs_ar, maybe_init_gemm_rs_ar=lambda *_a, **_k: False)))
    tilelang_utils = _optional("vllm.tilelang_utils")
    if tilelang_utils is not None and _absent("tilelang") and hasattr(tilelang_utils, "_DeferredTileLangJitKernel"):
        # vllm/tilelang_utils/__init__.py tilelang_jit, which DeepSeek-V4's mHC layers reach as they build (with JIT
        # warm-up on, vllm/models/deepseek_v4/nvidia/model.py imports the TileLang kernels to register their warm-up
        # shapes): off ROCm it applies tilelang.jit at import, and TileLang (a core requirement of vLLM 0.33 on CUDA,
        # some 200 MB with its compiler) is not in the lean install. While a model is built the decoration is
        # vLLM's own ROCm path, _DeferredTileLangJitKernel, which compiles on first use; no kernel runs while a model
        # is built, and the kernels hold no parameter.
        out.append((tilelang_utils, "tilelang_jit", tilelang_utils._DeferredTileLangJitKernel))
    out.append((v.registry, "_run_in_subprocess", lambda fn: fn()))  # no CUDA here to protect
    hf_config = _optional("vllm.transformers_utils.config")
    if hf_config is not None and hasattr(hf_config, "with_retry"):
        # vllm/transformers_utils/repo_utils.py with_retry, around get_config's read of config.json: it retries a
        # failed read after 2 s, for a Hub download that failed on the way. kvaudit hands vLLM a local folder
        # (kvaudit.model.hub resolves a Hub id to its cached snapshot first), where a config vLLM refuses is
        # refused again: it is read once, and the refusal comes 2 s sooner.
        out.append((hf_config, "with_retry", lambda func, *_a, **_k: func()))
    if not torch.cuda.is_available():
        # torch.cuda.Stream() / torch.cuda.Event() where a model builds its side streams for overlapping kernels
        # (vllm/models/kimi_k3/nvidia/model.py KimiLinearModel.__init__, its MLA / KDA layers; DeepSeek-V4 and
        # V4.1 likewise): a CPU build of torch refuses to make them. While a model is built they are
        # placeholders that are still instances of torch's classes; they are only held, never used, and hold
        # no tensor.
        stream, event = _placeholder_cuda_types(torch)
        out += [(torch.cuda, "Stream", stream), (torch.cuda, "Event", event)]
    if not torch.accelerator.is_available():  # the runner's workspace empties the device cache as it grows
        out.append((torch.accelerator, "empty_cache", lambda: None))
    return out


_MOE_EXPERTS = "vllm.model_executor.layers.fused_moe.experts"


def _quantized_moe_stand_ins() -> list[tuple[Any, str, Any]]:
    """The quantized-MoE oracles' questions, answered as on Hopper.

    vLLM's WNA16, NVFP4 and DeepSeek-V4 MXFP4 oracles (``fused_moe/oracle/int_wna16.py``
    ``select_wna16_moe_backend``: compressed-tensors int4, Kimi-K2.5; ``oracle/nvfp4.py``
    ``select_nvfp4_moe_backend``: ModelOpt NVFP4, MiniMax-M3-NVFP4; ``oracle/mxfp4.py``
    ``select_deepseek_v4_mxfp4_moe_backend``: Kimi-K3, DeepSeek-V4) walk a priority list and take the first
    backend whose kernel class passes ``is_supported_config``, which starts with ``_supports_current_device``.
    On Hopper every backend ahead of Humming / Marlin in those lists is refused by capability (FlashInfer
    TRT-LLM, CuTe-DSL, CUTLASS FP4, DeepGEMM FP4: SM100/SM120 only; FlashInfer CUTLASS: NVFP4 only on 10.0+;
    RDNA3: ROCm gfx1100), as they are here, so only the questions Humming's and Marlin's kernels ask are
    answered: ``is_cuda()`` (their capability checks already read ``get_device_capability``, which answers
    9.0), whether the ``humming`` package is installed, and ``prioritize_humming``'s ``prefers_humming``
    (Humming ahead of Marlin at capability 90). With vLLM 0.33 that picks HUMMING for all three, as an
    H100/H200 does; releases whose lists have no Humming entry there (0.23's WNA16) pick MARLIN.

    No parameter shape changes: the quant methods' ``create_weights`` size the expert parameters from the
    layer alone (``CompressedTensorsWNA16MoEMethod``, ``ModelOptNvFp4FusedMoE``; the latter's global-scale
    sizing ``is_global_sf_supported_for_nvfp4_backend`` is FlashInfer-only, false for Humming and Marlin
    alike), and both kernels repack in ``process_weights_after_loading``, which kvaudit never runs. The
    DeepSeek-V4 ``Mxfp4MoEMethod.maybe_roundup_sizes`` does pad by backend
    (``mxfp4_round_up_hidden_size_and_intermediate_size``: Marlin intermediate to 128 and hidden to 256,
    Humming intermediate to 64), which is why the backend chosen is Hopper's own and not just any.
    """
    out: list[tuple[Any, str, Any]] = []
    priority = _optional("vllm.model_executor.layers.quantization.utils.humming.priority")
    if priority is not None and hasattr(priority, "prefers_humming"):
        # vllm/model_executor/layers/quantization/utils/humming/priority.py prefers_humming: with no capability
        # given it asks current_platform.is_cuda() and the device's capability; answered for the deployment's device.
        prefers = priority.prefers_humming
        out.append((priority, "prefers_humming", lambda compute_capability=None: prefers(
            _capability().to_int() if compute_capability is None else compute_capability)))
    for name in ("marlin_moe", "fused_humming_moe"):
        # MarlinExpertsBase / HummingExpertsBase._supports_current_device: is_cuda() and capability >= 7.5. The
        # module's other platform questions (fp8_dtype, and is_cuda() in Humming's apply) pass through.
        m = _optional(f"{_MOE_EXPERTS}.{name}")
        if m is not None and hasattr(m, "current_platform"):
            out.append((m, "current_platform", _PlatformAnswering(m.current_platform, is_cuda=True)))
    humming = _optional(f"{_MOE_EXPERTS}.fused_humming_moe")
    if humming is not None and hasattr(humming, "has_humming") and _vllm_requires("humming"):
        # HummingExpertsBase._supports_current_device also asks has_humming() (vllm/utils/import_utils.py):
        # the humming-kernels wheel the installed vLLM requires on CUDA (0.33.0: humming-kernels[cu13]), which a
        # lean CPU install leaves out.
        out.append((humming, "has_humming", lambda: True))
        lazy = _optional("vllm.utils.humming")
        if _absent("humming") and lazy is not None and "_EXPORTS" in vars(lazy) \
                and "GemmType" in vars(lazy)["_EXPORTS"] and "GemmType" not in vars(lazy):
            # HummingExpertsBase.is_supported_config then keeps the Humming class whose humming_gemm_type()
            # (.value.lower()) is get_humming_moe_gemm_type's choice ("indexed", or "grouped_contiguous" under
            # expert parallelism), reading GemmType from vllm/utils/humming.py, which imports it lazily from the
            # humming package. While a model builds that name is an enum of the three members vLLM's classes
            # return, spelled as vLLM compares them; nothing else of humming is reached before loading.
            import enum

            gemm_type = enum.Enum("GemmType", {"INDEXED": "indexed", "GROUPED_CONTIGUOUS": "grouped_contiguous",
                                               "GROUPED_MASKED": "grouped_masked"}, module=__name__)
            out.append((vars(lazy), "GemmType", gemm_type))
    return out


def _vllm_requires(package: str) -> bool:
    """Whether the installed vLLM distribution requires ``package`` (or a ``package-…`` wheel providing it),
    outside its extras."""
    import importlib.metadata
    import re

    try:
        requires = importlib.metadata.requires("vllm") or []
    except importlib.metadata.PackageNotFoundError:
        return False
    names = [re.match(r"[A-Za-z0-9._-]*", r).group(0).lower() for r in requires if "extra ==" not in r]
    return any(n == package or n.startswith(package + "-") for n in names)


class _PlatformAnswering:
    """The current platform, except for the named yes/no questions, answered as CUDA on Hopper does."""

    def __init__(self, platform: Any, **answers: bool) -> None:
        self._platform = platform
        for name, answer in answers.items():
            setattr(self, name, lambda answer=answer: answer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


def _on_cpu(init: Callable[..., None]) -> Callable[..., None]:
    """A constructor run with the CPU as the default device (for scalar work a constructor reads back)."""
    def run(self: Any, *args: Any, **kwargs: Any) -> None:
        import torch

        with torch.device("cpu"):
            init(self, *args, **kwargs)
    return run


def _cuda_kernel_choice(choose: Callable[..., Any]) -> Callable[..., Any]:
    """Scaled-mm kernel choice: the platform's own answer, else the first kernel CUDA lists."""
    def pick(config: Any, possible_kernels: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return choose(config, possible_kernels, *args, **kwargs)
        except ValueError:
            PlatformEnum = module("vllm.platforms.interface").PlatformEnum
            return _supported_here(possible_kernels[PlatformEnum.CUDA][0])
    return pick


def _supported_here(kernel: type) -> type:
    """The CUDA kernel class, reporting itself supported (its constructor asserts that) on this host."""
    return type(kernel.__name__, (kernel,), {"is_supported": classmethod(lambda cls, *_a, **_k: (True, None))})


def _cuda_mp_kernel_choice(choose: Callable[..., Any], table: dict) -> Callable[..., Any]:
    """Mixed-precision (GPTQ/AWQ-style) kernel choice: the platform's answer, else the first kernel CUDA
    lists (these kernels repack weights after loading; the parameters are created by the quant method)."""
    def pick(config: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return choose(config, *args, **kwargs)
        except ValueError:
            PlatformEnum = module("vllm.platforms.interface").PlatformEnum
            return table[PlatformEnum.CUDA][0]
    return pick


def _placeholder_cuda_types(torch: Any) -> tuple[type, type]:
    """Subclasses of ``torch.cuda.Stream`` and ``torch.cuda.Event`` whose instances need no CUDA."""
    def placeholder(base: type) -> type:
        return type(base.__name__, (base,), {
            "__new__": lambda cls, *_a, **_k: object.__new__(cls),
            "__init__": lambda self, *_a, **_k: None,
            "__repr__": lambda self: f"<kvaudit placeholder torch.cuda.{base.__name__}>",
            "__module__": __name__,
        })
    return placeholder(torch.cuda.Stream), placeholder(torch.cuda.Event)


def _absent(name: str) -> bool:
    """Whether module ``name`` cannot be found (its parent packages are imported to look)."""
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def _module(name: str, **attrs: Any) -> Any:
    """A stand-in module holding only ``attrs``."""
    import types

    m = types.ModuleType(name, "kvaudit stand-in (kvaudit/model/vllm_model.py)")
    vars(m).update(attrs)
    return m


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception:  # a module this vLLM does not have, or cannot import here
        return None


_STAND_INS: list[tuple[Any, str, Any]] | None = None


def stand_ins() -> contextlib.AbstractContextManager[None]:
    """The stand-ins, for code outside this module that makes vLLM inspect a model (``ModelConfig``)."""
    return _stand_ins(_modules())


@contextlib.contextmanager
def _stand_ins(v: _Modules) -> Iterator[None]:
    global _STAND_INS
    if _STAND_INS is None:
        _STAND_INS = _stand_in_list(v)
    with contextlib.ExitStack() as stack:
        for obj, name, value in _STAND_INS:
            stack.enter_context(_patched(obj, name, value))
        yield


# --- parallel groups ------------------------------------------------------------------------------


def _init_distributed(v: _Modules, vc: Any) -> None:
    """One single-process gloo group, as vLLM's own CPU tests set up; TP, PP and DP ranks are views.
    The model runner's scratch workspace (read by DeepSeek-V3.2's indexer) lives on ``meta``."""
    ps = v.ps
    if ps.model_parallel_is_initialized():
        return
    workspace = _optional("vllm.v1.worker.workspace")
    if workspace is not None and hasattr(workspace, "init_workspace_manager"):
        workspace.init_workspace_manager(v.torch.device("meta"))
    # vLLM silences gloo's C-level prints by dup2-ing the fd of sys.stdout: give it a real one
    store = tempfile.mkdtemp(prefix="kvaudit-dist-")  # gloo's file store; removed by remove_temp_files
    _TEMP_DIRS.append(store)
    atexit.register(remove_temp_files)
    single = copy.copy(vc)  # (a DP size above 1 would make vLLM join a group of DP × TP processes: DP is a view too)
    object.__setattr__(single, "parallel_config", copy.copy(vc.parallel_config))
    object.__setattr__(single.parallel_config, "data_parallel_size", 1)
    with v.config.set_current_vllm_config(single), contextlib.redirect_stdout(sys.__stderr__):
        ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                        distributed_init_method=f"file://{os.path.join(store, 'store')}")
        ps.initialize_model_parallel(1, 1)


_TEMP_DIRS: list[str] = []


def remove_temp_files() -> None:
    """Remove the folder of the gloo group's file store (``kvaudit.plan.planner.remove_temp_dirs`` calls this before
    the CLI ends its process; at exit otherwise)."""
    while _TEMP_DIRS:
        shutil.rmtree(_TEMP_DIRS.pop(), ignore_errors=True)


@contextlib.contextmanager
def _parallel_view(v: _Modules, tp: int, pp: int, pp_rank: int, dp: int = 1) -> Iterator[None]:
    """Rank 0 of a TP group of ``tp``, rank ``pp_rank`` of a PP group of ``pp`` and rank 0 of a DP group of ``dp``
    (which an MoE layer reads to split its experts, ``FusedMoEParallelConfig.make``), as the model code reads them
    (``world_size``, ``rank_in_group``, first/last rank); no collective is ever run."""
    ps = v.ps
    tp_view = copy.copy(ps._TP)
    tp_view.world_size, tp_view.rank_in_group, tp_view.ranks = tp, 0, list(range(tp))
    pp_view = copy.copy(ps._PP)
    pp_view.world_size, pp_view.rank_in_group, pp_view.ranks, pp_view.rank = pp, pp_rank, list(range(pp)), pp_rank
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(ps, "_TP", tp_view))
        stack.enter_context(_patched(ps, "_PP", pp_view))
        if getattr(ps, "_DP", None) is not None:
            dp_view = copy.copy(ps._DP)
            dp_view.world_size, dp_view.rank_in_group, dp_view.ranks = dp, 0, list(range(dp))
            stack.enter_context(_patched(ps, "_DP", dp_view))
        if getattr(ps, "_EP", 0) is None:  # made only when the first model built was an MoE
            stack.enter_context(_patched(ps, "_EP", copy.copy(ps._WORLD)))
        yield


# --- building -------------------------------------------------------------------------------------


_BUILT: dict[str, BuiltModel] = {}


def built_model(key: str) -> BuiltModel | None:
    """The model built under ``key`` in this process, if any."""
    return _BUILT.get(key)


def remember(key: str, built: BuiltModel) -> None:
    """File a build under another key too (the same options, as vLLM resolved them)."""
    _BUILT.setdefault(key, built)


def build_model(vc: Any, key: str, pp_rank: int = 0) -> BuiltModel:
    """Build the model of ``vc`` on ``meta`` and file it under ``key`` (``built_model`` finds it);
    vLLM's refusal is a ConfigError."""
    v = _modules()
    pc = vc.parallel_config
    tp, pp, dp = pc.tensor_parallel_size, pc.pipeline_parallel_size, pc.data_parallel_size
    _init_distributed(v, vc)
    torch = v.torch
    arch = vc.model_config.architecture
    _fresh_backend_choice()
    if arch in getattr(v.registry, "_SPECULATIVE_DECODING_MODELS", {}) and vc.speculative_config is None:
        raise ConfigError(f"{arch} is a speculative-decoding draft model (vLLM's registry lists it among them): vLLM "
                          "builds it only beside the model it drafts for, given with --speculative-config; plan that "
                          "model (kvaudit plans an MTP draft with --num-speculative-tokens, not an EAGLE head)")
    try:
        with _stand_ins(v), _parallel_view(v, tp, pp, pp_rank, dp), v.config.set_current_vllm_config(vc), \
                torch.device("meta"), v.torch_utils.set_default_torch_dtype(vc.model_config.dtype):
            models = [v.loader.initialize_model(vllm_config=vc)]
            models += _draft_model(v, vc)
            online = _quantize_online(torch, models)
    except (KvauditError, MemoryError):
        raise
    except Exception as e:  # vLLM's model code on the user's config (a ZeroDivisionError on odd sizes, too)
        raise ConfigError(f"vLLM could not build {arch} for this deployment: {type(e).__name__}: "
                          f"{first_line(e, 300)}") from None
    built = BuiltModel(vllm_config=vc, architecture=arch, weights_bytes=_storage_bytes(models),
                       online=online, _tp=tp, _pp=pp, _pp_rank=pp_rank, _dp=dp)
    _BUILT[key] = built
    return built


ONLINE_PACKAGE = "vllm.model_executor.layers.quantization.online"
"""vLLM's online quantization (``--quantization fp8`` and its kin on a 16-bit checkpoint): its linear and MoE methods
create the checkpoint's 16-bit parameters and quantize them in ``process_weights_after_loading``."""
_OUT_PARAMETER_OPS = ("static_scaled_fp8_quant", "dynamic_scaled_fp8_quant", "dynamic_per_token_scaled_fp8_quant")
"""vLLM's FP8 quantization kernels (``vllm/_custom_ops.py`` ``scaled_fp8_quant``), which write into an output vLLM
allocates with the quantized shape and dtype: on ``meta`` they have nothing to compute."""


def _quantizes_online(method: Any) -> bool:
    """Whether a layer's quant method quantizes 16-bit weights after loading: one of ``ONLINE_PACKAGE`` (vLLM 0.33),
    an ``...Online...Method`` of ``quantization/fp8.py`` (0.23: ``Fp8OnlineLinearMethod``, ``Fp8OnlineMoEMethod``),
    or an FP8 method whose checkpoint is not FP8 (``Fp8Config.is_checkpoint_fp8_serialized`` false: older releases)."""
    if method is None:
        return False
    cls = type(method)
    return (cls.__module__.startswith(ONLINE_PACKAGE) or "Online" in cls.__name__
            or getattr(getattr(method, "quant_config", None), "is_checkpoint_fp8_serialized", True) is False)


def _quantize_online(torch: Any, models: list[Any]) -> str:
    """Run vLLM's own post-loading step of every online-quantized layer on ``meta``, so that the weights counted are
    the quantized ones the loaded model holds (the 16-bit parameters its layers created are replaced). A step that
    cannot run here is a one-line refusal, never 16-bit weights counted as quantized ones."""
    layers = [(name, mod) for model in models for name, mod in model.named_modules()
              if _quantizes_online(getattr(mod, "quant_method", None))]
    if not layers:
        return ""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(torch._dynamo.config, "disable", True))  # (its compiled quantizers run eagerly)
        for op in _OUT_PARAMETER_OPS:
            stack.enter_context(_patched(torch.ops._C, op, lambda *_a, **_k: None))
        for name, mod in layers:
            method = type(mod.quant_method).__name__
            try:
                mod.quant_method.process_weights_after_loading(mod)
            except Exception as e:  # a kernel's repacking this lean vLLM lacks
                raise ConfigError(
                    f"vLLM quantizes the weights online ({method}, layer {name}) after loading them, and that step "
                    f"could not run here ({type(e).__name__}: {first_line(e, 160)}): give the loaded weights with "
                    "--weights (vLLM logs them as 'Model loading took')") from None
    return ", ".join(sorted({type(mod.quant_method).__name__ for _, mod in layers}))


def _draft_model(v: _Modules, vc: Any) -> list[Any]:
    """MTP / EAGLE drafters: vLLM builds the draft model into the same forward context (its layers
    get KV cache too, marked ``is_draft``). Its weights count as built: the embedding and LM head
    that vLLM's proposer shares with the target after loading are counted twice."""
    spec = vc.speculative_config
    if spec is None or spec.draft_model_config is None:
        return []
    return [v.loader.initialize_model(vllm_config=vc, model_config=spec.draft_model_config)]


def _storage_bytes(models: list[Any]) -> int:
    """Bytes of the models' parameters and buffers, each storage once (tied weights, views)."""
    seen: dict[int, int] = {}
    for model in models:
        for t in list(model.parameters()) + list(model.buffers()):
            st = t.untyped_storage()
            seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def cache_key(*parts: Any) -> str:
    """A stable key for a build: every option that can change a parameter or a layer."""
    return json.dumps(parts, sort_keys=True, default=str)
