"""Each vLLM model family kvaudit plans, held to the rule its vLLM model file implements.

For every family the KV-cache layers we expect (spec class, layer count and, per rank at TP 1, the KV heads,
head size, sliding window, attention chunk or Mamba backend) are worked out here from the public config.json,
by the rule that family's vLLM 0.33 model file implements. Each rule cites the file and the function that
decides it, plus the transformers config defaults that file reads (``transformers/models/<type>/
configuration_<type>.py``), because the file sees the config object transformers built, not the raw JSON.
None of these numbers come from kvaudit's output. They are compared with what kvaudit gives for the same config:
the specs of the model it builds on ``meta`` (``BuiltModel.kv_cache_specs``) and the spec classes of its CUDA
plan (``build_plan``).

Two rules outside the model files come up again and again:

- ``Attention.__init__`` (``vllm/model_executor/layers/attention/attention.py``, ~L265): a layer with no
  ``per_layer_sliding_window`` falls back to ``cache_config.sliding_window``. ``EngineArgs.create_engine_config``
  (``vllm/engine/arg_utils.py``, ~L2288) sets that to ``ModelConfig.get_sliding_window()`` (the text config's
  ``sliding_window``) only when the config has no ``layer_types`` or every entry is ``"sliding_attention"``.
  ``ModelConfig.__post_init__`` (``config/model.py``, ~L815) reads a window of 0 as none. So a model-wide
  ``sliding_window`` makes every such layer a ``SlidingWindowSpec`` (``Attention.get_kv_cache_spec``, ~L624):
  see :func:`engine_window`.
- ``get_kv_cache_spec`` (``vllm/v1/worker/gpu/attn_utils.py``) skips layers that share another layer's KV cache
  (``kv_sharing_target_layer_name``).

Run under both venvs. Under a vLLM that does not serve an architecture the case is skipped. Under a vLLM other
than the primary one it is also skipped, with the one-line error, where kvaudit cannot build that model there
(``conftest.BUILDS_UNDER_0_23`` names the families that must build; their architectures fail instead). Under the
primary vLLM a build error fails the test.

Where kvaudit's answer disagrees with the model file, the family is a strict xfail whose reason is the
disagreement (``Family.xfail``): a kvaudit bug, not a looser expectation.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from conftest import BUILDS_UNDER_0_23, PRIMARY_VLLM, ROOT, VLLM_VERSION, each_vllm

pytestmark = each_vllm

FIXTURES = ROOT / "fixtures"
Layers = Counter  # Counter[(spec class name, ((attribute, value), ...))]


# --- the layers a rule can name -------------------------------------------------------------------------------


def _spec(kind: str, n: int = 1, **attrs: Any) -> Layers:
    return Counter({(kind, tuple(sorted(attrs.items()))): n}) if n else Counter()


def full(heads: int, head: int, n: int = 1) -> Layers:
    return _spec("FullAttentionSpec", n, num_kv_heads=heads, head_size=head)


def sliding(heads: int, head: int, window: int, n: int = 1) -> Layers:
    return _spec("SlidingWindowSpec", n, num_kv_heads=heads, head_size=head, sliding_window=window)


def attention(heads: int, head: int, window: int | None, n: int = 1) -> Layers:
    """An ``Attention`` layer: ``SlidingWindowSpec`` when it has a window, else ``FullAttentionSpec``."""
    return sliding(heads, head, window, n) if window else full(heads, head, n)


def chunked(heads: int, head: int, chunk: int, n: int = 1) -> Layers:
    return _spec("ChunkedLocalAttentionSpec", n, num_kv_heads=heads, head_size=head, attention_chunk_size=chunk)


def mla(head: int, n: int = 1) -> Layers:
    """MLA layers keep one latent "head" (``MLAAttention.get_kv_cache_spec``, mla_attention.py ~L1371)."""
    return _spec("MLAAttentionSpec", n, num_kv_heads=1, head_size=head)


def mamba(backend: str, n: int = 1) -> Layers:
    """A state layer (``MambaBase.get_kv_cache_spec``, layers/mamba/abstract.py ~L72) with the backend its mixer
    names: MAMBA1 (``MambaMixer``), MAMBA2 (``MambaMixer2``), SHORT_CONV, LINEAR, GDN_ATTN."""
    return _spec("MambaSpec", n, mamba_type=backend)


PerLayer = dict  # {layer index as vLLM names the layer: Layers}


def per_layer(parts) -> PerLayer:
    """The layers of decoder layers 0, 1, ... in order (an empty ``Layers`` for a layer that holds no cache)."""
    return {i: p for i, p in enumerate(parts) if p}


def merged(*maps: PerLayer) -> PerLayer:
    out: PerLayer = {}
    for m in maps:
        for i, p in m.items():
            out[i] = out.get(i, Counter()) + p
    return out


# --- what the model files read from the config ------------------------------------------------------------------


def kv_heads(c: dict) -> int:
    """KV heads per rank at TP 1: ``max(1, num_key_value_heads // tp)``, the heads when the config has no KV count."""
    return c.get("num_key_value_heads") or c["num_attention_heads"]


def head_dim(c: dict) -> int:
    """``config.head_dim``, else ``hidden_size // num_attention_heads`` (the files that read ``head_dim``)."""
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def hidden_head(c: dict) -> int:
    """``hidden_size // num_attention_heads``: the files that never read ``config.head_dim``."""
    return c["hidden_size"] // c["num_attention_heads"]


def engine_window(c: dict, layer_types: list[str] | None = None, default: int | None = None) -> int | None:
    """``cache_config.sliding_window``, the window of every layer built without a window of its own:
    ``EngineArgs.create_engine_config`` hands over ``sliding_window`` only when ``layer_types`` (as the config
    class has them; ``layer_types`` overrides the file's) is absent or all sliding, and ``ModelConfig`` reads 0 as
    none. ``default``: the config class's default when the key is absent."""
    types = layer_types if layer_types is not None else c.get("layer_types")
    if types is not None and not all(t == "sliding_attention" for t in types):
        return None
    return c.get("sliding_window", default) or None


def n_layers(c: dict) -> int:
    return c["num_hidden_layers"]


# --- the rules, one per vLLM model file -------------------------------------------------------------------------
# Each takes the language model's config and returns {layer index: Layers}, the index being the one vLLM's layer
# names carry (``model.layers.<i>.self_attn.attn``).


def llama_rule(c: dict, default_window: int | None = None) -> PerLayer:
    """llama.py ``LlamaAttention.__init__`` (~L185-204): a layer is sliding (``config.sliding_window``) when
    ``config.layer_types[i] == "sliding_attention"``. Other layers get no window of their own and fall back to the
    engine's model-wide window. Head size ``config.head_dim or hidden_size // num_attention_heads`` (~L158).
    Reused by mistral.py (``MistralAttention(LlamaAttention)``) and phi3.py (``Phi3ForCausalLM(LlamaForCausalLM)``)."""
    types = c.get("layer_types")
    return per_layer(
        attention(kv_heads(c), head_dim(c),
                  c["sliding_window"] if types and types[i] == "sliding_attention"
                  else engine_window(c, default=default_window))
        for i in range(n_layers(c)))


def mistral_rule(c: dict) -> PerLayer:
    """mistral.py ``MistralAttention(LlamaAttention)``: llama.py's rule. transformers' ``MistralConfig`` defaults
    ``sliding_window`` to 4096 when the key is absent (configuration_mistral.py ~L80); ``null`` means no window."""
    return llama_rule(c, default_window=4096)


def model_wide(head: Callable[[dict], int] = head_dim,
               window: Callable[[dict], int | None] = engine_window) -> Callable[[dict], PerLayer]:
    """Files whose every decoder layer builds ``Attention(..., cache_config=cache_config)`` with no per-layer
    window: every layer gets the engine's model-wide window (full attention when there is none)."""
    def rule(c: dict) -> PerLayer:
        return per_layer(attention(kv_heads(c), head(c), window(c)) for _ in range(n_layers(c)))
    return rule


def qwen2_window(c: dict) -> int | None:
    """transformers' ``Qwen2Config`` / ``Qwen3Config`` / ``Qwen3MoeConfig.__post_init__`` keep ``sliding_window``
    only when ``use_sliding_window`` is set, and ``Qwen2MoeConfig`` sets it to 0. The ``layer_types`` they generate
    are sliding from ``max_window_layers`` on, so they are all sliding only when ``max_window_layers`` is 0."""
    if not c.get("use_sliding_window", False):
        return None
    n, first = n_layers(c), c.get("max_window_layers", 28)
    return engine_window(c, c.get("layer_types") or ["sliding_attention" if i >= first else "full_attention"
                                                     for i in range(n)])


def gemma2_rule(c: dict) -> PerLayer:
    """gemma2.py ``Gemma2Attention.__init__`` (~L155): sliding (``config.sliding_window``) when
    ``config.layer_types[i] == "sliding_attention"``. ``Gemma2Config`` generates ``layer_types`` as sliding on even
    layers (``(i + 1) % 2``) and defaults the window to 4096. Head size ``config.head_dim`` (~L198)."""
    types = c.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                     for i in range(n_layers(c))]
    w = c.get("sliding_window", 4096)
    return per_layer(attention(kv_heads(c), c["head_dim"], w if t == "sliding_attention" else None) for t in types)


