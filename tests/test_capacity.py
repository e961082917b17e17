"""Capacity as vLLM computes and logs it, Mamba slots, the --kv-cache-memory that reproduces a plan,
the highest safe utilization per strategy, and ``kvaudit plan`` (every pipeline stage)."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest

from kvaudit.cli import main
from kvaudit.measure.audit import dry_run
from kvaudit.measure.utilization import highest_safe_utilization
from kvaudit.model.memory import TITLES
from kvaudit.plan.capacity import capacity
from kvaudit.plan.planner import build_plan, load_vllm
from kvaudit.strategies.builtin import STRATEGIES
from kvaudit.units import fmt_bytes
from conftest import VLLM_VERSION, deployment, each_vllm

pytestmark = [each_vllm, pytest.mark.fast]


def test_capacity_is_vllms_own_figure():
    plan = build_plan(deployment("qwen3-next"), "cuda")
    utils = load_vllm().kv_cache_utils
    if hasattr(utils, "get_kv_cache_capacity"):  # vLLM 0.29+
        tokens, concurrency = utils.get_kv_cache_capacity(plan.vllm_config, plan.kv_cache_config)
    else:  # what vLLM <= 0.28 logs: max concurrency x max_model_len
        concurrency = utils.get_max_concurrency_for_kv_cache_config(plan.vllm_config, plan.kv_cache_config)
        tokens = int(concurrency * plan.vllm_config.model_config.max_model_len)
    c = capacity(plan)
    assert (c.tokens, c.max_concurrency) == (tokens, concurrency)
    # a hybrid request takes blocks from all four groups: the logged tokens are not the pool
    assert c.pool_tokens == plan.num_blocks * plan.block_size and c.tokens < c.pool_tokens


def test_dense_capacity_by_hand():
    """Llama at 8192 tokens: a request needs 8192 / 16 = 512 blocks; tokens = blocks x 16."""
    plan = build_plan(deployment("llama-3.1-8b"), "cuda")
    c = capacity(plan)
    assert c.max_concurrency == plan.num_blocks / math.ceil(8192 / 16)
    assert c.tokens == plan.num_blocks * 16 == c.pool_tokens
    assert c.mamba_slots is None and not c.mamba_slots_short


def test_kv_cache_memory_reproduces_the_plan():
    d = deployment("qwen3-next")
    for platform in ("cuda", "ascend-align128", "ascend-contiguous"):
        plan = build_plan(d, platform)
        again = build_plan(dataclasses.replace(d, kv_cache_memory_bytes=capacity(plan).kv_cache_memory_bytes), platform)
        assert again.num_blocks == plan.num_blocks
        fewer = build_plan(dataclasses.replace(d, kv_cache_memory_bytes=capacity(plan).kv_cache_memory_bytes - 1),
                           platform)
        assert fewer.num_blocks == plan.num_blocks - 1


def test_mamba_slots_against_max_num_seqs():
    plan = build_plan(deployment("nemotron-h-8b", num_blocks_override=64, max_num_seqs=128), "cuda")
    c = capacity(plan)
    assert c.mamba_slots == 64 and c.max_num_seqs == 128 and c.mamba_slots_short
    ok = capacity(build_plan(deployment("nemotron-h-8b", num_blocks_override=64, max_num_seqs=64), "cuda"))
    assert not ok.mamba_slots_short


def test_highest_safe_utilization_is_the_edge():
    d = deployment("qwen3-next")
    s = STRATEGIES["ascend-0.11"]
    u = highest_safe_utilization(d, s)
    assert u is not None and 0.7 < u < 0.75  # issue #3368: 0.7 runs, 0.9 runs out

    def total(util: float) -> int:
        du = dataclasses.replace(d, gpu_memory_utilization=util)
        return du.non_kv_bytes + dry_run(build_plan(du, s.platform), s, False).total_bytes

    assert total(u) <= d.device_memory_bytes < total(round(u + 0.001, 3))
    assert highest_safe_utilization(d, STRATEGIES["vllm"]) == 1.0


def test_plan_command_json_shows_every_pipeline_stage(capsys):
    code = main(["plan", "--preset", "llama-3.1-8b", "--pp", "2", "--format", "json", "-s", "vllm"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [s["deployment"]["pipeline_parallel_rank"] for s in out["stages"]] == [0, 1]
    first = out["stages"][0]["plans"][0]
    assert first["capacity"]["tokens"] > 0 and out["stages"][0]["highest_safe_utilization"] == {"vllm": 1.0}
    assert out["schema_version"] == 1 and out["vllm_version"] == VLLM_VERSION and out["kvaudit_version"]
    assert first["strategies"] == ["vllm"] and first["platform"] == "cuda"


def test_plan_command_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code = main(["plan", "--preset", "qwen3-next", "--util", "0.7", "-s", "vllm", "-s", "ascend-0.11"])
    out = capsys.readouterr().out
    assert code == 0 and f"plans by vLLM {VLLM_VERSION} · nothing allocated" in out
    assert "Qwen3-Next-80B-A3B-Instruct (Qwen3NextForCausalLM) · TP 4 · bfloat16" in out
    d = deployment(overhead_bytes=None)  # the same deployment, with kvaudit's non-KV model as the command takes it
    terms = " + ".join(f"{TITLES[t.key]} {fmt_bytes(t.bytes)}" for t in d.overhead_terms)
    assert (f"60.96 GiB × 0.7 = 42.67 GiB = weights {fmt_bytes(d.weights_bytes)} + {terms} + KV "
            f"{fmt_bytes(d.kv_budget_bytes)} (vLLM {VLLM_VERSION}'s budget)") in out
    assert re.search(r"cuda\s+│ vllm\s+│\s+\d+ │", out) and re.search(r"ascend-align128 │ ascend-0.11 │\s+384 │", out)
    assert f"Start-up lines vLLM {VLLM_VERSION} would log under the ascend-align128 rule:" in out
    assert f"Loading model weights took {d.weights_bytes / (1 << 30):.4f} GB" in out and "cuda rule:" not in out
    assert re.search(r"does not run out of device memory: vllm 1\.000, ascend-0\.11 0\.7[0-9]{2}", out)


def test_audit_over_pipeline_stages(capsys):
    code = main(["audit", "--preset", "llama-3.1-8b", "--pp", "2", "--meter", "meta", "--format", "json",
                 "-s", "vllm", "-s", "ascend-0.16"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and len(out["stages"]) == 2
    layers = [set(s["plan"]["groups"][0]["layers"]) for s in out["stages"]]
    assert not layers[0] & layers[1] and len(layers[0] | layers[1]) == 32
    assert all(s["capacity"]["cuda"]["tokens"] > 0 for s in out["stages"])
    assert out["schema_version"] == 1 and out["kvaudit_version"] and out["exit_code"] == 0
    assert [s["exit_code"] for s in out["stages"]] == [0, 0]
