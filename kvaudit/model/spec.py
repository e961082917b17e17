"""Read a HuggingFace ``config.json`` into a ``ModelSpec``: which model it is, checked before vLLM loads.

No torch and no vLLM here: what the layers are is vLLM's model code's answer (``kvaudit.model.vllm_model``);
this module only refuses what is not a HuggingFace config, is inconsistent, or describes no model
(``check_config``), with a one-line message before anything heavy is imported.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from kvaudit.errors import ConfigError, UsageError
from kvaudit.escape import terminal_safe


EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
"""The config keys that hold an MoE model's routed experts, by family (Qwen, Mixtral, DeepSeek, ERNIE)."""


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
    num_hidden_layers: int | None
    """The layer count under any of the names transformers' configs give it (``LAYER_COUNT_KEYS``); None where the
    config leaves it to its class's default (a multimodal wrapper's ``text_config`` often does): vLLM reads it."""
    max_position_embeddings: int | None
    quantization: str | None
    """``quantization_config.quant_method``, if the checkpoint is quantized."""
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    """The config as read."""
    text: Mapping[str, Any] = field(repr=False, compare=False)
    """The language model's config (``text_config`` inside a multimodal wrapper, else ``raw``)."""
    trust_remote_code: bool = False
    """vLLM's ``--trust-remote-code``: whether the folder's own config and model code may run."""

    @property
    def routed_experts(self) -> int:
        """The model's routed experts (0 for a dense model), under the config keys ``EXPERT_COUNTS`` names."""
        return next((n for n in (self.text.get(k) for k in EXPERT_COUNTS)
                     if isinstance(n, int) and not isinstance(n, bool) and n > 0), 0)

    def check_parallel(self, tp: int, pp: int) -> None:
        """Refuse what no PP split of this model can be (``make_deployment`` has checked both are at
        least 1; vLLM checks TP against the heads when it plans)."""
        if self.num_hidden_layers is not None and pp > self.num_hidden_layers:
            raise UsageError(f"--pp {pp} exceeds the {self.num_hidden_layers} layers of {self.name}: "
                             "a pipeline stage would hold no layer")


def load_model_spec(path: str | Path, name: str | None = None, trust_remote_code: bool = False) -> ModelSpec:
    """Read ``config.json`` (or a model directory holding one) into a checked ``ModelSpec``; no code of the
    folder runs here (vLLM runs it later, and only with ``trust_remote_code``)."""
    from kvaudit.jsonfile import read_json

    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise ConfigError(f"config not found: {p}")
    try:
        cfg = read_json(p, "HuggingFace config.json", "give a model folder or its config.json")
    except UsageError as e:
        raise ConfigError(e.message) from None
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
    tc = check_config(cfg, p)
    mpe = tc.get("max_position_embeddings")
    quant = cfg.get("quantization_config")
    return ModelSpec(
        name=terminal_safe(name or p.parent.name), config_path=p, model_type=model_type, architecture=archs[0],
        dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or tc.get("torch_dtype") or tc.get("dtype") or "auto"),
        num_hidden_layers=layer_count(tc), max_position_embeddings=mpe if isinstance(mpe, int) else None,
        quantization=str(quant.get("quant_method")) if isinstance(quant, dict) and quant.get("quant_method") else None,
        raw=dict(cfg), text=dict(tc), trust_remote_code=trust_remote_code)


def text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: ``text_config`` inside a multimodal wrapper, else the config itself."""
    tc = cfg.get("text_config")
    return tc if isinstance(tc, dict) else cfg


def check_config(cfg: Mapping[str, Any], where: Any) -> Mapping[str, Any]:
    """Refuse, in one line naming ``where`` (exit 2), a config that describes no model, and return its text
    config: the checks of ``load_model_spec``, run again by ``kvaudit.plan.planner`` on the config with
    ``--hf-overrides`` applied. vLLM would plan many such configs (a ``full_attention_interval`` of -1 as 48
    full-attention layers, a ``sliding_window`` of 0 as full attention, a ``hidden_size`` of 0) and every
    strategy would pass on a model that does not exist."""
    tc = text_config(cfg)
    for key in LAYER_COUNT_KEYS:
        if key in tc:
            _positive(tc, key, where)
    layers = layer_count(tc)
    for c in ((tc, cfg) if tc is not cfg else (cfg,)):
        _check_sizes(c, where)
    _check_heads(tc, where)
    _check_layer_types(tc, layers, where)
    return tc


LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
"""The names transformers' config classes give the layer count (``attribute_map`` of GPT-2 and GPT-J: ``n_layer``;
ChatGLM: ``num_layers``; MPT: ``n_layers``); a config that sets none takes its class's default, as vLLM does."""