def gemma3_rule(c: dict) -> PerLayer:
    """gemma3.py ``Gemma3Attention.__init__`` (~L153-155): sliding (``config.sliding_window``) when
    ``config.layer_types[i] == "sliding_attention"``. ``Gemma3TextConfig`` generates ``layer_types`` from
    ``sliding_window_pattern`` (default 6): layer i is full when ``(i + 1) % pattern == 0``. Head size
    ``config.head_dim`` (~L226). gemma3_mm.py's ``Gemma3ForConditionalGeneration`` builds this text model."""
    pattern = c.get("sliding_window_pattern", 6)
    types = c.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                     for i in range(n_layers(c))]
    w = c.get("sliding_window", 4096)
    return per_layer(attention(kv_heads(c), c["head_dim"], w if t == "sliding_attention" else None) for t in types)


def gemma4_rule(c: dict) -> PerLayer:
    """gemma4.py ``Gemma4DecoderLayer.__init__`` (~L578): heads and head size come from
    ``config.per_layer_config[i]``. ``Gemma4TextConfig`` gives the full-attention layers ``global_head_dim``
    (default 512) and, with ``attention_k_eq_v``, ``num_global_key_value_heads`` (configuration_gemma4.py
    ~L210-222); sliding layers keep ``head_dim`` / ``num_key_value_heads``. ``Gemma4Attention.__init__``
    (~L449-451) slides on ``layer_types[i] == "sliding_attention"``. The last ``num_kv_shared_layers`` layers share
    an earlier layer's cache and get no spec of their own (~L403-491)."""
    first_shared = n_layers(c) - c.get("num_kv_shared_layers", 0)
    global_heads = c.get("num_global_key_value_heads") if c.get("attention_k_eq_v", True) else None
    return per_layer(
        (sliding(kv_heads(c), c["head_dim"], c["sliding_window"]) if t == "sliding_attention"
         else full(global_heads or kv_heads(c), c.get("global_head_dim", 512))) if i < first_shared else Counter()
        for i, t in enumerate(c["layer_types"]))


