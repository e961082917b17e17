"""Read a HuggingFace ``config.json`` into a ``ModelSpec``: which model it is, checked before vLLM loads.

No torch and no vLLM here: what the layers are is vLLM's model code's answer (``kvaudit.vllm_model``);
this module only refuses what is not a HuggingFace config, or is inconsistent, with a one-line
message before anything heavy is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from kvaudit.errors import ConfigError, UsageError

KNOWN_LAYER_TYPES = frozenset({
    "full_attention", "sliding_attention", "chunked_attention", "linear_attention", "attention", "mamba",
    "conv", "hybrid", "moe", "dense", "mlp"})
"""``layer_types`` entries that the HuggingFace configs of the models vLLM serves use."""


@dataclass(frozen=True)
class ModelSpec:
    """A model config as read: its identity and the fields checked before vLLM plans it."""

    name: str
    """Display name (the preset's title or the config's directory name)."""
    config_path: Path
    """The ``config.json`` that was read."""
    model_type: str
    architecture: str
    """``architectures[0]``: what vLLM's ``ModelRegistry`` resolves to a model class."""
    dtype: str
    """The config's declared weight dtype (``torch_dtype`` / ``dtype``), before vLLM's auto rule."""
    num_hidden_layers: int
    max_position_embeddings: int | None
    quantization: str | None
    """``quantization_config.quant_method``, if the checkpoint is quantized."""
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    """The config as read."""
    text: Mapping[str, Any] = field(repr=False, compare=False)
    """The language model's config (``text_config`` inside a multimodal wrapper, else ``raw``)."""

    def check_parallel(self, tp: int, pp: int) -> None:
        """Refuse what no PP split of this model can be (``make_deployment`` has checked both are at
        least 1; vLLM checks TP against the heads when it plans)."""
        if pp > self.num_hidden_layers:
            raise UsageError(f"--pp {pp} exceeds the {self.num_hidden_layers} layers of {self.name}: "
                             "a pipeline stage would hold no layer")


def load_model_spec(path: str | Path, name: str | None = None) -> ModelSpec:
    """Read ``config.json`` (or a model directory holding one) into a checked ``ModelSpec``."""
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
    if "model_type" not in cfg and {"d_model", "n_layer"} <= set(cfg):
        raise ConfigError(f"{p} is in mamba_ssm's format (d_model, n_layer, ssm_cfg), not a HuggingFace "
                          "config.json; vLLM serves the HuggingFace conversion (model_type mamba / mamba2)")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError(f"{p}: missing required field 'model_type' (is this a HuggingFace config.json?)")
    archs = cfg.get("architectures")
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        raise ConfigError(f"{p}: missing 'architectures' (vLLM resolves the model class from it)")
    tc = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    layers = _positive(tc, "num_hidden_layers", p)
    _check_heads(tc, p)
    _check_layer_types(tc, layers, p)
    mpe = tc.get("max_position_embeddings")
    _check_sliding_window(tc, mpe, p)
    quant = cfg.get("quantization_config")
    return ModelSpec(
        name=name or p.parent.name, config_path=p, model_type=model_type, architecture=archs[0],
        dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or tc.get("torch_dtype") or tc.get("dtype") or "auto"),
        num_hidden_layers=layers, max_position_embeddings=mpe if isinstance(mpe, int) else None,
        quantization=str(quant.get("quant_method")) if isinstance(quant, dict) and quant.get("quant_method") else None,
        raw=dict(cfg), text=dict(tc))


def _positive(cfg: Mapping[str, Any], key: str, path: Path) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"{path}: field {key!r} must be a positive integer, got {v!r}")
    return v


def _check_heads(tc: Mapping[str, Any], path: Path) -> None:
    heads, kv = tc.get("num_attention_heads"), tc.get("num_key_value_heads")
    for key, v in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise ConfigError(f"{path}: field {key!r} must be a positive integer, got {v!r}")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise ConfigError(f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}; "
                          "grouped-query attention needs whole groups")


def _check_layer_types(tc: Mapping[str, Any], layers: int, path: Path) -> None:
    kinds = tc.get("layer_types")
    if kinds is None:
        return
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ConfigError(f"{path}: 'layer_types' must be a list of strings")
    unknown = sorted(set(kinds) - KNOWN_LAYER_TYPES)
    if unknown:
        raise ConfigError(f"{path}: unknown layer_types entry {unknown[0]!r} (known: {', '.join(sorted(KNOWN_LAYER_TYPES))})")
    if len(kinds) < layers:
        raise ConfigError(f"{path}: 'layer_types' lists {len(kinds)} layers, the config has {layers}")


def _check_sliding_window(tc: Mapping[str, Any], mpe: Any, path: Path) -> None:
    window = tc.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or tc.get("use_sliding_window") is False:
        return
    if isinstance(mpe, int) and window > mpe:
        raise ConfigError(f"{path}: sliding_window {window} exceeds max_position_embeddings {mpe}; "
                          "the config is inconsistent")
