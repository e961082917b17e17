"""vLLM's own plans, checked against the hand arithmetic of the allocation reference (§7)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvaudit.errors import ConfigError, NotAuditable
from kvaudit.plan.planner import shared_by_view
from conftest import deployment, each_vllm, plan_for

pytestmark = [each_vllm, pytest.mark.fast]

# attention block size and uniform page P per platform rule, Qwen3-Next TP 4 bf16 (reference §7.3)
EXPECTED = {"cuda": (272, 278_528), "ascend-align128": (384, 393_216), "ascend-contiguous": (512, 536_576)}


@pytest.mark.parametrize("platform", list(EXPECTED))
def test_qwen3_next_plan_matches_the_reference(platform):
    d = deployment()
    plan = plan_for(d, platform)
    block, page = EXPECTED[platform]
    assert plan.block_size == block
    assert {g.page_size_bytes for g in plan.groups} == {page}
    assert [len(g.layer_names) for g in plan.groups] == [12, 12, 12, 12]
    assert sorted(g.spec_type for g in plan.groups) == ["FullAttentionSpec"] + ["MambaSpec"] * 3
    # N = floor(A / (12 P)); 12 regions of P·N; one backing allocation of 12·P·N (vLLM 0.29+ format)
    assert plan.num_blocks == d.kv_budget_bytes // (12 * page)
    assert len(plan.tensors) == 12
    assert all(t.size == page * plan.num_blocks for t in plan.tensors)
    assert plan.planned_bytes == 12 * page * plan.num_blocks <= d.kv_budget_bytes
    for i, t in enumerate(plan.tensors):
        kinds = sorted(plan.layer_specs[n] for n in t.shared_by)
        assert kinds == ["FullAttentionSpec", "MambaSpec", "MambaSpec", "MambaSpec"]
        assert set(t.shared_by) == {f"model.layers.{4 * i + 3}.self_attn.attn"} | {
            f"model.layers.{4 * i + k}.linear_attn" for k in range(3)}


def test_plan_names_the_vllm_that_planned():
    import importlib.metadata

    assert plan_for(deployment(), "cuda").vllm_version == importlib.metadata.version("vllm")


def test_num_blocks_override_scales_the_plan():
    plan = plan_for(deployment(num_blocks_override=64), "ascend-align128")
    assert plan.num_blocks == 64 and plan.planned_bytes == 12 * 393_216 * 64


def test_dense_control_plan():
    d = deployment("llama-3.1-8b")
    plan = plan_for(d, "cuda")
    # 32 layers × 8 KV heads × 128 dim × 2 (K, V) × 2 B = 128 KiB per token per layer... per block of 16
    page = 16 * 2 * 8 * 128 * 2
    assert len(plan.groups) == 1 and len(plan.groups[0].layer_names) == 32
    assert plan.groups[0].page_size_bytes == page
    assert plan.num_blocks == d.kv_budget_bytes // (32 * page)
    assert len(plan.tensors) == 32 and all(len(t.shared_by) == 1 for t in plan.tensors)


def test_budget_too_small_for_one_block_of_every_group():
    d = deployment(kv_cache_memory_bytes=4 << 20)  # 4 MiB: less than one block of 12 layers
    with pytest.raises(ConfigError, match="planner refused"):
        plan_for(d, "cuda")


def _t(layers, layer_stride, block_stride, offset=0):
    return SimpleNamespace(layers=layers, layer_stride=layer_stride, block_stride=block_stride, offset=offset,
                           size=1000)


def test_shared_by_view_groups_coincident_spans():
    tensors = [_t(["a0", "a1"], 100, 10), _t(["b0", "b1"], 100, 10)]
    view = shared_by_view(tensors, 10, {"a0": 10, "a1": 10, "b0": 10, "b1": 10})
    assert [(t.size, t.shared_by) for t in view] == [(100, ("a0", "b0")), (100, ("a1", "b1"))]


def test_shared_by_view_refuses_interleaved_layouts():
    # block-outermost: layer stride = page, block stride = packed block: spans overlap partially
    tensors = [_t(["a0", "a1"], 10, 20)]
    with pytest.raises(NotAuditable) as e:
        shared_by_view(tensors, 4, {"a0": 10, "a1": 10})
    assert str(e.value) == ("this plan interleaves layers within blocks (block-outermost layout); it has no shared_by "
                            "view for strategies written for KVCacheTensor(size, shared_by)")


# vLLM's EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py, the same tiers in 0.23.0 and 0.33.0): a device of
# >= 70 GiB that is not an A100 gets 1024 sequences and 8192 batched tokens under `vllm serve` (16384 for the LLM
# class); a smaller device 256 and 2048 (8192). SchedulerConfig's own class defaults are 128 and 2048.
@pytest.mark.parametrize("device, context, seqs, tokens", [
    ("h100-80g", "serve", 1024, 8192), ("h100-80g", "llm", 1024, 16384), ("h200-141g", "serve", 1024, 8192),
    ("atlas-a2-64g", "serve", 256, 2048), ("atlas-a2-64g", "llm", 256, 8192),
])
def test_unset_scheduler_options_take_vllm_serves_defaults_for_the_device(device, context, seqs, tokens):
    d = deployment("llama-3.1-8b", device=device, usage_context=context)
    assert (d.max_num_seqs, d.max_num_batched_tokens) == (seqs, tokens)
    assert set(d.defaults) >= {"max_num_seqs", "max_num_batched_tokens"}
    assert "get_batch_defaults" in d.defaults["max_num_seqs"] and ("vllm serve" if context == "serve" else "LLM class") \
        in d.defaults["max_num_seqs"]


def test_options_that_are_given_are_not_defaults():
    d = deployment("llama-3.1-8b", device="h100-80g", max_num_seqs=64, max_num_batched_tokens=4096)
    assert (d.max_num_seqs, d.max_num_batched_tokens) == (64, 4096)
    assert "max_num_seqs" not in d.defaults and "max_num_batched_tokens" not in d.defaults


def test_a_sliding_window_group_is_planned_with_the_serve_default_batch():
    """A sliding-window group holds window + max_num_batched_tokens tokens per request: with the class default
    (2048) instead of vllm serve's 8192 on an H100, gpt-oss's concurrency came out a third too high."""
    from kvaudit.plan.capacity import capacity
    from kvaudit.plan.planner import build_plan

    served = deployment("gpt-oss-120b", device="h100-80g", gpu_memory_utilization=0.9)
    forced = deployment("gpt-oss-120b", device="h100-80g", gpu_memory_utilization=0.9, max_num_batched_tokens=2048)
    a, b = capacity(build_plan(served, "cuda")), capacity(build_plan(forced, "cuda"))
    # (vLLM 0.33 counts each request's window + batch into concurrency fully: 45.1x vs 60.1x; vLLM 0.23: 54.1x vs 63.7x)
    assert served.max_num_batched_tokens == 8192 and a.max_concurrency < 0.9 * b.max_concurrency


def test_every_pipeline_stage_gets_the_smallest_stages_num_blocks():
    """vLLM's engine plans all stages at once and gives each the smallest stage's num_blocks
    (get_kv_cache_configs); planned apart, the stage with the smaller budget would have fewer."""
    from kvaudit.plan.planner import build_plan

    stages = [deployment("llama-3.1-8b", pp=3, pp_rank=r, device="h100-80g", gpu_memory_utilization=0.9)
              for r in (0, 1, 2)]  # 32 layers in stages of 11, 11 and 10, the embedding and the LM head apart
    assert len({s.kv_budget_bytes for s in stages}) == 3
    plans = [build_plan(s, "cuda") for s in stages]
    assert len({p.num_blocks for p in plans}) == 1
    page = {s.pp_rank: sum(g.page_size_bytes * len(g.layer_names) for g in p.groups) for s, p in zip(stages, plans)}
    alone = {s.pp_rank: s.kv_budget_bytes // page[s.pp_rank] for s in stages}
    assert len(set(alone.values())) > 1 and plans[0].num_blocks == min(alone.values())


def test_a_model_wide_sliding_window_is_planned_as_one():
    """A config with ``sliding_window`` and no ``layer_types`` (Mistral-7B, StarCoder2): vLLM's engine config hands
    ``ModelConfig.get_sliding_window()`` to the cache config, and every attention layer slides."""
    d = deployment("llama-3.1-8b", device="h100-80g", max_model_len=8192, hf_overrides={"sliding_window": 4096})
    plan = plan_for(d, "cuda")
    assert {g.spec_type for g in plan.groups} == {"SlidingWindowSpec"}
    assert sum(len(g.layer_names) for g in plan.groups) == 32


MAMBA_130M = {  # state-spaces/mamba-130m-hf's sizes (its config.json on the Hub, as vendored in public test files)
    "architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24,
    "state_size": 16, "conv_kernel": 4, "expand": 2, "intermediate_size": 1536, "time_step_rank": 48,
    "vocab_size": 50280, "layer_norm_epsilon": 1e-05, "use_bias": False, "use_conv_bias": True,
    "residual_in_fp32": True, "tie_word_embeddings": True, "torch_dtype": "float32"}


@pytest.mark.parametrize("platform", ["cuda", "ascend-align128", "ascend-contiguous"])
def test_an_attention_free_model_keeps_vllms_mamba_block_size(tmp_path, platform):
    """No attention layer, so nothing to align the state page to: vLLM aligns only hybrids (``is_hybrid``); the
    hybrid rule on a Mamba-1 model divided by a zero attention page."""
    import json

    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import make_deployment

    (tmp_path / "config.json").write_text(json.dumps(MAMBA_130M))
    d = make_deployment(load_model_spec(tmp_path), tp=1, gpu_memory_utilization=0.9, max_model_len=2048,
                        device="h100-80g", overhead_bytes=2 << 30)
    plan = plan_for(d, platform)
    assert [g.spec_type for g in plan.groups] == ["MambaSpec"] and len(plan.groups[0].layer_names) == 24


def test_the_layer_mix_names_each_kind_most_first():
    from kvaudit.plan.planner import layer_mix

    assert layer_mix(deployment()) == "36 GDN + 12 full attention"  # Qwen3-Next: 3 of every 4 layers linear
    assert layer_mix(deployment("llama-3.1-8b")) == "32 full attention"


@pytest.mark.parametrize("mamba_type, label", [("gdn_attention", "GDN"), (SimpleNamespace(name="MAMBA2"), "Mamba2"),
                                               ("mamba1", "Mamba"), ("short_conv", "short conv"),
                                               ("linear_attention", "linear attention"), ("kda", "kda")])
def test_mamba_like_layers_are_named_by_their_backend(mamba_type, label):
    from kvaudit.plan.planner import _mamba_kind

    assert _mamba_kind(SimpleNamespace(mamba_type=mamba_type)) == label


def test_a_reason_is_one_line_and_a_bare_assert_says_where_it_was_raised():
    from kvaudit.plan.planner import _at, _first_line

    def bare():
        raise AssertionError  # what a bare assert in vLLM's config checks raises (pytest rewrites this file's)

    try:
        bare()
    except AssertionError as e:
        raised = e
    line = bare.__code__.co_firstlineno + 1
    assert _at(raised) == f" at test_plan.py:{line}" and _at(ValueError("said why")) == "" and _at(AssertionError()) == ""
    assert _first_line(ValueError("Validation error for field 'x':\n  must be  positive\nthird")) == (
        "Validation error for field 'x': must be positive")
    assert _first_line(ValueError("first line:  \nsecond")) == "first line: second"
    assert _first_line(ValueError("  first line\nsecond:")) == "first line" and _first_line(KeyError()) == "KeyError"
