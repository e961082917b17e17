"""The non-KV memory model (``kvaudit.model.memory``) and the start-up lines (``kvaudit.report.startup``): every term is in the
budget, each release era is the one its vLLM had, and the lines carry that release's wording and definitions."""

from __future__ import annotations

import dataclasses
import re

import pytest

from kvaudit.errors import UsageError
from kvaudit.model import memory
from kvaudit.plan.capacity import capacity
from kvaudit.plan.planner import model_for
from kvaudit.report import startup
from conftest import deployment as _deployment
from conftest import ROOT, each_vllm, plan_for, skip_unless_planned

pytestmark = pytest.mark.fast


def deployment(preset, **kw):
    """A preset's deployment with kvaudit's non-KV model (not the fixed overhead other tests take)."""
    return _deployment(preset, **{"overhead_bytes": None, **kw})


def _terms(d):
    return {t.key: t for t in d.overhead_terms}


def test_the_budget_subtracts_every_term():
    """Device memory × util − weights − peak activation − non-torch − CUDA graphs, each computed here on its own
    from vLLM's config: dropping a term from the sum (or from the list) fails this."""
    d = deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9)
    vc = model_for(d).vllm_config
    act = memory.peak_activation(vc, "cuda", d.vllm_version)
    nt = memory.non_torch(vc, "cuda")
    graphs = memory.cuda_graphs(vc, d.vllm_version)
    assert act.bytes > 0 and nt.bytes > 0 and graphs is not None and graphs.bytes > 0 and graphs.budgeted
    assert set(_terms(d)) == {"peak_activation", "non_torch", "cuda_graphs"}
    assert d.kv_budget_bytes == int(d.device_memory_bytes * 0.9) - d.weights_bytes - act.bytes - nt.bytes - graphs.bytes
    assert d.non_kv_bytes == d.weights_bytes + act.bytes + nt.bytes + graphs.bytes


def test_overhead_replaces_the_model():
    d = _deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9, overhead_bytes=3 << 30)
    assert [t.key for t in d.overhead_terms] == ["overhead"]
    assert d.kv_budget_bytes == int(d.device_memory_bytes * 0.9) - d.weights_bytes - (3 << 30)


def test_graph_estimate_is_subtracted_from_vllm_0_20_only():
    new = deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9, vllm_release="0.20.0")
    old = deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9, vllm_release="0.19.1")
    g_new, g_old = _terms(new)["cuda_graphs"], _terms(old)["cuda_graphs"]
    assert g_new.budgeted and not g_old.budgeted
    assert old.unbudgeted_bytes == g_old.bytes > 0 and new.unbudgeted_bytes == 0
    # the older release hands the planner more, and uses the graphs' memory beyond the budget
    assert old.kv_budget_bytes - new.kv_budget_bytes == g_new.bytes
    assert old.non_kv_bytes == new.non_kv_bytes


@pytest.mark.parametrize("release, switch, subtracted", [
    ("0.33.0", "0", False), ("0.33.0", "1", True), ("0.19.1", "1", True), ("0.19.1", "0", False),
    ("0.17.0", "1", False)])  # (0.17 has no estimate to subtract: the switch came with it in 0.18)
