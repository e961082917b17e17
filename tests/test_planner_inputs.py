"""What the planner hands vLLM and what it keys a build on: the deployment's options as ``EngineArgs`` (only those
set), every option in the build's cache key, the prefix-caching default each vLLM release gives hybrids, and the
messages of a refused config. These are the inputs of a build; the builds themselves are tested in test_plan and
test_families."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvaudit.errors import ConfigError
from kvaudit.plan import planner
from kvaudit.model import vllm_model, vllm_modules
from conftest import deployment, ending, skip_unless_planned

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
    assert {k: args[k] for k in ("dtype", "max_model_len", "quantization", "hf_overrides", "kv_cache_dtype",
                                 "pipeline_parallel_size", "enforce_eager", "skip_tokenizer_init")} == {
        "dtype": d.requested_dtype, "max_model_len": d.max_model_len, "quantization": d.quantization,
        "hf_overrides": {}, "kv_cache_dtype": d.kv_cache_dtype, "pipeline_parallel_size": d.pp,
        "enforce_eager": d.enforce_eager, "skip_tokenizer_init": True}  # no tokenizer: kvaudit reads no weights
    assert (Path(args["model"]) / "config.json").read_text() == d.model.config_path.read_text()
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


def test_planning_without_vllm_says_what_to_install(monkeypatch):
    from kvaudit.errors import MissingDependency

    monkeypatch.setattr(planner, "_VLLM", None)
    monkeypatch.setattr(vllm_modules, "vllm_version", lambda: None)  # (the one door to vLLM checks it)
    with pytest.raises(MissingDependency) as e:
        planner.load_vllm()
    assert str(e.value) == ("vLLM is not installed in this environment; kvaudit plans with vLLM's own planner: install "
                            "vllm (see README: install), or audit a saved plan with kvaudit audit --plan PLAN.json, "
                            "which needs only torch")


def test_the_modules_vllm_plans_with_are_its_own(monkeypatch):
    monkeypatch.setattr(planner, "_VLLM", None)
    v = planner.load_vllm()
    assert v.version == planner.vllm_version()
    names = {k: getattr(v, k).__name__ for k in ("config", "iface", "kv_cache_utils", "flash_attn", "backend_utils",
                                                  "platform_iface", "worker_utils")}
    assert names == {"config": "vllm.config", "iface": "vllm.v1.kv_cache_interface",
                     "kv_cache_utils": "vllm.v1.core.kv_cache_utils",
                     "flash_attn": "vllm.v1.attention.backends.flash_attn",
                     "backend_utils": "vllm.v1.attention.backends.utils", "platform_iface": "vllm.platforms.interface",
                     "worker_utils": "vllm.v1.worker.utils"}
    assert v.planning.__name__ == "vllm.v1.core.kv_cache_planning"  # from vLLM 0.33 (kv_cache_utils before)


def _with_architectures(*archs: str):
    d = deployment("llama-3.1-8b")
    return dataclasses.replace(d, model=dataclasses.replace(d.model, raw={**d.model.raw, "architectures": list(archs)}))


def test_an_architecture_vllm_moved_out_is_named_with_where_it_went(monkeypatch):
    """vLLM's registry records the last release that served an architecture it removed and the plugin that serves
    one it moved out of tree; an architecture it serves, or a registry without those records, gives no message."""
    pytest.importorskip("vllm")
    vllm_modules.declare_torchvision_ops()  # as the planner does before its first vLLM import (said after a refusal)
    registry = pytest.importorskip("vllm.model_executor.models.registry")
    version = planner.vllm_version()
    previously = {"OldForCausalLM": "0.10.1", "LlamaForCausalLM": "0.1"}
    monkeypatch.setattr(registry, "_PREVIOUSLY_SUPPORTED_MODELS", previously, raising=False)
    monkeypatch.setattr(registry, "_OOT_SUPPORTED_MODELS", {"OutForCausalLM": "vllm-out-plugin"}, raising=False)
    assert planner._removed(_with_architectures("OldForCausalLM")) == (
        f"vLLM {version} no longer serves OldForCausalLM; vLLM 0.10.1 was the last release to serve it (plan with that "
        "vLLM: --vllm-python)")
    assert planner._removed(_with_architectures("OutForCausalLM", "OtherForCausalLM")) == (
        f"vLLM {version} serves OutForCausalLM only through a plugin (vllm-out-plugin): plan where it is installed")
    assert planner._removed(_with_architectures("LlamaForCausalLM")) == ""  # served now, whatever an old record says
    assert planner._removed(_with_architectures()) == ""
    monkeypatch.delattr(registry, "_PREVIOUSLY_SUPPORTED_MODELS")
    monkeypatch.delattr(registry, "_OOT_SUPPORTED_MODELS")
    assert planner._removed(_with_architectures("OldForCausalLM")) == ""


def test_an_exception_is_said_in_one_line_with_its_type_where_that_is_the_hint():
    assert planner._why(AssertionError()) == "AssertionError"
    assert planner._why(ZeroDivisionError("division by zero")) == "ZeroDivisionError: division by zero"
    assert planner._why(ValueError("block_size must be a multiple of 16\nmore")) == (
        "block_size must be a multiple of 16")
    assert planner._why(ValueError("x" * 500)) == "x" * 400


class _PydanticError(ValueError):
    """What vLLM's configs raise: pydantic's ValidationError, whose ``errors()`` lists each error's message."""

    def __init__(self, *errors):
        super().__init__("1 validation error for CacheConfig")
        self._errors = list(errors)

    def errors(self):
        return self._errors


