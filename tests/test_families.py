"""Every preset family, planned from vLLM's own model code: specs against hand arithmetic from the
public config, and the four built-in strategies on ``meta`` with the ratio each release's rules give.

Why each ratio is what it is (allocated / planned):
- vllm: 1.00 everywhere; it is vLLM's own allocation of its own plan.
- a dense, MoE or MLA model has one layer per planned tensor: every release allocates exactly the plan.
- ascend-0.11 (before vllm-ascend #3760) gives every layer of a shared tensor its own buffer, so its
  ratio is the mean number of layers per tensor: 4 for Qwen3-Next / Qwen3.5 (3 GDN + 1 attention),
  2 for gpt-oss (1 sliding + 1 full), 6.2 for Gemma 3 (62 layers in 10 tensors).
- ascend-0.12 (#3760) shares one buffer among the GDN layers and one K/V pair among the attention
  layers of a tensor, but not between the two: 2 for GDN hybrids, 1 for attention-only tensors.
- ascend-0.16 (#6887) allocates each tensor once: 1.00.
- Mamba / Mamba2 hybrids (Nemotron-H, Granite-4.0-H, Falcon-H1, Jamba) name their state layers
  ``mixer`` / ``mamba``, not ``linear_attn``; the 0.11 and 0.12 allocators branch on that substring,
  so those layers get no memory at all: FAIL although the ratio of what was allocated is 1.00.
- DeepSeek-V3.2's MLA and indexer pages differ, so vLLM 0.29+ interleaves them within blocks; the
  vllm-ascend allocators (written for ``shared_by`` regions) cannot allocate that plan: not audited.
"""

from __future__ import annotations

import json
import math

import pytest

from kvaudit.cli import main as main_cli
from kvaudit.measure.audit import audit_all
from kvaudit.measure.meters import make_meter
from kvaudit.model.deployment import PRESETS, fixtures_dir
from kvaudit.plan.planner import build_plan, layer_mix, model_for
from kvaudit.strategies.builtin import STRATEGIES
from conftest import deployment, each_vllm, skip_unless_planned

pytestmark = each_vllm

RATIOS = {  # preset: (ascend-0.11, ascend-0.12, ascend-0.16); vllm is 1.00 everywhere
    "qwen3-next": (4.0, 2.0, 1.0), "qwen3.5-27b": (4.0, 2.0, 1.0), "qwen3.5-397b-a17b": (4.0, 2.0, 1.0),
    "gpt-oss-120b": (2.0, 1.0, 1.0), "gemma-3-27b": (6.2, 1.0, 1.0),
}
MAMBA_NAMED = {"nemotron-h-8b", "nemotron-h-56b", "granite-4.0-h-small", "falcon-h1-7b", "jamba-mini"}
INTERLEAVED = {"deepseek-v3.2"}
def _primary_or(preset: str | None = None) -> None:
    skip_unless_planned(preset)


def _config(preset: str) -> dict:
    cfg = json.loads((fixtures_dir() / PRESETS[preset].config / "config.json").read_text())
    return cfg.get("text_config", cfg)


def _registered(preset: str) -> bool:
    from kvaudit.plan.planner import load_vllm

    load_vllm()  # declares torchvision's ops first where its extension cannot load
    from vllm.model_executor.models.registry import ModelRegistry

    arch = json.loads((fixtures_dir() / PRESETS[preset].config / "config.json").read_text())["architectures"][0]
    return arch in ModelRegistry.get_supported_archs()


