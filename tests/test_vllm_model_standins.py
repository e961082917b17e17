"""The stand-ins kvaudit/model/vllm_model.py applies for families that did not build on ``meta``: each family plans with
them, and where the installed vLLM has the place a stand-in answers for, the build fails without it."""

from __future__ import annotations

import inspect
import json
from collections import Counter

import pytest

from conftest import PRIMARY_VLLM, ROOT, VLLM_VERSION, each_vllm

pytestmark = [each_vllm, pytest.mark.skipif(VLLM_VERSION is None, reason="vLLM is not installed (a device host)")]

GEMMA_3N_E4B_TEXT = {
    # google/gemma-3n-E4B-it's text model, transcribed (Hugging Face was not reachable) from the defaults of
    # transformers' Gemma3nTextConfig (transformers/models/gemma3n/configuration_gemma3n.py, 5.x), which that class
    # documents as E4B's: hidden 2048, intermediate 16384, 35 layers, 8/2 heads, head_dim 256, 15 KV-shared
    # layers, AltUp 4, LAuReL 64, per-layer inputs 256, layer_types 4 sliding + 1 full, activation sparsity 0.95
    # for the first 10 layers. Not compared with the released config.json.
    "architectures": ["Gemma3nForCausalLM"], "model_type": "gemma3n_text", "vocab_size": 262400,
    "vocab_size_per_layer_input": 262144, "hidden_size": 2048, "hidden_size_per_layer_input": 256,
    "intermediate_size": [16384] * 35, "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 256, "max_position_embeddings": 32768, "sliding_window": 512, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "attention_bias": False, "attention_dropout": 0.0,
    "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0, "altup_active_idx": 0,
    "altup_coef_clip": 120.0, "altup_correct_scale": True, "altup_lr_multiplier": 1.0, "altup_num_inputs": 4,
    "laurel_rank": 64, "num_kv_shared_layers": 15, "query_pre_attn_scalar": 256, "initializer_range": 0.02,
    "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
    "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 25, "torch_dtype": "bfloat16"}

GEMMA_3N_E4B = {
    # The multimodal wrapper around it: the vision (timm's MobileNet-V5 300M) and audio (USM conformer) configs
    # and token ids are transformers 5.x's Gemma3nConfig defaults, which that class documents as E4B's.
    "architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n", "torch_dtype": "bfloat16",
    "audio_soft_tokens_per_image": 188, "vision_soft_tokens_per_image": 256, "boi_token_id": 255999,
    "eoi_token_id": 262144, "image_token_id": 262145, "boa_token_id": 256000, "eoa_token_id": 262272,
    "audio_token_id": 262273, "eos_token_id": [1, 106], "initializer_range": 0.02,
    "text_config": {k: v for k, v in GEMMA_3N_E4B_TEXT.items() if k != "architectures"},
    "vision_config": {"model_type": "gemma3n_vision", "architecture": "mobilenetv5_300m_enc", "hidden_size": 2048,
                      "vocab_size": 128, "vocab_offset": 262144, "rms_norm_eps": 1e-6, "do_pooling": False},
    "audio_config": {"model_type": "gemma3n_audio", "vocab_size": 128, "vocab_offset": 262272, "input_feat_size": 128,
                     "hidden_size": 1536, "rms_norm_eps": 1e-6, "conf_attention_chunk_size": 12,
                     "conf_attention_context_left": 13, "conf_attention_context_right": 0,
                     "conf_attention_logit_cap": 50.0, "conf_num_attention_heads": 8, "conf_num_hidden_layers": 12,
                     "conf_conv_kernel_size": 5, "conf_reduction_factor": 4, "conf_residual_weight": 0.5,
                     "sscp_conv_channel_size": [128, 32], "sscp_conv_group_norm_eps": 0.001,
                     "sscp_conv_kernel_size": [[3, 3], [3, 3]], "sscp_conv_stride_size": [[2, 2], [2, 2]]}}

KIMI_LINEAR_48B = {
    # moonshotai/Kimi-Linear-48B-A3B-Instruct, transcribed (Hugging Face was not reachable): the sizes as
    # ml-explore/mlx-lm's mlx_lm/models/kimi_linear.py ModelArgs defaults give them (@ 07442894: vocab 163840,
    # hidden 2304, intermediate 9216, MoE 1024 x 256 experts + 1 shared, top 8, 27 layers, 32 heads, head_dim
    # 72, MLA 512/64/128/128, first_k_dense_replace 1, scaling 2.446). linear_attn_config (KDA heads 32 x 128,
    # kernel 4; every 4th layer and the last MLA) follows the 3:1 KDA-to-MLA layout MoonshotAI/Kimi-Linear's
    # README describes; the exact layer lists are not checked against the released file.
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "vocab_size": 163840,
    "hidden_size": 2304, "head_dim": 72, "intermediate_size": 9216, "num_hidden_layers": 27,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False, "first_k_dense_replace": 1,
    "moe_intermediate_size": 1024, "moe_layer_freq": 1, "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid", "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1,
    "routed_scaling_factor": 2.446, "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "mla_use_nope": True, "num_nextn_predict_layers": 0,
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128,
                           "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
                           "num_heads": 32, "short_conv_kernel_size": 4},
    "model_max_length": 1048576, "eos_token_id": 163586, "torch_dtype": "bfloat16", "use_cache": True}

