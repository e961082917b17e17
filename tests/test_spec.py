"""config.json -> ModelSpec: what is read before vLLM loads, and every bad-input error (one line, exit 2)."""

from __future__ import annotations

import json
import sys

import pytest

from kvaudit.cli import main
from kvaudit.errors import ConfigError, UsageError
from kvaudit.model.spec import load_model_spec
from conftest import ROOT, each_vllm, ending

QWEN = ROOT / "fixtures/configs/qwen3-next-80b-a3b-instruct/config.json"
GEMMA = ROOT / "fixtures/configs/gemma-3-27b-it/config.json"


def test_wrapper_configs_are_read_through_their_text_config():
    s = load_model_spec(GEMMA)
    assert s.architecture == "Gemma3ForConditionalGeneration"
    assert s.num_hidden_layers == 62 and s.text["sliding_window"] == 1024


def test_quantization_config_is_read():
    assert load_model_spec(ROOT / "fixtures/configs/deepseek-v3").quantization == "fp8"
    assert load_model_spec(ROOT / "fixtures/configs/gpt-oss-120b").quantization == "mxfp4"
    assert load_model_spec(QWEN).quantization is None


def test_spec_parsing_imports_neither_torch_nor_vllm():
    import subprocess

    code = ("import sys; from kvaudit.model.spec import load_model_spec; import kvaudit.report.render, kvaudit.model.deployment; "
            f"load_model_spec({str(QWEN)!r}); "
            "print([m for m in ('torch', 'vllm', 'rich') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _write(tmp_path, cfg) -> str:
    p = tmp_path / "config.json"
    p.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return str(p)


def _qwen(**changes) -> dict:
    cfg = json.loads(QWEN.read_text())
    cfg.update(changes)
    return cfg


def _gemma_window(window: int) -> dict:
    cfg = json.loads(GEMMA.read_text())
    cfg["text_config"].update(sliding_window=window, max_position_embeddings=131072)
    return cfg


@pytest.mark.parametrize("cfg, message", [
    ("{ not json", "not JSON \\(Expecting property name"),
    ("[1, 2]", "must hold a JSON object"),
    ({"hidden_size": 1}, "missing required field 'model_type'"),
    ({"d_model": 2560, "n_layer": 64, "vocab_size": 50277, "ssm_cfg": {}}, "mamba_ssm's format"),
    ({"model_type": "llama", "num_hidden_layers": 2}, "missing 'architectures'"),
    ("layer_types", "'layer_types' lists 12 layers, the config has 48"),
    ("heads", "not a multiple of num_key_value_heads"),
    ("layers", "'num_hidden_layers' must be a positive integer"),
])
def test_bad_configs_are_one_line_errors(tmp_path, cfg, message):
    cfg = {
        "layer_types": _qwen(layer_types=["full_attention"] * 12),
        "heads": _qwen(num_attention_heads=16, num_key_value_heads=3),
        "layers": _qwen(num_hidden_layers=0),
    }.get(cfg, cfg) if isinstance(cfg, str) and not cfg.startswith(("{", "[")) else cfg
    with pytest.raises(ConfigError, match=message):
        load_model_spec(_write(tmp_path, cfg))


@pytest.mark.parametrize("cfg", [
    {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 12, "n_embd": 768},  # GPT-2's names
    {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],  # sizes from LlamaConfig's defaults
     "text_config": {"model_type": "llama"}},
    "window_attention", "deepseek-ocr"])
def test_what_transformers_defines_is_not_refused_before_vllm(tmp_path, cfg):
    """A layer count under another name (``n_layer``), one left to the config class's default, and a
    ``layer_types`` entry transformers allows (``ALLOWED_LAYER_TYPES``) are vLLM's and transformers' to read: kvaudit
    checks nothing vLLM does not."""
    if cfg == "window_attention":
        cfg = _qwen(layer_types=["window_attention"] * 48)
    elif cfg == "deepseek-ocr":  # use_mla false, qk_rope_head_dim 0: MLA's sizes are not this model's
        cfg = json.loads((ROOT / "fixtures/architectures/deepseek-ai--DeepSeek-OCR/config.json").read_text())
    spec = load_model_spec(_write(tmp_path, cfg))
    assert spec.num_hidden_layers == (cfg.get("n_layer") or cfg.get("num_hidden_layers"))