def gpt_oss_rule(c: dict) -> PerLayer:
    """gpt_oss.py ``OAIAttention`` (~L175): ``sliding_window = config.sliding_window if layer_idx % 2 == 0``;
    the file ignores ``layer_types``. Head size ``config.head_dim`` (~L106)."""
    return per_layer(attention(kv_heads(c), c["head_dim"], c["sliding_window"] if i % 2 == 0 else None)
                     for i in range(n_layers(c)))


def llama4_rule(c: dict) -> PerLayer:
    """llama4.py ``Llama4Attention.__init__`` (~L184-263): a layer is NoPE when ``no_rope_layers[i] == 0`` and
    is then plain ``Attention``. A RoPE layer with ``attention_chunk_size`` set is ``ChunkedLocalAttention``
    (``ChunkedLocalAttentionSpec``, layers/attention/chunked_local_attention.py ~L119). ``Llama4TextConfig``
    fills ``no_rope_layers`` as ``int((i + 1) % no_rope_layer_interval != 0)`` (interval 4) when it is empty.
    Head size ``config.head_dim``. mllama4.py's ``Llama4ForConditionalGeneration`` builds this text model."""
    interval = c.get("no_rope_layer_interval", 4)
    rope = c.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n_layers(c))]
    chunk = c.get("attention_chunk_size", 8192)
    hd = c.get("head_dim") or hidden_head(c)
    return per_layer(chunked(kv_heads(c), hd, chunk) if r and chunk else full(kv_heads(c), hd) for r in rope)


def mimo_v2_rule(c: dict) -> PerLayer:
    """mimo_v2.py ``MiMoV2FlashDecoderLayer.__init__`` (~L403-450): ``cache_config.sliding_window`` is cleared.
    A layer with ``hybrid_layer_pattern[i] == 1`` (``is_compressed_softmax_layer``, ~L499) is SWA with
    ``swa_num_key_value_heads`` / ``swa_head_dim`` and window ``sliding_window_size``. The others are full
    attention with ``num_key_value_heads`` / ``head_dim``."""
    return per_layer(sliding(c["swa_num_key_value_heads"], c["swa_head_dim"], c["sliding_window_size"]) if p == 1
                     else full(c["num_key_value_heads"], c["head_dim"]) for p in c["hybrid_layer_pattern"])


def deepseek_mla_rule(c: dict) -> PerLayer:
    """deepseek_v2.py ``DeepseekV2DecoderLayer.__init__`` (~L1277-1291): MLA (``DeepseekV2MLAAttention``) when
    ``ModelConfig.use_mla`` and the config has non-zero ``qk_nope_head_dim`` / ``qk_rope_head_dim``. The latent
    cache is ``kv_lora_rank + qk_rope_head_dim`` wide (``MLAAttention``). MTP layers are built only with a
    speculative config."""
    return per_layer(mla(c["kv_lora_rank"] + c["qk_rope_head_dim"]) for _ in range(n_layers(c)))


def deepseek_v32_rule(c: dict) -> PerLayer:
    """vllm/models/deepseek_v32/attention.py ``DeepseekV32Attention.__init__`` (~L166-200): every layer is
    sparse MLA. Layer i also gets an ``DeepseekV32Indexer`` unless it skips top-k:
    ``max(i - index_skip_topk_offset + 1, 0) % index_topk_freq != 0`` (offset 2, freq 1 by default), or
    ``index_topk_pattern[i] == "S"``. The indexer's key cache (``DeepseekV32IndexerCache.get_kv_cache_spec``,
    deepseek_v2.py ~L659) is one MLA-spec head of ``index_head_dim + index_head_dim // 128 * 4`` bytes (fp8 values
    + fp32 scales per 128)."""
    freq, offset = c.get("index_topk_freq", 1), c.get("index_skip_topk_offset", 2)
    pattern = c.get("index_topk_pattern")

    def skips(i: int) -> bool:
        if pattern is None:
            return max(i - offset + 1, 0) % freq != 0
        return i < len(pattern) and pattern[i] == "S"

    index_head = c["index_head_dim"] + c["index_head_dim"] // 128 * 4
    return per_layer(mla(c["kv_lora_rank"] + c["qk_rope_head_dim"]) + (Counter() if skips(i) else mla(index_head))
                     for i in range(n_layers(c)))


