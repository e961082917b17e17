"""The budget vLLM gives the KV cache, and the impossible numbers that are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import each_vllm

from kvaudit.errors import ConfigError, UsageError
from kvaudit.model.deployment import DEVICES, get_preset, load_preset_spec
from kvaudit.plan.planner import deploy, make_deployment
from kvaudit.units import GiB, fmt_bytes, parse_size

pytestmark = pytest.mark.fast


def _qwen():
    return load_preset_spec(get_preset("qwen3-next"))


def test_budget_is_memory_times_util_minus_non_kv():
    d = make_deployment(_qwen(), tp=4, max_model_len=4096, gpu_memory_utilization=0.7)
    mem = DEVICES["atlas-a2-64g"].memory_bytes
    assert d.device_memory_bytes == 65_452_113_920
    terms = sum(t.bytes for t in d.overhead_terms)
    assert [t.key for t in d.overhead_terms] == ["peak_activation", "non_torch"]  # (no CUDA graphs on Ascend)
    assert d.non_kv_bytes == d.weights_bytes + terms and 0.5 * GiB < terms < 3 * GiB
    assert d.kv_budget_bytes == int(mem * 0.7) - d.non_kv_bytes
    assert 3.0 * GiB < d.kv_budget_bytes < 4.5 * GiB


def test_kv_cache_memory_overrides_the_formula():
    d = make_deployment(_qwen(), tp=4, max_model_len=4096, gpu_memory_utilization=0.7,
                        kv_cache_memory_bytes=5 * GiB)
    assert d.kv_budget_bytes == 5 * GiB


@pytest.mark.parametrize("util", [0.0, -0.1, 1.01, 7])
def test_util_outside_0_1_is_refused(util):
    with pytest.raises(UsageError, match="--util"):
        make_deployment(_qwen(), tp=4, max_model_len=4096, gpu_memory_utilization=util)


def test_budget_below_zero_names_the_utilization_needed():
    with pytest.raises(ConfigError, match="--util must exceed 0.6"):
        make_deployment(_qwen(), tp=4, max_model_len=4096, gpu_memory_utilization=0.5)


@pytest.mark.parametrize("kw", [dict(device_memory_bytes=0), dict(device_memory_bytes=-5),
                                dict(weights_bytes=0), dict(overhead_bytes=-1), dict(num_blocks_override=0),
                                dict(max_model_len=0), dict(max_model_len=10**9), dict(device="tpu-v9")])
def test_impossible_numbers_are_refused(kw):
    args = dict(tp=4, max_model_len=4096, gpu_memory_utilization=0.7)
    args.update(kw)
    with pytest.raises((UsageError, ConfigError)) as e:  # ours, or vLLM's own length check
        make_deployment(_qwen(), **args)
    assert e.value.exit_code == 2


def test_unknown_preset():
    with pytest.raises(UsageError, match="unknown preset 'qwen9'"):
        get_preset("qwen9")


@pytest.mark.parametrize("text,n", [("65452113920", 65452113920), ("2GiB", 2 * GiB), ("1.5 MiB", 1572864),
                                    ("2GB", 2_000_000_000), ("512", 512)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "abc", "-1GiB", "0", "3 parsecs"])
def test_parse_size_refuses(text):
    with pytest.raises(UsageError):
        parse_size(text, "--device-memory")


def test_fmt_bytes():
    assert fmt_bytes(3 * GiB // 2) == "1.50 GiB" and fmt_bytes(512) == "512 B" and fmt_bytes(-2048) == "-2.00 KiB"


def test_deploy_hands_every_option_to_the_deployment():
    """``deploy`` (the one place the command line and policy files turn options into a deployment): each option
    reaches its field, by vLLM's flag name, sizes parsed from text, the preset's values only where unset."""
    from kvaudit.plan.planner import deploy

    o = {"tp": 2, "util": 0.8, "max_model_len": 4096, "device": "a100-80g", "device_memory": "70GiB",
         "dtype": "float16", "weights": "15GiB", "overhead": "1GiB", "vllm_version": "0.30.0",
         "kv_cache_memory": "20GiB", "kv_transfer": True, "num_blocks": 123, "pp": 2, "kv_cache_dtype": "fp8",
         "quantization": "fp8", "block_size": 32, "enable_prefix_caching": False, "max_num_seqs": 7,
         "hf_overrides": '{"max_position_embeddings": 65536}', "max_num_batched_tokens": 4096,
         "enforce_eager": True, "max_cudagraph_capture_size": 64, "usage_context": "llm", "dp": 3}
    d = deploy(load_preset_spec(get_preset("llama-3.1-8b")), get_preset("qwen3-next"), o, pp_rank=1)
    assert (d.tp, d.gpu_memory_utilization, d.max_model_len, d.pp, d.pp_rank) == (2, 0.8, 4096, 2, 1)
    assert (d.device_memory_bytes, d.weights_bytes, d.overhead_bytes, d.kv_cache_memory_bytes) == (
        70 * GiB, 15 * GiB, 1 * GiB, 20 * GiB)
    assert d.weights_source == "--weights" and d.requested_dtype == d.dtype == "float16"
    assert (d.vllm_version, d.kv_transfer, d.num_blocks_override, d.kv_cache_dtype, d.quantization) == (
        "0.30.0", True, 123, "fp8", "fp8")
    assert (d.block_size, d.enable_prefix_caching, d.max_num_seqs, d.max_num_batched_tokens) == (32, False, 7, 4096)
    assert d.hf_overrides == {"max_position_embeddings": 65536}
    assert (d.enforce_eager, d.max_cudagraph_capture_size, d.usage_context, d.dp) == (True, 64, "llm", 3)
    hybrid = deploy(load_preset_spec(get_preset("qwen3-next")), None, {
        "mamba_cache_mode": "none", "num_speculative_tokens": 1, "overhead": "0", "device": "a100-80g",
        "weights": "10GiB"})
    assert (hybrid.mamba_cache_mode, hybrid.num_speculative_tokens, hybrid.overhead_bytes) == ("none", 1, 0)
    assert (hybrid.tp, hybrid.device) == (1, "a100-80g")  # no preset: one device
    assert deploy(load_preset_spec(get_preset("llama-3.1-8b")), None, {}).device == "atlas-a2-64g"
    unset = deploy(load_preset_spec(get_preset("qwen3-next")), get_preset("qwen3-next"), {})
    assert (unset.tp, unset.max_model_len, unset.usage_context, unset.gpu_memory_utilization) == (
        get_preset("qwen3-next").tp, get_preset("qwen3-next").max_model_len, "serve", 0.92)  # vLLM 0.20.0+'s default
    assert unset.weights_bytes != 15 * GiB and unset.kv_cache_memory_bytes is None and unset.device_memory_bytes


@pytest.mark.parametrize("options, message", [
    ({"hf_overrides": "{max_position_embeddings: 1}"}, "--hf-overrides is not valid JSON: Expecting property name "
     "enclosed in double quotes (column 2)"),
    ({"hf_overrides": "[1]"}, "--hf-overrides must be a JSON object, e.g. '{\"max_position_embeddings\": 65536}'"),
    ({"weights": "0"}, None), ({"kv_cache_memory": "0"}, None), ({"device_memory": "0"}, None),
    ({"kv_cache_memory": "lots"}, None)])
def test_deploy_says_which_option_is_bad(options, message):
    from kvaudit.plan.planner import deploy

    with pytest.raises(UsageError) as e:
        deploy(load_preset_spec(get_preset("llama-3.1-8b")), None, options)
    if message:
        assert str(e.value) == message
    else:
        assert str(e.value).startswith(f"--{next(iter(options)).replace('_', '-')} ")


@pytest.mark.parametrize("name, preset", [
    ("deepseek-ai/DeepSeek-R1", ("deepseek-v3", True)),  # R1 is V3's architecture
    ("DeepSeek-R1-Distill-Qwen-32B", ("qwen2.5-7b", False)),  # its distilled models are their bases' (Qwen2.5, Llama)
    ("deepseek-r1-qwen-distill-32B", ("qwen2.5-7b", False)),  # xorbitsai/inference#2893 (held-out-16), words swapped
    ("DeepSeek-R1-Distill-Llama-70B", ("llama-3.1-8b", False)),
    ("deepseek-r1-distill-phi-4", None),  # a distilled model of a base kvaudit has no preset of is no R1
])
def test_a_model_name_finds_its_preset_or_family(name, preset):
    from kvaudit.model.deployment import preset_for_model

    assert preset_for_model(name) == preset


def test_device_memory_given_keeps_the_kinds_platform_and_rules():
    """``--device-memory`` replaces a kind's memory, never its platform: an L40S of 40 GiB is planned by CUDA's
    rules, its size shown as given (not as the kind's), where the unknown kind "custom" once planned by Ascend's."""
    from kvaudit.plan.planner import deploy

    spec = load_preset_spec(get_preset("llama-3.1-8b"))
    d = deploy(spec, None, {"device": "l40s-48g", "device_memory": "40GiB", "max_model_len": 4096})
    assert (d.device, d.platform, d.device_memory_bytes, d.device_memory_given) == ("l40s-48g", "cuda", 40 * GiB, True)
    own = deploy(spec, None, {"device": "l40s-48g", "max_model_len": 4096})
    assert (own.device_memory_bytes, own.device_memory_given) == (DEVICES["l40s-48g"].memory_bytes, False)
    with pytest.raises(UsageError, match=r"unknown --device 'custom': Ascend: atlas-a2-64g, atlas-a2-32g; CUDA: .*l40s-48g"):
        make_deployment(spec, tp=1, gpu_memory_utilization=0.9, max_model_len=4096, device="custom",
                        device_memory_bytes=40 * GiB)


@pytest.mark.parametrize("device, tier", [("gb10-128g", 2048), ("rtx-pro-6000-96g", 8192), ("l40s-48g", 2048)])
def test_batch_defaults_follow_the_device_kind_as_vllm_reads_it(device, tier):
    """vLLM's ``EngineArgs.get_batch_defaults`` for ``vllm serve``: 8,192 batched tokens on a device of 70 GiB or
    more, except a GB10 (DGX Spark, capability 12.1: vLLM asks ``is_device_capability((12, 1))``), which keeps the
    small tier's 2,048 though its 121.69 GiB is more than 70."""
    d = make_deployment(load_preset_spec(get_preset("llama-3.1-8b")), tp=1, gpu_memory_utilization=0.9,
                        max_model_len=4096, device=device)
    assert d.max_num_batched_tokens == tier and d.platform == "cuda"



def test_data_and_expert_parallel_split_the_experts_as_vllms_moe_layer_does():
    """``--dp`` and ``--enable-expert-parallel`` reach vLLM's ``FusedMoEParallelConfig``: with DP 2 an MoE model's
    experts are split over the DP × TP ranks (by width, or whole with expert parallelism), the attention only by TP;
    a dense model's rank is the same at any DP. gpt-oss's MXFP4 experts pad their width, so whole experts weigh
    less than width-split ones: vLLM built them whole. EP where it changes nothing is refused."""
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import deploy

    arch = Path(__file__).resolve().parents[1] / "fixtures" / "architectures"
    moe = load_model_spec(arch / "Qwen--Qwen3-30B-A3B")
    base = {"device": "h100-80g", "max_model_len": 4096}
    one, dp2, tp2 = (deploy(moe, None, {**base, **o}) for o in ({}, {"dp": 2}, {"tp": 2}))
    experts = 48 * 128 * 3 * 2048 * 768 * 2  # Qwen3-30B-A3B: layers × experts × (gate, up, down) × hidden × width, bf16
    assert one.weights_bytes - dp2.weights_bytes == experts // 2
    assert dp2.weights_bytes - tp2.weights_bytes > 1 << 30  # (TP 2 splits attention and embeddings too)
    assert "rank 0 of DP 2: experts by width over 2 ranks" in dp2.weights_source
    assert "DP 2" in next(t for t in dp2.overhead_terms if t.key == "non_torch").source
    ep = deploy(moe, None, {**base, "dp": 2, "enable_expert_parallel": True})
    assert ep.weights_bytes - dp2.weights_bytes == 48 * 128 * 4  # vLLM's expert_map: an int32 per expert, per layer
    assert "experts whole over 2 ranks (expert parallel)" in ep.weights_source
    act = {d: next(t.bytes for t in d.overhead_terms if t.key == "peak_activation") for d in (one, dp2, ep)}
    assert act[one] < act[dp2] < act[ep]  # (the DP group's tokens gathered; whole experts are twice as wide)
    oss = load_model_spec(arch / "openai--gpt-oss-20b")
    width, whole = (deploy(oss, None, {**base, "tp": 2, **o}) for o in ({}, {"enable_expert_parallel": True}))
    assert whole.weights_bytes < width.weights_bytes - (64 << 20)
    dense = load_preset_spec(get_preset("llama-3.1-8b"))
    assert deploy(dense, None, {**base, "dp": 4}).weights_bytes == deploy(dense, None, base).weights_bytes
    with pytest.raises(ConfigError, match="Number of experts in the model must be greater than 0 when expert"):
        deploy(dense, None, {**base, "tp": 2, "enable_expert_parallel": True})
    with pytest.raises(UsageError, match="with DP 1 and TP 1: one rank holds every expert either way"):
        deploy(moe, None, {**base, "enable_expert_parallel": True})
    for bad in (0, -1):
        with pytest.raises(UsageError, match="--dp must be at least 1"):
            deploy(moe, None, {**base, "dp": bad})


@each_vllm
def test_vllms_default_utilization_is_the_emulated_releases():
    """vLLM's default ``gpu_memory_utilization`` is stated once, by era (``UTILIZATION_DEFAULTS``): the installed
    vLLM's own ``CacheConfig`` default is the one for its release, and an unset ``--util`` plans with the emulated
    release's (0.9 up to 0.19.1, 0.92 from 0.20.0, read in those sdists)."""
    import dataclasses

    pytest.importorskip("vllm")
    from kvaudit.model.memory import default_gpu_memory_utilization
    from kvaudit.model.vllm_modules import module, vllm_version

    field = next(f for f in dataclasses.fields(module("vllm.config").CacheConfig) if f.name == "gpu_memory_utilization")
    assert default_gpu_memory_utilization(vllm_version()) == getattr(field.default, "default", field.default)
    assert [default_gpu_memory_utilization(v) for v in ("0.11.0", "0.19.1", "0.20.0", "0.33.0")] == [0.9, 0.9, 0.92,
                                                                                                     0.92]
    spec = load_preset_spec(get_preset("llama-3.1-8b"))
    assert deploy(spec, None, {}).gpu_memory_utilization == default_gpu_memory_utilization(vllm_version())
    assert deploy(spec, None, {"vllm_version": "0.19.1"}).gpu_memory_utilization == 0.9
    assert deploy(spec, None, {"vllm_version": "0.20.0", "util": 0.8}).gpu_memory_utilization == 0.8


def test_deploy_takes_a_typed_record_of_the_options():
    """The command line's namespace and a policy's mapping become one typed record (``DeploymentOptions``): a
    command's own options are left out, an unset one takes its declared default, and the record plans as the
    mapping does."""
    import dataclasses
    from types import SimpleNamespace

    from kvaudit.model.options import DeploymentOptions

    record = DeploymentOptions.of(SimpleNamespace(tp=4, util=0.7, fmt="json", strategy=["vllm"], pp=None))
    assert (record.tp, record.util, record.pp, record.dtype) == (4, 0.7, 1, "auto")
    assert "fmt" not in {f.name for f in dataclasses.fields(record)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.tp = 8
    spec = load_preset_spec(get_preset("qwen3-next"))
    assert deploy(spec, None, record) == deploy(spec, None, {"tp": 4, "util": 0.7})
