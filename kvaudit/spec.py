"""Read a HuggingFace ``config.json`` into a validated ``ModelSpec``: layer kinds, heads, weights.

No torch and no vLLM here: this module only checks the config and names vLLM's layers, so bad
input fails fast with a one-line message before anything heavy is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from kvaudit.errors import ConfigError, UsageError

FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                  "float": "float32"}


@dataclass(frozen=True)
class LayerKV:
    """One layer that holds KV cache, named as vLLM's model code names it."""

    name: str
    """vLLM's layer name, e.g. ``model.layers.3.self_attn.attn`` or ``model.layers.0.linear_attn``."""
    index: int
    """Decoder layer index in the model."""
    kind: str
    """``full_attention`` (vLLM ``FullAttentionSpec``) or ``linear_attention`` (GatedDeltaNet,
    vLLM ``MambaSpec``)."""


@dataclass(frozen=True)
class LinearAttentionDims:
    """GatedDeltaNet dimensions, the inputs of vLLM's ``gated_delta_net_state_shape``."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel_size: int


@dataclass(frozen=True)
class ModelSpec:
    """What kvaudit needs from a model config: its layers, heads and weight count."""

    name: str
    """Display name (the preset's title or the config's directory name)."""
    config_path: Path
    """The ``config.json`` that was read."""
    model_type: str
    architecture: str
    dtype: str
    """The config's weight dtype (``bfloat16``, ``float16`` or ``float32``)."""
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_size: int
    max_position_embeddings: int
    layers: tuple[LayerKV, ...]
    linear: LinearAttentionDims | None
    """GatedDeltaNet dimensions for hybrid models, else ``None``."""
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    """The config as read."""

    @property
    def is_hybrid(self) -> bool:
        """True when the model mixes full attention with linear (mamba-style) attention."""
        return self.linear is not None

    def check_tensor_parallel(self, tp: int) -> None:
        """Refuse a TP size that vLLM would refuse for this model, with vLLM's reason."""
        if tp < 1:
            raise UsageError(f"--tp must be at least 1, got {tp}")
        if self.num_attention_heads % tp:
            raise UsageError(
                f"TP {tp} does not divide the {self.num_attention_heads} attention heads of "
                f"{self.name} (vLLM requires num_attention_heads % tensor_parallel_size == 0)")
        kvh = self.num_key_value_heads
        if (kvh >= tp and kvh % tp) or (kvh < tp and tp % kvh):
            raise UsageError(
                f"TP {tp} and the {kvh} KV heads of {self.name} neither divide nor replicate evenly "
                f"(vLLM requires num_key_value_heads % tp == 0 or tp % num_key_value_heads == 0)")
        if self.linear is not None:
            for what, n in (("linear_num_key_heads", self.linear.num_k_heads),
                            ("linear_num_value_heads", self.linear.num_v_heads)):
                if n % tp:
                    raise UsageError(f"TP {tp} does not divide {what} = {n} of {self.name}")

    def weight_params_per_rank(self, tp: int) -> int:
        """Parameters one TP rank holds: sharded weights / tp plus replicated ones (norms, routers)."""
        sharded, replicated = _FAMILIES[self.model_type].params(self, tp)
        return sharded // tp + replicated


def resolve_dtype(dtype: str, spec: ModelSpec) -> str:
    """Resolve a ``--dtype`` value (``auto`` takes the config's) to a dtype name vLLM accepts."""
    d = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if d == "auto":
        return spec.dtype
    if d not in DTYPE_BYTES:
        raise UsageError(f"unknown --dtype {dtype!r} (use auto, bfloat16, float16 or float32)")
    return d


