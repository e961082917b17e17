"""Triage's conclusion, cause by cause, where the report names no model kvaudit can plan: each test is the one line
(or the few) that decides a branch, and asserts the cause and the figure that branch computes.

These reports are written for the branch they reach, not taken from a thread. Their lines keep the formats of the
programs that print them: torch's out-of-memory message (``c10/cuda/CUDACachingAllocator.cpp``), vLLM's worker log
lines (``vllm/v1/worker/gpu_worker.py``: "Available KV cache memory: %s GiB", "Free memory on device ... on
startup"; ``gpu_model_runner.py``: "Model loading took %s GiB memory", "Graph capturing finished in %.0f secs, took
%.2f GiB"; ``vllm/v1/engine/core.py``: "Initializing a V1 LLM engine ... with config:"), nvidia-smi's process rows.
The real reports are in ``tests/test_triage_golden.py`` and ``tests/test_triage_threads.py``."""

from __future__ import annotations

import pytest

from kvaudit.triage.conclude import MATCHES_PLAN, PLAN_NOT_INVOLVED, triage
from kvaudit.triage.evidence import clean_lines, extract
from conftest import ROOT

pytestmark = pytest.mark.fast

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has {held} GiB memory in use. "
       "Of the allocated memory 60.50 GiB is allocated by PyTorch, and 1.98 GiB is reserved by PyTorch but unallocated.")
"""The device's 79.15 GiB less this process's share less the free 1.06 GiB is what other processes hold."""


def _cause(text: str):
    t = triage(text)
    assert t.verdict == MATCHES_PLAN, t.headline
    return t


def test_another_process_in_the_smi_table_is_the_largest_row_that_is_not_vllm():
    smi = ("|    0   N/A  N/A      2210      C   python3                                   40000MiB |\n"
           "|    0   N/A  N/A      2211      C   /usr/bin/vllm-worker                      70000MiB |\n")
    t = _cause(smi + OOM.format(held="75.00"))
    assert t.cause == "another-process"
    assert "another process holds 40,000 MB (line 1:" in t.headline  # the vLLM row (70,000 MB) is the engine
    assert "a process holds 70,000 MB of device memory — line 2" in "\n".join(t.evidence)


def test_another_process_the_reporter_names_with_its_size():
    t = _cause("another process uses 20 GB on the same GPU\n" + OOM.format(held="75.00"))
    assert t.cause == "another-process"
    assert "another process holds 20.00 GiB (line 1:" in t.headline


def test_another_process_from_the_free_memory_at_start_up_not_the_oom_line():
    # 79.15 − 75.00 − 1.06 = 3.09 GiB outside this process: under a quarter of the device, so the figure said is
    # the start-up line's
    startup = ("ValueError: Free memory on device cuda:0 (30.50/79.15 GiB) on startup is less than desired GPU memory "
               "utilization (0.9, 71.24 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
               "processes.\n")
    t = _cause(startup + OOM.format(held="75.00"))
    assert t.cause == "another-process"
    assert "another process holds all but 30.50 GiB free at start-up (line 1:" in t.headline


def test_another_process_from_the_oom_line_where_it_breaks_the_ledgers_headroom():
    """The ledger's one rule (``Ledger.breach``): held outside over (1 − u) × T and a GiB of slack."""
    t = _cause(OOM.format(held="30.00"))  # 79.15 − 30.00 − 1.06 = 48.09 GiB held elsewhere
    assert t.cause == "another-process"
    assert ("another process holds more than the utilization leaves it (held outside this process 48.09 GiB (line 1) > "
            "what the utilization leaves free, (1 − 0.92) × 79.15 GiB = 6.33 GiB)") in t.headline  # (vLLM's default)
    t = _cause("vllm serve /models/x --gpu-memory-utilization 0.3\n" + OOM.format(held="30.00"))
    assert t.cause != "another-process"  # 48.09 GiB is within the 55.41 GiB that 0.3 leaves


def test_a_utilization_the_report_says_works_is_the_cause_and_the_room_it_leaves():
    t = _cause("vllm serve /models/x --gpu-memory-utilization 0.92\nwith utilization 0.85 it works\n"
               + OOM.format(held="78.00"))
    assert t.cause == "utilization-too-high"
    assert "the report says 0.85 works (line 2:" in t.headline
    assert "works at `--gpu-memory-utilization 0.85`; that leaves 5.54 GiB" in t.actions[-1]  # 0.07 × 79.15 GiB


def test_a_small_utilization_the_report_sets_leaves_no_room():
    t = _cause("vllm serve /models/x --gpu-memory-utilization 0.4\n" + OOM.format(held="78.00"))
    assert t.cause == "no-room-for-kv-cache"
    assert "the report sets `--gpu-memory-utilization 0.4`" in t.headline


def test_weights_over_the_utilizations_share_recommend_a_utilization():
    t = _cause("vllm serve /models/x --gpu-memory-utilization 0.8\n"
               "INFO 01-23 15:50:29 [gpu_model_runner.py:2000] Model loading took 70.5 GiB memory and 20.1 seconds\n"
               + OOM.format(held="78.00"))
    assert t.cause == "weights"  # the weights over the utilization's budget, the ledger's first breach
    assert "vLLM may use 63.32 GiB of the 79.15 GiB device, and the weights alone take 70.50 GiB" in t.headline
    assert t.recommended_utilization == 0.92  # min(vLLM's default 0.92, 70.5 / 79.15 + 0.1)
    old = _cause("vllm serve /models/x --gpu-memory-utilization 0.8\nvLLM version 0.11.0\n"
                 "INFO 01-23 15:50:29 [gpu_model_runner.py:2000] Model loading took 70.5 GiB memory and 20.1 seconds\n"
                 + OOM.format(held="78.00"))
    assert old.recommended_utilization == 0.9  # the default of the release the report names (0.9 before 0.20.0)


def test_a_negative_budget_recommends_the_utilization_that_covers_it_and_2_gib():
    t = _cause("vllm serve /models/x --gpu-memory-utilization 0.8\n"
               "INFO 01-23 15:50:29 [gpu_worker.py:298] Available KV cache memory: -2.50 GiB\n"
               + OOM.format(held="78.00"))
    assert t.cause == "no-room-for-kv-cache"
    assert t.recommended_utilization == 0.86  # 0.8 + (2.50 + 2) GiB / 79.15 GiB, to two places
    assert "The budget is short by 2.50 GiB: `--gpu-memory-utilization 0.86`" in t.actions[-1]