def test_vllms_graph_estimate_switch_set_where_kvaudit_runs_decides(monkeypatch, release, switch, subtracted):
    """``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, as vLLM reads it (``vllm/envs.py``: ``bool(int(...))``), decides
    for every release that has the estimate (0.18+), whatever the release's default; the term says so."""
    monkeypatch.setenv("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", switch)
    d = deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9, vllm_release=release)
    graphs = _terms(d)["cuda_graphs"]
    assert graphs.budgeted == subtracted
    assert (f"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS={switch} here" in graphs.source) == (release != "0.17.0")
    assert d.unbudgeted_bytes == (0 if subtracted else graphs.bytes)
    monkeypatch.setenv("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "yes")
    with pytest.raises(UsageError, match="VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS='yes' is not an integer"):
        memory.subtracts_graph_estimate("0.33.0")


def test_no_graphs_with_enforce_eager_or_on_ascend():
    eager = deployment("llama-3.1-8b", device="h100-80g", enforce_eager=True)
    assert "cuda_graphs" not in _terms(eager)
    npu = deployment("llama-3.1-8b", device="atlas-a2-64g")
    assert npu.platform == "ascend" and "cuda_graphs" not in _terms(npu)


def test_sampler_copies_follow_the_release():
    """0.12-0.16 sort in PyTorch (7 copies of the logits); 0.17+ and FlashInfer 3.5; vllm-ascend only computes the
    logits (half a copy in bf16)."""
    kw = dict(device="h100-80g", max_num_seqs=1024, max_num_batched_tokens=1024)
    sort = _terms(deployment("llama-3.1-8b", vllm_release="0.15.0", **kw))["peak_activation"].bytes
    triton = _terms(deployment("llama-3.1-8b", vllm_release="0.33.0", **kw))["peak_activation"].bytes
    npu = _terms(deployment("llama-3.1-8b", device="atlas-a2-64g", max_num_seqs=1024,
                            max_num_batched_tokens=1024))["peak_activation"].bytes
    logits = 1024 * 128_256 * 4
    assert sort - triton == int(7.0 * logits) - int(3.5 * logits)
    assert triton - npu == int(3.5 * logits) - int(0.5 * logits)  # the same forward on both platforms


def test_more_batched_tokens_more_activation():
    small = _terms(deployment("llama-3.1-8b", device="h100-80g", max_num_batched_tokens=2048, max_num_seqs=16))
    large = _terms(deployment("llama-3.1-8b", device="h100-80g", max_num_batched_tokens=32768, max_num_seqs=16))
    assert large["peak_activation"].bytes > 4 * small["peak_activation"].bytes


def test_only_the_last_pp_stage_samples():
    skip_unless_planned("qwen3-8b")
    kw = dict(device="h100-80g", pp=2, tp=1, max_model_len=8192, gpu_memory_utilization=0.9)
    first = deployment("qwen3-8b", pp_rank=0, **kw)
    last = deployment("qwen3-8b", pp_rank=1, **kw)
    assert "logits" not in _terms(first)["peak_activation"].source
    assert _terms(last)["peak_activation"].bytes > _terms(first)["peak_activation"].bytes
    # planning stage 0, the planner is handed every stage's budget: the last stage's is its own (it samples)
    from kvaudit.plan.planner import _pp_stages

    stages = _pp_stages(first)
    assert [s.pp_rank for s in stages] == [0, 1] and stages[1].kv_budget_bytes == last.kv_budget_bytes
    assert stages[0].kv_budget_bytes == first.kv_budget_bytes != last.kv_budget_bytes


def test_collectives_count_once_a_rank_has_peers():
    one = _terms(deployment("qwen3-30b-a3b", device="h100-80g", tp=1, gpu_memory_utilization=0.9))["non_torch"].bytes
    two = _terms(deployment("qwen3-30b-a3b", device="h100-80g", tp=2, gpu_memory_utilization=0.9))["non_torch"].bytes
    assert two - one == memory.COLLECTIVE_BYTES["cuda"]


@each_vllm
def test_capture_sizes_are_vllms():
    d = deployment("llama-3.1-8b", device="h100-80g")  # 1024 sequences: vLLM captures up to 512
    sizes = memory.capture_sizes(model_for(d).vllm_config)
    assert sizes[:4] == [1, 2, 4, 8] and max(sizes) == 512 and len(sizes) == 51


# --- start-up lines --------------------------------------------------------------------------------------

def _lines(d, rule="cuda"):
    plan = plan_for(d, rule)
    return startup.lines(d, plan, capacity(plan)), plan


def test_startup_lines_in_the_wording_of_vllm_0_33():
    d = deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9, vllm_release="0.33.0")
    lines, plan = _lines(d)
    cap = capacity(plan)
    assert lines[0] == f"Model loading took {round(d.weights_bytes / (1 << 30), 2)} GiB memory and ... seconds"
    assert f"Available KV cache memory: {round(d.kv_budget_bytes / (1 << 30), 2)} GiB" in lines
    assert lines[-1] == (f"GPU KV cache size: {int(cap.max_concurrency * d.max_model_len):,} tokens, Maximum "
                         f"concurrency for {d.max_model_len:,} tokens per request: {cap.max_concurrency:.2f}x")