def layer_count(tc: Mapping[str, Any]) -> int | None:
    """The layer count the config sets, under the first of ``LAYER_COUNT_KEYS`` it uses; None where it sets none."""
    for key in LAYER_COUNT_KEYS:
        v = tc.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def with_overrides(cfg: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config as vLLM applies ``--hf-overrides`` to it (``ModelConfig``): flat keys set on the config
    itself, a table merged into the sub-config of that name (``{"text_config": {...}}``)."""
    out = dict(cfg)
    for key, value in (overrides or {}).items():
        out[key] = with_overrides(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


AT_LEAST_ONE = (
    *LAYER_COUNT_KEYS, "hidden_size", "intermediate_size", "moe_intermediate_size",
    "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "sliding_window", "sliding_window_pattern", "full_attention_interval", "attention_chunk_size",
    "num_experts_per_tok", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_n_heads", "mamba_d_head",
    "mamba_head_dim", "mamba_n_groups", "ssm_state_size", "conv_kernel", "n_groups", "attn_layer_period",
    "expert_layer_period", "decoder_sparse_step")
"""Config fields that, where a config sets them (not ``null``), are sizes, counts, periods or windows of at least
1: HuggingFace's definitions ("Dimension of the hidden representations", "Number of hidden layers", "the
sliding window attention window size", a full-attention layer "every N layers"). 0 or less describes no model."""

MLA_SIZES = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
"""The sizes of multi-head latent attention, which a DeepSeek-V2 config with ``use_mla: false`` does not use (vLLM's
``ModelConfig.is_deepseek_mla`` reads the flag; DeepSeek-OCR sets ``qk_rope_head_dim`` to 0)."""

AT_LEAST_ZERO = ("num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts",
                 "num_nextn_predict_layers", "first_k_dense_replace", "shared_expert_intermediate_size")
"""Counts where 0 is a model without that part (a dense Granite 4.0-H has ``num_local_experts: 0``); negative
describes none."""

AT_MOST = {
    **dict.fromkeys((*LAYER_COUNT_KEYS, "num_nextn_predict_layers"), 512),
    "hidden_size": 1 << 17,
    **dict.fromkeys(("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"), 1 << 20),
    "vocab_size": 1 << 22,
    **dict.fromkeys(("num_attention_heads", "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads",
                     "mamba_n_heads"), 1024),
    **dict.fromkeys(("head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank", "q_lora_rank",
                     "linear_key_head_dim", "linear_value_head_dim", "mamba_d_head", "mamba_head_dim"), 1 << 14),
    "max_position_embeddings": 1 << 28,
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), 1 << 14),
}
"""Upper bounds, far beyond any real model, so that no config makes kvaudit build millions of layers: the
largest public configs have 126 layers, hidden size 16,384, intermediate size 53,248 and 128 heads
(Llama 3.1 405B), a 262,208-token vocabulary (Gemma 3), 10,485,760 positions (Llama 4 Scout) and 512 experts
(Qwen3-Next)."""


def _check_sizes(cfg: Mapping[str, Any], where: Any) -> None:
    for key, least in (*((k, 1) for k in AT_LEAST_ONE), *((k, 0) for k in AT_LEAST_ZERO)):
        v = cfg.get(key)
        if v is None or isinstance(v, (list, dict)):
            continue  # absent, null (none of it), or per-layer values: vLLM's and transformers' own checks judge it
        if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                (isinstance(v, float) and not (math.isfinite(v) and v.is_integer())):
            raise ConfigError(f"{where}: field {key!r} is {v!r}, not a whole number (a count, size or period: true is "
                              "no count, and NaN or infinity no size)")
        if key == "sliding_window" and cfg.get("use_sliding_window") is False:
            continue  # (Qwen2's configs: a window that is not used)
        if key in MLA_SIZES and cfg.get("use_mla") is False:
            continue  # (DeepSeek-OCR: a DeepSeek-V2 language model with MLA off, qk_rope_head_dim 0)
        if v < least:
            raise ConfigError(f"{where}: field {key!r} is {v!r}; it must be at least {least}: a config with it "
                              "describes no model" + (" (null means none)" if key == "sliding_window" else ""))
        if key in AT_MOST and v > AT_MOST[key]:
            raise ConfigError(f"{where}: field {key!r} is {v:,}, beyond any real model (kvaudit takes at most "
                              f"{AT_MOST[key]:,})")


def _positive(cfg: Mapping[str, Any], key: str, path: Any) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"{path}: field {key!r} must be a positive integer, got {v!r}")
    return v


def _check_heads(tc: Mapping[str, Any], path: Any) -> None:
    heads, kv = tc.get("num_attention_heads"), tc.get("num_key_value_heads")
    for key, v in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise ConfigError(f"{path}: field {key!r} must be a positive integer, got {v!r}")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise ConfigError(f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}; "
                          "grouped-query attention needs whole groups")


def _check_layer_types(tc: Mapping[str, Any], layers: int | None, path: Any) -> None:
    kinds = tc.get("layer_types")
    if kinds is None:
        return
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ConfigError(f"{path}: 'layer_types' must be a list of strings")
    if layers is not None and len(kinds) < layers:
        raise ConfigError(f"{path}: 'layer_types' lists {len(kinds)} layers, the config has {layers}")
