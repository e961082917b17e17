"""The memory ledger (kvaudit/triage/ledger.py): each term reported (with its line) beside predicted, and the
inequality of vLLM's budget the figures break, on real start-up logs and out-of-memory lines (each fixture cites its
thread)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import ROOT
from kvaudit.model.memory import Term
from kvaudit.triage import ledger
from kvaudit.triage.evidence import clean_lines, extract
from kvaudit.units import GiB

pytestmark = pytest.mark.fast


def _facts(path: str):
    return extract(clean_lines((ROOT / path).read_text()))


def _deployment(**kw):
    """What the ledger reads of a ``Deployment`` (its fields and ``kv_budget_bytes``), without planning one."""
    d = dict(device="h100-80g", device_memory_bytes=80 * GiB, device_memory_given=False, gpu_memory_utilization=0.9,
             weights_bytes=60 * GiB,
             weights_source="the model", max_model_len=8192,
             overhead_terms=(Term("peak_activation", 2 * GiB, "profile"), Term("non_torch", GiB, "nccl"),
                             Term("cuda_graphs", GiB // 2, "graphs", budgeted=False)))
    d.update(kw)
    ns = SimpleNamespace(**d)
    ns.kv_budget_bytes = int(ns.device_memory_bytes * ns.gpu_memory_utilization) - ns.weights_bytes - sum(
        t.bytes for t in ns.overhead_terms if t.budgeted)
    return ns


def test_vllms_refusal_for_max_model_len_is_the_inequality_its_figures_break():
    """vllm#34076: "24.0 GiB KV cache is needed, which is larger than the available KV cache memory (3.18 GiB)"."""
    led = ledger.build(_facts("fixtures/startup-logs/cuda/vllm-34076-qwen3-coder-30b-fp8-pp2-5070ti-5090d.log"))
    need, have = led.row("KV for one request"), led.row("KV budget")
    assert (need.reported, have.reported) == (24 * GiB, round(3.18 * GiB))
    assert need.reported_at.startswith("line 11: ") and need.predicted is None
    b = led.breach()
    assert b is not None and (b.cause, b.term) == ("budget-too-small-for-max-model-len", "KV for one request")
    assert b.inequality == "KV for one request of 262,144 tokens 24.00 GiB (line 11) > KV budget 3.18 GiB (line 11)"


def test_a_negative_kv_budget_is_no_room_whatever_else_is_known():
    """vllm#23278: gpt-oss-120b on an H100, "Available KV cache memory: -2.14 GiB" after 65.97 GiB of weights."""
    led = ledger.build(_facts("fixtures/startup-logs/cuda/vllm-23278-gpt-oss-120b-h100-negative-kv.log"))
    assert led.row("KV budget").reported == round(-2.14 * GiB)
    assert led.row("weights").reported == round(65.9651 * GiB) and led.row("weights").reported_at.startswith("line 4:")
    b = led.breach()
    assert b is not None and (b.cause, b.term) == ("no-room-for-kv-cache", "KV budget")
    assert b.inequality == "KV budget -2.14 GiB (line 9) ≤ 0"


def test_memory_other_processes_hold_breaks_the_headroom_the_utilization_leaves():
    """QwenLM/Qwen3#187: torch's message lists six other processes on GPU 0 beside "this process has 29.47 GiB"."""
    facts = _facts("fixtures/reports/develop/QwenLM-Qwen3-187.txt")
    oom = facts.first("oom").value
    led = ledger.build(facts, _deployment(device_memory_bytes=oom.total, weights_bytes=10 * GiB))
    outside = led.row("outside this process")
    assert outside.reported == oom.total - oom.this_process - oom.free and outside.reported > 40 * GiB
    assert led.row("failing allocation").reported == 768 << 20
    assert led.row("free when it ran out").reported == oom.free  # what it met, on the same line
    b = led.breach()
    assert b is not None and (b.cause, b.term) == ("another-process", "outside this process")
    assert "what the utilization leaves free, (1 − 0.9) × 79.15 GiB" in b.inequality
    # the same line at a utilization that leaves that much free: nothing outside breaks; this process's 29.47 GiB is
    # over 0.3's budget (23.75 GiB) instead
    b = ledger.build(facts, _deployment(device_memory_bytes=oom.total, weights_bytes=10 * GiB,
                                        gpu_memory_utilization=0.3)).breach()
    assert b is not None and (b.cause, b.term) == ("over-budget", "this process")
    assert b.inequality == "held by this process 29.47 GiB (line 4) > vLLM's budget, 0.3 × 79.15 GiB = 23.75 GiB"
    assert ledger.build(facts, _deployment(device_memory_bytes=oom.total, weights_bytes=10 * GiB,
                                           gpu_memory_utilization=0.38)).breach() is None  # 29.47 < 30.08 + 1 GiB


