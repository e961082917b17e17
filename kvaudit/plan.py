"""The one adapter to vLLM's own KV-cache planner: deployment + platform rule -> ``KVPlan``.

Every plan comes from the installed vLLM: its ``ModelConfig``/``VllmConfig``, its ``KVCacheSpec``
classes and mamba state helpers, its hybrid block-size alignment (CUDA), and its
``get_kv_cache_configs``. The only code here that is not vLLM's is the Ascend block-size rule,
which lives in vllm-ascend (``patch_mamba_config.py``) and cannot be imported without an NPU; it
is restated from ``shared/design/allocation-reference.md`` §3 and §5.4.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.metadata
import logging
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from kvaudit.deployment import Deployment
from kvaudit.errors import ConfigError, StrategyFailed
from kvaudit.results import GroupPlan, KVPlan, TensorPlan
from kvaudit.spec import FULL_ATTENTION


@dataclass(frozen=True)
class PlatformRule:
    """How a platform sizes attention blocks and pads pages before vLLM plans."""

    name: str
    title: str
    apply: Callable[[Any, Any, Deployment], None]
    """``apply(vllm, vllm_config, deployment)`` sets ``cache_config.block_size`` and the paddings."""
    attention_page_padded: bool = False
    """Whether attention specs get ``page_size_padded = mamba padded page`` (vllm-ascend #6887)."""


def vllm_version() -> str | None:
    """The installed vLLM's version, read from package metadata without importing vLLM."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def quiet_vllm() -> Iterator[None]:
    """Keep vLLM's logging and prints off stdout, which belongs to the report."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    for name in ("vllm", "torch._library.triton", "transformers"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    with contextlib.redirect_stdout(sys.stderr):
        yield


class _Vllm:
    """The vLLM modules the adapter uses, imported once."""

    def __init__(self) -> None:
        if vllm_version() is None:
            raise StrategyFailed("vLLM is not installed in this environment; kvaudit plans with "
                                 "vLLM's own planner (see README: install)")
        with quiet_vllm():
            self.config = importlib.import_module("vllm.config")
            self.iface = importlib.import_module("vllm.v1.kv_cache_interface")
            try:
                self.planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
            except ImportError:  # vLLM <= 0.32
                self.planning = importlib.import_module("vllm.v1.core.kv_cache_utils")
            self.mamba_utils = importlib.import_module("vllm.model_executor.layers.mamba.mamba_utils")
            self.flash_attn = importlib.import_module("vllm.v1.attention.backends.flash_attn")
            self.backend_utils = importlib.import_module("vllm.v1.attention.backends.utils")
            self.platform_iface = importlib.import_module("vllm.platforms.interface")
            self.worker_utils = importlib.import_module("vllm.v1.worker.utils")
            self.gdn = importlib.import_module("vllm.v1.attention.backends.gdn_attn")
            self.registry = importlib.import_module("vllm.v1.attention.backends.registry")
        self.version = vllm_version() or "unknown"


_VLLM: _Vllm | None = None


def load_vllm() -> _Vllm:
    """Import the vLLM modules the planner needs (the slow part: 5-10 s cold)."""
    global _VLLM
    if _VLLM is None:
        _VLLM = _Vllm()
    return _VLLM


# --- platform rules -----------------------------------------------------------------------------


def _attn_page_1_token(v: _Vllm, vc: Any) -> int:
    mc, pc = vc.model_config, vc.parallel_config
    return v.iface.FullAttentionSpec(block_size=1, num_kv_heads=mc.get_num_kv_heads(pc),
                                     head_size=mc.get_head_size(), dtype=_kv_dtype(vc)).page_size_bytes


def _kv_dtype(vc: Any) -> Any:
    return vc.model_config.dtype  # kv_cache_dtype "auto": the model dtype


def _cuda_rule(v: _Vllm, vc: Any, d: Deployment) -> None:
    """Upstream vLLM on CUDA with FlashAttention: vLLM's own ``_align_hybrid_block_size``."""
    if d.model.is_hybrid:
        v.platform_iface.Platform._align_hybrid_block_size(vc, v.flash_attn.FlashAttentionBackend)


def _ascend_align_rule(align: int) -> Callable[[_Vllm, Any, Deployment], None]:
    """vllm-ascend's patched ``verify_and_update_config`` up to v0.15: upstream's hybrid formula with
    a 64-token (to v0.11.0rc1) or 128-token (v0.11.0rc2 .. v0.15) alignment (§5.4)."""
    return lambda v, vc, d: _ascend_align(v, vc, d, align)


def _ascend_align(v: _Vllm, vc: Any, d: Deployment, align: int) -> None:
    cc = vc.cache_config
    if not d.model.is_hybrid:
        cc.block_size = 128  # NPUPlatform.check_and_update_config when block_size is unset
        return
    attn_1 = _attn_page_1_token(v, vc)
    mamba_page = _mamba_page(v, vc)
    block = align * math.ceil(mamba_page / (align * attn_1))
    if cc.block_size is None or cc.block_size < block:
        cc.block_size = block
    attn_page = cc.block_size * attn_1
    assert attn_page >= mamba_page
    if cc.mamba_cache_mode == "align":
        cc.mamba_block_size = cc.block_size
    cc.mamba_page_size_padded = attn_page if attn_page != mamba_page else None


def _ascend_contiguous_rule(v: _Vllm, vc: Any, d: Deployment) -> None:
    """vllm-ascend #6887 (v0.16.0rc1 on): K page = ssm state, page = 2K + conv (§3)."""
    cc, mc, pc = vc.cache_config, vc.model_config, vc.parallel_config
    if not d.model.is_hybrid:
        cc.block_size = 128
        return
    kernel = 128
    k_tok = mc.get_head_size() * mc.get_num_kv_heads(pc) * _kv_dtype(vc).itemsize
    shapes, dtypes = _mamba_state(v, vc)
    sizes = [math.prod(s) * dt.itemsize for s, dt in zip(shapes, dtypes)]
    ssm_page, conv_page = max(sizes), min(sizes)
    block = kernel * math.ceil(ssm_page / (kernel * k_tok))
    if k_tok * block != ssm_page:
        raise ConfigError(f"vllm-ascend's contiguous layout needs the K page ({k_tok} B/token × {block}) "
                          f"to equal the ssm state ({ssm_page} B); this model does not fit it")
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


# --- building the plan ----------------------------------------------------------------------------


def _mamba_state(v: _Vllm, vc: Any) -> tuple[tuple, tuple]:
    """GatedDeltaNet state shapes and dtypes from vLLM's own calculators, sharded for TP."""
    hf, cc = vc.model_config.hf_text_config, vc.cache_config
    spec = vc.speculative_config
    num_spec = spec.num_speculative_tokens if spec else 0
    shapes = v.mamba_utils.MambaStateShapeCalculator.gated_delta_net_state_shape(
        vc.parallel_config.tensor_parallel_size, hf.linear_num_key_heads, hf.linear_num_value_heads,
        hf.linear_key_head_dim, hf.linear_value_head_dim, hf.linear_conv_kernel_dim, num_spec)
    dtypes = v.mamba_utils.MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        vc.model_config.dtype, cc.mamba_cache_dtype, cc.mamba_ssm_cache_dtype)
    return tuple(tuple(s) for s in shapes), tuple(dtypes)


