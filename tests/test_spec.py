"""config.json -> ModelSpec: layer kinds, TP checks, weights per rank, and every bad-input error."""

from __future__ import annotations

import json
import sys

import pytest

from kvaudit.errors import ConfigError, UsageError
from kvaudit.spec import FULL_ATTENTION, LINEAR_ATTENTION, load_model_spec
from conftest import ROOT

QWEN = ROOT / "fixtures/configs/qwen3-next-80b-a3b-instruct/config.json"
LLAMA = ROOT / "fixtures/configs/llama-3.1-8b/config.json"


def test_qwen3_next_layers_follow_full_attention_interval():
    s = load_model_spec(QWEN)
    assert len(s.layers) == 48
    full = [l.index for l in s.layers if l.kind == FULL_ATTENTION]
    assert full == list(range(3, 48, 4))
    assert s.layers[3].name == "model.layers.3.self_attn.attn"
    assert s.layers[0].name == "model.layers.0.linear_attn" and s.layers[0].kind == LINEAR_ATTENTION
    assert s.is_hybrid and s.linear.num_v_heads == 32 and s.linear.conv_kernel_size == 4


def test_weights_per_rank_match_public_figures():
    # ~80B parameters in all; vllm-ascend logs "Loading model weights took 37.2362 GB" at TP 4.
    s = load_model_spec(QWEN)
    assert 79e9 < s.weight_params_per_rank(1) < 81e9
    gib = s.weight_params_per_rank(4) * 2 / 2**30
    assert abs(gib - 37.24) < 0.1
    # Llama-3.1-8B: 8.03B parameters.
    assert abs(load_model_spec(LLAMA).weight_params_per_rank(1) - 8.03e9) < 0.01e9


def test_spec_parsing_imports_neither_torch_nor_vllm():
    import subprocess

    code = ("import sys; from kvaudit.spec import load_model_spec; import kvaudit.report, kvaudit.deployment; "
            f"load_model_spec({str(QWEN)!r}); "
            "print([m for m in ('torch', 'vllm', 'rich') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("tp", [3, 5, 64])
def test_tp_that_does_not_divide_heads_is_refused(tp):
    with pytest.raises(UsageError, match=f"TP {tp}"):
        load_model_spec(QWEN).check_tensor_parallel(tp)


def test_tp_above_kv_heads_replicates():
    load_model_spec(QWEN).check_tensor_parallel(8)  # 2 KV heads replicated over 8 ranks: allowed


def _write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return p


def test_missing_path(tmp_path):
    with pytest.raises(ConfigError, match="config not found"):
        load_model_spec(tmp_path / "nope.json")


def test_directory_without_config(tmp_path):
    with pytest.raises(ConfigError, match="config not found"):
        load_model_spec(tmp_path)


def test_not_json(tmp_path):
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model_spec(_write(tmp_path, "{ not json"))


def test_not_an_object(tmp_path):
    with pytest.raises(ConfigError, match="JSON object"):
        load_model_spec(_write(tmp_path, "[1, 2]"))


def test_missing_required_field(tmp_path):
    cfg = json.loads(QWEN.read_text())
    del cfg["linear_num_value_heads"]
    with pytest.raises(ConfigError, match="missing required field 'linear_num_value_heads'"):
        load_model_spec(_write(tmp_path, cfg))


def test_bad_field_value(tmp_path):
    cfg = json.loads(LLAMA.read_text())
    cfg["num_key_value_heads"] = -8
    with pytest.raises(ConfigError, match="positive integer"):
        load_model_spec(_write(tmp_path, cfg))


def test_unknown_model_type(tmp_path):
    with pytest.raises(ConfigError, match="unsupported model_type 'gpt2'"):
        load_model_spec(_write(tmp_path, {"model_type": "gpt2"}))


def test_missing_model_type(tmp_path):
    with pytest.raises(ConfigError, match="model_type"):
        load_model_spec(_write(tmp_path, {"hidden_size": 1}))


def test_bad_layer_types(tmp_path):
    cfg = json.loads(QWEN.read_text())
    cfg["layer_types"] = ["full_attention"] * 3
    with pytest.raises(ConfigError, match="layer_types"):
        load_model_spec(_write(tmp_path, cfg))