def _expected_mix(preset: str) -> dict[str, int]:
    """Layers per kind, from the public config's own fields (what vLLM's model code reads)."""
    c = _config(preset)
    n = c["num_hidden_layers"]
    if preset.startswith(("qwen3-next", "qwen3.5")):
        full = sum(1 for i in range(n) if (i + 1) % c["full_attention_interval"] == 0)
        return {"GDN": n - full, "full attention": full}
    if preset in ("gpt-oss-120b", "gemma-3-27b"):
        if "layer_types" in c:
            sliding = c["layer_types"].count("sliding_attention")
        else:  # Gemma 3: every sliding_window_pattern-th layer is global
            sliding = sum(1 for i in range(n) if (i + 1) % c.get("sliding_window_pattern", 6))
        return {"sliding window": sliding, "full attention": n - sliding}
    if preset.startswith("deepseek-v3.2"):
        return {"MLA": n, "indexer": n}
    if c.get("kv_lora_rank"):
        return {"MLA": n}
    if preset.startswith("nemotron-h"):
        pattern = c["hybrid_override_pattern"]
        return {"Mamba2": pattern.count("M"), "full attention": pattern.count("*")}
    if preset == "granite-4.0-h-small":
        return {"Mamba2": c["layer_types"].count("mamba"), "full attention": c["layer_types"].count("attention")}
    if preset == "falcon-h1-7b":
        return {"Mamba2": n, "full attention": n}
    if preset == "jamba-mini":
        attn = sum(1 for i in range(n) if i % c["attn_layer_period"] == c["attn_layer_offset"])
        return {"Mamba": n - attn, "full attention": attn}
    return {"full attention": n}