def test_startup_lines_in_the_wording_of_vllm_0_11():
    d = deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9, vllm_release="0.11.0")
    lines, plan = _lines(d)
    assert lines[0] == f"Model loading took {d.weights_bytes / (1 << 30):.4f} GiB and ... seconds"
    assert f"Available KV cache memory: {d.kv_budget_bytes / (1 << 30):.2f} GiB" in lines
    assert not any("Estimated CUDA graph" in line for line in lines)  # (0.18+)
    assert lines[-2] == f"GPU KV cache size: {plan.num_blocks * plan.block_size:,} tokens"
    assert lines[-1].startswith("Maximum concurrency for 8,192 tokens per request: ")


def test_kv_cache_tokens_changed_meaning_in_0_20_1():
    """For a hybrid the old definition (blocks per group × block size) and the new (concurrency × length) differ; the
    patch release 0.20.1 brought the new one (its sdist's ``_report_kv_cache_config``; a Gemma 4 start on 0.20.2 logs
    984,297 tokens = 30.04 × 32,768)."""
    d = deployment("qwen3-next", device="h100-80g", gpu_memory_utilization=0.9)
    plan = plan_for(d, "cuda")
    cap = capacity(plan)
    old = startup.kv_cache_tokens(plan, cap, "0.20.0")
    new = startup.kv_cache_tokens(plan, cap, "0.20.1")
    assert old == plan.num_blocks // 4 * plan.block_size
    assert new == int(cap.max_concurrency * d.max_model_len) and new != old
    assert startup.kv_cache_tokens(plan, cap, "0.21.0") == new


def test_ascend_startup_lines():
    d = deployment("qwen3-next", vllm_release="0.13.0")
    lines, plan = _lines(d, "ascend-align128")
    assert lines[0] == f"Loading model weights took {d.weights_bytes / (1 << 30):.4f} GB"
    assert lines[1] == f"Available memory: {d.kv_budget_bytes}, total memory: {d.device_memory_bytes}"
    newer = dataclasses.replace(d, vllm_version="0.30.0")
    assert startup.lines(newer, plan, capacity(plan))[-1].startswith("NPU KV cache size: ")


def test_a_bad_vllm_version_is_a_usage_error():
    from kvaudit.errors import UsageError

    with pytest.raises(UsageError, match="vllm-version"):
        deployment("llama-3.1-8b", vllm_release="latest")


@each_vllm
def test_mxfp4_experts_are_padded_for_marlin():
    """gpt-oss on an A100, or on Hopper before vLLM 0.12, runs Marlin's MXFP4 kernel, which pads every expert
    (intermediate 2880 → 2944, hidden 2880 → 3072, vLLM's own maybe_roundup_sizes): the weights "Model loading
    took" counts grow by about 1.2 MB an expert."""
    skip_unless_planned("gpt-oss-120b")
    kw = dict(tp=1, max_model_len=8192, gpu_memory_utilization=0.95)
    triton = deployment("gpt-oss-120b", device="h100-80g", **kw)
    old = deployment("gpt-oss-120b", device="h100-80g", vllm_release="0.11.0", **kw)
    a100 = deployment("gpt-oss-120b", device="a100-80g", **kw)
    experts = 36 * 128
    assert 1.1e6 < (old.weights_bytes - triton.weights_bytes) / experts < 1.3e6
    assert a100.weights_bytes == old.weights_bytes
    # consumer Blackwell and a GB10 (capability 12.x): Marlin too (a GB10 start of NVIDIA's 0.13 build logs it)
    spark = deployment("gpt-oss-120b", device="gb10-128g", **kw)
    assert spark.weights_bytes == old.weights_bytes