def qwen3_next_types(c: dict) -> list[str]:
    """``Qwen3NextConfig`` / ``Qwen3_5TextConfig``: ``layer_types`` generated from ``full_attention_interval``
    (default 4): every interval-th layer is ``full_attention``, the others ``linear_attention``."""
    interval = c.get("full_attention_interval", 4)
    return c.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                    for i in range(n_layers(c))]


def gdn_rule(c: dict) -> PerLayer:
    """qwen3_next.py ``Qwen3NextDecoderLayer.__init__`` (~L500-518), built by layer type
    ``config.layer_types[i]`` (~L668): ``linear_attention`` is a ``Qwen3NextGatedDeltaNet`` (GDN MambaSpec),
    ``full_attention`` a ``Qwen3NextAttention`` with ``config.head_dim``. qwen3_5.py's
    ``Qwen3_5DecoderLayer(Qwen3NextDecoderLayer)`` (~L149-168) makes the same choice."""
    return per_layer(mamba("GDN_ATTN") if t == "linear_attention" else full(kv_heads(c), head_dim(c))
                     for t in qwen3_next_types(c))


def nemotron_h_rule(c: dict) -> PerLayer:
    """nemotron_h.py ``NemotronHModel.__init__`` ``get_layer`` (~L595-602): one layer per character of
    ``hybrid_override_pattern``. ``M`` is a Mamba2 mixer, ``*`` attention (``NemotronHAttention``, head size
    ``config.head_dim`` or ``hidden_size // heads``, ~L453), ``-`` MLP and ``E`` MoE hold no cache."""
    kinds = {"M": mamba("MAMBA2"), "*": full(kv_heads(c), head_dim(c))}
    return per_layer(kinds.get(t, Counter()) for t in c["hybrid_override_pattern"])


LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}
"""transformers' ``remap_legacy_layer_types`` (configuration_utils.py ~L94): config files written with the old
names are read with the new ones, which is what granitemoehybrid.py's ``ALL_DECODER_LAYER_TYPES`` is keyed by."""


def granite_hybrid_rule(c: dict) -> PerLayer:
    """granitemoehybrid.py ``GraniteMoeHybridModel.__init__`` (~L350): ``ALL_DECODER_LAYER_TYPES[layer_types[i]]``.
    ``linear_attention`` (legacy ``mamba``) is a Mamba2 mixer. ``full_attention`` (legacy ``attention``) is
    ``GraniteMoeHybridAttention``, head size ``hidden_size // heads`` (~L240). A config without ``layer_types`` is all
    Mamba (``GraniteMoeHybridConfig.__post_init__``)."""
    types = [LEGACY_LAYER_TYPES.get(t, t) for t in c.get("layer_types") or ["linear_attention"] * n_layers(c)]
    return per_layer(mamba("MAMBA2") if t == "linear_attention" else full(kv_heads(c), hidden_head(c))
                     for t in types)


def falcon_h1_rule(c: dict) -> PerLayer:
    """falcon_h1.py ``FalconH1ParallelHybrid.__init__`` (~L335-348): every decoder layer i holds an attention
    block and a Mamba2 mixer, the mixer registered as layer ``num_hidden_layers + i``. Head size
    ``config.head_dim`` or ``hidden_size // heads`` (~L235)."""
    n = n_layers(c)
    return merged(per_layer(full(kv_heads(c), head_dim(c)) for _ in range(n)),
                  {n + i: mamba("MAMBA2") for i in range(n)})


def jamba_rule(c: dict) -> PerLayer:
    """jamba.py ``JambaModel.__init__`` (~L322): ``ALL_DECODER_LAYER_TYPES[config.layers_block_type[i]]``.
    ``JambaConfig.layers_block_type`` is ``attention`` when ``i % attn_layer_period == attn_layer_offset``, else
    ``mamba`` (a Mamba-1 ``MambaMixer``). Attention head size ``hidden_size // heads`` (~L209). Its ``layer_types``
    property is mixed, so the engine hands over no model-wide window."""
    period, offset = c.get("attn_layer_period", 8), c.get("attn_layer_offset", 4)
    return per_layer(full(kv_heads(c), hidden_head(c)) if i % period == offset else mamba("MAMBA1")
                     for i in range(n_layers(c)))


def transformers_backend_rule(c: dict) -> PerLayer:
    """model_executor/models/transformers/base.py ``create_attention_instances`` (~L626-694): one ``Attention``
    per decoder layer. ``per_layer_sliding_window = config.sliding_window`` when
    ``layer_types[i] == "sliding_attention"``, otherwise the engine's model-wide window. Head size from the
    model's arch config (``head_dim`` or ``hidden_size // heads``)."""
    types = c.get("layer_types")
    return per_layer(attention(kv_heads(c), head_dim(c),
                               c["sliding_window"] if types and types[i] == "sliding_attention" else engine_window(c))
                     for i in range(n_layers(c)))