def test_a_config_validation_error_is_said_by_its_first_message():
    assert planner._why(_PydanticError({"msg": "Value error, block_size must be positive\nmore"}, {"msg": "b"})) == (
        "block_size must be positive")
    assert planner._why(_PydanticError({"msg": "y" * 500})) == "y" * 400
    assert planner._why(_PydanticError({"type": "missing"})) == "1 validation error for CacheConfig"  # no message


def test_a_bare_assert_is_placed_at_the_line_that_raised_it():
    in_vllm = compile("\n\nraise AssertionError  # a bare assert: no message of its own", "/vllm/v1/kv_cache_utils.py",
                      "exec")

    def outer():
        exec(in_vllm)

    try:
        outer()
    except AssertionError as e:
        assert planner._at(e) == " at kv_cache_utils.py:3"
    assert planner._at(AssertionError("it says why")) == ""


def test_the_layer_mix_names_a_kind_it_has_no_label_for_by_its_spec(monkeypatch):
    full, new = type("FullAttentionSpec", (), {}), type("ZSpec", (), {})
    specs, d = {"a": full(), "b": full(), "c": new()}, deployment()
    monkeypatch.setattr(planner, "model_for", lambda d: SimpleNamespace(kv_cache_specs=lambda: specs))
    assert planner.layer_mix(d) == "2 full attention + 1 ZSpec"  # most first, not by name


def test_a_mamba_kind_is_read_from_its_types_name():
    import enum

    class MambaType(str, enum.Enum):
        GDN_ATTN = "gated_delta"

        __str__ = str.__str__  # as a StrEnum: its text is its value

    assert planner._mamba_kind(SimpleNamespace(mamba_type=MambaType.GDN_ATTN)) == "GDN"
    assert planner._mamba_kind(SimpleNamespace(mamba_type="short_conv")) == "short conv"
    assert planner._mamba_kind(SimpleNamespace(mamba_type="rwkv7")) == "rwkv7"


def test_the_temporary_model_folders_are_removed(monkeypatch, tmp_path):
    made, gone = tmp_path / "made", tmp_path / "gone"
    made.mkdir()
    monkeypatch.setattr(planner, "_MODEL_DIRS", {Path("a.json"): made, Path("b.json"): gone})
    removed = []
    monkeypatch.setitem(sys.modules, "kvaudit.model.vllm_model",
                        SimpleNamespace(remove_temp_files=lambda: removed.append(1)))
    planner.remove_temp_dirs()
    assert not made.exists() and planner._MODEL_DIRS == {} and removed == [1]


def test_a_hybrid_rule_without_an_attention_layer_says_so():
    with pytest.raises(ConfigError) as e:
        planner._attn_page_1_token({})
    assert str(e.value) == "the model has no attention layer to align the hybrid block size to"