NEMOTRON_3_NANO = ROOT / "fixtures" / "architectures" / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
"""An exact copy of nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's config.json (its SOURCE file names where from)."""


def _plan(tmp_path, config: dict | None = None, folder=None):
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import build_plan, make_deployment

    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        folder = tmp_path
    d = make_deployment(load_model_spec(folder), tp=1, gpu_memory_utilization=0.9, max_model_len=4096,
                        device="h200-141g", overhead_bytes=2 << 30)
    return build_plan(d, "cuda")


def _without(monkeypatch, dropped) -> None:
    """Build afresh, with every stand-in but those ``dropped(obj, name)`` names."""
    from kvaudit.model import vllm_model

    stand_ins = vllm_model._stand_in_list(vllm_model._modules())
    kept = [(o, n, v) for o, n, v in stand_ins if not dropped(o, n)]
    assert len(kept) < len(stand_ins), "the stand-in to leave out is not in the list"
    monkeypatch.setattr(vllm_model, "_STAND_INS", kept)
    monkeypatch.setattr(vllm_model, "_BUILT", {})


def _specs(plan) -> Counter:
    return Counter(plan.layer_specs.values())


def _vllm_module(name: str):
    import importlib

    return importlib.import_module(name)


def test_gemma_3n_plans_its_20_cache_layers(tmp_path):
    """35 layers, the last 15 reuse the KV of earlier ones: 16 sliding-window and 4 full-attention caches."""
    plan = _plan(tmp_path, GEMMA_3N_E4B_TEXT)
    assert _specs(plan) == {"SlidingWindowSpec": 16, "FullAttentionSpec": 4}


def test_gemma_3n_needs_the_sparse_activation_stand_in(tmp_path, monkeypatch):
    act = _vllm_module("vllm.model_executor.layers.activation")
    if ".item()" not in inspect.getsource(act.GeluAndMulSparse.__init__):
        pytest.skip(f"vLLM {VLLM_VERSION}'s GeluAndMulSparse reads no scalar back at init")
    _without(monkeypatch, lambda obj, name: obj is act.GeluAndMulSparse and name == "__init__")
    from kvaudit.errors import ConfigError

    with pytest.raises(ConfigError, match="meta tensors"):
        _plan(tmp_path, GEMMA_3N_E4B_TEXT)


@pytest.mark.skipif(VLLM_VERSION != PRIMARY_VLLM, reason="vLLM 0.23's Gemma 3n wrapper refuses kvaudit's hybrid "
                    "KV-cache setting when it re-validates the text config")