def test_one_process_holding_the_device_breaks_nothing_outside():
    """vllm#27508: "Process 3270336 has 78.96 GiB memory in use" of 79.11 GiB, 140.75 MiB free: all of it is this
    process's; the other figures decide."""
    facts = _facts("fixtures/reports/threads/vllm-27508.txt")
    led = ledger.build(facts, _deployment(device_memory_bytes=round(79.11 * GiB), gpu_memory_utilization=0.95))
    assert abs(led.row("outside this process").reported) < GiB // 10
    assert led.breach() is None or led.breach().term != "outside this process"


def test_predicted_terms_come_from_the_deployment_and_the_reported_ones_win():
    d = _deployment()
    led = ledger.build(extract(["INFO [gpu_worker.py:276] Available KV cache memory: 5.00 GiB"]), d)
    kv = led.row("KV budget")
    assert (kv.reported, kv.predicted, kv.difference) == (5 * GiB, d.kv_budget_bytes, 5 * GiB - d.kv_budget_bytes)
    assert kv.value == 5 * GiB and kv.source.startswith("line 1: ")
    assert led.row("weights").value == 60 * GiB and led.row("weights").source == "predicted: the model"
    assert led.row("graphs").predicted == GiB // 2 and "not subtracted" in led.row("graphs").predicted_by
    assert led.row("budget").predicted == int(80 * GiB * 0.9)
    assert [r["term"] for r in led.to_dict()] == ["device memory", "budget", "weights", "peak activation",
                                                  "non-torch", "graphs", "KV budget"]
    assert led.breach() is None  # 5 GiB of KV and nothing else known: no inequality breaks


def test_weights_over_the_device_come_first():
    led = ledger.build(extract([""]), _deployment(weights_bytes=90 * GiB))
    b = led.breach()
    assert b is not None and (b.cause, b.term) == ("weights", "weights")
    assert b.inequality == "weights 90.00 GiB (predicted) > device memory 80.00 GiB (predicted)"
    assert led.breach("serving requests") is None or led.breach("serving requests").cause != "weights"


def test_weights_over_the_utilizations_budget_break_before_a_predicted_kv_budget_but_after_vllms_own():
    """72 GiB is the budget of 0.9 of 80 GiB: weights of 72 GiB leave it nothing (the predicted KV budget is negative
    too, but the weights are the first term that breaks); where vLLM logged its KV budget, its own figure decides."""
    led = ledger.build(extract([""]), _deployment(weights_bytes=72 * GiB))
    b = led.breach()
    assert b is not None and (b.cause, b.term) == ("weights", "weights")
    assert b.inequality == "weights 72.00 GiB (predicted) ≥ budget 72.00 GiB (0.9 × 80.00 GiB (predicted))"
    assert ledger.build(extract([""]), _deployment(weights_bytes=72 * GiB - 1)).breach().cause == "no-room-for-kv-cache"
    logged = extract(["INFO [gpu_worker.py:276] Available KV cache memory: -1.00 GiB"])
    b = ledger.build(logged, _deployment(weights_bytes=72 * GiB)).breach()
    assert b.cause == "no-room-for-kv-cache" and b.inequality.startswith("KV budget -1.00 GiB (line 1) ≤ 0; weights")