def test_a_sliding_window_request_reserves_the_batches_in_flight_its_release_did():
    """gpt-oss-120b at TP 2 (18 sliding-window layers of 128 tokens, 8 KV heads of 64): from vLLM 0.26 a request
    reserves ``window − 1 + max_in_flight_tokens`` per sliding layer (two batches of ``max_num_batched_tokens`` under
    async scheduling), up to 0.25 ``window − 1 + max_num_batched_tokens`` (each release's
    ``SlidingWindowSpec.max_admission_blocks_per_request``): one batch of blocks fewer per sliding layer, plus the
    block the window may straddle in both."""
    from kvaudit.model.deployment import PRESETS, fixtures_dir, load_preset_spec

    skip_unless_planned()
    from kvaudit.plan.capacity import capacity

    c = json.loads((fixtures_dir() / PRESETS["gpt-oss-120b"].config / "config.json").read_text())
    sliding, window = c["layer_types"].count("sliding_attention"), c["sliding_window"]
    spec = load_preset_spec(PRESETS["gpt-oss-120b"])
    need, batched, tokens = {}, {}, {}
    for release in ("0.25.0", "0.26.0"):
        d = planner.make_deployment(spec, tp=2, gpu_memory_utilization=0.9, max_model_len=32768, device="h100-80g",
                                    kv_cache_memory_bytes=40 << 30, vllm_release=release)
        need[release], batched[release] = planner.request_need(d).bytes, d.max_num_batched_tokens
        tokens[release] = capacity(planner.build_plan(d, "cuda")).tokens
    block, page = 16, 16 * (c["num_key_value_heads"] // 2) * c["head_dim"] * 2 * 2  # K and V, bf16
    b = batched["0.26.0"]
    assert batched["0.25.0"] == b == 8192  # vllm serve on an H100
    one, two = -(-(window - 1 + b) // block) + 1, -(-(window - 1 + 2 * b) // block) + 1
    assert need["0.26.0"] - need["0.25.0"] == sliding * (two - one) * page
    assert tokens["0.25.0"] > 1.15 * tokens["0.26.0"]  # a request takes fewer blocks: more fit the same pool


EAGLE3_DRAFT = {
    # SpecForge's EAGLE-3 draft head for Llama 3.1 8B (sgl-project/SpecForge, configs/llama3-8B-eagle3.json, as
    # stored for the fork yubofredwang/SpecForge@79694c7a), the form of the released EAGLE3 heads' config.json
    "architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 2048,
    "model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
    "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 31960}


def test_a_draft_head_given_alone_is_refused_saying_what_it_is(tmp_path, capsys):
    """An EAGLE-3 head alone: vLLM's model asserts a speculative config (``llama_eagle3.py``), which kvaudit said as
    "AssertionError: AssertionError"; the refusal names the draft model and what to plan instead, exit 2."""
    skip_unless_planned()
    from kvaudit.cli import main

    (tmp_path / "config.json").write_text(json.dumps(EAGLE3_DRAFT))
    assert main(["plan", str(tmp_path), "--device", "h100-80g"]) == 2
    err = "\n".join(ending(capsys.readouterr().err))
    assert err == ("kvaudit: error: LlamaForCausalLMEagle3 is a speculative-decoding draft model (vLLM's registry lists "
                   "it among them): vLLM builds it only beside the model it drafts for, given with --speculative-config; "
                   "plan that model (kvaudit plans an MTP draft with --num-speculative-tokens, not an EAGLE head)")


def test_a_multimodal_model_emulating_an_older_release_keeps_its_one_batch_rule():
    """Gemma 3 27B (a multimodal wrapper with sliding-window layers) at ``--vllm-version 0.25.0``: vLLM copies and
    re-validates the config while it builds such a model, so the emulated rule is kept beside the config, not on it;
    the plan holds more tokens than 0.26's, whose requests reserve two batches in flight."""
    from kvaudit.model.deployment import PRESETS, load_preset_spec
    from kvaudit.plan.capacity import capacity

    skip_unless_planned()
    spec = load_preset_spec(PRESETS["gemma-3-27b"])
    tokens = {}
    for release in ("0.25.0", "0.26.0"):
        d = planner.make_deployment(spec, tp=2, gpu_memory_utilization=0.9, max_model_len=32768, device="h100-80g",
                                    kv_cache_memory_bytes=20 << 30, vllm_release=release)
        tokens[release] = capacity(planner.build_plan(d, "cuda")).tokens
    assert tokens["0.25.0"] > tokens["0.26.0"]