def test_a_window_above_the_positions_is_vllms_to_judge(tmp_path):
    """Phi-3.5-mini's and Phi-4-mini's configs slide over 262,144 tokens with 131,072 positions, and vLLM serves
    them: kvaudit makes no check vLLM does not make."""
    spec = load_model_spec(_write(tmp_path, _gemma_window(300000)))
    assert spec.text["sliding_window"] == 300000


def test_missing_config_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="config not found"):
        load_model_spec(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match="config not found"):
        load_model_spec(tmp_path)


def test_pp_larger_than_the_layer_count_is_refused():
    with pytest.raises(UsageError, match="--pp 49 exceeds the 48 layers"):
        load_model_spec(QWEN).check_parallel(4, 49)


@pytest.mark.parametrize("args, message", [
    (["--pp", "49"], "--pp 49 exceeds the 48 layers"),
    (["--tp", "3"], "vLLM rejected"),
    (["--pp", "2", "--pp-rank", "2"], "--pp-rank must be in"),
    (["--kv-cache-dtype", "int3"], "unknown --kv-cache-dtype"),
    (["--hf-overrides", "[1]"], "--hf-overrides must be a JSON object"),
    (["--max-model-len", "10000000"], "vLLM rejected"),
])
def test_bad_deployments_exit_2_with_one_line(capsys, args, message):
    code = main(["audit", "--config", str(QWEN), "--meter", "meta", *args])
    err = ending(capsys.readouterr().err)
    assert code == 2
    assert len(err) == 1 and message in err[0], err


@each_vllm
def test_an_architecture_vllm_does_not_serve_is_one_line(tmp_path, capsys):
    cfg = {"model_type": "llama", "architectures": ["NoSuchModelForCausalLM"], "num_hidden_layers": 2,
           "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128,
           "intermediate_size": 128, "max_position_embeddings": 512}
    code = main(["audit", "--config", _write(tmp_path, cfg), "--meter", "meta"])
    err = ending(capsys.readouterr().err)
    assert code == 2 and len(err) == 1 and "NoSuchModelForCausalLM" in err[0], err