def test_vllms_own_memory_lines_are_read():
    from kvaudit.triage.evidence import clean_lines, extract

    ev = extract(clean_lines(
        "(Worker_TP1 pid=1) INFO 08-14 09:28:01 [gpu_worker.py:857] Free memory on device (77.78/79.33 GiB) on startup. "
        "Desired GPU memory utilization is (0.85, 67.43 GiB). Actual usage is 16.92 GiB for weight, 5.66 GiB for peak "
        "activation, 0.13 GiB for non-torch memory, and 1.34 GiB for CUDAGraph memory.\n"
        "(Worker pid=1) INFO [gpu_model_runner.py:6100] Estimated CUDA graph memory: 0.13 GiB total\n"
        "(Worker pid=1) INFO [gpu_model_runner.py:5000] Graph capturing finished in 13 secs, took 0.49 GiB\n"))
    gib = 1 << 30
    assert [round(ev.value(k) / gib, 2) for k in ("profiled_weights", "peak_activation", "non_torch", "cudagraph_memory",
                                                   "cudagraph_estimate", "graph_capture")] == [16.92, 5.66, 0.13, 1.34,
                                                                                              0.13, 0.49]


def test_a_saved_plan_keeps_the_terms(tmp_path):
    from kvaudit.measure.utilization import plan_stage
    from kvaudit.plan import planfile
    from kvaudit.strategies.builtin import STRATEGIES

    d = deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9)
    path = planfile.save([plan_stage(d, [STRATEGIES["vllm"]])], d.vllm_version, tmp_path / "p.json")
    back = planfile.load(path).stages[0].deployment
    assert back.overhead_terms == d.overhead_terms and back.kv_budget_bytes == d.kv_budget_bytes
    assert back.vllm_version == d.vllm_version and back.platform == "cuda"


def test_hybrids_default_to_no_prefix_caching_before_vllm_0_28():
    old = deployment("qwen3-next", vllm_release="0.27.1")
    new = deployment("qwen3-next", vllm_release="0.28.0")
    assert old.enable_prefix_caching is False and "PR #50991" in old.defaults["enable_prefix_caching"]
    assert new.enable_prefix_caching is True and new.mamba_cache_mode == "align"
    dense = deployment("llama-3.1-8b", vllm_release="0.27.1")  # (not a hybrid: on in every release)
    assert dense.enable_prefix_caching is True


def test_a_plan_file_with_a_forged_term_is_refused(tmp_path):
    import json

    from kvaudit.errors import ConfigError
    from kvaudit.measure.utilization import plan_stage
    from kvaudit.plan import planfile
    from kvaudit.strategies.builtin import STRATEGIES

    d = deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9)
    path = planfile.save([plan_stage(d, [STRATEGIES["vllm"]])], d.vllm_version, tmp_path / "p.json")
    data = json.loads(path.read_text())
    data["stages"][0]["deployment"]["overhead_terms"][0]["bytes"] += 1  # no longer the sum it claims
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="overhead_bytes is not the sum"):
        planfile.load(path)
    data["stages"][0]["deployment"]["overhead_terms"][0].update(key="os.system", bytes=1)
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="not a non-KV term"):
        planfile.load(path)


def test_max_cudagraph_capture_size_bounds_the_graphs():
    full = _terms(deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9))["cuda_graphs"]
    small = deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9, max_cudagraph_capture_size=64)
    assert memory.capture_sizes(model_for(small).vllm_config, 64)[-1] == 64
    assert _terms(small)["cuda_graphs"].bytes < full.bytes / 3 and "up to batch 64" in _terms(small)["cuda_graphs"].source