def test_a_request_longer_than_the_budget_holds_is_short_of_kv():
    need = SimpleNamespace(bytes=20 * GiB, max_model_len=131072, fits_max_model_len=70000)
    led = ledger.build(extract([""]), _deployment(), need)
    assert led.row("KV for one request").predicted == 20 * GiB and led.fits_max_model_len == 70000
    b = led.breach()
    assert b is not None and b.cause == "budget-too-small-for-max-model-len"
    assert b.inequality.startswith("KV for one request of 131,072 tokens 20.00 GiB (predicted) > KV budget")


def test_the_package_a_traceback_frame_belongs_to():
    from kvaudit.triage.evidence import _package

    assert _package("/opt/venv/lib/python3.12/site-packages/lmcache/v1/memory_management.py") == "lmcache"
    assert _package("/usr/local/lib/python3.12/dist-packages/deep_ep/buffer.py") == "deep_ep"
    assert _package("/usr/local/lib/python3.10/dist-packages/vllm/v1/worker/gpu_model_runner.py") == "vllm"
    assert _package("/workspace/vllm/vllm/v1/worker/gpu_worker.py") == "vllm"  # a source checkout
    assert _package("/home/me/run.py") is None  # the reporter's own script


def test_memory_a_component_outside_vllms_budget_allocated_is_that_components():
    """The deepest frame above the out-of-memory line that is neither vLLM's runtime nor Python's names who asked for
    the memory; vLLM's own frame there means vLLM did. Frames as Python prints them; the out-of-memory line is
    QwenLM/Qwen3#187's."""
    oom = (ROOT / "fixtures/reports/develop/QwenLM-Qwen3-187.txt").read_text().splitlines()[3]
    frame = '  File "/opt/venv/lib/python3.12/site-packages/{}", line 10, in f\n    x = torch.empty(n)\n'
    through_connector = ("Traceback (most recent call last):\n" + frame.format("vllm/v1/worker/gpu_model_runner.py")
                         + frame.format("lmcache/v1/memory_management.py") + frame.format("torch/utils/_device.py")
                         + oom)
    facts = extract(through_connector.splitlines())
    assert facts.value("oom_package") == "lmcache" and facts.first("oom_package").line == 4
    b = ledger.build(facts).breach()
    assert b is not None and (b.cause, b.term) == ("outside-budget", "failing allocation")
    assert b.inequality == "the allocation that ran out (768.00 MiB (line 8)) is lmcache's (line 4), memory vLLM's budget does not hold"
    by_vllm = ("Traceback (most recent call last):\n" + frame.format("lmcache/integration/vllm/adapter.py")
               + frame.format("vllm/v1/worker/gpu_model_runner.py") + frame.format("torch/nn/modules/module.py") + oom)
    assert extract(by_vllm.splitlines()).value("oom_package") is None  # vLLM allocated, whoever called it