def mamba1_rule(c: dict) -> PerLayer:
    """mamba.py ``MambaModel.__init__`` (~L121): ``num_hidden_layers`` ``MambaDecoderLayer`` s, each a Mamba-1
    ``MambaMixer`` (~L63); no attention layer."""
    return per_layer(mamba("MAMBA1") for _ in range(n_layers(c)))


def chatglm_rule(c: dict) -> PerLayer:
    """chatglm.py ``GLMAttention.__init__`` (~L57-100): KV heads ``multi_query_group_num`` when
    ``multi_query_attention``, else the attention heads; head size ``hidden_size // num_attention_heads`` (~L75);
    ``Attention(cache_config)`` with no per-layer window, so the engine's (vLLM's ``ChatGLMConfig`` has none).
    ``GLMTransformer`` builds ``config.num_layers`` layers (~L275; the config class maps ``num_hidden_layers``
    onto it)."""
    kv = c["multi_query_group_num"] if c.get("multi_query_attention") else c["num_attention_heads"]
    return per_layer(attention(kv, hidden_head(c), engine_window(c)) for _ in range(c["num_layers"]))


def layer_types_rule(head: Callable[[dict], int] = head_dim) -> Callable[[dict], PerLayer]:
    """Files that slide exactly the layers ``config.layer_types`` marks ``"sliding_attention"``, with
    ``config.sliding_window``, and give every layer ``num_key_value_heads`` KV heads: laguna.py
    ``LagunaAttention.__init__`` (~L299-305, head size ``head_dim or hidden // heads`` ~L290; its per-layer
    ``num_attention_heads_per_layer`` changes query heads only, ~L492-502) and muse_glimmer.py
    ``MuseGlimmerAttention.__init__`` (~L964-974, head size ``config.head_dim``). A layer without a window of its own
    takes the engine's, which is none for mixed ``layer_types``."""
    def rule(c: dict) -> PerLayer:
        types = c["layer_types"]
        return per_layer(attention(kv_heads(c), head(c), c["sliding_window"] if t == "sliding_attention"
                                   else engine_window(c)) for t in types)
    return rule


def mamba2_rule(c: dict) -> PerLayer:
    """mamba2.py ``Mamba2Model.__init__`` (~L114): ``num_hidden_layers`` ``Mamba2DecoderLayer`` s, each a
    ``MambaMixer2`` (~L57); no attention layer."""
    return per_layer(mamba("MAMBA2") for _ in range(n_layers(c)))


def zamba2_rule(c: dict) -> PerLayer:
    """zamba2.py ``Zamba2Model.__init__`` (~L729-780): every entry of ``layers_block_type`` is a Mamba2 mixer
    (a ``hybrid`` layer wraps one too), registered as layer ``len(hybrid_layer_ids) + i``. The shared attention
    blocks keep one ``Attention`` per hybrid layer (``Zamba2Attention.__init__`` ~L181-200, ``model.attn.<j>`` for
    j = 0 .. hybrid layers - 1) with ``num_attention_heads`` KV heads (no ``num_kv_heads`` given) of
    ``attention_head_dim``, which ``Zamba2Config`` sets to ``2 * hidden_size // num_attention_heads``
    (configuration_zamba2.py ~L115). Its ``layer_types`` are the block types, so no model-wide window."""
    types = c["layers_block_type"]
    hybrid = types.count("hybrid")
    head = 2 * c["hidden_size"] // c["num_attention_heads"]
    return merged({j: full(c["num_attention_heads"], head) for j in range(hybrid)},
                  {hybrid + i: mamba("MAMBA2") for i in range(len(types))})


def lfm2_rule(c: dict) -> PerLayer:
    """lfm2.py ``Lfm2Model.__init__`` ``get_layer`` (~L433-438): ``layer_types[i] == "full_attention"`` is an
    ``Lfm2AttentionDecoderLayer`` (``num_key_value_heads``, head size ``hidden_size // heads``, ~L135), any other a
    ``ShortConv`` (SHORT_CONV state, ~L354). ``Lfm2Config`` makes ``layer_types`` from ``full_attn_idxs`` when the
    config has none (configuration_lfm2.py ~L82-88)."""
    n = n_layers(c)
    idxs = c.get("full_attn_idxs")
    types = c.get("layer_types") or ["full_attention" if i in (idxs if idxs is not None else range(n)) else "conv"
                                     for i in range(n)]
    return per_layer(full(kv_heads(c), hidden_head(c)) if t == "full_attention" else mamba("SHORT_CONV")
                     for t in types)


def aliased(rule: Callable[[dict], PerLayer], **aliases: str) -> Callable[[dict], PerLayer]:
    """``rule`` on the config as its transformers class reads it through ``attribute_map`` (``num_hidden_layers``
    read from ``n_layer``, ...)."""
    return lambda c: rule({**c, **{name: c[key] for name, key in aliases.items() if key in c}})


def defaulted(rule: Callable[[dict], PerLayer], **defaults: Any) -> Callable[[dict], PerLayer]:
    """``rule`` on the config with its transformers class's defaults for the keys the file leaves out."""
    return lambda c: rule({**defaults, **c})