def test_the_cudagraph_mode_decides_which_graphs_take_memory():
    """``--compilation-config '{"cudagraph_mode": ...}'`` (vLLM's ``CUDAGraphMode``): FULL_AND_PIECEWISE (the default)
    captures FULL graphs for the decode sizes and PIECEWISE for every size, in one pool (one first capture); PIECEWISE
    drops the FULL ones (one increment each but the first); NONE captures none, which the KV budget gets back."""
    from kvaudit.model.deployment import get_preset, load_preset_spec
    from kvaudit.plan.planner import deploy

    spec = load_preset_spec(get_preset("llama-3.1-8b"))
    base = {"device": "h100-80g", "max_model_len": 8192}

    def graphs(mode):
        d = deploy(spec, None, {**base, **({"compilation_config": f'{{"cudagraph_mode": "{mode}"}}'} if mode else {})})
        return d, _terms(d).get("cuda_graphs")

    d, both = graphs(None)
    sizes = memory.capture_sizes(model_for(d).vllm_config)
    decode = [s for s in sizes if s <= d.max_num_seqs]
    per_graph = max(memory.GRAPH_BYTES_PER_LAYER * 32, 1 << 20)  # Llama 3.1 8B: 32 decoder layers
    _, piecewise = graphs("piecewise")
    assert both.bytes - piecewise.bytes == per_graph * (len(decode) - 1) > 0
    assert "PIECEWISE" in piecewise.source and piecewise.source.startswith(f"0 FULL + {len(sizes)} PIECEWISE")
    _, full = graphs("FULL_DECODE_ONLY")
    assert both.bytes - full.bytes == per_graph * (len(sizes) - 1) > 0
    assert full.source.startswith(f"{len(decode)} FULL + 0 PIECEWISE graphs (FULL_DECODE_ONLY)")
    none, off = graphs("NONE")
    assert off is None and none.kv_budget_bytes - d.kv_budget_bytes == both.bytes
    assert none.cudagraph_mode == "NONE"
    for bad, message in (('{"cudagraph_mode": "SOMETIMES"}', "cudagraph_mode 'SOMETIMES' is not one of vLLM's (NONE"),
                         ('{"level": 3}', "--compilation-config: kvaudit takes cudagraph_mode only; level would change "
                                          "nothing"),
                         ("{cudagraph_mode: NONE}", "--compilation-config is not valid JSON"),
                         ('["NONE"]', "--compilation-config must be a JSON object")):
        with pytest.raises(UsageError, match=re.escape(message)):
            deploy(spec, None, {**base, "compilation_config": bad})


def test_every_term_says_the_code_it_follows_and_how_many_public_logs_set_its_constant():
    """Issue 33: each non-KV term in the report names vLLM's code it follows and the public logs behind its constant
    (``memory.BASIS``), on CUDA and on Ascend."""
    for d in (deployment("llama-3.1-8b", device="h100-80g", gpu_memory_utilization=0.9),
              deployment("llama-3.1-8b", gpu_memory_utilization=0.9)):
        terms = _terms(d)
        assert set(terms) >= {"peak_activation", "non_torch"}
        for key, term in terms.items():
            basis = memory.BASIS[key] if key != "non_torch" else memory.BASIS[key][d.platform]
            assert term.source.endswith(f"[{basis}]") and re.search(r"\d public (?:\w+ )?logs?\b", basis), (key, term.source)


def test_a_multimodal_model_says_its_encoder_profile_is_not_modelled_and_the_flags_that_remove_it_do():
    """vLLM profiles a multimodal model's encoder (``profile_run``), which kvaudit cannot size without the processor:
    the deployment says so, and its budget is an upper bound. The flags that remove that profile remove the note
    (``--skip-mm-profiling``; every modality at 0, by ``--limit-mm-per-prompt`` or ``--language-model-only``, which
    also drops the vision tower's weights as vLLM's model builds it); one modality at 0 leaves the other profiled."""
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import deploy

    spec = load_model_spec(ROOT / "fixtures" / "architectures" / "Qwen--Qwen2-VL-2B")
    base = {"device": "rtx4090-24g", "max_model_len": 4096, "util": 0.8}
    full = deploy(spec, None, base)
    assert len(full.unmodelled) == 1 and full.unmodelled[0].startswith("the multimodal encoder's profile (image, video:")
    assert full.to_dict()["unmodelled"] == list(full.unmodelled)
    from kvaudit.report.render import split_line

    assert split_line(full).endswith("; the KV an upper bound: the multimodal encoder's profile not modelled")
    video = deploy(spec, None, {**base, "limit_mm_per_prompt": '{"image": 0}'})
    assert video.unmodelled[0].startswith("the multimodal encoder's profile (video:")
    skip = deploy(spec, None, {**base, "skip_mm_profiling": True})
    assert skip.unmodelled == () and skip.weights_bytes == full.weights_bytes
    for text_only in ({"limit_mm_per_prompt": '{"image": 0, "video": 0}'}, {"language_model_only": True}):
        d = deploy(spec, None, {**base, **text_only})
        assert d.unmodelled == () and 0 < d.weights_bytes < full.weights_bytes - (1 << 30)  # (the 675M-parameter ViT)
        assert d.kv_budget_bytes == full.kv_budget_bytes + full.weights_bytes - d.weights_bytes