def test_a_budget_of_exactly_zero_is_the_device_running_out():
    t = _cause("INFO 01-23 15:50:29 [gpu_worker.py:298] Available KV cache memory: 0.00 GiB\n"
               "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    assert t.cause == "no-room-for-kv-cache"  # not "no memory error" for the RuntimeError
    assert "the KV budget logged is 0 B" in t.headline


def test_an_out_of_memory_in_kv_cache_planning_is_before_any_allocator():
    t = _cause('Traceback (most recent call last):\n'
               '  File "/usr/lib/python3/site-packages/vllm/v1/core/kv_cache_utils.py", line 1000, in '
               'get_kv_cache_config\n' + OOM.format(held="78.00"))
    assert t.phase == "kv-cache planning"
    assert "the device ran out during kv-cache planning, before any KV cache was allocated" in t.headline


def test_an_out_of_memory_in_weight_loading_is_before_any_allocator():
    t = _cause('Traceback (most recent call last):\n'
               '  File "/usr/lib/python3/site-packages/vllm/v1/worker/gpu_model_runner.py", line 2000, in load_model\n'
               + OOM.format(held="78.00"))
    assert (t.phase, t.cause) == ("weight loading", "weights")
    assert "the device ran out during weight loading, before any KV cache was allocated" in t.headline


def test_the_engine_config_lines_device_config_names_the_platform():
    t = triage("INFO 12-15 11:45:09 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: "
               "model='/models/x', dtype=torch.bfloat16, device_config=npu, enforce_eager=True\n"
               "RuntimeError: out of memory")
    assert t.deployment["platform"].value == "ascend"
    assert t.deployment["platform"].source.startswith("line 1: INFO 12-15")


def test_tp_is_not_inferred_from_ranks_when_pp_is_given():
    t = _cause("vllm serve /models/x --pipeline-parallel-size 2\n"
               "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert t.deployment["tensor parallel size"].value == 1  # rank 3 of TP × PP = 4 ranks, not TP 4
    assert t.deployment["tensor parallel size"].source == "assumed: no TP in the report"


def test_evidence_says_graphs_were_captured_without_a_value():
    t = _cause("INFO 01-23 15:50:29 [gpu_model_runner.py:3480] Graph capturing finished in 18 secs, took 0.53 GiB\n"
               "during inference with long prompts the service shows out of memory")
    assert t.cause == "activations-while-serving"
    assert ("it captured graphs — line 1: `INFO 01-23 15:50:29 [gpu_model_runner.py:3480] Graph capturing finished in "
            "18 secs, took 0.53 GiB`") in t.evidence


def test_evidence_lists_at_most_twelve_flags_the_parser_did_not_take():
    t = _cause("vllm serve /models/x " + " ".join(f"--made-up-{i} {i}" for i in range(14))
               + "\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    unread = [e for e in t.evidence if e.startswith("not an engine argument")]
    assert len(unread) == 12
    assert unread[-1].endswith("--made-up-11 11 — line 1")


def test_a_non_memory_error_is_plan_not_involved():  # the contrast of the zero budget above
    t = triage("vllm serve Qwen/Qwen2.5-Omni-7B\nAttributeError: 'tuple' object has no attribute 'ndim'\nRuntimeError: "
               "Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    assert (t.verdict, t.cause) == (PLAN_NOT_INVOLVED, "not-out-of-memory")
    assert "'tuple' object has no attribute 'ndim'" in t.headline  # (the error, not the line that points at it)


def _reconstruct(text: str, config: str | None = None):
    from kvaudit.triage.conclude import reconstruct
    from kvaudit.triage.evidence import clean_lines, extract

    return reconstruct(extract(clean_lines(text)), config)


def test_a_hub_model_the_report_names_is_read_from_its_config(monkeypatch):
    import kvaudit.triage.conclude as conclude

    real = conclude.load_model
    asked = []

    def from_cache(preset, ref, *a, **k):  # the Hugging Face cache, as a fixture folder
        asked.append(ref)
        return real(None, str(ROOT / "fixtures" / "configs" / "qwen3-8b"))

    monkeypatch.setattr(conclude, "load_model", from_cache)
    values, missing, inputs = _reconstruct("vllm serve some-org/Some-Model-8B --max-model-len 4096\n"
                                           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert asked == ["some-org/Some-Model-8B"]
    assert inputs.spec is not None and inputs.family_of is None and values["model"].value == inputs.spec.name
    assert values["model"].source == ("line 1: vllm serve some-org/Some-Model-8B --max-model-len 4096 → its config.json "
                                      "from the Hugging Face cache or the Hub")
    assert values["tensor parallel size"].source == "assumed: no TP in the report"  # no preset's deployment stands in


def test_a_config_given_beside_the_report_names_the_reports_model_too():
    config = str(ROOT / "fixtures" / "configs" / "qwen3-8b")
    values, _, inputs = _reconstruct("vllm serve /models/x\ntorch.OutOfMemoryError: CUDA out of memory.", config)
    assert values["model"].source == f"--config {config} (report: line 1: vllm serve /models/x)"
    values, _, _ = _reconstruct("torch.OutOfMemoryError: CUDA out of memory.", config)
    assert values["model"].source == f"--config {config}"


def test_a_log_with_the_kv_cache_size_ran_past_vllms_max_model_len_check():
    _, _, inputs = _reconstruct("INFO 01-23 15:50:29 [kv_cache_utils.py:1087] GPU KV cache size: 123,456 tokens\n"
                                "torch.OutOfMemoryError: CUDA out of memory.")
    assert inputs.ran is not None and inputs.ran.key == "kv_cache_tokens"
    _, _, inputs = _reconstruct("torch.OutOfMemoryError: CUDA out of memory.")
    assert inputs.ran is None


def test_a_deployment_vllms_planner_refuses_says_so_and_asks_for_the_logged_budget():
    # Llama 3.1 8B at 0.25 of an 80 GB device: a positive budget far below one 131,072-token request
    t = triage("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 131072 --gpu-memory-utilization 0.25\n"
               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert t.verdict == "insufficient-information"
    assert t.headline.startswith("vLLM's planner refuses the reconstructed deployment: vLLM (any release): vLLM's "
                                 "planner refused the budget of ")
    assert "(one block of every group needs 2,097,152 B)" in t.headline  # 32 layers × 16 tokens × 4 KiB
    assert "To serve at least one request with the model's max seq len (131072)" in t.headline
    assert t.ask_for[0] == "the startup log lines with 'Available KV cache memory' or 'Available memory'"


def test_an_ascend_workers_memory_line_alone_names_the_platform():
    t = triage("INFO [worker.py:1] Available memory: 1000, total memory: 65452113920\nRuntimeError: out of memory")
    assert t.deployment["platform"].value == "ascend"  # no "NPU" or "Ascend" in the text: the log line's format


def test_a_deployment_vllm_refuses_outright_is_answered_without_a_plan():
    t = _cause("vllm serve Qwen/Qwen3-8B --tensor-parallel-size 3\n"
               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")  # 32 heads over 3 ranks
    assert "the full startup log, from `vllm serve` to the error" in t.ask_for
    assert t.headline.startswith("The allocation is not the cause: on CUDA the allocator is upstream vLLM's")


def test_launches_read_without_vllms_parser_are_named(monkeypatch):
    from kvaudit.triage import commands

    monkeypatch.setattr(commands, "_PARSER", [None])
    t = _cause("vllm serve /models/own-reader --gpu-memory-utilization 0.4\n" + OOM.format(held="78.00"))
    assert t.not_parsed == ("line 1: `vllm serve /models/own-reader --gpu-memory-utilization 0.4`",)
    assert t.deployment["gpu_memory_utilization"].value == 0.4


def test_a_stated_ascend_card_size_is_never_replaced_by_the_assumed_card():
    """"on a 32GB vNPU" (issue 32's example): the 32 GB Atlas A2 card's torch figure, not the 64 GB card kvaudit assumes
    where the report states none."""
    t = triage("vllm-ascend on a 32GB vNPU runs out of memory\n"
               "INFO 12-05 10:00:00 [__init__.py:36] Platform plugin ascend is activated")
    assert t.deployment["device memory"].value == 31_662_800_896
    assert t.deployment["device memory"].source.startswith("line 1: vllm-ascend on a 32GB vNPU runs out of memory → atlas-a2-32g")


def test_a_quantization_scheme_stated_in_prose_weighs_the_weights_the_models_name_implies():
    """"TP=8, PP=2" and "w4a8" in prose (issue 32's examples): the 4-bit weights of a 235B model spread over 16 ranks."""
    t = _cause("deployment of Qwen3-235B-A22B, TP=8, PP=2, w4a8 quantization: out of memory")
    assert t.deployment["weight bits"].value == 4 and t.deployment["pipeline parallel size"].value == 2
    assert "235B parameters × 0.5 bytes / TP 8 × PP 2 = 6.84 GiB per device" in " ".join(
        r["predicted_by"] or "" for r in t.to_dict()["ledger"])


def test_what_decides_a_runtime_oom_is_asked_for_first_and_what_each_answer_would_mean():
    """A report that says the device ran out without torch's own line: the line (and the smi table) decide the ledger's
    last terms, so they are asked for first, each with what its answer would mean; a report whose line tells what is
    held outside the process is asked neither."""
    from kvaudit.triage.causes import DECIDING_OOM, DECIDING_OOM_PHASE, DECIDING_SMI

    t = triage("vllm serve /models/some-model --tensor-parallel-size 2\nit crashes with CUDA OOM after a while")
    assert t.cause == "unknown" and t.ask_for[:2] == (DECIDING_OOM_PHASE, DECIDING_SMI)
    assert t.deciding[:2] == ("failing allocation", "outside this process")
    assert t.deciding == tuple(t.to_dict()["deciding"])
    assert "the failing allocation, the memory held outside this process" in t.headline
    assert ("**What decides, and the report lacks**: the failing allocation, the memory held outside this process"
            in t.to_markdown())
    assert "another process is the cause" in DECIDING_OOM and "a KV connector, a trainer" in DECIDING_OOM
    t = triage("vllm serve /models/some-model --tensor-parallel-size 2\n" + OOM.format(held="60.00"))
    assert DECIDING_OOM not in t.ask_for and DECIDING_SMI not in t.ask_for
    assert t.cause == "another-process" and t.deciding == ("budget",)  # it rests on the utilization, assumed


def test_where_no_traceback_or_start_up_step_places_an_oom_the_terms_its_phase_decides_are_asked_for_once():
    """A device out of memory that nothing places in a phase (no traceback, no start-up step logged before it): the
    phase decides which budgeted term ran out (the weights, the profile run's activations, the graphs), so those are
    deciding terms, asked for in one question with torch's line, or alone where that line is shown; an eager launch
    captures no graph; a phase the frames or the log show decides, and none is asked."""
    from kvaudit.triage.causes import DECIDING_OOM_PHASE, DECIDING_PHASE

    said = "it crashes with CUDA OOM after a while"
    t = triage("vllm serve /models/some-model --tensor-parallel-size 2\n" + said)
    assert t.deciding[2:] == ("weights", "peak activation", "graphs")
    assert DECIDING_OOM_PHASE in t.ask_for and DECIDING_PHASE not in t.ask_for
    assert "`capture_model`" in DECIDING_PHASE and "`profile_run`" in DECIDING_PHASE and "`load_model`" in DECIDING_PHASE
    eager = triage("vllm serve /models/some-model --tensor-parallel-size 2 --enforce-eager\n" + said)
    assert eager.deciding[2:] == ("weights", "peak activation")
    loaded = "INFO 01-23 15:50:29 [gpu_model_runner.py:2000] Model loading took 7.5 GiB memory and 20.1 seconds\n"
    placed = triage("vllm serve /models/some-model --tensor-parallel-size 2\n" + loaded + said)
    assert placed.phase == "memory profiling" and not set(placed.deciding) & {"weights", "graphs"}
    warm = triage((ROOT / "fixtures/reports/held-out-11/vllm-17939.txt").read_text())  # (after graph capture)
    assert (warm.phase, warm.cause) == ("warm-up", "unknown") and not set(warm.deciding) & {"weights", "graphs"}
    shown = triage("vllm serve /models/some-model --gpu-memory-utilization 0.9\n" + OOM.format(held="70.00"))
    assert shown.deciding == ("weights", "peak activation", "graphs") and shown.ask_for[0] == DECIDING_PHASE


def test_a_concluded_cause_names_the_terms_it_rests_on_that_the_report_does_not_state():
    """A cause is concluded from the report's figures where it states them and from kvaudit's prediction where it does
    not; the terms it rests on that the report does not state are named, and asked for, as an undecided answer's are
    (``RESTS_ON``): the weights from a model's name, but not from vLLM's "Model loading took" line."""
    from kvaudit.triage.causes import DECIDING

    loaded = "INFO 01-23 15:50:29 [gpu_model_runner.py:2000] Model loading took 70.5 GiB memory and 20.1 seconds\n"
    t = _cause("vllm serve /models/x --gpu-memory-utilization 0.8\n" + loaded + OOM.format(held="78.00"))
    assert t.cause == "weights" and "weights" not in t.deciding  # the log states them, and the device (torch's line)
    assert t.deciding == () and DECIDING["weights"] not in t.ask_for
    t = _cause("vllm serve /models/llama-3-70b-instruct --gpu-memory-utilization 0.8\nit crashes with CUDA OOM on one "
               "A100 80GB while loading")
    assert t.cause == "weights" and "weights" in t.deciding  # 70B × 2 bytes, from the name: a prediction
    assert DECIDING["weights"] in t.ask_for
    assert "**What decides, and the report lacks**: the weights each rank loaded" in t.to_markdown()


@pytest.mark.parametrize("shown, named", [
    ("", True), ("| NVIDIA-SMI 535.54.03              Driver Version: 535.54.03    CUDA Version: 12.2     |\n", False)])
def test_a_driver_failure_rests_on_the_driver_release_unless_the_smi_header_states_it(shown, named):
    t = triage(shown + "RuntimeError: The NVIDIA driver on your system is too old (found version 11040).")
    assert t.verdict == PLAN_NOT_INVOLVED and t.cause == "driver"
    assert ("release" in t.deciding) is named and any("Driver Version" in a for a in t.ask_for) is named


@pytest.mark.parametrize("shown, named", [
    ("", True), ("Mem:           503Gi        41Gi       400Gi\n", False), ("docker run --shm-size=10gb vllm\n", False),
    ("Mem:        527958520    43012344  419430400\n", False),  # `free` in KiB: stated, though no figure is read
    ("内存：64g\n", False), ("GPU memory: 80GB\n", True)])  # a spec sheet's host memory; a device's is not the host's
def test_a_host_memory_failure_rests_on_the_hosts_memory_unless_the_report_shows_it(shown, named):
    t = triage(shown + "vllm serve /models/x\nRayOutOfMemoryError: Task was killed due to the node running low on memory.")
    assert t.verdict == PLAN_NOT_INVOLVED and t.cause == "host-memory"
    assert ("host memory" in t.deciding) is named


@pytest.mark.parametrize("text, host", [
    # vllm-ascend#7661: the host's RAM, in Chinese, named with its use, and nothing of the NPU's memory
    ("[Performance]: 310P docker部署宿主机RAM占用过高\nNPU：Atlas 300Duo\n宿主机ram内存占用高达12g", True),
    # vllm#2345: a leak shown by ps's RSS column (the host's), not by any device figure
    ("memory leak in v0.2.7\nUSER  PID %CPU %MEM    VSZ   RSS TTY STAT START TIME COMMAND\n"
     "root  42  101  9.8 123456 9876543 ?  Sl  10:00 5:00 ray::RayWorkerVllm", True),
    # vllm-ascend#6299: a leak shown by top's RES column; collect_env's npu-smi table shows the NPU held at vLLM's
    # budget (59,715 of 65,536 MB at 0.9), as planned
    ("[Bug]: memory leak when running GLM-4.7-W8A8\n"
     "| 0     910B3               | OK            | 97.1        39                0    / 0             |\n"
     "| 0                         | 0000:C2:00.0  | 0           0    / 0          59715/ 65536         |\n"
     "    PID USER      PR  NI    VIRT    RES    SHR S  %CPU  %MEM     TIME+ COMMAND", True),
    # vllm#18156: "RAM" of a GPU is the device's
    ("each A10 GPU has 24G RAM? so we have 24*4 G?\nI couldn't serve it on 4A10 it always give me OOM.", False),
    ("RAM usage is 20 GB\n" + OOM.format(held="78.00"), False),  # torch's line: the device ran out
])
def test_a_report_that_names_only_the_hosts_memory_is_about_the_hosts_memory(text, host):
    t = triage(text)
    assert (t.verdict == PLAN_NOT_INVOLVED and t.cause == "host-memory") is host, t.headline


def test_where_the_report_shows_no_launch_the_terms_its_settings_decide_are_asked_for_as_one_question():
    """vllm-ascend#2422's maintainers asked first for the launch ("can you share your start CLI"): without it, the
    utilization, max_model_len and max_num_seqs are unknown, and with them the budget, the KV one request needs and
    the profile run's peak. A launch that leaves a setting out runs vLLM's default: nothing is then unknown."""
    from kvaudit.triage.causes import DECIDING_LAUNCH

    t = triage("Qwen2-7B-Instruct runs out of memory on one A100 40GB\nit crashes with CUDA OOM after a while")
    assert t.cause == "unknown" and {"budget", "KV for one request", "peak activation"} <= set(t.deciding)
    assert t.ask_for.count(DECIDING_LAUNCH) == 1 and not any("gpu_memory_utilization` the engine" in a
                                                             for a in t.ask_for)
    t = triage("vllm serve Qwen/Qwen2-7B-Instruct --max-model-len 4096\nit crashes with CUDA OOM after a while")
    assert not set(t.deciding) & {"budget", "KV for one request"} and DECIDING_LAUNCH not in t.ask_for


@pytest.mark.parametrize("text, preallocated", [
    # vllm-project/vllm#4253 (held-out-17): the device's memory as "gpu ram"
    ("[Usage]: Why 0.5B model requires 21G gpu ram ?\nI fine-tuned a 0.5B model based on Qwen 0.5B.", True),
    # vllm-project/vllm#7155 (held-out-17): the reservation stated, not asked about
    ("[Performance]: max_model_len argument to LLM class does not limit GPU utilization.\nCurrently, vLLM allocates all "
     "available GPU memory after loading model weights, regardless of the max_model_len setting.", True),
    # the same comparison with Hugging Face vllm#10357 makes, its figures in one sentence
    ("Qwen2-VL-7B takes only 18Gb when run by using huggingface code, but the same model takes 38 GB GPU memory with "
     "vLLM", True),
    # vllm-project/vllm#355 (held-out-14): "requires much more memory", a question in its title
    ("Why using LLM class to load models requires much more memory than using huggingface from_pretrained method?\nI "
     "tried the code `llm = LLM(model=\"facebook/opt-125m\")` on a single T4", True),
    # vllm#2352: a question about memory use, and nothing failed
    ("Why vLLM - GPTQ deployment consumes high memory?\nwhen deploying the GPTQ version of the model with vLLM it "
     "consumes around 69GB of GPU", True),
    # zai-org/GLM-4#149: the same question where the deployment will not run ("跑不起来") is a failure's
    ("请教glm4-9b-1M跑起来需要多少显存？\n想部署一下glm4-9b-1m模型，目前40G显存跑不起来，请问一下需要多少显存才能跑支持max_model_len为1M的大模型？",
     False),
])
def test_a_question_about_memory_use_where_nothing_failed_is_vllms_preallocation(text, preallocated):
    t = triage(text)
    assert (t.cause == "preallocated") is preallocated, t.headline
    if preallocated:
        assert "nothing failed" in t.headline and "--gpu-memory-utilization" in t.actions[0]
        assert t.deciding == ("budget",)  # (the utilization is vLLM's default here: asked for)


def test_vllm_refusing_a_request_longer_than_max_model_len_is_no_memory_failure():
    """A write-up of an L4 deployment (fixtures/reports/held-out-6/kenrollins-...-context-window-edge.txt): the
    OpenAI client prints vLLM's validation error ("This model's maximum context length is N tokens"), which refuses
    one request; the KV cache's plan is not involved."""
    t = triage("Symptom\n\nError code: 400 - This model's maximum context length is 4096 tokens.\nHowever, you "
               "requested 1024 output tokens and your prompt contains at\nleast 3073 input tokens")
    assert (t.verdict, t.cause) == (PLAN_NOT_INVOLVED, "not-out-of-memory")
    assert "maximum context length is 4096 tokens" in t.headline


@pytest.mark.parametrize("spec", ["Memory size: 768GB", "Mem:           768Gi        41Gi       700Gi", "Mem: 0.75Ti"])
@pytest.mark.parametrize("size, host", [(200, True), (100, False)])
def test_a_kv_connectors_host_buffers_once_per_worker_over_the_hosts_memory_are_the_hosts_memory(size, host, spec):
    """LMCache/LMCache#949 (held-out-7): LMCache's ``max_local_cpu_size`` is a host buffer per vLLM worker; at TP 4,
    200 GB of it is 800 GB on a 768 GB host, and the server does not start; 100 GB starts. The host's memory as its
    spec sheet or `free -h` states it."""
    t = triage(f"{spec}\nGPU: 4x L40s (48GB each)\nLMCACHE_CONFIG_FILE=lmcache_config.yaml vllm serve "
               "Qwen/Qwen2.5-72B-Instruct --tensor-parallel-size 4 --kv-transfer-config "
               "'{\"kv_connector\":\"LMCacheConnectorV1\",\"kv_role\":\"kv_both\"}'\n"
               f"max_local_cpu_size: {size}\nthe vLLM server does not manage to start")
    assert (t.verdict == PLAN_NOT_INVOLVED and t.cause == "host-memory") is host, t.headline
    if host:
        assert "max_local_cpu_size 200 GB × 4 worker(s) (TP 4) = 800 GB, more than the host's 768 GB" in t.headline


def test_a_kv_connector_the_report_runs_is_a_deciding_term_until_the_failing_frames_show_it():
    """With a connector in the launch (vLLM's own ``--kv-transfer-config``) and no torch line, its release and
    settings are asked for beside the line and the smi table; the question says what its allocations would mean."""
    from kvaudit.triage.causes import DECIDING_COMPONENT

    launch = ("vllm serve /models/some-model --kv-transfer-config "
              "'{\"kv_connector\":\"LMCacheConnectorV1\",\"kv_role\":\"kv_both\"}'\n")
    t = triage(launch + "it crashes with CUDA OOM after a while")
    assert t.deciding[:3] == ("failing allocation", "outside this process", "component")
    assert DECIDING_COMPONENT in t.ask_for and "the KV connector's own allocations" in t.headline
    assert "outside vLLM's budget" in DECIDING_COMPONENT
    t = triage("vllm serve /models/some-model\nit crashes with CUDA OOM after a while")
    assert "component" not in t.deciding


def test_where_the_figures_show_what_was_held_outside_the_unstated_utilization_decides():
    """torch's line shows 7.09 GiB held outside this process: over what 0.95 leaves (3.96 GiB and a GiB of slack),
    within what 0.9 leaves (7.92 GiB). With no utilization in the report, nothing breaks at the assumed 0.9, and the
    utilization the engine ran with is what decides; stated, it decides itself."""
    from kvaudit.triage.causes import DECIDING_BUDGET

    t = _cause(OOM.format(held="71.00"))
    assert (t.cause, t.deciding[0]) == ("unknown", "budget") and t.ask_for[0] == DECIDING_BUDGET
    assert "outside this process" not in t.deciding  # (the phase, unplaced, decides which term ran out)
    t = _cause("vllm serve /models/x --gpu-memory-utilization 0.95\n" + OOM.format(held="71.00"))
    assert t.cause == "another-process" and t.deciding == ()


def test_a_second_llm_in_one_python_paste_is_a_second_engine_but_not_across_two_code_blocks():
    """vllm-project/vllm-ascend#449 pastes one sample twice, each in its own code block: two programs, not a second
    engine beside the first."""
    engine = '    llm = LLM(model="/models/Qwen2.5-7B-Instruct", tensor_parallel_size=1)'
    one = "\n".join(["```python", "from vllm import LLM", engine, "del llm", engine, "```",
                     "torch.OutOfMemoryError: CUDA out of memory."])
    t = triage(one)
    assert t.cause == "another-process" and "a second engine starts in the same process" in t.headline
    two = "\n".join(["```python", "from vllm import LLM", engine, "```", "and again:", "```python", engine, "```",
                     "torch.OutOfMemoryError: CUDA out of memory."])
    assert triage(two).cause != "another-process"


@pytest.mark.parametrize("sentence, grows", [
    ("GPU memory keeps growing with every request until it runs out of memory", True),
    ("显存占用持续上涨，最终 OOM", True),
    ("Memory consumption climbs steadily at a rate of ~0.1GB per inference iteration, then OOM", True),
    ("memory leak in v0.2.7, then out of memory", False),  # vllm#2345: the host's RAM, as the thread found
])
def test_memory_that_grows_is_the_devices_only_where_the_sentence_places_or_measures_it(sentence, grows):
    t = _cause("vllm serve /models/x\n" + sentence)
    assert (t.cause == "memory-growth") is grows
    assert grows or "failing allocation" in t.deciding


def test_an_oom_with_no_traceback_happened_in_the_step_after_the_furthest_start_up_step_logged():
    """vLLM's start-up as it logs it: the weights loaded, then the profile run; graph capture begun; graphs captured,
    then serving. Workers' lines interleave (vllm#15598: one worker's "Capturing cudagraphs" above another's weights
    line), so the furthest step counts, not the last line."""
    from kvaudit.triage.causes import phase_of

    loaded = "INFO 01-23 15:50:29 [gpu_model_runner.py:2000] Model loading took 14.5 GiB memory and 20.1 seconds"
    capture = "INFO 01-23 15:50:40 [gpu_model_runner.py:2100] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
    done = "INFO 01-23 15:50:59 [gpu_model_runner.py:2200] Graph capturing finished in 19 secs, took 0.52 GiB"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."

    def phase(*lines: str) -> str | None:
        return phase_of(extract(clean_lines("\n".join(lines))))

    assert phase(loaded, oom) == "memory profiling"
    assert phase(loaded, capture, oom) == "CUDA/ACL graph capture"
    assert phase(loaded, capture, done, oom) == "serving requests"
    assert phase(capture, loaded, oom) == "CUDA/ACL graph capture"  # interleaved workers
    assert phase(oom, loaded) is None  # logged after the error: not the step it happened in


def test_this_process_over_vllms_budget_is_a_term_that_grew_decided_by_the_traceback_and_the_weights():
    """78.00 GiB held by this process at 0.9 of 79.15 GiB (71.24 GiB): nothing outside it broke the headroom; a term
    vLLM budgeted grew past its plan, the weights or the activations, which the traceback and the weights' figure
    tell. Not a utilization guess, even at 0.95; a lower utilization the report says works still is the answer."""
    from kvaudit.triage.causes import DECIDING_WEIGHTS

    t = _cause("vllm serve /models/x --gpu-memory-utilization 0.9\n" + OOM.format(held="78.00"))
    assert (t.cause, t.deciding) == ("unknown", ("failing allocation", "weights"))
    assert t.inequality == "held by this process 78.00 GiB (line 2) > vLLM's budget, 0.9 × 79.15 GiB = 71.24 GiB"
    assert DECIDING_WEIGHTS in t.ask_for and "grew past what it planned" in t.headline
    assert _cause("vllm serve /models/x --gpu-memory-utilization 0.95\n" + OOM.format(held="78.00")).cause == "unknown"
    within = _cause("vllm serve /models/x --gpu-memory-utilization 0.9\n" + OOM.format(held="70.00"))
    assert within.inequality is None and within.deciding[:2] != ("failing allocation", "weights")  # within it


_WORKER_FAILED = (  # QwenLM/Qwen2.5-Omni#288 (held-out-9), verbatim: a worker's error, vLLM's own shutdown, the shell
    "ERROR 05-19 22:17:53 [core.py:386] RuntimeError: ('Worker failed with error %s, please check the stack trace "
    "above for the root cause', \"'tuple' object has no attribute 'ndim'\")\n"
    "CRITICAL 05-19 22:17:53 [core_client.py:359] Got fatal signal from worker processes, shutting down. See stack "
    "trace above for root cause issue.\n")


@pytest.mark.parametrize("before, cause", [(_WORKER_FAILED, "not-out-of-memory"), ("", "host-memory")])
def test_the_shells_killed_after_vllm_killed_its_own_process_tree_is_not_the_hosts_memory(before, cause):
    """vLLM's engine client kills its process tree (SIGKILL) on a worker's fatal signal, so the shell's "Killed" after
    it is vLLM's own; the worker's error is the cause. A bare "Killed" alone is still the kernel's."""
    t = triage("vllm serve Qwen2.5-Omni-7B --dtype bfloat16 -tp 4\n" + before + "Killed\n")
    assert (t.verdict, t.cause) == (PLAN_NOT_INVOLVED, cause), t.headline


@pytest.mark.parametrize("line", [
    # xorbitsai/inference#1848 and #3041 (held-out-9): Xinference refusing a second model on a GPU vLLM holds
    "RuntimeError: [address=0.0.0.0:54846, pid=45] User specified GPU index 0 has been occupied with a vLLM model: "
    "Qwen1.5-14B-Chat-GPTQ-int4-1-0, therefore cannot allocate GPU memory for a new model.",
    '"detail": "[address=0.0.0.0:22635, pid=141] GPU index 0 has been occupied with a vLLM model: qwen2.5-instruct-0, '
    'therefore cannot allocate GPU memory for a new model."',
    "加载第二个模型时报错，显卡被其他进程占用了"])
def test_a_device_another_model_or_process_holds_is_another_process(line):
    t = triage("vllm serve Qwen/Qwen2.5-7B-Instruct\n" + line)
    assert (t.verdict, t.cause) == (MATCHES_PLAN, "another-process"), t.headline


def test_a_chinese_sentence_reads_the_device_running_out_and_the_weights_bits():
    """xorbitsai/inference#1292 (held-out-9): "显存就会溢出" is the device running out; "4位量化模型" a 4-bit checkpoint,
    whose weights the name's parameter count gives at half a byte each."""
    ev = extract(clean_lines("我一直使用xinfernece部署Qwen1.5-14b 4位量化模型，2~3轮对话后显存就会溢出"))
    assert ev.value("oom_mentioned") is True and ev.value("weight_bits") == 4
    assert {f.value for f in ev.all("model_mention")} == {"Qwen1.5-14b"}  # (not "Qwen1.5-14b 4")
    t = triage("我一直使用xinfernece部署Qwen1.5-14b 4位量化模型，2~3轮对话后显存就会溢出")
    assert "14B parameters × 0.5 bytes" in str(t.ledger.to_dict())


@pytest.mark.parametrize("text, host", [
    # hiyouga/EasyR1#50 (held-out-9): which memory grows, the report does not say
    ("When I train geometry3k using run_qwen2_5_vl_7b_geo. I encountered an issue where memory usage is growing "
     "slowly. I guess there is a memory leakage.", True),
    ("vllm serve x: GPU memory usage keeps growing over time", False),  # the device's, named
    # vllm-project/production-stack#782 (held-out-9): a pod Kubernetes restarts, no error shown
    ("bug: vLLM Router CrashLoopBack error on deployment\nThe router pod goes into crashLoopBack on deployment.", True),
    ("deepseek-r1-distill-llama-8b-5cc594fd46-hg5rw   0/1     CrashLoopBackOff   5 (2m30s ago)   13m\n" + OOM.format(
        held="78.00"), False)])  # torch's line: the device's memory
def test_where_the_report_does_not_say_which_memory_ran_out_the_hosts_memory_decides_first(text, host):
    t = triage(text)
    assert (t.deciding[:1] == ("host memory",)) is host, t.deciding


@pytest.mark.parametrize("text, model", [
    ("MiniCPM-o 2.6 | GPU | 18 GB", "MiniCPM-o 2.6"),  # OpenBMB/MiniCPM-V#919 (held-out-9): a version after a blank
    ("I run Aria 2 GPUs with vllm", None)])  # a device count is no version
def test_a_family_named_in_prose_takes_a_version_after_a_blank(text, model):
    found = [f.value for f in extract(clean_lines(text)).all("model_mention")]
    assert found == ([model] if model else [])


def test_a_question_about_memory_in_use_ending_in_a_chinese_particle_is_preallocation():
    """OpenBMB/MiniCPM-V#919 (held-out-9): "占用显存18GB" is memory used, not the device's size, and a sentence that
    ends in 呢 asks; vLLM reserves the utilization's share whatever the model needs."""
    text = "[vllm] - 文档写占用显存18GB，但是我实际vllm部署时候发现占用了70多GB呢\nMiniCPM-o 2.6 | GPU | 18 GB"
    assert extract(clean_lines(text)).first("device_nominal_gb") is None
    t = triage(text)
    assert (t.verdict, t.cause) == (MATCHES_PLAN, "preallocated"), t.headline


_REFUSALS = ("🚫 ValueError: No available memory for the cache blocks.\n"  # (velog.io/@js03210, held-out-10, verbatim)
             "🚫 KV cache is needed, which is larger than the available KV cache memory.\n")


def test_a_run_of_vllms_refusal_quoted_alone_is_that_refusal_and_two_that_exclude_each_other_leave_the_kv_budget():
    """vLLM's "To serve at least one request ..." quoted by one literal run between its figures still marks it; beside
    "No available memory for the cache blocks" (a KV budget at or below zero, where the other needs one above), the
    KV budget and what one request needs decide which ran."""
    from kvaudit.triage.loglines import retyped

    assert retyped("KV cache is needed, which is larger than the available KV cache memory.") == [
        ("kv_capacity_error", "To serve at least one request with the models's max seq len")]
    assert retyped("the KV cache memory is larger than expected") == []
    t = triage("vllm serve /models/x --gpu-memory-utilization 0.6 --max-model-len 40960\n" + _REFUSALS)
    assert (t.cause, t.deciding) == ("unknown", ("KV budget", "KV for one request")), t.headline
    assert triage("vllm serve /models/x\n" + _REFUSALS.splitlines()[0]).cause == "no-room-for-kv-cache"


def test_vllms_refusal_retold_with_its_two_figures_is_the_budget_short_of_one_request():
    """qevos.com's 27B-on-a-4090 write-up (held-out-10): "KV cache OOM (need 8.33 GiB, only 8.29 GiB)"."""
    t = triage("--gpu-memory-utilization 0.85\n| 262,144 | ❌ | — | KV cache OOM (need 8.33 GiB, only 8.29 GiB) |")
    assert (t.verdict, t.cause) == (MATCHES_PLAN, "budget-too-small-for-max-model-len"), t.headline
    assert t.inequality == "KV for one request 8.33 GiB (line 2) > KV budget 8.29 GiB (line 2)"


_TWO_INSTANCES = (  # a jianshu.com write-up (held-out-10), verbatim but the utilization, set per case
    " 默认情况下,GPU的存储将被用满(预先给KV Cache预留,默认配置--gpu-memory-utilization 0.95);\n"
    "以相同的参数配置运行两个7B模型,第二个实例报错分配的cache内存不足,错误信息如下:\n"
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
    "the engine.\n"
    "docker run -d --network host --privileged --gpus=all --name=vllm_qwen7B_01 --ipc=host\n"
    "-e PORT=6003 -e MODEL_NAME=DeepSeek-R1-Distill-Qwen-7B\n"
    "-e VLLM_FLASH_ATTN_VERSION=2 -e TP=4\n"
    '-e CMD_ARGS="--gpu-memory-utilization {u}"\n'
    "| GPU | 4 * H20 (4 * 98G) |\n")


@pytest.mark.parametrize("u, cause", [(0.2, "another-process"), (0.05, "no-room-for-kv-cache")])
def test_no_room_beside_another_instance_whose_weights_fill_under_half_the_budget_is_the_other_instance(u, cause):
    """A second instance on the same devices that found no room for its KV cache, though a 7B model's weights over TP
    4 fill under half of 0.2 × 96 GB: vLLM's profile counted the other instance's memory. At 0.05 the weights fill
    most of it: no room of its own. The utilization is docker's ``-e CMD_ARGS="..."``, not the default a sentence
    names."""
    t = triage(_TWO_INSTANCES.format(u=u))
    assert t.deployment["gpu_memory_utilization"].value == u
    assert (t.verdict, t.cause) == (MATCHES_PLAN, cause), t.headline


@pytest.mark.parametrize("noun, cause", [("multiple LLM classes", "another-process"),
                                         ("multiple LLM calls", "no-room-for-kv-cache")])
def test_several_llm_engines_on_one_gpu_are_instances_that_count_each_others_memory(noun, cause):
    """vllm-project/vllm#9198 (held-out-14), verbatim but the noun: two ``LLM`` objects (vLLM's engine class) built at
    once on one T4, each at 0.4: the second's profile counts the first's memory. "LLM calls" name no engine."""
    t = triage(f"vllm:  0.5.5+cu118\nmy llm model is qwen2 1.5b，so i want to initialize multiple workers on one single "
               f"GPU(T4，16G mem) for high throughput.\nbut，when initializing {noun} simultaneously on the same GPU "
               "results in an error: \n**_ValueError: No available memory for the cache blocks. Try increasing "
               "gpu_memory_utilization when initializing the engine._** \nself.llm = LLM(model=model_path, "
               "tensor_parallel_size=1, enforce_eager=True, gpu_memory_utilization=0.4)")
    assert (t.verdict, t.cause) == (MATCHES_PLAN, cause), t.headline


@pytest.mark.parametrize("growth, cause", [(", ultimately leading to continuous memory growth", "unknown"),
                                           ("", "another-process")])
def test_memory_kept_that_is_said_to_grow_is_a_leak_not_an_earlier_engines(growth, cause):
    """vllm-project/vllm-ascend#14720 (held-out-14): references kept in a global list "cannot release the referenced
    global memory, ultimately leading to continuous memory growth": a leak in this process, not memory an earlier
    engine left (whose memory the report does not say: no cause); without the growth, what is kept is held outside."""
    t = triage("[Bug]: OOM when loading weights\nThe gc.collect() and torch.accelerator.empty_cache() cannot release "
               f"the referenced global memory{growth} and eventually causing an OOM.")
    assert t.cause == cause, t.headline


def test_a_failure_the_reporter_ties_to_the_utilization_is_one_of_vllms_budget():
    """vllm-project/vllm#3345 (held-out-15): no error shown, but "when gpu-memory-utilization is 0.2 (10G), it looks ok.
    set gpu-memory-utilization=0.15, will fail to run": a failure the utilization decides is within vLLM's budget,
    and the allocation on CUDA is upstream's."""
    t = triage("how to reduce gpu memory in vllm\n python -m vllm.entrypoints.openai.api_server --model /m/qw7bint4 "
               "--max-model-len 2046 --gpu-memory-utilization 0.15\nwhen gpu-memory-utilization is 0.2 (10G),  it looks "
               "ok.  set  gpu-memory-utilization=0.15, will fail to run")
    assert t.verdict == MATCHES_PLAN, t.headline


@pytest.mark.parametrize("text", [
    "[Bug]:vllm从0.7.0开始版本部署Qwen2_vl服务存在内存(不是GPU显存)泄漏问题",  # vllm-project/vllm#15597 (held-out-15)
    "服务相关进程内存不会释放，最终打爆服务器内存，导致服务停止",  # its body
    "the process memory (not GPU memory) keeps growing until the service stops"])
def test_the_hosts_memory_said_as_not_the_devices_or_the_servers_is_the_hosts(text):
    t = triage("vllm 0.7.0 Qwen2-VL\n" + text)
    assert (t.verdict, t.cause) == (PLAN_NOT_INVOLVED, "host-memory"), t.headline


def test_a_variable_an_env_file_sets_twice_runs_with_its_last_value():
    """xusenlinzy/api-for-open-llm#218 (held-out-15): the .env sets TENSOR_PARALLEL_SIZE=2, then TENSOR_PARALLEL_SIZE=1
    further down; the server runs with 1, on one card (where the thread found the cause). A value set once stands."""
    env = ("进行如下设置，本地启动会在第一张卡上启动，然后因为显存不足而报\n```\nMODEL_PATH=meta-llama/Llama-2-13b-chat-hf\n"
           "TENSOR_PARALLEL_SIZE=2\nENGINE=vllm\nDEVICE=cuda\nGPUS=3,4\n{again}DTYPE=half\n```")
    assert triage(env.format(again="TENSOR_PARALLEL_SIZE=1\n")).deployment["tensor parallel size"].value == 1
    assert triage(env.format(again="")).deployment["tensor parallel size"].value == 2


@pytest.mark.parametrize("said, cause", [("启动报错", "unknown"), ("启动报错 CUDA out of memory", "utilization-too-high")])
def test_a_utilization_near_one_is_the_cause_only_of_an_error_said_to_be_the_devices_memory(said, cause):
    """vllm-project/vllm#15529 (held-out-16): a launch at 0.99 and "启动报错" (an error at start-up), the error itself a
    screenshot: the maintainer asked for the log. The utilization alone decides nothing; said to be out of memory, it
    is the cause."""
    t = triage("[Usage]: Qwen2.5-VL-32B-Instruct 4卡4090" + said + "\nvllm serve /data/models/Qwen2.5-VL-32B-Instruct "
               "--tensor-parallel-size 4 --max-model-len 8192 --gpu-memory-utilization 0.99")
    assert (t.verdict, t.cause) == (MATCHES_PLAN, cause), t.headline


def test_a_triton_kernel_over_the_gpus_shared_memory_is_no_device_memory_failure():
    """zai-org/GLM-V#154 (held-out-16): Triton's OutOfResources is one block's on-chip shared memory, not the device's."""
    t = triage("vllm serve zai-org/GLM-4.5V-FP8 --tensor-parallel-size 4\ntriton.runtime.errors.OutOfResources: out of "
               "resource: shared memory, Required: 147456, Hardware limit: 101376. Reducing block sizes or `num_stages` "
               "may help.")
    assert (t.verdict, t.cause) == (PLAN_NOT_INVOLVED, "not-out-of-memory"), t.headline
    assert "shared memory of one block" in t.headline and any("Triton kernel" in a for a in t.actions)


def test_a_report_about_the_devices_memory_on_cuda_is_upstreams_allocation_whatever_else_it_lacks():
    """netease-youdao/QAnything#257 (held-out-14): on an RTX 3060 (CUDA) the reporter says the engine's error asked for
    a higher utilization, nothing more: the allocator is upstream vLLM's, whatever the cause; a report that speaks of
    no memory at all is not answered so."""
    t = triage("[BUG] 纯python环境安装gpu利用率默认参数为0.61导致rtx3060用不起\ngpu内存为12G，llm_engine.py报错增加"
               "gpu_memory_utilization。被迫去源码手动修改了一下")
    assert (t.verdict, t.cause) == (MATCHES_PLAN, "unknown"), t.headline
    assert triage("vllm on an RTX 3060 does not start, please help").verdict != MATCHES_PLAN


def test_the_devices_memory_taken_by_the_models_own_weights_is_no_other_process():
    """vllm-project/vllm#14450 (held-out-3): "the GPU memory occupied by the model weight and activation" names this
    engine's own terms; "the GPU is already occupied by another model" names another holder."""
    assert extract(["only the GPU memory occupied by the model weight and activation is considered"]).first(
        "device_occupied") is None
    assert extract(["the GPU is already occupied by another model"]).first("device_occupied") is not None


def test_a_sentence_that_begins_with_a_flag_names_no_model():
    """instructlab/instructlab#1773 (held-out-18): its title "--max-ctx-size does not take effect when serve model with
    vllm" is a sentence, not a launch: a word of it left over as the positional model ("not") is no model; flags alone
    with a Hub id or a path still name one."""
    assert extract(["--max-ctx-size does not take effect when serve model with vllm"]).first("model") is None
    assert extract(["--max-model-len 4096 Qwen/Qwen2.5-7B-Instruct"]).first("model") is not None


def test_an_error_that_only_points_at_its_root_cause_is_not_the_error():
    """SergiioB/intel-arc-pro-b70-inference-cookbook#4 (held-out-19): the store kept vLLM's "Engine core initialization
    failed. See root cause above." and cut the refusal above it: that line is no error of its own, so the answer is not
    "no memory error"; Triton's "type fp8e4nv not supported in this architecture" (vllm#17581) is one."""
    pointer = ("vllm serve Qwen/Qwen3-8B --max-model-len 32768\n(APIServer pid=1) RuntimeError: Engine core "
               "initialization failed. See root cause above. Failed core proc(s): {}")
    assert triage(pointer).cause != "not-out-of-memory"
    fp8 = "[Bug]: Qwen3 FP8 on 0.8.5: type fp8e4nv not supported in this architecture.\n" + pointer
    assert (triage(fp8).verdict, triage(fp8).cause) == (PLAN_NOT_INVOLVED, "not-out-of-memory")


def test_the_hosts_memory_taken_by_one_line_of_code_is_the_hosts_memory():
    """vllm-project/vllm-ascend#3454 (held-out-10): "一行代码开1T cpu内存": memory taken (开, allocate, exceed) on the
    host, and nothing of the device's."""
    t = triage("[Bug]: 一行代码开1T cpu内存\n上下文256k时，8卡单实例，attn mask一行代码开了1T. Cpu内存，超出atlas主机硬件限制")
    assert (t.verdict, t.cause) == (PLAN_NOT_INVOLVED, "host-memory"), t.headline


def test_a_retold_no_room_refusal_is_no_room_however_it_is_cased():
    """pat-jj/s3#10 (held-out-14): "received the error no available memory for the cache blocks during allocation":
    vLLM's refusal where the KV budget is not positive, known by its anchor, not by the line's case."""
    t = triage("vllm gpu_memory_utilization..\nI ran train_s3.sh using 30904 and received the error no available memory "
               "for the cache blocks during allocation.\n3090 24gb *4 should be enough")
    assert (t.verdict, t.cause) == (MATCHES_PLAN, "no-room-for-kv-cache"), t.headline


def test_vllms_own_swap_space_full_is_the_hosts_memory():
    """vllm-project/vllm#787 (held-out-14): V0's scheduler aborts when the CPU swap space it reserves for preempted
    sequences is full ("Aborted due to the lack of CPU swap space"): host memory, and a larger `--swap-space`."""
    t = triage("RuntimeError: Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this "
               "error.\nllm = LLM(model='lmsys/vicuna-7b-v1.3')")
    assert (t.verdict, t.cause) == (PLAN_NOT_INVOLVED, "host-memory"), t.headline
    assert any("a larger `--swap-space`" in a for a in t.actions)


def test_the_worker_method_an_executor_names_on_the_error_line_places_it():
    """vllm-project/vllm#8903 (held-out-14): V0's multiprocessing executor names the worker method the out-of-memory
    error left ("while processing method determine_num_available_blocks"): the profile run, with no frame printed;
    a frame the traceback prints still decides first."""
    line = ("(VllmWorkerProcess pid=214) ERROR 09-27 05:20:38 multiproc_worker_utils.py:233] Exception in worker "
            "VllmWorkerProcess while processing method determine_num_available_blocks: CUDA out of memory. Tried to "
            "allocate 19.63 GiB. GPU 3 has a total capacity of 79.15 GiB of which 17.73 GiB is free. Process 78 has "
            "61.41 GiB memory in use.")
    assert triage("vllm serve x --tensor-parallel-size 4\n" + line).phase == "memory profiling"
    framed = ('Traceback (most recent call last):\n  File "/x/vllm/worker/model_runner.py", line 1, in capture_model\n'
              + line)
    assert triage("vllm serve x\n" + framed).phase == "CUDA/ACL graph capture"
    ray = "ERROR worker_base.py:464] Error executing method 'determine_num_available_blocks'. This might cause deadlock"
    assert triage("vllm serve x\n" + ray + "\ntorch.OutOfMemoryError: CUDA out of memory").phase == "memory profiling"


def test_engine_arguments_passed_through_another_librarys_call_are_a_launch():
    """BatsResearch/bonito#22 (held-out-14): ``Bonito("BatsResearch/bonito-v1", gpu_memory_utilization=0.9)`` hands
    vLLM's engine arguments on: its first argument is the model, as ``LLM(...)``'s is; a call with none of vLLM's
    arguments is not a launch."""
    t = triage('ValueError: No available memory for the cache blocks.\nbonito = Bonito("BatsResearch/bonito-v1",'
               'gpu_memory_utilization=0.9)')
    assert t.deployment["model"].value == "BatsResearch/bonito-v1" and t.deployment["model"].reported
    assert not any("which model" in a for a in t.ask_for)
    assert extract(['bonito = Bonito("BatsResearch/bonito-v1", gpu_memory_utilization=0.9)']).first(
        "launch_parser") is not None
    assert extract(['m = AutoModel.from_pretrained("org/other-7b", torch_dtype="auto")']).first("launch_parser") is None


@pytest.mark.parametrize("line", [
    "[BUG] GPU OOM when switching to next generative model",  # EuroEval/EuroEval#171 (held-out-11), its title
    "Using vllm, the model is initialised with with every request leading to CUDA out of memory error",  # litellm#883
    "in my handler a new LLM is created for each request, and it runs out of memory",
    "only one of the GPUs has its cache reset, so an OOM error is hit when the next model is benchmarked",
    "切换到下一个模型时报OOM"])
def test_a_next_model_loaded_after_the_first_in_one_program_is_the_first_engines_memory(line):
    t = triage("vllm\n" + line)
    assert (t.verdict, t.cause) == (MATCHES_PLAN, "another-process"), t.headline
    assert "a second engine starts in the same process" in t.headline


_WARM_UP = (  # vllm-project/vllm#17939 (held-out-11), verbatim but the worker prefixes cut
    "INFO 05-10 16:00:15 [gpu_model_runner.py:1686] Graph capturing finished in 112 secs, took 0.95 GiB\n"
    "ERROR 05-10 16:00:15 [multiproc_executor.py:470] WorkerProc hit an exception.\n"
    "ERROR 05-10 16:00:15 [multiproc_executor.py:470] Traceback (most recent call last):\n"
    'ERROR 05-10 16:00:15 [multiproc_executor.py:470]   File "/opt/envs/torch/lib/python3.10/site-packages/vllm/v1/'
    'worker/gpu_model_runner.py", line 1544, in _dummy_sampler_run\n'
    "ERROR 05-10 16:00:15 [multiproc_executor.py:470] RuntimeError: CUDA out of memory occurred when warming up sampler "
    "with 256 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the "
    "engine.\n")


@pytest.mark.parametrize("launch, captured, phase, cause", [
    ("vllm serve /models/x --gpu-memory-utilization=1\n", True, "warm-up", "utilization-too-high"),
    ("vllm serve /models/x --gpu-memory-utilization=0.9\n", True, "warm-up", "unknown"),  # the batch, or the headroom
    ("vllm serve /models/x --gpu-memory-utilization=1\n", False, "memory profiling", "memory-profiling")])
def test_a_dummy_run_after_graph_capture_is_v1s_warm_up_not_the_profile_run(launch, captured, phase, cause):
    """V1's worker runs the sampler's dummy batch again after the KV cache is allocated and graphs captured
    (``compile_or_warm_up_model``); there the headroom outside the budget is what ran out."""
    text = launch + (_WARM_UP if captured else _WARM_UP.split("\n", 1)[1])
    t = triage(text)
    assert (t.phase, t.cause) == (phase, cause), t.headline
    assert ("in the warm-up after graph capture" in t.headline) is (cause == "utilization-too-high")
    if cause == "unknown":  # (the utilization stated, what the warm-up asked for against what was left decides)
        assert t.deciding[:1] == ("failing allocation",)


def test_vllms_start_up_check_of_free_memory_is_the_device_and_another_process_holds_the_rest():
    """ls1intum/edutelligence#570 (held-out-12): vLLM refuses to start where the device has less free than its
    utilization's share ("Free memory on device ... on startup is less than desired GPU memory utilization"): the
    device's memory, held by another process, not an error that is no memory error."""
    t = triage("a `tp=2` lane for `google/gemma-3-27b-it` fails to start with:\n```\nValueError: Free memory on device "
               "cuda:0 (79.12/94.97 GiB) on startup is less\nthan desired GPU memory utilization (0.95, 90.22 GiB).\n```")
    assert (t.verdict, t.cause) == (MATCHES_PLAN, "another-process"), t.headline
    assert "all but 79.12 GiB free at start-up" in t.headline


@pytest.mark.parametrize("text, count", [("[Bug]: serve Llama-3.2-11B-Vision-Instruct with 2 A10 oom", 2),
                                         ("running on 8×H100", 8), ("8张A10", 8), ("A100 80GB", None),
                                         ("you need 2xA100 80GB", None)])  # (a reply's suggestion: vllm#5711)
def test_a_count_before_the_devices_name_is_the_device_count(text, count):
    assert extract(clean_lines(text)).value("device_count") == count  # vllm-project/vllm#10034 (held-out-12)


def test_a_vllm_release_written_as_the_wheels_name_is_read_and_the_platform_is_what_is_asked():
    """The vLLM forum's topic 2608 (held-out-12): "Vllm-0.18.0" in the title is vLLM's release; where no platform is
    named the question is whether it runs on a GPU or under vllm-ascend, not which vLLM runs."""
    text = "Vllm-0.18.0 kv cache使用率从100%掉到0%\nvllm serve Qwen3.5-9B --max-num-seqs 128\n"  # (a hybrid model)
    assert extract(clean_lines(text)).value("vllm_prose") == "0.18.0"
    t = triage(text)
    assert t.version_needed and not any("which vLLM" in a for a in t.ask_for), t.ask_for
    assert t.ask_for[0].startswith("whether vLLM 0.18.0 (line 1: Vllm-0.18.0"), t.ask_for


@pytest.mark.parametrize("error, no_memory", [
    ("RuntimeError: [address=0.0.0.0:1234, pid=7] the scheduler failed to allocate a slot for the new model", False),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", True)])  # vllm-project/vllm#1518
def test_an_error_whose_own_message_speaks_of_memory_running_short_is_never_no_memory_error(error, no_memory):
    t = triage("vllm serve Qwen/Qwen2.5-7B-Instruct\n" + error)
    assert (t.cause == "not-out-of-memory") is no_memory, t.headline


def test_a_launch_with_data_and_expert_parallelism_weighs_one_rank_of_its_experts():
    """``--data-parallel-size 2 --enable-expert-parallel`` in the launch: the predicted weights are one rank's, its
    MoE experts split whole over the DP × TP ranks, as vLLM builds them."""
    t = triage("vllm serve Qwen/Qwen3-30B-A3B --tensor-parallel-size 1 --data-parallel-size 2 --enable-expert-parallel "
               "--max-model-len 4096\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
               "total capacity of 79.19 GiB of which 1.00 GiB is free.",
               config=str(ROOT / "fixtures" / "configs" / "qwen3-30b-a3b" / "config.json"))
    assert (t.deployment["data parallel size"].value, t.deployment["expert parallel"].value) == (2, True)
    assert any("rank 0 of TP 1, rank 0 of DP 2: experts whole over 2 ranks (expert parallel)" in (r["predicted_by"] or "")
               for r in t.to_dict()["ledger"])