@pytest.mark.parametrize("preset, field, value, message", [
    # vLLM would plan each of these, and every strategy would pass on a model that does not exist
    ("qwen3-next-80b-a3b-instruct", "full_attention_interval", -1, "'full_attention_interval' is -1; it must be at least 1"),
    ("gemma-3-27b-it", "sliding_window", 0, "'sliding_window' is 0; it must be at least 1"),
    ("llama-3.1-8b", "hidden_size", 0, "'hidden_size' is 0"),
    ("llama-3.1-8b", "vocab_size", -1, "'vocab_size' is -1"),
    ("llama-3.1-8b", "head_dim", 0, "'head_dim' is 0"),
    ("llama-3.1-8b", "num_hidden_layers", 10 ** 7, "'num_hidden_layers' is 10,000,000, beyond any real model"),
    ("deepseek-v3", "kv_lora_rank", 0, "'kv_lora_rank' is 0"),
    ("granite-4.0-h-small", "num_local_experts", -2, "'num_local_experts' is -2; it must be at least 0"),
])
def test_a_config_that_describes_no_model_is_refused_before_planning(tmp_path, capsys, preset, field, value, message):
    cfg = json.loads((ROOT / "fixtures/configs" / preset / "config.json").read_text())
    (cfg.get("text_config") or cfg)[field] = value
    code = main(["plan", "--config", _write(tmp_path, cfg), "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 2 and len(ending(err)) == 1 and message in err, err
    assert json.loads(out)["exit_code"] == 2 and message in json.loads(out)["error"]  # stdout: the error object


@pytest.mark.parametrize("overrides, message", [
    ('{"full_attention_interval": -1}', "with --hf-overrides: field 'full_attention_interval' is -1"),
    ('{"num_hidden_layers": 0}', "with --hf-overrides: field 'num_hidden_layers' must be a positive integer"),
])
def test_the_checks_run_again_on_the_config_with_hf_overrides(capsys, monkeypatch, overrides, message):
    import kvaudit.plan.planner

    monkeypatch.setattr(kvaudit.plan.planner, "model_for", lambda d: pytest.fail("planned a config that describes no model"))
    code = main(["plan", "--config", str(QWEN), "--hf-overrides", overrides])
    err = ending(capsys.readouterr().err)
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_a_zero_count_that_means_none_is_read():
    """0 is a model without that part: a dense Granite 4.0-H, DeepSeek without an MTP layer."""
    from kvaudit.model.spec import check_config

    cfg = json.loads((ROOT / "fixtures/configs/granite-4.0-h-small/config.json").read_text())
    check_config({**cfg, "num_local_experts": 0}, "x")
    cfg = json.loads((ROOT / "fixtures/configs/deepseek-v3/config.json").read_text())
    check_config({**cfg, "num_nextn_predict_layers": 0, "n_shared_experts": 0}, "x")


def test_overrides_are_merged_as_vllm_merges_them():
    from kvaudit.model.spec import with_overrides

    base = {"a": 1, "text_config": {"b": 2, "c": 3}}
    assert with_overrides(base, {"a": 5, "text_config": {"b": 7}}) == {"a": 5, "text_config": {"b": 7, "c": 3}}
    assert base == {"a": 1, "text_config": {"b": 2, "c": 3}}


@pytest.mark.parametrize("args, message", [
    (["--tp", "100000"], "--tp 100,000 is beyond any real deployment (kvaudit takes at most 256)"),
    (["--pp", "1000"], "--pp 1,000 is beyond any real deployment"),
    (["--max-num-seqs", "0"], "--max-num-seqs must be at least 1"),
    (["--device-memory", "1e309"], "is more than kvaudit takes (1 PiB"),
    (["--device-memory", "-inf"], "--device-memory must be positive"),
    (["--num-speculative-tokens", "1000"], "--num-speculative-tokens 1,000 is beyond any real deployment"),
])
def test_deployment_options_beyond_any_real_deployment_are_refused_before_building(capsys, monkeypatch, args, message):
    import kvaudit.plan.planner

    monkeypatch.setattr(kvaudit.plan.planner, "model_for", lambda d: pytest.fail("built a model for an impossible deployment"))
    code = main(["plan", "--config", str(QWEN), *args])
    err = ending(capsys.readouterr().err)
    assert code == 2 and len(err) == 1 and message in err[0], err


@each_vllm
@pytest.mark.parametrize("field, value, reason", [
    ("rms_norm_eps", "abc", "StrictDataclassFieldValidationError: Validation error for field 'rms_norm_eps': TypeError"),
    ("attention_bias", 3, "Validation error for field 'attention_bias'"),
])  # (a size, count or period that is no whole number kvaudit refuses itself, before vLLM: test_properties.py)
def test_what_vllms_and_transformers_config_code_refuse_is_bad_input_with_their_reason(tmp_path, capsys, monkeypatch,
                                                                                         field, value, reason):
    """... at once: vLLM's ``with_retry`` around its read of config.json waits 2 s and reads it again, for a Hub
    download; kvaudit hands it a local folder, read once."""
    import time

    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)
    cfg = json.loads((ROOT / "fixtures/configs/llama-3.1-8b/config.json").read_text())
    cfg[field] = value
    code = main(["plan", "--config", _write(tmp_path, cfg)])
    err = ending(capsys.readouterr().err)
    assert code == 2 and len(err) == 1 and err[0].startswith("kvaudit: error: vLLM rejected") and reason in err[0], err
    assert waits == []


def test_routed_experts_are_read_under_each_familys_key():
    """``ModelSpec.routed_experts`` (triage drops a report's --enable-expert-parallel for a dense model, as vLLM would
    refuse it): Qwen's ``num_experts``, Mixtral's ``num_local_experts``, DeepSeek's ``n_routed_experts``; 0 if dense."""
    from kvaudit.model.spec import load_model_spec

    configs = ROOT / "fixtures" / "configs"
    assert [load_model_spec(configs / name).routed_experts for name in (
        "qwen3-30b-a3b", "mixtral-8x7b-instruct", "deepseek-v3", "llama-3.1-8b")] == [128, 8, 256, 0]