def test_gemma_3n_with_its_vision_and_audio_towers_plans(tmp_path):
    """timm (requirements/vllm-*/nodeps.txt) builds the MobileNet-V5 vision tower; the towers hold no KV cache."""
    plan = _plan(tmp_path, GEMMA_3N_E4B)
    assert _specs(plan) == {"SlidingWindowSpec": 16, "FullAttentionSpec": 4}


def _nemotron_3_nano():
    if not (NEMOTRON_3_NANO / "config.json").is_file():
        pytest.skip(f"{NEMOTRON_3_NANO.relative_to(ROOT)} is not in this checkout")
    return NEMOTRON_3_NANO


def test_nemotron_3_nano_plans_23_mamba_and_6_attention_layers(tmp_path):
    plan = _plan(tmp_path, folder=_nemotron_3_nano())
    assert _specs(plan) == {"MambaSpec": 23, "FullAttentionSpec": 6}


def test_nemotron_3_nano_needs_the_non_gated_moe_stand_in(tmp_path, monkeypatch):
    """Its relu2 experts are not gated (is_act_and_mul=False), which vLLM allows only where is_cuda_alike()."""
    folder = _nemotron_3_nano()
    _without(monkeypatch, lambda obj, name: name == "current_platform"
             and getattr(obj, "__name__", "").startswith("vllm.model_executor.layers.fused_moe."))
    from kvaudit.errors import ConfigError

    with pytest.raises(ConfigError, match="is_act_and_mul=False"):
        _plan(tmp_path, folder=folder)


kimi_linear = pytest.mark.skipif(VLLM_VERSION != PRIMARY_VLLM, reason="Kimi-Linear's MLA prefill has no stand-in "
                                 "under vLLM 0.23")


@kimi_linear
def test_kimi_linear_plans_20_kda_and_7_mla_layers(tmp_path):
    plan = _plan(tmp_path, KIMI_LINEAR_48B)
    assert _specs(plan) == {"MambaSpec": 20, "MLAAttentionSpec": 7}


@kimi_linear
def test_kimi_linear_needs_the_gemm_rs_ar_stand_in(tmp_path, monkeypatch):
    import importlib.util
    import sys

    if importlib.util.find_spec("cutlass") is not None:
        pytest.skip("the CUTLASS DSL is installed: vLLM's own module answers")
    name = "vllm.model_executor.kernels.linear.cute_dsl.gemm_rs_ar"
    _without(monkeypatch, lambda obj, key: obj is sys.modules and key == name)
    from kvaudit.errors import ConfigError

    with pytest.raises(ConfigError, match="cutlass"):
        _plan(tmp_path, KIMI_LINEAR_48B)