def _mamba_page(v: _Vllm, vc: Any) -> int:
    shapes, dtypes = _mamba_state(v, vc)
    return v.iface.MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes


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


def _vllm_config(v: _Vllm, d: Deployment) -> Any:
    c = v.config
    try:
        mc = c.ModelConfig(model=str(_model_dir(d.model.config_path)), dtype=d.dtype,
                           max_model_len=d.max_model_len)
        vc = c.VllmConfig(model_config=mc, cache_config=c.CacheConfig(),
                          parallel_config=c.ParallelConfig(tensor_parallel_size=d.tp),
                          device_config=c.DeviceConfig(device="cpu"))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"vLLM rejected the config {d.model.config_path}: {_first_line(e)}") from None
    # With no accelerator vLLM's UnspecifiedPlatform turns the hybrid KV-cache manager off; every
    # platform kvaudit audits (CUDA, Ascend) keeps it on.
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    vc.cache_config.num_gpu_blocks_override = d.num_blocks_override
    return vc


def _layer_specs(v: _Vllm, vc: Any, d: Deployment, rule: PlatformRule) -> dict[str, Any]:
    """One ``KVCacheSpec`` per layer, in model order, as the model runner's ``get_kv_cache_spec``."""
    cc, mc, pc = vc.cache_config, vc.model_config, vc.parallel_config
    specs: dict[str, Any] = {}
    mamba = _mamba_state(v, vc) if d.model.is_hybrid else None
    for layer in d.model.layers:
        if layer.kind == FULL_ATTENTION:
            kw: dict[str, Any] = dict(block_size=cc.block_size, num_kv_heads=mc.get_num_kv_heads(pc),
                                      head_size=mc.get_head_size(), dtype=_kv_dtype(vc))
            if rule.attention_page_padded and cc.mamba_page_size_padded:
                kw["page_size_padded"] = cc.mamba_page_size_padded
            spec = v.iface.FullAttentionSpec(**kw)
            if rule.name == "cuda" and hasattr(v.worker_utils, "customize_attention_spec"):  # vLLM 0.29+
                spec = v.worker_utils.customize_attention_spec(v.flash_attn.FlashAttentionBackend, spec)
        else:
            assert mamba is not None
            spec = v.iface.MambaSpec(
                shapes=mamba[0], dtypes=mamba[1], block_size=cc.mamba_block_size,
                page_size_padded=cc.mamba_page_size_padded,
                mamba_type=v.registry.MambaAttentionBackendEnum.GDN_ATTN,
                mamba_cache_mode=cc.mamba_cache_mode, num_speculative_blocks=vc.num_speculative_tokens)
        specs[layer.name] = spec
    return specs