def _attention_page(preset: str, tp: int, block_size: int, dtype_bytes: int = 2) -> int:
    """One block of one attention layer: K and V, KV heads per rank (replicated when TP exceeds them)."""
    c = _config(preset)
    if c.get("kv_lora_rank"):  # MLA: one latent "head" of kv_lora_rank + rope dims, no separate V
        return block_size * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * dtype_bytes
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    head = c.get("head_dim") or c["hidden_size"] // heads
    return block_size * 2 * max(1, kv // tp) * head * dtype_bytes


@pytest.mark.parametrize("preset", list(PRESETS))
def test_family_specs_plan_and_strategies(preset):
    _primary_or(preset)
    if not _registered(preset):
        pytest.skip(f"this vLLM does not serve {preset}'s architecture")
    p = PRESETS[preset]
    d = deployment(preset, gpu_memory_utilization=0.9)
    mix = dict((kind, int(count)) for count, kind in (part.split(" ", 1) for part in layer_mix(d).split(" + ")))
    assert mix == _expected_mix(preset)

    plan = build_plan(d, "cuda")
    if preset in INTERLEAVED:  # MLA and indexer pages differ: vLLM plans them as one uniform-type group
        assert [g.spec_type for g in plan.groups] == ["UniformTypeKVCacheSpecs"]
    attention = [g for g in plan.groups if g.spec_type in ("FullAttentionSpec", "MLAAttentionSpec")
                 and not any("indexer" in n for n in g.layer_names)]
    assert attention or preset in INTERLEAVED, plan.groups
    g = attention[0] if attention else None
    if g is not None:
        assert g.page_size_bytes >= _attention_page(preset, p.tp, g.block_size)  # hybrids pad up to the state page
        if not any(s == "MambaSpec" for s in plan.layer_specs.values()):
            assert g.page_size_bytes == _attention_page(preset, p.tp, g.block_size)
    assert sum(len(x.layer_names) for x in plan.groups) == sum(mix.values())
    # the plan fills the budget to within one block of every layer: bytes per block = planned / num_blocks
    per_block = plan.planned_bytes / plan.num_blocks
    assert plan.planned_bytes <= d.kv_budget_bytes < plan.planned_bytes + per_block

    skipped: list = []
    results = {r.strategy: r for r in audit_all(d, list(STRATEGIES.values()), make_meter("meta"), skipped=skipped)}
    assert results["vllm"].ratio == pytest.approx(1.0) and results["vllm"].verdict.value == "PASS"
    if preset in INTERLEAVED:
        assert plan.interleaved and {s for s, _ in skipped} == {"ascend-0.11", "ascend-0.12", "ascend-0.16"}
        return
    assert not skipped
    ratios = tuple(round(results[s].ratio, 1) for s in ("ascend-0.11", "ascend-0.12", "ascend-0.16"))
    assert ratios == RATIOS.get(preset, (1.0, 1.0, 1.0))
    if preset in MAMBA_NAMED:
        for s in ("ascend-0.11", "ascend-0.12"):
            assert results[s].verdict.value == "FAIL"
            assert "got no memory" in results[s].reasons[0] or "got no memory" in " ".join(results[s].reasons)
        assert results["ascend-0.16"].verdict.value == "PASS"


def test_weights_are_vllms_parameters_per_rank():
    """Qwen3-Next at TP 4: the parameters and buffers of vLLM's model for rank 0 (about 80B / 4 in bf16)."""
    d = deployment("qwen3-next")
    assert 37.1 < d.weights_bytes / 2**30 < 37.3
    built = model_for(d)
    assert built.architecture == "Qwen3NextForCausalLM"


def test_quantized_checkpoints_are_weighed_as_quantized():
    """DeepSeek-V3's FP8 checkpoint: about 1 byte per parameter (671B / 8 ranks), not bf16's 2."""
    _primary_or()
    fp8 = deployment("deepseek-v3")
    assert 75 < fp8.weights_bytes / 2**30 < 85
    bf16 = deployment("deepseek-v3", hf_overrides={"quantization_config": None}, device_memory_bytes=400 * 2**30)
    assert bf16.weights_bytes > 1.8 * fp8.weights_bytes
    gpt = deployment("gpt-oss-120b")  # MXFP4 experts: about 4.25 bits per expert weight
    assert gpt.weights_bytes / 2**30 < 35


# quantization_config blocks in the format of public 4-bit AWQ / GPTQ and W8A8 (compressed-tensors) checkpoints
AWQ = {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq", "version": "gemm",
       "zero_point": True}
GPTQ = {"bits": 4, "damp_percent": 0.01, "desc_act": False, "group_size": 128, "quant_method": "gptq",
        "static_groups": False, "sym": True, "true_sequential": True}
W8A8 = {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                                                  "dynamic": False},
                                      "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                                            "strategy": "token", "dynamic": True}}}}


@pytest.mark.parametrize("quant, bits", [(AWQ, 4), (GPTQ, 4), (W8A8, 8)])
def test_4_and_8_bit_checkpoints_are_weighed_as_such(quant, bits):
    """Qwen3-8B: the decoder's linear weights at ``bits`` (+ scales), embeddings and LM head in bf16."""
    _primary_or()
    c = _config("qwen3-8b")
    h, n, inter, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    heads, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    linear = n * (h * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * inter)
    embeddings = 2 * vocab * h * 2  # untied embedding + LM head, bf16
    expected = embeddings + linear * bits // 8
    d = deployment("qwen3-8b", hf_overrides={"quantization_config": quant})
    assert expected <= d.weights_bytes <= expected * 1.05  # scales, zero points, norms, rotary cache
    assert d.weights_bytes < 0.6 * deployment("qwen3-8b").weights_bytes


@pytest.mark.parametrize("quantization", ["fp8", "fp8_per_block"])
def test_online_quantization_weighs_the_weights_vllm_quantizes_after_loading(quantization):
    """``--quantization fp8`` on Qwen3-8B's bf16 checkpoint: vLLM's online methods create the checkpoint's bf16
    parameters and quantize them in ``process_weights_after_loading`` (vllm/model_executor/layers/quantization/
    online/fp8.py); kvaudit runs that step on meta, so the linear weights weigh 1 byte (+ scales) and the
    embeddings and LM head stay bf16, never the 16-bit weights the option would otherwise leave unchanged."""
    _primary_or()
    c = _config("qwen3-8b")
    h, n, inter, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    heads, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    linear = n * (h * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * inter)
    expected = 2 * vocab * h * 2 + linear  # bf16 embedding and LM head, FP8 linear weights
    d = deployment("qwen3-8b", quantization=quantization)
    assert expected <= d.weights_bytes <= expected * 1.01  # scales, norms
    assert "quantized after loading by Fp8Per" in d.weights_source


def test_online_quantization_that_cannot_finish_here_is_refused_not_weighed_in_16_bits():
    """An online-quantized MoE (Qwen3-30B-A3B, ``--quantization fp8``): the expert kernel's repacking after loading
    needs a kernel this lean vLLM lacks, so the deployment is refused in one line that says what to give instead."""
    _primary_or()
    from kvaudit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"vLLM quantizes the weights online \(Fp8PerTensorOnlineMoEMethod, layer "
                                          r"model\.layers\.0\.mlp\.experts.* give the loaded weights with --weights"):
        deployment("qwen3-30b-a3b", quantization="fp8")