def test_a_multimodal_flag_that_would_change_nothing_is_refused():
    from kvaudit.model.deployment import get_preset, load_preset_spec
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import deploy

    vl = load_model_spec(ROOT / "fixtures" / "architectures" / "Qwen--Qwen2-VL-2B")
    base = {"device": "rtx4090-24g", "max_model_len": 4096}
    for options, message in (
            ({"limit_mm_per_prompt": '{"audio": 1}'}, "--limit-mm-per-prompt: Qwen2VLForConditionalGeneration takes "
                                                      "image, video; a limit on audio would change nothing"),
            ({"limit_mm_per_prompt": '{"image": true}'}, "--limit-mm-per-prompt: 'image' must be a count of items"),
            ({"limit_mm_per_prompt": '{"image": -1}'}, "--limit-mm-per-prompt: 'image' must be a count of items"),
            ({"limit_mm_per_prompt": "[0]"}, "--limit-mm-per-prompt must be a JSON object"),
            ({"limit_mm_per_prompt": "{}"}, "--limit-mm-per-prompt names no modality, so it would change nothing"),
            ({"limit_mm_per_prompt": "null"}, "--limit-mm-per-prompt names no modality")):
        with pytest.raises(UsageError, match=re.escape(message)):
            deploy(vl, None, {**base, **options})
    text = load_preset_spec(get_preset("llama-3.1-8b"))
    with pytest.raises(UsageError, match=re.escape("--skip-mm-profiling: Llama-3.1-8B")):
        deploy(text, None, {**base, "skip_mm_profiling": True})
    with pytest.raises(UsageError, match="takes text only, so it would change nothing"):
        deploy(text, None, {**base, "limit_mm_per_prompt": '{"image": 0}'})


def test_releases_before_0_11_capture_piecewise_graphs_only():
    """vLLM 0.11.0 made FULL_AND_PIECEWISE the default ``cudagraph_mode``; an emulated 0.10 release captures the
    PIECEWISE graphs alone, as ``--compilation-config '{"cudagraph_mode": "PIECEWISE"}'`` does in later ones."""
    old = _terms(deployment("llama-3.1-8b", device="h100-80g", max_model_len=8192, vllm_release="0.10.2"))["cuda_graphs"]
    new = _terms(deployment("llama-3.1-8b", device="h100-80g", max_model_len=8192, vllm_release="0.11.0"))["cuda_graphs"]
    assert old.source.startswith("0 FULL + ") and "(PIECEWISE)" not in old.source
    assert not new.source.startswith("0 FULL + ") and old.bytes < new.bytes


def test_a_multimodal_model_whose_processing_info_needs_its_tokenizer_still_plans():
    """Kimi-K2.5's processing info asks for its tokenizer, which a config alone does not have: the encoder profile is
    still named as not modelled (its modalities unknown), and a modality limit is passed on to vLLM unchecked."""
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import deploy

    spec = load_model_spec(ROOT / "fixtures" / "architectures" / "moonshotai--Kimi-K2.5")
    base = {"device": "h200-141g", "tp": 8, "max_model_len": 4096, "kv_cache_memory": "8GiB"}
    d = deploy(spec, None, base)
    assert d.unmodelled[0].startswith("the multimodal encoder's profile (its modalities: vLLM runs the encoder")
    assert deploy(spec, None, {**base, "skip_mm_profiling": True}).unmodelled == ()