def load_model_spec(path: str | Path, name: str | None = None) -> ModelSpec:
    """Read ``config.json`` (or a model directory holding one) into a validated ``ModelSpec``."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"config not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {p}: {e}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{p} must hold a JSON object, not {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type is None:
        raise ConfigError(f"{p}: missing required field 'model_type'")
    family = _FAMILIES.get(model_type)
    if family is None:
        raise ConfigError(
            f"{p}: unsupported model_type {model_type!r} (supported: {', '.join(sorted(_FAMILIES))})")
    return family.build(cfg, p, name or p.parent.name)


# --- model families -------------------------------------------------------------------------


def _int(cfg: Mapping[str, Any], key: str, path: Path, default: int | None = None) -> int:
    if key not in cfg or cfg[key] is None:
        if default is not None:
            return default
        raise ConfigError(f"{path}: missing required field {key!r} for model_type {cfg['model_type']!r}")
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"{path}: field {key!r} must be a positive integer, got {v!r}")
    return v


def _config_dtype(cfg: Mapping[str, Any], path: Path) -> str:
    d = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    d = _DTYPE_ALIASES.get(str(d).lower(), str(d).lower())
    if d not in DTYPE_BYTES:
        raise ConfigError(f"{path}: unsupported weight dtype {d!r} (supported: {', '.join(DTYPE_BYTES)})")
    return d


def _architecture(cfg: Mapping[str, Any], default: str) -> str:
    archs = cfg.get("architectures") or [default]
    return str(archs[0])


class _Dense:
    """Llama-style decoders: every layer is full attention (``FullAttentionSpec``)."""

    model_types = ("llama", "qwen2", "qwen3")
    default_arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

    def build(self, cfg: Mapping[str, Any], path: Path, name: str) -> ModelSpec:
        n = _int(cfg, "num_hidden_layers", path)
        heads = _int(cfg, "num_attention_heads", path)
        hidden = _int(cfg, "hidden_size", path)
        kvh = _int(cfg, "num_key_value_heads", path, default=heads)
        head_dim = _int(cfg, "head_dim", path, default=hidden // heads)
        _int(cfg, "intermediate_size", path)
        if cfg.get("use_sliding_window"):
            raise ConfigError(f"{path}: sliding-window attention is not supported yet")
        return ModelSpec(
            name=name, config_path=path, model_type=cfg["model_type"],
            architecture=_architecture(cfg, self.default_arch[cfg["model_type"]]),
            dtype=_config_dtype(cfg, path), hidden_size=hidden, vocab_size=_int(cfg, "vocab_size", path),
            num_attention_heads=heads, num_key_value_heads=kvh, head_size=head_dim,
            max_position_embeddings=_int(cfg, "max_position_embeddings", path),
            layers=tuple(LayerKV(f"model.layers.{i}.self_attn.attn", i, FULL_ATTENTION) for i in range(n)),
            linear=None, raw=dict(cfg))

    def params(self, s: ModelSpec, tp: int) -> tuple[int, int]:
        c, h = s.raw, s.hidden_size
        inter = c["intermediate_size"]
        kv = max(1, s.num_key_value_heads // tp) * tp * s.head_size  # replicated KV heads count per rank
        attn = h * s.num_attention_heads * s.head_size * 2 + h * kv * 2
        if c.get("attention_bias") or s.model_type == "qwen2":
            attn += s.num_attention_heads * s.head_size + 2 * kv
        mlp = 3 * h * inter
        embed = s.vocab_size * h * (1 if c.get("tie_word_embeddings") else 2)
        sharded = embed + len(s.layers) * (attn + mlp)
        replicated = h * (2 * len(s.layers) + 1)
        if s.model_type == "qwen3":
            replicated += 2 * s.head_size * len(s.layers)  # q_norm, k_norm
        return sharded, replicated


class _Qwen3Next:
    """Qwen3-Next: GatedDeltaNet (``MambaSpec``) layers with full attention every N-th layer."""

    model_types = ("qwen3_next",)

    def build(self, cfg: Mapping[str, Any], path: Path, name: str) -> ModelSpec:
        n = _int(cfg, "num_hidden_layers", path)
        heads = _int(cfg, "num_attention_heads", path)
        hidden = _int(cfg, "hidden_size", path)
        for key in ("num_key_value_heads", "head_dim", "num_experts", "moe_intermediate_size"):
            _int(cfg, key, path)
        linear = LinearAttentionDims(
            num_k_heads=_int(cfg, "linear_num_key_heads", path),
            num_v_heads=_int(cfg, "linear_num_value_heads", path),
            head_k_dim=_int(cfg, "linear_key_head_dim", path),
            head_v_dim=_int(cfg, "linear_value_head_dim", path),
            conv_kernel_size=_int(cfg, "linear_conv_kernel_dim", path))
        kinds = cfg.get("layer_types")
        if kinds is None:
            interval = _int(cfg, "full_attention_interval", path)
            kinds = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(n)]
        if not isinstance(kinds, list) or len(kinds) != n or set(kinds) - {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise ConfigError(f"{path}: 'layer_types' must list {n} entries of "
                              f"'{FULL_ATTENTION}' or '{LINEAR_ATTENTION}'")
        layers = tuple(
            LayerKV(f"model.layers.{i}.self_attn.attn" if k == FULL_ATTENTION else f"model.layers.{i}.linear_attn",
                    i, k) for i, k in enumerate(kinds))
        return ModelSpec(
            name=name, config_path=path, model_type="qwen3_next",
            architecture=_architecture(cfg, "Qwen3NextForCausalLM"), dtype=_config_dtype(cfg, path),
            hidden_size=hidden, vocab_size=_int(cfg, "vocab_size", path), num_attention_heads=heads,
            num_key_value_heads=cfg["num_key_value_heads"], head_size=cfg["head_dim"],
            max_position_embeddings=_int(cfg, "max_position_embeddings", path),
            layers=layers, linear=linear, raw=dict(cfg))

    def params(self, s: ModelSpec, tp: int) -> tuple[int, int]:
        # Parameter shapes as vLLM's qwen3_next.py builds them (gated attention doubles q_proj;
        # the router gate and shared_expert_gate are ReplicatedLinear; norms are replicated).
        c, h, lin = s.raw, s.hidden_size, s.linear
        assert lin is not None
        kv = max(1, s.num_key_value_heads // tp) * tp * s.head_size
        q_out = s.num_attention_heads * s.head_size * (2 if c.get("attn_output_gate", True) else 1)
        attn = h * q_out + 2 * h * kv + s.num_attention_heads * s.head_size * h
        key_dim, value_dim = lin.num_k_heads * lin.head_k_dim, lin.num_v_heads * lin.head_v_dim
        conv_dim = 2 * key_dim + value_dim
        gdn = (h * (2 * key_dim + 2 * value_dim) + h * 2 * lin.num_v_heads + conv_dim * lin.conv_kernel_size
               + 2 * lin.num_v_heads + value_dim * h)
        experts, moe_i = c["num_experts"], c["moe_intermediate_size"]
        shared_i = c.get("shared_expert_intermediate_size") or 0
        sparse_step = c.get("decoder_sparse_step") or 1
        mlp_only = set(c.get("mlp_only_layers") or [])
        sharded = s.vocab_size * h * (1 if c.get("tie_word_embeddings") else 2)
        replicated = h  # final norm
        for layer in s.layers:
            sharded += attn if layer.kind == FULL_ATTENTION else gdn
            replicated += 2 * h + (2 * s.head_size if layer.kind == FULL_ATTENTION else lin.head_v_dim)
            if layer.index not in mlp_only and experts > 0 and (layer.index + 1) % sparse_step == 0:
                sharded += experts * 3 * h * moe_i + 3 * h * shared_i
                replicated += h * experts + (h if shared_i else 0)
            else:
                sharded += 3 * h * _int(c, "intermediate_size", s.config_path)
        return sharded, replicated


_FAMILIES: dict[str, Any] = {}
for _family in (_Dense(), _Qwen3Next()):
    for _mt in _family.model_types:
        _FAMILIES[_mt] = _family

SUPPORTED_MODEL_TYPES = tuple(sorted(_FAMILIES))