def build_plan(d: Deployment, platform: str) -> KVPlan:
    """Plan the KV cache for ``d`` with vLLM's own planner under the platform's block-size rule."""
    rule = PLATFORMS[platform]
    v = load_vllm()
    with quiet_vllm():
        vc = _vllm_config(v, d)
        rule.apply(v, vc, d)
        specs = _layer_specs(v, vc, d, rule)
        if hasattr(v.backend_utils, "resolve_kv_cache_layout"):  # vLLM 0.29+: the engine resolves it first
            backends = [v.flash_attn.FlashAttentionBackend] + ([v.gdn.GDNAttentionBackend] if d.model.is_hybrid else [])
            layouts = [lay.name for lay in v.backend_utils.get_supported_kv_cache_layouts(backends)]
            v.backend_utils.resolve_kv_cache_layout(vc, [layouts], specs.values())
        groups: list[Any] = []
        try:
            if hasattr(v.planning, "get_global_kv_cache_groups"):
                groups = v.planning.get_global_kv_cache_groups(vc, [specs])
                cfg = v.planning.get_kv_cache_configs(vc, [specs], [d.kv_budget_bytes], groups)[0]
            else:
                cfg = v.planning.get_kv_cache_configs(vc, [specs], [d.kv_budget_bytes])[0]
        except ValueError as e:
            per_block = max((g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in groups), default=0)
            raise ConfigError(
                f"vLLM's planner refused the budget of {d.kv_budget_bytes:,} B (one block of every group "
                f"needs {per_block:,} B): {_first_line(e)}") from None
    if cfg.num_blocks < 1:
        raise ConfigError(f"the KV budget {d.kv_budget_bytes} B holds no block of every group")
    return _to_plan(cfg, vc, d, rule, specs, v.version)


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def _to_plan(cfg: Any, vc: Any, d: Deployment, rule: PlatformRule, specs: dict[str, Any],
             version: str) -> KVPlan:
    groups = tuple(
        GroupPlan(index=i, spec_type=type(g.kv_cache_spec).__name__, block_size=g.kv_cache_spec.block_size,
                  page_size_bytes=g.kv_cache_spec.page_size_bytes, layer_names=tuple(g.layer_names))
        for i, g in enumerate(cfg.kv_cache_groups))
    tensors = cfg.kv_cache_tensors
    if tensors and hasattr(tensors[0], "shared_by"):
        fmt = "shared_by"
        regions = tuple(TensorPlan(size=t.size, shared_by=tuple(t.shared_by)) for t in tensors)
        planned = sum(t.size for t in tensors)
    else:
        fmt = "layers"
        page = {name: g.page_size_bytes for g in groups for name in g.layer_names}
        regions = shared_by_view(tensors, cfg.num_blocks, page)
        planned = max(t.size for t in tensors) if tensors else 0
    return KVPlan(vllm_version=version, platform=rule.name, block_size=vc.cache_config.block_size,
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
            raise StrategyFailed(
                "this plan interleaves layers within blocks (block-outermost layout); it has no "
                "shared_by view for strategies written for KVCacheTensor(size, shared_by)")
    return tuple(TensorPlan(size=e - s, shared_by=tuple(names)) for (s, e), names in ordered)
