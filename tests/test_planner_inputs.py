"""What the planner hands vLLM and what it keys a build on: the deployment's options as ``EngineArgs`` (only those
set), every option in the build's cache key, the prefix-caching default each vLLM release gives hybrids, and the
messages of a refused config. These are the inputs of a build; the builds themselves are tested in test_plan and
test_families."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from kvaudit.errors import ConfigError
from kvaudit.plan import planner
from conftest import deployment

pytestmark = pytest.mark.fast


def test_engine_args_carry_every_option_set_and_nothing_unset():
    d = deployment("qwen3-next", block_size=64, max_num_seqs=8, max_num_batched_tokens=4096, num_speculative_tokens=2,
                   max_cudagraph_capture_size=128, enable_prefix_caching=False)
    d = dataclasses.replace(d, model=dataclasses.replace(d.model, trust_remote_code=True))
    args = planner._engine_args(d)
    assert {k: args[k] for k in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_cudagraph_capture_size",
                                 "enable_prefix_caching", "tensor_parallel_size", "trust_remote_code")} == {
        "block_size": 64, "max_num_seqs": 8, "max_num_batched_tokens": 4096, "max_cudagraph_capture_size": 128,
        "enable_prefix_caching": False, "tensor_parallel_size": d.tp, "trust_remote_code": True}
    assert args["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    plain = planner._engine_args(deployment("qwen3-next"))
    assert plain["trust_remote_code"] is False
    assert not {"block_size", "max_cudagraph_capture_size", "speculative_config"} & set(plain)  # vLLM's defaults decide


@pytest.mark.parametrize("option, value", [
    ("num_speculative_tokens", 1), ("max_cudagraph_capture_size", 64), ("hf_overrides", {"num_hidden_layers": 4}),
    ("max_num_seqs", 16), ("block_size", 32), ("enforce_eager", True), ("vllm_version", "0.23.0"), ("tp", 8)])
def test_every_build_input_is_in_the_build_key(option, value):
    d = deployment("qwen3-next")
    assert getattr(d, option) != value
    assert planner._build_key(dataclasses.replace(d, **{option: value})) != planner._build_key(d)


@pytest.mark.parametrize("release, wanted", [("0.27.0", False), ("0.28.0", True), ("0.33.0", True)])
def test_hybrid_prefix_caching_is_on_by_default_from_0_28(release, wanted):
    d = dataclasses.replace(deployment("qwen3-next"), vllm_version=release, enable_prefix_caching=None)
    for installed in (False, True):  # the installed vLLM's default, as its config resolved it
        vc = SimpleNamespace(model_config=SimpleNamespace(is_hybrid=True),
                             cache_config=SimpleNamespace(enable_prefix_caching=installed))
        assert planner._hybrid_prefix_caching(d, vc) == (None if installed == wanted else wanted)
    dense = SimpleNamespace(model_config=SimpleNamespace(is_hybrid=False), cache_config=None)
    assert planner._hybrid_prefix_caching(d, dense) is None


def test_config_code_is_refused_without_trust_remote_code_and_says_how(tmp_path):
    from kvaudit.model.deployment import load_model

    (tmp_path / "config.json").write_text(json.dumps({  # a config whose class is code in its folder (auto_map)
        "architectures": ["MadeUpForCausalLM"], "model_type": "made_up", "hidden_size": 1024, "num_hidden_layers": 2,
        "num_attention_heads": 8, "vocab_size": 1000, "auto_map": {"AutoConfig": "configuration_made_up.MadeUpConfig"}}))
    spec = load_model(None, str(tmp_path))[0]
    with pytest.raises(ConfigError) as e:
        planner.make_deployment(spec, tp=1, max_model_len=1024, device="h100-80g", gpu_memory_utilization=0.9)
    assert e.value.message == (f"{spec.name}'s config is code in its folder (configuration_made_up.MadeUpConfig), which "
                               "vLLM runs only with --trust-remote-code: give it if you trust that code")