GPT_ALIASES = dict(hidden_size="n_embd", num_attention_heads="n_head", num_hidden_layers="n_layer")
"""``GPT2Config.attribute_map`` (configuration_gpt2.py ~L71)."""

LLAMA_DEFAULTS = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32)
"""``LlamaConfig``'s defaults (configuration_llama.py ~L65-90; KV heads and head size then follow from these)."""


# --- the families --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    id: str
    """The vLLM 0.33 model file that decides the layers (and a member, where one file has several cases)."""
    config: str
    """The config, under ``fixtures/``."""
    rule: Callable[[dict], PerLayer]
    """The expected layers per layer index, from the language model's config (``text_config`` in a multimodal
    wrapper)."""
    xfail: str | None = None
    """Where kvaudit disagrees with the model file: the disagreement (a kvaudit bug), as a strict xfail."""
    plan_fails: str | None = None
    """Where vLLM itself cannot plan the config (its layers are still checked): why; the plan must fail."""


A = "architectures/"
FAMILIES = [
    Family("llama", A + "meta-llama--Meta-Llama-3.1-8B", llama_rule),
    Family("mistral", A + "mistralai--Mistral-7B-v0.1", mistral_rule),  # model-wide "sliding_window": 4096
    Family("mistral-v0.3", A + "mistralai--Mistral-7B-Instruct-v0.3", mistral_rule),  # "sliding_window": null
    # phi3.py: Phi3ForCausalLM(LlamaForCausalLM); Phi-4-mini's model-wide sliding_window 262144 and no layer_types
    Family("phi3", A + "microsoft--Phi-4-mini-instruct", llama_rule),
    # mixtral.py MixtralAttention.__init__ (~L202): Attention(cache_config) with no per-layer window; head size
    # config.head_dim or hidden // heads (~L173); MixtralConfig's sliding_window defaults to None
    Family("mixtral", A + "mistralai--Mixtral-8x7B-v0.1", model_wide()),
    # qwen2.py Qwen2Attention (~L118-180): Attention(cache_config) with no per-layer window; head size
    # hidden // heads (~L150)
    Family("qwen2", A + "Qwen--Qwen2-7B-Instruct", model_wide(hidden_head, qwen2_window)),
    # qwen2_moe.py Qwen2MoeAttention (~L225, ~L262): likewise, head size hidden // heads
    Family("qwen2_moe", A + "Qwen--Qwen1.5-MoE-A2.7B-Chat", model_wide(hidden_head, qwen2_window)),
    # qwen3.py Qwen3DecoderLayer: Qwen2Model builds it without per_layer_sliding_window (qwen2.py ~L380), so
    # Qwen3Attention's Attention (~L148) takes the engine window; head size head_dim or hidden // heads (~L100)
    Family("qwen3", "startup-logs/configs/Qwen--Qwen3-1.7B", model_wide(window=qwen2_window)),
    # qwen3_moe.py Qwen3MoeAttention (~L277, ~L315): Attention(cache_config), head_dim or hidden // heads
    Family("qwen3_moe", A + "Qwen--Qwen3-30B-A3B", model_wide(window=qwen2_window)),
    # qwen3_vl.py: the text model is Qwen3LLMForCausalLM (qwen3.py's decoder layers)
    Family("qwen3_vl", A + "Qwen--Qwen3-VL-8B-Instruct", model_wide(window=qwen2_window)),
    # qwen3_vl_moe.py: the text model is built from qwen3_moe.py's decoder layers
    Family("qwen3_vl_moe", A + "Qwen--Qwen3-VL-30B-A3B-Instruct", model_wide(window=qwen2_window)),
    Family("qwen3_next", "configs/qwen3-next-80b-a3b-instruct", gdn_rule),
    Family("qwen3_5", A + "Qwen--Qwen3.5-35B-A3B", gdn_rule),  # Qwen3_5MoeForConditionalGeneration
    # gemma.py GemmaAttention (~L155, Attention(cache_config)): the engine window (GemmaConfig has none);
    # head size config.head_dim (~L220)
    Family("gemma", A + "google--gemma-2b", model_wide(lambda c: c["head_dim"])),
    Family("gemma2", A + "google--gemma-2-9b-it", gemma2_rule),
    Family("gemma3", A + "google--gemma-3-1b-it", gemma3_rule),  # Gemma3ForCausalLM
    Family("gemma3_mm", "configs/gemma-3-27b-it", gemma3_rule),  # Gemma3ForConditionalGeneration
    Family("gemma4", A + "google--gemma-4-26B-A4B", gemma4_rule),
    Family("gpt_oss", A + "openai--gpt-oss-20b", gpt_oss_rule),
    Family("llama4", A + "meta-llama--Llama-4-Scout-17B-16E-Instruct", llama4_rule),
    Family("mimo_v2", A + "XiaomiMiMo--MiMo-V2-Flash", mimo_v2_rule),
    Family("deepseek_v2", A + "deepseek-ai--DeepSeek-V2-Lite-Chat", deepseek_mla_rule),
    Family("deepseek_v2-kimi-k2", A + "moonshotai--Kimi-K2-Instruct", deepseek_mla_rule),  # DeepseekV3ForCausalLM
    Family("deepseek_v32", A + "deepseek-ai--DeepSeek-V3.2", deepseek_v32_rule),
    Family("deepseek_v32-glm-5", A + "zai-org--GLM-5", deepseek_v32_rule),  # GlmMoeDsaForCausalLM
    # glm4_moe.py Glm4MoeAttention (~L255): Attention(cache_config), head size config.head_dim or hidden // heads;
    # the num_nextn_predict_layers MTP layer is built only with a speculative config
    Family("glm4_moe", "configs/glm-4.5", model_wide()),
    # minimax_m2.py MiniMaxM2DecoderLayer (~L270): MiniMaxM2Attention is built without attn_window_size, so its
    # Attention (~L209) takes the engine window; head size head_dim or hidden // heads (~L170)
    Family("minimax_m2", A + "MiniMaxAI--MiniMax-M2.5", model_wide()),
    Family("nemotron_h", "configs/nemotron-h-8b", nemotron_h_rule),
    Family("granitemoehybrid", "configs/granite-4.0-h-small", granite_hybrid_rule),
    Family("falcon_h1", "configs/falcon-h1-7b-instruct", falcon_h1_rule),
    Family("jamba", "configs/jamba-mini-1.7", jamba_rule),
    # commandr.py CohereAttention (~L235-253): a CohereConfig model (v1) gets no per-layer window, so the engine's
    # (CohereConfig has no sliding_window); head size config.head_dim when the config has one, else hidden // heads
    Family("commandr", A + "CohereForAI--aya-23-8B", model_wide()),
    # olmoe.py OlmoeAttention (~L147, ~L180): Attention(cache_config), head size hidden // heads
    Family("olmoe", A + "allenai--OLMoE-1B-7B-0924", model_wide(hidden_head)),
    # stablelm.py StablelmAttention (~L120, ~L154): Attention(cache_config), head size hidden // heads
    Family("stablelm", A + "stabilityai--stablelm-2-zephyr-1_6b", model_wide(hidden_head)),
    # Starcoder2ForCausalLM is served by the Transformers backend in vLLM 0.33 (registry.py
    # _TRANSFORMERS_SUPPORTED_MODELS): model-wide sliding_window 4096, no layer_types
    Family("transformers-starcoder2", A + "bigcode--starcoder2-7b", transformers_backend_rule),
    Family("transformers-olmo2", A + "allenai--OLMo-2-1124-7B", transformers_backend_rule),
    Family("mamba", A + "state-spaces--mamba-130m-hf", mamba1_rule),
    # registry.py: FalconMambaForCausalLM is mamba.py's MambaForCausalLM
    Family("mamba-falcon-mamba", A + "tiiuae--falcon-mamba-7b", mamba1_rule),
    Family("mamba2", A + "mistralai--Mamba-Codestral-7B-v0.1", mamba2_rule),
    Family("zamba2", A + "Zyphra--Zamba2-7B", zamba2_rule, plan_fails=(
        "the config (an early Zyphra revision) has no n_mamba_heads, so Zamba2Config's default 8 applies: the layers "
        "build Mamba heads of intermediate // 8 = 896 (zamba2.py ~L544) while Zamba2ForCausalLM."
        "get_mamba_state_shape_from_config (~L892), which vLLM's _align_hybrid_block_size pads by, reads "
        "mamba_headdim 64; the padded page is then smaller than the layer's state and MambaSpec.page_size_bytes "
        "asserts, in vLLM as in kvaudit")),
    Family("laguna", A + "poolside--Laguna-XS.2-FP8", layer_types_rule()),
    Family("muse_glimmer", A + "meta-models--Muse-Glimmer-30B", layer_types_rule(lambda c: c["head_dim"])),
    # nemotron.py NemotronAttention (~L172-232): Attention(cache_config) with no per-layer window; head size
    # config.head_dim or hidden // heads (~L202)
    Family("nemotron", A + "nvidia--Minitron-4B-Base", model_wide()),
    Family("chatglm", A + "THUDM--chatglm3-6b", chatglm_rule),  # ChatGLMModel
    Family("lfm2", A + "LiquidAI--LFM2-350M", lfm2_rule),  # full_attn_idxs, no layer_types
    # glm4_moe_lite.py Glm4MoeLiteDecoderLayer.__init__ (~L133-150): Glm4MoeLiteMLAAttention (DeepseekV2MLAAttention)
    # when ModelConfig.use_mla, so deepseek_v2.py's MLA rule; the MTP layer is built only with a speculative config
    Family("glm4_moe_lite", A + "zai-org--GLM-4.7-Flash", deepseek_mla_rule),
    # qwen2_vl.py Qwen2VLForConditionalGeneration: the text model is qwen2.py's Qwen2Model ("use_sliding_window": false)
    Family("qwen2_vl", A + "Qwen--Qwen2-VL-2B", model_wide(hidden_head, qwen2_window)),
    # GlmForCausalLM and SmolLM3ForCausalLM are served by the Transformers backend in vLLM 0.33
    Family("transformers-glm", A + "THUDM--glm-4-9b-chat-hf", transformers_backend_rule),
    Family("transformers-smollm3", A + "HuggingFaceTB--SmolLM3-3B", transformers_backend_rule),
    # gpt2.py GPT2Attention (~L73-95): heads num_attention_heads, head size hidden // heads, Attention(cache_config)
    Family("gpt2", A + "openai-community--gpt2", aliased(model_wide(hidden_head), **GPT_ALIASES)),
    # llava.py LlavaForConditionalGeneration (~L569): the text model is the text_config's architecture
    # (LlamaForCausalLM), so llama.py's rule on text_config, which leaves its sizes to LlamaConfig's defaults
    Family("llava", A + "llava-hf--llava-1.5-7b-hf", defaulted(llama_rule, **LLAMA_DEFAULTS)),
]