def test_the_program_vllm_runs_inside_is_the_outermost_other_package_above_vllms_frames():
    """An RL trainer that drives an ``LLM`` (verl's checkout, ``/verl/verl/...``) is the host when vLLM's frames are
    deeper than its own; a component vLLM calls (a connector below vLLM's frames) is not; frames printed after the
    out-of-memory line count too, as the phase's do. The out-of-memory line is QwenLM/Qwen3#187's."""
    from kvaudit.triage.evidence import _package

    assert _package("/verl/verl/workers/fsdp_workers.py") == "verl"  # a source checkout: the folder twice
    assert _package("/home/u/.cache/ray/session_1/runtime_resources/working_dir_files/_ray_pkg_5ce9/openrlhf/cli/"
                    "train_ppo_ray.py") == "openrlhf"  # a Ray job's working_dir (TideDra/lmm-r1#43)
    oom = (ROOT / "fixtures/reports/develop/QwenLM-Qwen3-187.txt").read_text().splitlines()[3]
    frame = '  File "{}", line 10, in {}\n    x = f()\n'
    host = ("Traceback (most recent call last):\n" + frame.format("/verl/verl/workers/fsdp_workers.py", "generate")
            + frame.format("/venv/lib/python3.10/site-packages/vllm/entrypoints/llm.py", "wake_up")
            + frame.format("/venv/lib/python3.10/site-packages/torch/cuda/memory.py", "f"))
    facts = extract((host + oom).splitlines())
    assert facts.value("host_package") == "verl" and facts.first("host_package").line == 2
    assert extract((oom + "\n" + host).splitlines()).value("host_package") == "verl"  # the error printed first
    called = ("Traceback (most recent call last):\n"
              + frame.format("/venv/lib/python3.10/site-packages/vllm/v1/worker/gpu_model_runner.py", "execute_model")
              + frame.format("/venv/lib/python3.10/site-packages/lmcache/v1/cache_engine.py", "store") + oom)
    assert extract(called.splitlines()).value("host_package") is None


def test_memory_outside_the_process_breaks_only_beyond_the_headroom_and_a_gib_of_slack():
    """The headroom the utilization leaves, (1 - u) x device memory, plus 1 GiB for what vLLM does not budget
    exactly (CUDA context, fragmentation): QwenLM/Qwen3#187's 48.95 GiB held outside, at utilizations that leave just
    less and just more room than that."""
    facts = _facts("fixtures/reports/develop/QwenLM-Qwen3-187.txt")
    oom = facts.first("oom").value
    outside = oom.total - oom.this_process - oom.free

    def breach_at(headroom: int):
        u = 1 - headroom / oom.total
        return ledger.build(facts, _deployment(device_memory_bytes=oom.total, weights_bytes=GiB,
                                               gpu_memory_utilization=u)).breach()

    assert breach_at(outside - GiB - GiB // 8).cause == "another-process"
    assert breach_at(outside - GiB + GiB // 8) is None


def test_a_budget_that_holds_exactly_one_request_is_enough_as_vllms_check_says():
    """vLLM refuses where the KV one request needs is larger than the budget (``needed_memory > available_memory``),
    not where it is equal."""
    d = _deployment()
    exact = SimpleNamespace(bytes=d.kv_budget_bytes, max_model_len=8192, fits_max_model_len=8192)
    assert ledger.build(extract([""]), d, exact).breach() is None
    over = SimpleNamespace(bytes=d.kv_budget_bytes + 1, max_model_len=8192, fits_max_model_len=8191)
    assert ledger.build(extract([""]), d, over).breach().cause == "budget-too-small-for-max-model-len"


@pytest.mark.parametrize("phase, cause", [("CUDA/ACL graph capture", "graph-capture"),
                                          ("kv-cache allocation", "budget-did-not-fit"),
                                          ("serving requests", "activations-while-serving"),
                                          ("memory profiling", "memory-profiling"), ("weight loading", "weights")])
def test_an_allocation_that_met_less_free_memory_breaks_at_the_phase_the_frames_name(phase, cause):
    """vllm#27508's line: 786 MiB asked, 140.75 MiB free, all of the device this process's; the phase names the term
    that asked. Without a phase, or where the memory outside breaks first, the phase decides nothing."""
    facts = _facts("fixtures/reports/threads/vllm-27508.txt")
    led = ledger.build(facts, _deployment(device_memory_bytes=round(79.11 * GiB), gpu_memory_utilization=0.95,
                                          weights_bytes=10 * GiB))
    b = led.breach(phase)
    assert (b.cause, b.term) == (cause, "failing allocation")
    assert b.inequality.startswith("the failing allocation 786.00 MiB (line 121) > free when it ran out 140.75 MiB "
                                   "(line 121), allocating ") and b.inequality.endswith(f"({phase})")
    assert led.breach(None).cause == "over-budget"  # no phase: 79 GiB held here, over 0.95 × 79.11 GiB and a GiB