def test_auto_dtype_follows_vllm_for_float32_configs(tmp_path):
    cfg = json.loads((fixtures_dir() / "llama-3.1-8b" / "config.json").read_text())
    cfg["torch_dtype"] = "float32"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import make_deployment

    d = make_deployment(load_model_spec(tmp_path), tp=1, max_model_len=4096, gpu_memory_utilization=0.9)
    assert d.dtype == "bfloat16"
    assert build_plan(d, "cuda").groups[0].page_size_bytes == 16 * 2 * 8 * 128 * 2


def test_layer_types_sliding_layers_are_planned_as_sliding():
    d = deployment("gpt-oss-120b")
    specs = model_for(d).kv_cache_specs()
    c = _config("gpt-oss-120b")
    for i, kind in enumerate(c["layer_types"]):
        spec = specs[f"model.layers.{i}.attn.attn"]
        assert (type(spec).__name__ == "SlidingWindowSpec") == (kind == "sliding_attention")
        if kind == "sliding_attention":
            assert spec.sliding_window == c["sliding_window"]


def test_max_model_len_follows_vllms_own_length_check(tmp_path):
    """RoPE scaling that vLLM multiplies into the derived length (here linear, factor 4 over Qwen3-8B's
    40960) lets --max-model-len exceed max_position_embeddings, exactly as far as vLLM allows. (For YaRN,
    vLLM 0.33 expects max_position_embeddings already scaled, as transformers does.)"""
    from kvaudit.errors import ConfigError
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import make_deployment

    cfg = json.loads((fixtures_dir() / "qwen3-8b" / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_model_spec(tmp_path)
    d = make_deployment(spec, tp=1, max_model_len=4 * 40960, gpu_memory_utilization=0.9)
    assert d.max_model_len == 163840
    with pytest.raises(ConfigError, match="greater than the derived max_model_len"):
        make_deployment(spec, tp=1, max_model_len=4 * 40960 + 1, gpu_memory_utilization=0.9)


def test_fp8_kv_cache_halves_attention_pages():
    auto = build_plan(deployment("llama-3.1-8b"), "cuda").groups[0].page_size_bytes
    fp8 = build_plan(deployment("llama-3.1-8b", kv_cache_dtype="fp8"), "cuda").groups[0].page_size_bytes
    assert fp8 * 2 == auto == 16 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("tp, heads", [(1, 2), (2, 1), (4, 1), (8, 1)])
def test_tp_above_kv_heads_replicates_them(tp, heads):
    specs = model_for(deployment("qwen3-next", tp=tp, kv_cache_memory_bytes=2**32)).kv_cache_specs()
    assert specs["model.layers.3.self_attn.attn"].num_kv_heads == heads


def test_pp_splits_layers_and_budgets_each_stage():
    one = deployment("llama-3.1-8b")
    first = deployment("llama-3.1-8b", pp=2, pp_rank=0)
    last = deployment("llama-3.1-8b", pp=2, pp_rank=1)
    p0, p1 = build_plan(first, "cuda"), build_plan(last, "cuda")
    assert sorted(p0.layer_specs) == sorted(f"model.layers.{i}.self_attn.attn" for i in range(16))
    assert sorted(p1.layer_specs) == sorted(f"model.layers.{i}.self_attn.attn" for i in range(16, 32))
    # each stage holds half the decoder layers; the embedding sits on the first, the LM head on the last
    assert first.weights_bytes < one.weights_bytes and last.weights_bytes < one.weights_bytes
    assert first.kv_budget_bytes != one.kv_budget_bytes
    assert p0.num_blocks > build_plan(one, "cuda").num_blocks


def test_mtp_draft_layer_gets_kv_cache():
    d = deployment("qwen3-next", num_speculative_tokens=1)
    plan = build_plan(d, "cuda")
    assert "mtp.layers.0.self_attn.attn" in plan.layer_specs
    assert len(plan.layer_specs) == 49
    assert d.weights_bytes > deployment("qwen3-next").weights_bytes  # the draft model's weights count


def test_block_size_prefix_caching_and_mamba_cache_mode_reach_the_plan():
    assert build_plan(deployment("llama-3.1-8b", block_size=32), "cuda").block_size == 32
    plan = build_plan(deployment("nemotron-h-8b", enable_prefix_caching=False), "cuda")
    mamba = [g for g in plan.groups if g.spec_type == "MambaSpec"]
    assert mamba and math.prod([1]) == 1


@pytest.mark.parametrize("preset", ["qwen3-next", "qwen3.5-27b", "nemotron-h-8b", "granite-4.0-h-small",
                                    "falcon-h1-7b", "jamba-mini"])
def test_built_state_specs_match_the_model_class_helpers(preset):
    """Cross-check of two vLLM paths: the state specs the built layers report equal what the model
    class's own ``get_mamba_state_shape_from_config`` / ``get_mamba_state_dtype_from_config`` give
    (the lighter path, with no model built)."""
    _primary_or(preset)
    built = model_for(deployment(preset))
    from vllm.model_executor.models.registry import ModelRegistry

    vc = built.vllm_config
    cls, _ = ModelRegistry.resolve_model_cls(vc.model_config.architectures, vc.model_config)
    shapes = tuple(tuple(s) for s in cls.get_mamba_state_shape_from_config(vc))
    dtypes = tuple(cls.get_mamba_state_dtype_from_config(vc))
    states = {(tuple(tuple(x) for x in s.shapes), tuple(s.dtypes)) for s in built.kv_cache_specs().values()
              if type(s).__name__ == "MambaSpec"}
    assert states == {(shapes, dtypes)}


def test_not_audited_strategies_are_named_and_exit_3(capsys):
    _primary_or("deepseek-v3.2")
    code = main_cli(["deepseek-v3.2", "--meter", "meta", "--detail", "summary"])
    captured = capsys.readouterr()
    out = " ".join(captured.out.split())
    assert code == 3
    assert all(f"{s}: not audited:" in out for s in ("ascend-0.11", "ascend-0.12", "ascend-0.16")), out
    last = captured.err.strip().splitlines()[-1]
    assert "NOT MEASURED" in last and "3 not audited" in last


def test_llama_config_with_layer_types_is_planned_as_vllms_llama_reads_it(tmp_path):
    """A Llama-style config with ``layer_types`` and ``sliding_window`` (as Mistral-style checkpoints
    publish them): vLLM's llama.py gives the sliding layers a sliding window; so does the plan."""
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import make_deployment

    cfg = json.loads((fixtures_dir() / "llama-3.1-8b" / "config.json").read_text())
    cfg["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(32)]
    cfg["sliding_window"] = 4096
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    d = make_deployment(load_model_spec(tmp_path), tp=1, max_model_len=8192, gpu_memory_utilization=0.9)
    specs = model_for(d).kv_cache_specs()
    sliding = sorted(int(n.split(".")[2]) for n, s in specs.items() if type(s).__name__ == "SlidingWindowSpec")
    assert sliding == list(range(0, 32, 2))
    assert {s.sliding_window for s in specs.values() if type(s).__name__ == "SlidingWindowSpec"} == {4096}