# --- what kvaudit builds -----------------------------------------------------------------------------------------


def _config(family: Family) -> tuple[dict, dict]:
    raw = json.loads((FIXTURES / family.config / "config.json").read_text())
    text = raw.get("text_config")
    return raw, text if isinstance(text, dict) else raw


_BUILT: dict[str, Any] = {}


def _deployment(family: Family):
    """The config at TP 1 on one H200, as kvaudit builds it (one build per config for the session). The weights
    are given (``--weights``), so that a 671B model at TP 1 still leaves a budget to plan."""
    from kvaudit.errors import KvauditError
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import make_deployment

    spec = load_model_spec(FIXTURES / family.config)
    if family.config not in _BUILT:
        longest = next((v for c in (spec.text, spec.raw) for k in ("max_position_embeddings", "n_positions",
                                                                   "seq_length") if isinstance(v := c.get(k), int)),
                       4096)
        try:
            _BUILT[family.config] = make_deployment(
                spec, tp=1, max_model_len=min(4096, longest),
                gpu_memory_utilization=0.9, device="h200-141g", weights_bytes=1 << 30, overhead_bytes=2 << 30)
        except KvauditError as e:
            _BUILT[family.config] = e
    built = _BUILT[family.config]
    if isinstance(built, Exception):
        if VLLM_VERSION != PRIMARY_VLLM and spec.architecture not in _must_build():
            pytest.skip(f"kvaudit does not build {family.config} under vLLM {VLLM_VERSION}: {built}")
        raise built
    return built