@kimi_linear
def test_kimi_linear_needs_the_cuda_stream_stand_in(tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: torch makes real streams")
    _without(monkeypatch, lambda obj, name: obj is torch.cuda and name in ("Stream", "Event"))
    from kvaudit.errors import ConfigError

    with pytest.raises(ConfigError, match="torch.cuda.Stream requires CUDA"):
        _plan(tmp_path, KIMI_LINEAR_48B)


def test_the_stand_ins_are_undone_after_a_build(tmp_path):
    """Outside a build vLLM sees this host as it is (a CPU torch: no CUDA stream)."""
    import torch

    from kvaudit.model import vllm_model

    _plan(tmp_path, GEMMA_3N_E4B_TEXT)
    for obj, name, _value in vllm_model._STAND_INS:
        if obj is torch.cuda:
            assert getattr(torch.cuda, name).__module__ == "torch.cuda.streams"
    act = _vllm_module("vllm.model_executor.layers.activation")
    assert act.GeluAndMulSparse.__init__.__module__ == act.__name__


# --- quantized MoE backends: the WNA16, NVFP4 and DeepSeek-V4 MXFP4 oracles, as on Hopper -------------------

KIMI_K2_5 = ROOT / "fixtures" / "architectures" / "moonshotai--Kimi-K2.5"
"""moonshotai/Kimi-K2.5's config.json: compressed-tensors int4 (group 32, symmetric) routed experts."""
MINIMAX_M3_NVFP4 = ROOT / "fixtures" / "architectures" / "nvidia--MiniMax-M3-NVFP4"
"""nvidia/MiniMax-M3-NVFP4's config.json and hf_quant_config.json: ModelOpt NVFP4 routed experts."""
KIMI_K3 = ROOT / "fixtures" / "architectures" / "moonshotai--Kimi-K3"
"""moonshotai/Kimi-K3's config.json: compressed-tensors MXFP4 routed experts (the DeepSeek-V4 MXFP4 method)."""

_MOE_BACKEND_SELECTORS = {
    # the quant method's module, the oracle function it imports by name
    "wna16": ("vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
              "compressed_tensors_moe_wna16", "select_wna16_moe_backend"),
    "nvfp4": ("vllm.model_executor.layers.quantization.modelopt", "select_nvfp4_moe_backend"),
    "mxfp4": ("vllm.model_executor.layers.quantization.mxfp4", "select_deepseek_v4_mxfp4_moe_backend"),
}


def _big_model(folder, architecture: str):
    if not (folder / "config.json").is_file():
        pytest.skip(f"{folder.relative_to(ROOT)} is not in this checkout")
    from kvaudit.model import vllm_model

    if architecture not in vllm_model._modules().registry.ModelRegistry.get_supported_archs():
        pytest.skip(f"vLLM {VLLM_VERSION} has no {architecture}")
    return folder


def _kimi_k2_5():
    if VLLM_VERSION != PRIMARY_VLLM:
        pytest.skip(f"vLLM {VLLM_VERSION}'s Kimi-K2.5 wrapper refuses kvaudit's hybrid KV-cache setting when it "
                    "re-validates the config")
    return _big_model(KIMI_K2_5, "KimiK25ForConditionalGeneration")


def _backends_chosen(monkeypatch, kind: str) -> Counter:
    """The MoE backends vLLM's oracle returns while the next model builds (afresh), by name."""
    from kvaudit.model import vllm_model

    module, name = _MOE_BACKEND_SELECTORS[kind]
    try:
        m = _vllm_module(module)
    except ImportError:
        pytest.skip(f"vLLM {VLLM_VERSION} has no {module}")
    if not hasattr(m, name):
        pytest.skip(f"vLLM {VLLM_VERSION}'s {module} has no {name}")
    chosen: Counter = Counter()
    select = getattr(m, name)

    def record(*args, **kwargs):
        backend, experts = select(*args, **kwargs)
        chosen[backend.name] += 1
        return backend, experts

    monkeypatch.setattr(m, name, record)
    monkeypatch.setattr(vllm_model, "_BUILT", {})
    return chosen


def _deploy(folder, tp: int, pp: int = 1):
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import build_plan, make_deployment

    d = make_deployment(load_model_spec(folder), tp=tp, pp=pp, gpu_memory_utilization=0.9, max_model_len=4096,
                        device="h200-141g", overhead_bytes=2 << 30)
    return d, build_plan(d, "cuda")


def _hopper_moe_backend() -> str:
    """HUMMING where vLLM ranks it ahead of Marlin at capability 9.0 (``prioritize_humming``), else MARLIN."""
    try:
        _vllm_module("vllm.model_executor.layers.quantization.utils.humming.priority")
    except ImportError:
        return "MARLIN"
    return "HUMMING"


def _without_quantized_moe_stand_ins(monkeypatch, names=("current_platform", "has_humming", "prefers_humming",
                                                           "GemmType")) -> None:
    """Build afresh without the stand-ins kvaudit/model/vllm_model.py ``_quantized_moe_stand_ins`` lists (those named)."""
    from kvaudit.model import vllm_model

    ours = {(id(o), n) for o, n, _v in vllm_model._quantized_moe_stand_ins()}
    _without(monkeypatch, lambda obj, name: (id(obj), name) in ours and name in names)


def _routed_expert_bytes(layers: int, experts: int, hidden: int, intermediate: int, tp: int,
                         bits_per_weight: float) -> int:
    """Bytes of the routed experts' gate, up and down weights and their block scales on one TP rank."""
    return int(layers * experts * 3 * hidden * intermediate // tp * bits_per_weight / 8)


def test_kimi_k2_5_plans_with_the_hopper_wna16_moe_backend(monkeypatch):
    """int4 group-32 experts at TP 8: vLLM's WNA16 oracle picks Humming on Hopper (Marlin where it lists no
    Humming); rank 0 holds its eighth of the 60 MoE layers' 384 experts (4 bits + a bf16 scale per 32 weights:
    ~71.3 GB, so ~570.7 GB of the ~595 GB checkpoint) plus the attention, shared experts and vision tower."""
    folder = _kimi_k2_5()
    chosen = _backends_chosen(monkeypatch, "wna16")
    d, plan = _deploy(folder, tp=8)
    assert chosen == {_hopper_moe_backend(): 60}
    experts = _routed_expert_bytes(60, 384, 7168, 2048, 8, 4 + 16 / 32)
    assert experts < d.weights_bytes < experts + (6 << 30)
    assert _specs(plan) == {"MLAAttentionSpec": 61}


def test_kimi_k2_5_needs_the_quantized_moe_stand_ins(tmp_path, monkeypatch):
    """Marlin and Humming ask ``current_platform.is_cuda()``; with no answer no WNA16 backend is left."""
    folder = _kimi_k2_5()
    _without_quantized_moe_stand_ins(monkeypatch, names=("current_platform",))
    from kvaudit.errors import ConfigError

    with pytest.raises(ConfigError, match="No WNA16 MoE backend supports"):
        _deploy(folder, tp=8)


def test_kimi_k2_5_picks_humming_only_as_hopper_ranks_it(monkeypatch):
    """Without the capability-9.0 answer to ``prefers_humming`` Marlin stays ahead of Humming (what vLLM does
    on an A100 or Blackwell); the experts' parameters are the same either way (both repack after loading)."""
    folder = _kimi_k2_5()
    if _hopper_moe_backend() != "HUMMING":
        pytest.skip(f"vLLM {VLLM_VERSION} ranks no Humming WNA16 backend")
    _without_quantized_moe_stand_ins(monkeypatch, names=("prefers_humming",))
    chosen = _backends_chosen(monkeypatch, "wna16")
    _deploy(folder, tp=8)
    assert chosen == {"MARLIN": 60}


def test_minimax_m3_nvfp4_plans_with_the_hopper_nvfp4_moe_backend(monkeypatch):
    """NVFP4 experts at TP 8: every FlashInfer / CUTLASS FP4 kernel wants SM100+, so Hopper runs Humming; rank 0
    holds its eighth of the 57 MoE layers' 128 experts (4 bits + an fp8 scale per 16 weights: ~29 GB)."""
    folder = _big_model(MINIMAX_M3_NVFP4, "MiniMaxM3SparseForConditionalGeneration")
    chosen = _backends_chosen(monkeypatch, "nvfp4")
    d, _plan = _deploy(folder, tp=8)
    assert chosen == {_hopper_moe_backend(): 57}
    experts = _routed_expert_bytes(57, 128, 6144, 3072, 8, 4 + 8 / 16)
    assert experts < d.weights_bytes < experts + (4 << 30)


def test_minimax_m3_nvfp4_needs_the_quantized_moe_stand_ins(monkeypatch):
    folder = _big_model(MINIMAX_M3_NVFP4, "MiniMaxM3SparseForConditionalGeneration")
    _without_quantized_moe_stand_ins(monkeypatch, names=("current_platform",))
    from kvaudit.errors import ConfigError

    with pytest.raises(ConfigError, match="No NvFp4 MoE backend supports"):
        _deploy(folder, tp=8)


def test_kimi_k3_plans_with_the_hopper_mxfp4_moe_backend(monkeypatch):
    """MXFP4 experts (latent width 3584) at TP 8 and PP 2 (some 1.5 TB of weights: 16 H200s): Hopper runs
    Humming, which pads the expert widths only to 64 (``mxfp4_round_up_hidden_size_and_intermediate_size``);
    each stage holds its 46 of the 92 MoE layers' 896 experts (4 bits + an e8m0 scale per 32 weights)."""
    folder = _big_model(KIMI_K3, "KimiK3ForConditionalGeneration")
    chosen = _backends_chosen(monkeypatch, "mxfp4")
    d, plan = _deploy(folder, tp=8, pp=2)
    assert chosen == {"HUMMING": 92}
    experts = _routed_expert_bytes(46, 896, 3584, 3072, 8, 4 + 8 / 32)
    assert experts < d.weights_bytes < experts + (16 << 30)
    assert sum(_specs(plan).values()) > 0


def test_kimi_k3_needs_the_quantized_moe_stand_ins(monkeypatch):
    folder = _big_model(KIMI_K3, "KimiK3ForConditionalGeneration")
    _without_quantized_moe_stand_ins(monkeypatch, names=("current_platform",))
    from kvaudit.errors import ConfigError

    with pytest.raises(ConfigError, match="No MXFP4 MoE backend supports"):
        _deploy(folder, tp=8)


def test_humming_is_chosen_without_importing_it(monkeypatch):
    """A lean install has no humming package: vLLM's lazy GemmType is the stand-in's while a model builds, and
    without it the Humming kernel check imports humming."""
    import importlib.util

    if importlib.util.find_spec("humming") is not None:
        pytest.skip("humming is installed: vLLM's own GemmType answers")
    folder = _kimi_k2_5()
    if _hopper_moe_backend() != "HUMMING":
        pytest.skip(f"vLLM {VLLM_VERSION} ranks no Humming WNA16 backend")
    _without_quantized_moe_stand_ins(monkeypatch, names=("GemmType",))
    from kvaudit.errors import ConfigError

    with pytest.raises(ConfigError, match="No module named 'humming'"):
        _deploy(folder, tp=8)


DEEPSEEK_V4_FLASH = ROOT / "fixtures" / "architectures" / "deepseek-ai--DeepSeek-V4-Flash"


@pytest.mark.skipif(VLLM_VERSION != PRIMARY_VLLM, reason="vLLM 0.23's DeepSeek-V4 builds only with an fp8 KV cache, and "
                    "has no deferred TileLang decoration")
def test_deepseek_v4_builds_without_tilelang_and_its_cuda_plan_is_refused_saying_why():
    """DeepSeek-V4-Flash at TP 8: its mHC layers import vLLM's TileLang kernels as they build (JIT warm-up), which
    vLLM decorates eagerly off ROCm; with the decoration deferred as on ROCm the model builds. Its compressed MLA
    layers keep one state per 128 tokens, which vLLM's CUDA attention backend gives a block size to hold: kvaudit
    does not set it, so the CUDA plan is refused naming the layer, never with the planner's ZeroDivisionError."""
    folder = _big_model(DEEPSEEK_V4_FLASH, "DeepseekV4ForCausalLM")
    from kvaudit.errors import NotAuditable
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import build_plan, make_deployment

    d = make_deployment(load_model_spec(folder), tp=8, gpu_memory_utilization=0.9, max_model_len=4096,
                        device="h200-141g", overhead_bytes=2 << 30)
    assert d.architecture == "DeepseekV4ForCausalLM" and d.weights_bytes > 10 << 30
    with pytest.raises(NotAuditable, match=r"model\.layers\.\d+\.attn's MLAAttentionSpec holds 0 bytes a block at "
                                           r"block size 16 under the cuda rule \(one state per 128 tokens\)"):
        build_plan(d, "cuda")


@pytest.mark.skipif(VLLM_VERSION != PRIMARY_VLLM, reason="vLLM 0.23 has no deferred TileLang decoration")
def test_deepseek_v4_needs_the_tilelang_stand_in(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("tilelang") is not None:
        pytest.skip("TileLang is installed: vLLM's own decoration runs")
    folder = _big_model(DEEPSEEK_V4_FLASH, "DeepseekV4ForCausalLM")
    _without(monkeypatch, lambda obj, name: name == "tilelang_jit")
    import sys

    # (a build before this one imported the kernels with their decoration deferred: import them afresh)
    monkeypatch.delitem(sys.modules, "vllm.model_executor.kernels.mhc.tilelang_kernels", raising=False)
    from kvaudit.errors import ConfigError
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import make_deployment

    with pytest.raises(ConfigError, match="tilelang is required"):
        make_deployment(load_model_spec(folder), tp=8, gpu_memory_utilization=0.9, max_model_len=4096,
                        device="h200-141g", overhead_bytes=2 << 30)


# --- the attention backend vLLM picks on each device kind ------------------------------------------------------


@pytest.mark.skipif(VLLM_VERSION != PRIMARY_VLLM, reason="vLLM's backend priorities by capability: one release")
def test_the_attention_backend_follows_the_device_kind():
    """DeepSeek-V3.2's sparse MLA with an fp8 KV cache: on Hopper FlashMLA-sparse stores vLLM's fp8_ds_mla entry (656
    bytes a token); on a B200 vLLM's priorities for capability 10 put FlashInfer's sparse MLA first for fp8, which
    stores plain fp8 (576 bytes); on an RTX 5090 FlashInfer's SM120 sparse MLA stores fp8_ds_mla again (vLLM's
    ``_canonicalize_sparse_mla_kv_cache_dtype``); on an A100 no backend of vLLM's takes sparse MLA, which is refused
    with vLLM's reasons. The backend choice is made again for each device in one process (vLLM caches it by layer settings)."""
    from kvaudit.errors import ConfigError
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import make_deployment, model_for

    spec = load_model_spec(ROOT / "fixtures" / "configs" / "deepseek-v3.2-exp")

    def entries(device):
        d = make_deployment(spec, tp=8, device=device, gpu_memory_utilization=0.9, max_model_len=8192,
                            kv_cache_dtype="fp8", kv_cache_memory_bytes=20 << 30)
        return Counter((getattr(s, "cache_dtype_str", None), s.page_size_bytes // s.block_size)
                       for s in model_for(d).kv_cache_specs().values())

    assert entries("h100-80g")[("fp8_ds_mla", 656)] == 61
    assert entries("b200-192g")[("fp8", 576)] == 61
    assert entries("rtx5090-32g")[("fp8_ds_mla", 656)] == 61  # (consumer Blackwell: FlashInfer's SM120 sparse MLA)
    assert entries("h100-80g")[("fp8_ds_mla", 656)] == 61
    with pytest.raises(ConfigError, match="no attention backend of vLLM's is valid on a device of capability 8.0 "
                                          "for this model: .*FLASHMLA_SPARSE: compute capability not supported"):
        entries("a100-80g")
    # dense MLA on an A100 builds with Triton MLA (vLLM's choice below Hopper), which asks the SM count while it builds
    dense = load_model_spec(ROOT / "fixtures" / "configs" / "deepseek-v3")
    d = make_deployment(dense, tp=8, device="a100-80g", gpu_memory_utilization=0.9, max_model_len=8192,
                        kv_cache_memory_bytes=20 << 30)
    assert Counter(s.page_size_bytes // s.block_size for s in model_for(d).kv_cache_specs().values()) == {576 * 2: 61}