def _must_build() -> set[str]:
    """The architectures of the presets that build under every vLLM kvaudit is tested with."""
    from kvaudit.model.deployment import PRESETS, load_preset_spec

    return {load_preset_spec(PRESETS[p]).architecture for p in BUILDS_UNDER_0_23}


def _served(raw: dict) -> None:
    from kvaudit.plan.planner import load_vllm

    load_vllm()
    from vllm.model_executor.models.registry import ModelRegistry

    arch = raw["architectures"][0]
    if arch not in ModelRegistry.get_supported_archs():
        pytest.skip(f"vLLM {VLLM_VERSION} does not serve {arch}")


def _value(spec: Any, attr: str) -> Any:
    v = getattr(spec, attr, None)
    return getattr(v, "name", v) if attr == "mamba_type" else v


LAYER_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def built_layers(specs: dict[str, Any], expected: PerLayer) -> PerLayer:
    """The built specs by the layer index in their names, each read for the attributes the rule names for its
    class."""
    attrs = {kind: [a for a, _ in items] for layers in expected.values() for kind, items in layers}
    out: PerLayer = {}
    for name, s in specs.items():
        kind = type(s).__name__
        i = int(LAYER_INDEX.search(name).group(1))
        out.setdefault(i, Counter())[(kind, tuple((a, _value(s, a)) for a in attrs.get(kind, ())))] += 1
    return out


def _kinds(layers: PerLayer) -> Counter:
    out: Counter = Counter()
    for per in layers.values():
        for (kind, _), n in per.items():
            out[kind] += n
    return out


def _differences(expected: PerLayer, built: PerLayer) -> list:
    return [(i, dict(expected.get(i, {})), dict(built.get(i, {}))) for i in sorted(set(expected) | set(built))
            if expected.get(i, Counter()) != built.get(i, Counter())]


@pytest.mark.parametrize("family", [pytest.param(f, id=f.id, marks=[pytest.mark.xfail(strict=True, reason=f.xfail)]
                                                 if f.xfail else []) for f in FAMILIES])
def test_layers_follow_the_model_file(family: Family):
    raw, text = _config(family)
    _served(raw)
    d = _deployment(family)
    expected = family.rule(text)
    from kvaudit.plan.planner import build_plan, model_for

    built = built_layers(model_for(d).kv_cache_specs(), expected)
    assert _kinds(built) == _kinds(expected)
    assert _differences(expected, built)[:4] == []
    if family.plan_fails:
        from kvaudit.errors import ConfigError

        with pytest.raises(ConfigError, match="could not (size the KV-cache pages|plan)"):  # one line, exit 2: vLLM refuses
            build_plan(d, "cuda")
        return
    plan = build_plan(d, "cuda")
    assert Counter(plan.layer_specs.values()) == _kinds(expected)


def test_enough_families():
    """At least 32 distinct vLLM model files, each with a config that exists."""
    files = {f.id.split("-")[0] for f in FAMILIES}
    assert len(files) >= 32, sorted(files)
    assert all((FIXTURES / f.config / "config.json").is_file() for f in FAMILIES)
