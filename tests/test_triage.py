"""Triage: the fixtures under fixtures/reports (verdict, key numbers, recommendations), the JSON
contract, robustness to how people paste, and input kvaudit refuses."""

from __future__ import annotations

import json

import subprocess
import sys

import jsonschema
import pytest

from kvaudit.cli import main
from kvaudit.triage.conclude import MATCHES_PLAN, OVER_ALLOCATION, INSUFFICIENT, triage
from kvaudit.triage.evidence import MAX_REPORT_BYTES, clean_lines, extract
from conftest import ROOT, each_vllm, skip_unless_planned

pytestmark = pytest.mark.fast

REPORTS = ROOT / "fixtures" / "reports"
SCHEMA = json.loads((ROOT / "kvaudit" / "triage.schema.json").read_text())
GiB = 1 << 30
T_A2 = 65_452_113_920


def _triage(name: str, text: str | None = None):
    t = triage(text if text is not None else (REPORTS / name).read_text())
    jsonschema.validate(t.to_dict(), SCHEMA)
    return t


@each_vllm  # (the seed case concluded from each vLLM's plan: the shared_by and the layers forms)
def test_buggy_release_over_allocates_4x():
    t = _triage("ascend-0.11-qwen3-next-oom.log")
    assert t.verdict == OVER_ALLOCATION and t.factor == pytest.approx(4.0, rel=1e-3)
    assert t.fixed_in.startswith("vllm-ascend v0.16.0rc1")
    # reported budget 16,669,979,392 B at 0.9 of 65,452,113,920 B: keeping real use at 0.9 with 4x
    # leaves a quarter of the budget: --kv-cache-memory = A / 4, utilization = 0.9 - 3A/(4T)
    A = 16_669_979_392
    assert t.recommended_kv_cache_memory_bytes == A // 4
    assert t.recommended_utilization == 0.708
    d = t.deployment
    assert d["vllm-ascend"].value == "0.11.0" and d["vllm-ascend"].source.startswith("line 20:")
    assert d["tensor parallel size"].value == 4 and d["KV budget"].value == A
    assert d["device memory"].value == T_A2
    rows = {r[0].split(":")[0] + (":legacy" if "vllm#40691" in r[0] else ""): r for r in t.comparison}
    # this report's vLLM 0.11 logged num_blocks // groups × block size; both figures are shown
    assert rows["KV cache size (tokens):legacy"][1] == "339,072"
    assert rows["KV cache size (tokens):legacy"][-1].startswith("339,072")
    assert "at allocation 21 of 60" in rows["out of memory"][1] and "kv-cache allocation" in rows["out of memory"][-1]
    assert any("PR #3760" in a for a in t.actions)


@each_vllm
def test_pr_3760_release_over_allocates_2x():
    t = _triage("ascend-0.13-qwen3-next-oom.log")
    assert t.verdict == OVER_ALLOCATION and t.factor == pytest.approx(2.0, rel=1e-3)
    A = 13_397_373_696
    assert t.recommended_kv_cache_memory_bytes == A // 2
    assert t.recommended_utilization == 0.747  # 0.85 - A / (2 T)
    assert t.deployment["vllm-ascend"].value == "0.13.0"
    assert t.deployment["gpu_memory_utilization"].value == 0.85


def test_fixed_release_with_a_budget_that_did_not_fit():
    t = _triage("ascend-0.18-budget-oom.log")
    assert t.verdict == MATCHES_PLAN and t.factor == pytest.approx(1.0) and t.fixed_in is None
    assert "another process holds 5,120 MB" in t.headline
    # the failing request needed 1.55 GiB with 102 MiB free: free 1.1 x that shortfall + 256 MiB
    shortfall = round(1.55 * GiB) - 102 * (1 << 20)
    margin = int(shortfall * 1.1) + (256 << 20)
    assert t.recommended_kv_cache_memory_bytes == round(18.57 * GiB) - margin
    assert t.recommended_utilization == round(0.95 - margin / T_A2 - 0.0005, 3) == 0.919
    assert t.deployment["device memory"].value == T_A2  # 60.96 GiB from the message, snapped to the card


def test_cuda_report_out_of_memory_in_graph_capture():
    t = _triage("cuda-0.23-llama-graph-oom.log")
    assert t.verdict == MATCHES_PLAN and t.factor == pytest.approx(1.0)
    assert "graph capture" in t.headline and "after the KV cache was allocated" in t.headline and t.cause == "graph-capture"
    assert t.deployment["platform"].value == "cuda" and t.deployment["vLLM"].value == "0.23.0"
    assert t.deployment["KV budget"].value == round(57.53 * GiB)
    assert t.recommended_utilization == 0.939
    rows = {r[0].split(":")[0]: r for r in t.comparison}
    assert rows["KV cache size (tokens)"][1] == "471,280"  # one group: every vLLM logs the same figure


def test_too_little_information_says_what_to_ask_for():
    t = _triage("too-little.log")
    assert t.verdict == INSUFFICIENT and t.factor is None and t.recommended_utilization is None
    asks = " ".join(t.ask_for)
    assert "versions" in asks and "which model" in asks and "traceback" in asks


def test_markdown_is_ready_to_paste():
    md = _triage("ascend-0.11-qwen3-next-oom.log").to_markdown()
    assert md.startswith("### kvaudit triage: allocator-over-allocation (4.00×)")
    assert "| tensor parallel size | 4 | line 48:" in md and "**What to do**" in md
    assert "meta meter (accounting, not a device measurement)" in md


def _shuffled_blocks(text: str) -> str:
    """The collect_env block after the log, the smi table first: same facts, another order."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("```text") and i > 40)
    return "\n".join(lines[start:] + lines[:start])


@pytest.mark.parametrize("mangle", [
    ("reordered", _shuffled_blocks),
    ("ansi", lambda t: "\n".join(f"\x1b[0;36m{l}\x1b[0m" if l else l for l in t.splitlines())),
    ("ansi without ESC", lambda t: "\n".join(f"[1;36m{l}[0;0m" for l in t.splitlines())),
    ("crlf", lambda t: t.replace("\n", "\r\n")),
    ("iso timestamps", lambda t: "\n".join(f"2025-10-10T08:04:{i % 60:02d}.123+08:00 | {l}"
                                           for i, l in enumerate(t.splitlines()))),
    ("interleaved", lambda t: "\n".join(f"{l}\nLoading safetensors checkpoint shards:  {i % 100}% Completed | "
                                        f"{i % 41}/41 [00:40<00:51,  2.21s/it]" for i, l in enumerate(t.splitlines()))),
], ids=lambda m: m[0])
def test_pasted_in_other_shapes_the_triage_is_the_same(mangle):
    text = (REPORTS / "ascend-0.11-qwen3-next-oom.log").read_text()
    t = _triage("", mangle[1](text))
    assert t.verdict == OVER_ALLOCATION and t.factor == pytest.approx(4.0, rel=1e-3)
    assert t.recommended_utilization == 0.708
    assert t.deployment["tensor parallel size"].value == 4


def test_log_lines_are_read_without_torch_or_vllm():
    """Only a launch needs vLLM (its parser): a log without one is read by kvaudit alone."""
    log = REPORTS / "ascend-0.13-qwen3-next-oom.log"
    code = ("import sys; from kvaudit.triage.evidence import clean_lines, extract; "
            f"lines = [l for l in clean_lines(open({str(log)!r}).read()) if 'vllm serve' not in l and '--' not in l]; "
            "ev = extract(lines); print(len(ev) > 10, any('vLLM' in f.value for f in ev.all('launch_parser')), "
            "[m for m in ('torch', 'vllm') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True False []"


def test_the_report_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    text = (REPORTS / "too-little.log").read_text() + (
        f"\n__import__('os').system('touch {marker}')\nnon-default args: {{'model': __import__('os').system('touch "
        f"{marker}')}}\n")
    triage(text)
    assert not marker.exists()


def _cli(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_markdown_and_json(capsys):
    code, out, err = _cli(["triage", str(REPORTS / "ascend-0.13-qwen3-next-oom.log")], capsys)
    assert code == 0 and out.startswith("### kvaudit triage: allocator-over-allocation (2.00×)")
    assert err.strip().splitlines()[-1] == "kvaudit triage: allocator-over-allocation (2.00×)"
    code, out, err = _cli(["triage", str(REPORTS / "ascend-0.13-qwen3-next-oom.log"), "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == OVER_ALLOCATION and doc["recommended_utilization"] == 0.747


def test_cli_reads_stdin(capsys, monkeypatch):
    import io

    data = (REPORTS / "too-little.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, err = _cli(["triage", "-"], capsys)
    assert code == 0 and "insufficient-information" in out


@pytest.mark.parametrize("content,message", [
    (b"", "is empty"),
    (b"   \n\n  \t\n", "is empty"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00\x00" + bytes(range(256)) * 10, "binary"),
    ("Lorem ipsum dolor sit amet, consectetur adipiscing elit.\nSed do eiusmod tempor.\n".encode() * 50,
     "nothing in the text mentions an out-of-memory error, vLLM"),
])
def test_unusable_input_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    p = tmp_path / "report.txt"
    p.write_bytes(content)
    code, out, err = _cli(["triage", str(p)], capsys)
    assert code == 2 and out == "" and message in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_a_50_mb_report_is_refused_without_reading_it_all(tmp_path, capsys):
    p = tmp_path / "huge.log"
    with p.open("wb") as f:
        f.truncate(50 * 1000 * 1000)  # sparse: 50 MB without writing them
    code, out, err = _cli(["triage", str(p)], capsys)
    assert code == 2 and "47.7 MiB" in err and f"up to {MAX_REPORT_BYTES >> 20} MiB" in err


def test_missing_report_file(capsys):
    code, out, err = _cli(["triage", "/nonexistent/report.log"], capsys)
    assert code == 2 and "report not found" in err


def test_real_shapes_of_public_reports_parse():
    """Line shapes seen in public vllm-ascend reports (transcribed in the formats kvaudit reads)."""
    text = "\n".join([
        "(Worker_TP0 pid=911501) ERROR 02-07 18:18:59 [v1/executor/multiproc_executor.py:824]   File \"/home/u/"
        "site-packages/vllm_ascend/worker/model_runner_v1.py\", line 2499, in _allocate_kv_cache_tensors",
        "(Worker_TP0 pid=911501) ERROR 02-07 18:18:59 [v1/executor/multiproc_executor.py:824] RuntimeError: NPU out "
        "of memory. Tried to allocate 2.57 GiB (NPU 0; 60.96 GiB total capacity; 57.49 GiB already allocated; 57.49 "
        "GiB current active; 1.96 GiB free; 57.62 GiB reserved in total by PyTorch) If reserved memory is >> allocated",
        "| 0                         | 0000:C1:00.0  | 0           0    / 0          3424 / 65536         |",
        "(EngineCore_DP0 pid=7279) (Worker_TP7 pid=7286) INFO 11-05 09:18:38 [model_runner_v1.py:2661] Loading model "
        "weights took 18.6823 GB",
        "vllm_ascend                       0.14.0rc2.dev119+g52aa9c006      /vllm-workspace/vllm-ascend",
    ])
    ev = extract(clean_lines(text))
    assert ev.value("oom").tried == round(2.57 * GiB) and ev.value("oom_phase") == "kv-cache allocation"
    assert ev.value("hbm_total_mb") == 65536 and max(f.value for f in ev.facts["worker_tp_rank"]) == 7
    assert ev.value("weights") == round(18.6823 * GiB)
    assert ev.value("vllm_ascend_version") == "0.14.0rc2.dev119+g52aa9c006"


def test_a_very_long_line_is_cut_not_choked_on(capsys, tmp_path):
    p = tmp_path / "one-line.log"
    p.write_text("| " + "1 " * 4_000_000 + "\n" + (REPORTS / "too-little.log").read_text())
    code, out, err = _cli(["triage", str(p)], capsys)
    assert code == 0 and "insufficient-information" in out


# --- what the triage must not get wrong -------------------------------------------------------------

_QWEN3_NEXT_013 = """vllm serve Qwen/Qwen3-Next-80B-A3B-Instruct --max-model-len 4096 --gpu-memory-utilization 0.85
vLLM Ascend Version: 0.13.0
"""
_KV_OOM = ("RuntimeError: NPU out of memory. Tried to allocate 1.04 GiB (NPU 0; 60.96 GiB total capacity; 58.03 GiB "
           "already allocated; 58.03 GiB current active; 1003.52 MiB free; 58.80 GiB reserved in total by PyTorch)")
_KV_FRAME = ('  File "/vllm-workspace/vllm-ascend/vllm_ascend/worker/model_runner_v1.py", line 2499, in '
             '_allocate_kv_cache_tensors')


def test_tp_is_not_inferred_from_rank_0_alone():
    text = _QWEN3_NEXT_013 + f"(Worker_TP0 pid=7) ERROR {_KV_OOM}\n"
    tp = triage(text).deployment["tensor parallel size"]
    assert tp.value == 4 and tp.source.startswith("assumed: the qwen3-next preset's")
    seen = triage(text + "(Worker_TP5 pid=12) INFO 10-10 08:02:11 [worker.py:1] ready\n").deployment["tensor parallel size"]
    assert seen.value == 8 and "at least 6" in seen.source and seen.source.startswith("line ")


def test_frames_printed_after_the_oom_line_give_its_phase():
    """Some logs print the error first and its traceback after it (multiproc executors, ``[rank0]:``)."""
    ev = extract(clean_lines(f"[rank0]: {_KV_OOM}\n[rank0]: Traceback (most recent call last):\n[rank0]: {_KV_FRAME}\n"))
    assert ev.value("oom_phase") == "kv-cache allocation"
    before = extract(clean_lines(f"Traceback (most recent call last):\n{_KV_FRAME}\n{_KV_OOM}\n"))
    assert before.value("oom_phase") == "kv-cache allocation"


def test_the_over_allocation_threshold_is_the_audits_tolerance(monkeypatch):
    """Triage has no threshold of its own: with the audit's tolerance widened past 3× excess, the 4×
    release matches the plan for triage as it does for the audit."""
    text = (REPORTS / "ascend-0.11-qwen3-next-oom.log").read_text()
    import kvaudit.results

    monkeypatch.setattr(kvaudit.results, "DEFAULT_TOLERANCE", 3.5)
    t = triage(text)
    assert t.verdict == MATCHES_PLAN and t.factor == pytest.approx(4.0, rel=1e-3) and t.fixed_in is None
    assert triage(text, tolerance=2.9).verdict == OVER_ALLOCATION


def test_kv_transfer_padding_on_a_fixed_release_is_not_over_allocation():
    """vllm-ascend pads each KV-transfer buffer by 2 MiB (alignment): 12 tensors on a 1.5 GiB budget are
    1.6 % over the plan, above the 0.5 % tolerance, and still not over-allocation: the audit's allowance."""
    text = (REPORTS / "ascend-0.18-budget-oom.log").read_text()
    text = text.replace("Available KV cache memory: 18.57 GiB", "Available KV cache memory: 1.50 GiB").replace(
        "vllm serve", "vllm serve --kv-transfer-config '{\"kv_connector\":\"LLMDataDistCMgrConnector\","
                      "\"kv_role\":\"kv_producer\"}'", 1)
    t = triage(text)
    r = t.audits[0]
    assert t.deployment["KV transfer"].value is True and r.alignment_allowance_bytes == 12 * (2 << 20)
    assert t.factor > 1.005 and t.verdict == MATCHES_PLAN and t.fixed_in is None
    assert not any("Upgrade" in a for a in t.actions)


def test_fixed_in_only_for_a_release_older_than_the_fix():
    assert _triage("ascend-0.13-qwen3-next-oom.log").fixed_in.startswith("vllm-ascend v0.16.0rc1")
    t = triage(_QWEN3_NEXT_013.replace("0.13.0", "0.16.0") + f"{_KV_FRAME}\n{_KV_OOM}\n")
    assert t.verdict == MATCHES_PLAN and t.fixed_in is None and t.cause == "budget-did-not-fit"


def test_a_full_attention_model_needs_no_version():
    t = triage("vllm serve Qwen/Qwen3-8B --tensor-parallel-size 2\nRuntimeError: NPU out of memory. Tried to "
               "allocate 20.00 MiB (NPU 1; 60.96 GiB total capacity)\n")
    assert t.verdict == MATCHES_PLAN and t.version_needed is False and "vllm-ascend" not in t.deployment
    assert "The release is not needed for this verdict" in t.headline and len(t.releases) == 4


def test_a_hybrid_model_without_a_version_asks_for_it():
    t = triage("vllm serve Qwen/Qwen3-Next-80B-A3B-Instruct --tensor-parallel-size 4\nRuntimeError: NPU out of "
               "memory. Tried to allocate 2.00 GiB (NPU 0; 60.96 GiB total capacity)\n")
    assert t.verdict == INSUFFICIENT and t.version_needed is True
    assert {r["ratio"] for r in t.releases} == {4.0, 2.0, 1.0}
    assert any("which vllm-ascend release" in a and "4.00×" in a for a in t.ask_for)


def test_a_deployment_that_served_requests_is_not_refused_for_its_max_model_len():
    """Qwen3-8B's config says 40,960 positions; a deployment that served requests at 131,072 (RoPE scaling
    on its command line, or VLLM_ALLOW_LONG_MAX_MODEL_LEN) got past vLLM's check, so kvaudit plans it."""
    base = ("vllm serve Qwen/Qwen3-8B --max-model-len 131072\nvLLM Ascend Version: 0.13.0\n"
            f"{_KV_OOM.replace('1.04 GiB', '20.00 MiB')}\n")
    refused = triage(base)
    assert refused.verdict == INSUFFICIENT and "max_model_len" in refused.headline.lower().replace(" ", "_")
    served = triage(base.replace("\n", "\nINFO 11-05 09:20:01 [loggers.py:123] Avg prompt throughput: 12.3 tokens/s\n", 1))
    assert served.verdict == MATCHES_PLAN and served.deployment["max model len"].value == 131072
    # the check lifted for the deployment that ran does not carry over to the next report in this process
    assert triage(base).verdict == INSUFFICIENT


def test_titles_count_given_apart_or_as_the_first_line():
    body = "vllm serve Qwen/Qwen3-Next-80B-A3B-Instruct --tensor-parallel-size 4\n" + _KV_OOM + "\n"
    for t in (triage(body, title="[Bug]: 0.13.0 qwen3-next-80b oom"), triage("[Bug]: 0.13.0 qwen3-next-80b oom\n\n" + body)):
        assert t.verdict == OVER_ALLOCATION and t.factor == pytest.approx(2.0, rel=1e-3)
        assert t.deployment["vllm-ascend"].value == "0.13.0"
    assert triage(body, title="[Bug]: 0.13.0 qwen3-next-80b oom").deployment["vllm-ascend"].source.startswith("title: ")


def test_schema_names_every_cause_and_phase():
    from kvaudit.triage.causes import CAUSES
    from kvaudit.triage.evidence import PHASES

    assert set(SCHEMA["properties"]["cause"]["enum"]) - {None} == set(CAUSES)
    assert set(SCHEMA["properties"]["phase"]["enum"]) - {None} == set(PHASES)


def test_a_regression_after_the_fix_is_not_told_to_upgrade(monkeypatch):
    """A release at or after the fix that over-allocates (here the ascend-0.16 strategy made to allocate
    everything twice) gets no ``fixed_in`` and no advice to move to another release."""
    import dataclasses

    import kvaudit.strategies.builtin as strategies

    fixed = strategies.STRATEGIES["ascend-0.16"]

    held = []

    def twice(plan, device, kv_transfer=False):
        held.append(fixed.allocate(plan, device, kv_transfer))  # a first set of buffers, kept alive
        return fixed.allocate(plan, device, kv_transfer)

    monkeypatch.setitem(strategies.STRATEGIES, "ascend-0.16", dataclasses.replace(fixed, allocate=twice))
    t = triage(_QWEN3_NEXT_013.replace("0.13.0", "0.18.0") + f"{_KV_FRAME}\n{_KV_OOM}\n")
    assert t.verdict == OVER_ALLOCATION and t.factor == pytest.approx(2.0, rel=1e-3)
    assert t.fixed_in is None and not any("Upgrade" in a for a in t.actions)
    assert any("not older than kvaudit's known fix" in a for a in t.actions)


HOSTILE = ("x ` <!-- all below hidden --> [l](https://evil.example/x) ![i](https://evil.example/i.png) "
           "@maintainer www.evil.example <b>b</b> **b** #1 | p ``` y")
"""Markdown and HTML a report may hold (128 characters: kvaudit quotes up to 150 of a line)."""


def _rendered(markdown: str) -> tuple[str, str]:
    """The HTML a CommonMark renderer with GitHub's tables makes of ``markdown``, and that HTML's text outside
    code spans."""
    import re

    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(markdown)
    return html, re.sub(r"<code>.*?</code>", "", html, flags=re.S)


@pytest.mark.parametrize("where", ["title", "log", "prose"])
def test_report_text_is_pasted_as_text_into_the_markdown(where):
    """Report text in the triage's Markdown: a backtick and ``<!--`` once hid the rest of the comment on GitHub,
    and links, images and mentions rendered. Each piece of the report must stay inert: inside code spans, or
    escaped so that it renders as written."""
    body = (ROOT / "fixtures/reports/ascend-0.11-qwen3-next-oom.log").read_text()
    title = None
    if where == "title":
        title = "[Bug]: 0.11.0 qwen3-next OOM " + HOSTILE
    elif where == "log":  # a log line quoted as the source of a figure
        start = body.index("(Worker_TP0 pid=661) INFO 10-10 08:04:02")
        body = body[:start] + HOSTILE + " Loading model weights took" + body[body.index(" 37.2362 GB", start):]
    else:  # a sentence quoted as evidence
        body = "Another process holds 19 GB " + HOSTILE + "\n" + body
    t = triage(body, title=title)
    assert "@maintainer" in t.to_markdown()  # the report's text is there, to be made inert
    html, outside_code = _rendered(t.to_markdown())
    assert "<a " not in html and "<img" not in html and "<script" not in html and "<!--" not in html
    assert "@maintainer" not in outside_code and "https://evil" not in outside_code and "www.evil" not in outside_code
    assert "**Evidence**" not in html and "<strong>Evidence</strong>" in html  # kvaudit's own Markdown still renders
    assert html.count("<table>") == 3 and "Prediction vs report" in html  # nothing hid the rest of the report
    assert "Memory ledger" in html


def test_markdown_escaping_keeps_the_text_as_written():
    from kvaudit.escape import md, md_code

    html, _ = _rendered(md(HOSTILE) + "\n\n" + md_code("a `` b") + "\n\n| x |\n|---|\n| " + md(HOSTILE, cell=True) + " |\n")
    import html as html_module
    import re

    shown = html_module.unescape(re.sub(r"<[^>]+>", "", html))  # what a reader sees
    for piece in ("x ` <!-- all below hidden -->", "[l](https://evil.example/x)", "![i](https://evil.example/i.png)",
                  "@maintainer", "<b>b</b> **b** #1 | p ``` y"):
        assert shown.count(piece) == 2, piece  # as written, in the paragraph and in the table cell
    assert "<code>a `` b</code>" in html and html.count("<td>") == 1


def test_without_vllm_triage_says_which_launches_its_own_reader_read():
    """Where vLLM is not installed, the launch lines are read by kvaudit's reader, and the answer says so."""
    report = ROOT / "fixtures" / "reports" / "threads" / "vllm-13061.txt"
    p = subprocess.run([sys.executable, str(ROOT / "tests/without.py"), "vllm,torch", "triage", str(report),
                        "--format", "json"], capture_output=True, text=True)
    doc = json.loads(p.stdout)
    assert p.returncode == 3 and doc["not_parsed"] and all(s.startswith("line ") for s in doc["not_parsed"])
    assert doc["deployment"]["tensor parallel size"]["value"] == 2  # the common flags are still read
    jsonschema.validate(doc, SCHEMA)


@pytest.mark.parametrize("report", [
    "部署Qwen2.5-7B报错：\nValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
    "when initializing the engine.",
    "(EngineCore_DP0 pid=1) INFO [gpu_worker.py:298] Available KV cache memory: -2.14 GiB\nvllm serve Qwen/Qwen3-8B",
])
def test_a_budget_at_or_below_zero_is_no_room_for_the_kv_cache(report):
    """Neither a max-model-len problem nor "it fits": the weights and activations leave nothing (issue 21; the first
    report once ended in a TypeError)."""
    t = triage(report)
    assert (t.verdict, t.cause) == (MATCHES_PLAN, "no-room-for-kv-cache"), t.headline
    jsonschema.validate(t.to_dict(), SCHEMA)


def test_an_npu_smi_table_alone_is_a_report():
    table = (ROOT / "fixtures" / "reports" / "develop" / "vllm-ascend-3314.txt").read_text().splitlines()[2:12]
    t = triage("\n".join(table))
    assert t.to_dict()["schema_version"] == 1


def test_prefill_decode_disaggregation_in_prose_is_kv_transfer():
    t = triage("[Bug]: PD separation, 2P1D, Qwen3-8B NPU out of memory on v0.11.0rc3")
    assert t.deployment["KV transfer"].value is True and "2P1D" in t.deployment["KV transfer"].source


def test_a_short_prose_report_about_a_model_is_answered_not_refused(capsys):
    """vllm issue 3281: no vLLM, GPU or error word, only a model that will not unload: an answer, never exit 2."""
    text = ("unload the model\nHi, i don't find how unload model. like i load a model, i delete the object and i call "
            "the garbage collector but it does nothing.\n")
    t = triage(text)
    assert t.verdict == "allocation-matches-plan" and t.cause == "another-process"


def test_a_hub_page_gives_the_size_a_titles_model_lacks():
    """vllm issue 4821: the title's "Llama 3" is the linked Llama-3-...-8b-instruct; a title with a size keeps it."""
    from kvaudit.triage.conclude import _model
    from kvaudit.triage.evidence import clean_lines, extract

    sizeless = extract(clean_lines("[Bug]: Llama 3 - Out of memory\nI use https://huggingface.co/rhaymison/"
                                   "Llama-3-portuguese-Tom-cat-8b-instruct and it OOMs"))
    assert _model(sizeless)[0].value == "rhaymison/Llama-3-portuguese-Tom-cat-8b-instruct"
    sized = extract(clean_lines("[Usage]: Running Llama 3 70B on A100\ntry https://huggingface.co/TechxGenus/"
                                "Meta-Llama-3-70B-Instruct-GPTQ"))
    assert _model(sized)[0].value.startswith("Llama 3 70B")


@pytest.mark.parametrize("name, width", [("Qwen3.8-27B NVFP4", 0.5), ("Llama-3-8B-bnb-4bit", 0.5),
                                         ("Qwen2.5-72B-Instruct-FP8", 1), ("Qwen2.5-7B", 2)])
def test_weights_from_a_name_take_the_checkpoints_width(name, width):
    from kvaudit.triage.causes import weights_per_rank
    from kvaudit.triage.sourced import Sourced

    got = weights_per_rank({"model": Sourced(name, "test")})
    assert got is not None and f"× {width:g} bytes" in got[1]


def test_nccl_reporting_the_device_out_of_memory_is_the_devices():
    """vllm issue 18446: "NCCL error ... unhandled cuda error" whose last error is "Cuda failure 'out of memory'"."""
    t = triage("[Bug]: OOM Error with Qwen3-235B-A22B on V1 Engine\n"
               "(VllmWorker rank=7 pid=240) torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/"
               "distributed/c10d/NCCLUtils.cpp:133, unhandled cuda error (run with NCCL_DEBUG=INFO for details)\n"
               "(VllmWorker rank=7 pid=240) ncclUnhandledCudaError: Call to CUDA function failed.\n"
               "(VllmWorker rank=7 pid=240) Last error:\n(VllmWorker rank=7 pid=240) Cuda failure 'out of memory'\n")
    assert t.verdict == "allocation-matches-plan"


def test_graph_capture_at_a_stated_utilization_near_1_is_the_utilizations():
    """vllm issue 57475: OOM capturing CUDA graphs at --gpu-memory-utilization 0.98; 0.97 boots."""
    text = ("[Bug] OOM during graph capture at high `--gpu-memory-utilization`\n"
            "vllm serve Qwen/Qwen3-8B --gpu-memory-utilization 0.98\n"
            "it crashes during CUDA-graph capture with `torch.OutOfMemoryError`.\n")
    assert triage(text).cause == "utilization-too-high"
    assert triage(text.replace("0.98", "0.9")).cause == "graph-capture"


def test_a_report_naming_a_changed_default_is_told_the_change_and_its_switch():
    """vllm issue 49224: Model Runner V2, the default for dense models from 0.25.0, reserved no CUDA graph memory."""
    t = triage("[Bug]: Model Runner V2 (now default for dense models) skips CUDA graph memory reservation\n"
               "vllm serve meta-llama/Llama-3.1-70B-Instruct -tp 8\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    assert t.cause == "default-changed" and any("VLLM_USE_V2_MODEL_RUNNER=0" in a for a in t.actions)



def test_the_schema_names_every_term_of_the_ledger():
    from kvaudit.triage.ledger import TERMS

    assert SCHEMA["properties"]["ledger"]["items"]["properties"]["term"]["enum"] == list(TERMS)


def test_a_refusal_the_reports_own_figures_show_needs_no_plan_and_asks_for_nothing():
    """vllm#34076: vLLM's refusal states both figures and its own estimate; the model (a family stand-in here) is not
    needed for the verdict, so nothing is asked for."""
    t = _triage("", (ROOT / "fixtures/startup-logs/cuda/vllm-34076-qwen3-coder-30b-fp8-pp2-5070ti-5090d.log").read_text())
    assert (t.verdict, t.cause) == (MATCHES_PLAN, "budget-too-small-for-max-model-len")
    assert t.inequality == "KV for one request of 262,144 tokens 24.00 GiB (line 11) > KV budget 3.18 GiB (line 11)"
    assert t.headline.startswith("vLLM refuses to start: KV for one request of 262,144 tokens 24.00 GiB")
    assert t.ask_for == ()
    assert t.actions[0].startswith("`--max-model-len 34736`: vLLM's own estimate of what the budget holds (line 11:")
    rows = {r["term"]: r for r in t.to_dict()["ledger"]}
    assert rows["KV for one request"]["reported"] == 24 * GiB and rows["KV budget"]["predicted"] is None
    assert "**What breaks**: KV for one request of 262,144 tokens 24.00 GiB (line 11) &gt; KV budget" in t.to_markdown()


def test_a_negative_budget_is_concluded_from_the_ledger_with_fixes_planned_again():
    """vllm#23278: gpt-oss-120b logs 65.97 GiB of weights and a KV budget of -2.14 GiB; kvaudit plans the utilization
    that holds one request and the TP whose ranks hold the report's weights, each checked by planning again."""
    from kvaudit.model.memory import default_gpu_memory_utilization

    skip_unless_planned("gpt-oss-120b")
    t = _triage("", (ROOT / "fixtures/startup-logs/cuda/vllm-23278-gpt-oss-120b-h100-negative-kv.log").read_text())
    assert (t.verdict, t.cause) == (MATCHES_PLAN, "no-room-for-kv-cache")
    assert t.inequality == "KV budget -2.14 GiB (line 9) ≤ 0"
    rows = {r["term"]: r for r in t.to_dict()["ledger"]}
    assert rows["weights"]["reported"] == round(65.9651 * GiB) and rows["weights"]["reported_at"].startswith("line 4:")
    assert rows["weights"]["predicted"] < rows["weights"]["reported"]  # kvaudit's own weighing, beside the report's
    need = rows["KV for one request"]["predicted"]
    T = rows["device memory"]["reported"]
    u = t.recommended_utilization
    ran = default_gpu_memory_utilization(None)  # the log names no release: the newest default is assumed
    assert u is not None and -round(2.14 * GiB) + (u - ran) * T >= need  # it holds one request
    assert -round(2.14 * GiB) + (u - 0.01 - ran) * T < need  # and 0.01 less does not
    assert any(a.startswith("`--tensor-parallel-size ") and a.endswith("(planned again).") for a in t.actions)


def test_a_refusal_kvaudit_predicts_but_the_report_does_not_show_is_not_concluded():
    """Llama 3.1 8B at 0.25 of a device kvaudit assumes: its prediction says vLLM would refuse, but the report shows an
    out-of-memory error instead, so the prediction decides nothing (the planner's refusal is said as before)."""
    t = triage("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 131072 --gpu-memory-utilization 0.25\n"
               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert t.verdict == INSUFFICIENT
    assert t.inequality.startswith("KV for one request of 131,072 tokens 16.00 GiB (predicted) > KV budget")


def test_an_answer_without_a_plan_still_shows_the_reports_own_ledger():
    """QwenLM/Qwen3#187 names a 72B model kvaudit does not plan here: its ledger holds the figures torch's message
    states and the weights the name implies, and the inequality they break is the answer's cause."""
    t = _triage("develop/QwenLM-Qwen3-187.txt")
    rows = {r["term"]: r for r in t.to_dict()["ledger"]}
    assert rows["outside this process"]["reported"] > 40 * GiB and rows["free when it ran out"]["reported"] > 0
    assert "from the model's name" in rows["weights"]["predicted_by"] and rows["weights"]["reported"] is None
    assert t.cause == "weights" and t.inequality.startswith("weights 134.11 GiB (predicted) > device memory")


def test_an_error_that_is_no_memory_error_gets_no_devices_advice():
    """vllm#1518: an AWQ kernel's illegal memory access (fixed by a vLLM upgrade): the answer points at the error,
    not at compute capabilities or dtypes, which only a device's own failure calls for."""
    t = _triage("held-out-1/vllm-1518.txt")
    assert (t.verdict, t.cause) == ("plan-not-involved", "not-out-of-memory")
    assert t.actions[0].startswith("Fix the error the traceback ends in (line 1: `codellama-13b-awq RuntimeError: CUDA")
    assert "compute capability" not in " ".join(t.actions)


@pytest.mark.parametrize("line, named", [
    ("python -m vllm.entrypoints.openai.api_server -model /model/Qwen2-7B", "/model/Qwen2-7B"),  # QwenLM/Qwen3#845
    ("Deploy ModelScope/ZhipuAI/glm-4-9b-chat-1m from modelscope", "ModelScope/ZhipuAI/glm-4-9b-chat-1m"),  # gpustack#1342
    ("    --model /mnt/data/ai-ground/models/Qwen/Qwen2.5-VL-72B-Instruct \\",
     "/mnt/data/ai-ground/models/Qwen/Qwen2.5-VL-72B-Instruct"),  # modelscope/ms-swift#5424
    ("cd /home/qwen/run.py", None),  # a folder on the way is no model
    ("see /models/Qwen2-7B/config.json", None),
])
def test_a_model_named_by_its_path_is_the_whole_path_to_its_last_folder(line, named):
    ev = extract(clean_lines(line))
    assert ({f.value for f in ev.all("model_mention")} or {None}) == {named}


@pytest.mark.parametrize("line, named", [
    ("I used vllm 0.8.0 to deploy whisper-large-v3-turbo . The model is only 1.6G", "whisper-large-v3-turbo"),  # vllm#15216
    ("04-GLM-4-9B-Chat vLLM 部署调用显存溢出问题", "GLM-4-9B-Chat"),  # datawhalechina/self-llm#162: a numbered heading
    ("python -m vllm.entrypoints.openai.api_server then load opt-125m", "opt-125m"),
    ("we compared it with GPT-4 and Aria", None),  # a closed model; a family's name alone is a word
    ("step1: clone my-qwen-finetune", None),  # an English word with a digit; a name's tail
])
def test_a_model_of_a_family_in_vllms_registry_is_read_where_a_digit_follows_its_name(line, named):
    """Families come from vLLM's own registry (``model_families.json``, written by ``scripts/model_families.py``)."""
    ev = extract(clean_lines(line))
    assert ({f.value for f in ev.all("model_mention")} or {None}) == {named}


def test_settings_in_a_reporters_shorthand_are_read_and_a_device_count_is_no_part_of_a_models_name():
    """vllm#3285: the title "Mixtral 4x 4090 OOM" names the model and the rig; the text "TP 4, model len 1000"."""
    ev = extract(clean_lines("Mixtral 4x 4090 OOM\nHi! TP 4, model len 1000, enforce eager; RTX 4090 TP 4090"))
    assert [f.value for f in ev.all("model_mention")] == ["Mixtral"]
    assert [f.value for f in ev.all("tp_prose")] == [4] and [f.value for f in ev.all("mml_prose")] == [1000]
    assert [f.value for f in extract(["Running Llama 3 70B on A100"]).all("model_mention")] == ["Llama 3 70B"]
    ev = extract(clean_lines("a title\nThe model loads fine. Weights take 22 GB. Then the first request crashes\n"
                             "weight decay takes 3 epochs"))  # (a blog on a 5090: the reporter states the weights)
    assert [f.value for f in ev.all("weights")] == [22 << 30]


@pytest.mark.parametrize("line, grew", [
    ("然而在1个多小时之后，vllm显存占用变成了18G，2个小时后占用变成了20G", True),  # QwenLM/Qwen3-VL#55
    ("GPU memory was 30 GB, after 2 hours it is 38 GB", True),
    ("memory 40GB, after 3 hours 20GB", False),  # (it fell)
    ("GPU memory 24 GB and it takes 2 hours to load", False),
])
def test_device_memory_measured_rising_over_time_is_growth(line, grew):
    assert (extract(clean_lines("a title\n" + line)).first("memory_growth") is not None) is grew


def test_a_titles_model_is_the_fullest_name_the_text_gives_it():
    """A blog's title names "Qwen3.5-35B"; its text the checkpoint, cyankiwi/Qwen3.5-35B-A3B-AWQ-4bit, whose 4-bit
    weights are a quarter of what the title's name would give. Two fuller names that differ leave the title's."""
    t = triage("Running Qwen3.5-35B on an RTX 5090\nThe model in question is cyankiwi/Qwen3.5-35B-A3B-AWQ-4bit, a "
               "community quantization.\nRuntimeError: CUDA out of memory")
    assert t.deployment["model"].value == "cyankiwi/Qwen3.5-35B-A3B-AWQ-4bit"
    from kvaudit.triage.conclude import _fullest
    from kvaudit.triage.evidence import Fact

    said = [Fact("model_mention", name, n, name) for n, name in enumerate(("Qwen", "Qwen2-7B", "Qwen2-72B"))]
    assert _fullest(said[0], said) is said[0]
    assert _fullest(said[0], said[:2]) is said[1]


def test_the_model_families_are_those_of_the_registries_of_the_tested_vllms():
    """``model_families.json`` is what ``scripts/model_families.py`` reads from the installed vLLM's registry (with
    ``ast``): a family vLLM adds or drops shows here first."""
    import importlib.util
    from pathlib import Path

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import model_families
    finally:
        sys.path.pop(0)
    registry = Path(importlib.util.find_spec("vllm").origin).parent / "model_executor" / "models" / "registry.py"
    found, _ = model_families.families(registry)
    shipped = set(json.loads((ROOT / "kvaudit" / "triage" / "model_families.json").read_text())["families"])
    assert found <= shipped and {"whisper", "glm", "opt", "internlm", "mistral"} <= shipped
    assert not shipped & model_families.EXCLUDED


def test_curly_quotes_a_forum_printed_are_read_as_the_straight_ones_the_log_had():
    """discuss.vllm.ai#1602: Discourse turned the quotes of the pasted start-up log curly."""
    ev = extract(clean_lines("INFO 09-13 13:31:16 [cli_args.py:261] non-default args: {\u2018model_tag\u2019: "
                             "\u2018mistralai/Mistral-7B-Instruct-v0.2\u2019, \u2018max_model_len\u2019: 16384}"))
    assert ev.value("max_model_len") == 16384
    assert clean_lines("\u201cquoted\u201d") == ['"quoted"']


def test_a_lower_utilization_recommended_is_planned_again_against_one_request():
    """vllm#27508: freeing the failing request's shortfall lowers the utilization to 0.938; planned again with vLLM,
    that budget no longer holds one request of the 32,768 tokens the report runs, so the max_model_len vLLM's
    estimate gives for it comes with the advice. vllm#15598's lower utilization still holds its 16,384 tokens."""
    skip_unless_planned()
    t = triage((ROOT / "fixtures/reports/threads/vllm-27508.txt").read_text())
    again = [a for a in t.actions if a.startswith("Planned again")]
    assert t.recommended_utilization == 0.938 and len(again) == 1
    assert "no longer holds one request of 32,768 tokens" in again[0] and "`--max-model-len 27776`" in again[0]
    t = triage((ROOT / "fixtures/reports/threads/vllm-15598.txt").read_text())
    assert any(a.startswith("Planned again at `--gpu-memory-utilization 0.974`") and "still holds one request of "
               "16,384 tokens" in a for a in t.actions)


def test_lscpus_model_name_in_collect_env_names_the_cpu_not_the_model():
    """vllm-project/vllm-ascend#6299 pastes collect_env.py's CPU section: "Model name: Kunpeng-920" is lscpu's."""
    cpu = ["CPU:", "Architecture:                    aarch64", "CPU op-mode(s):                  64-bit",
           "Vendor ID:                       HiSilicon", "Model name:                      Kunpeng-920"]
    assert extract(clean_lines("\n".join(cpu))).value("model_prose") is None
    assert extract(clean_lines("Model name: Qwen2.5-7B-Instruct")).value("model_prose") == "Qwen2.5-7B-Instruct"


@pytest.mark.parametrize("text, key, value", [
    ("I'm on vllm 0.10.1.1", "vllm_prose", "0.10.1.1"),  # four release segments (PEP 440)
    ("I serve `microsoft/phi-2` with it", "model_prose", "microsoft/phi-2"),  # a Hub id quoted as code
    ("模型 `vikhyatk/moondream2`，还是报错", "model_prose", "vikhyatk/moondream2"),
    ("settings: model: microsoft/phi-2, dtype: bfloat16", "model", "microsoft/phi-2"),  # a setting's name and value
    ("$ vllm serve org/m --max-model-len=8192 -tp 2\n\\\n    --dtype=float16", "dtype", "float16"),  # a lone "\"
    ("$ vllm serve org/m --max-model-len=8192 -tp 2\n-pp 1 \\\n    --dtype=float16", "dtype", "float16"),
    ("vllm serve org/m --gpu-memory-utilization 0.5\n--max-model-len 2048 --dtype\nfloat16", "dtype", "float16"),
])
def test_settings_a_paste_wraps_or_words_its_own_way_are_read(text, key, value):
    """Forms the round trip (tests/test_roundtrip.py) draws, each on its own: a miss of one of them alone stays under
    that test's 1 %."""
    assert extract(clean_lines(text)).value(key) == value


@pytest.mark.parametrize("text", ["the model: the 7B one", "see `vllm/v1/worker/gpu_worker.py`", "model=it"])
def test_a_model_is_stated_as_a_hub_id_or_a_path_not_as_a_word(text):
    ev = extract(clean_lines(text))
    assert ev.value("model") is None and ev.value("model_prose") is None


@pytest.mark.parametrize("printed, snapped", [("95.01", "rtx-pro-6000-96g"), ("94.97", None), ("47.53", None),
                                              ("184.31", "gb200-186g")])
def test_a_total_printed_by_torch_is_a_device_kinds_only_where_it_prints_that_kinds_figure(printed, snapped):
    """torch rounds the total to 0.01 GiB: a figure equal to a kind's (95.01: an RTX PRO 6000) is that kind's exact
    bytes; a neighbour's (94.97, another driver's total; 47.53 beside the A6000's 47.54) stays the report's own."""
    from kvaudit.model.deployment import DEVICES
    from kvaudit.triage.conclude import _device_memory

    ev = extract(clean_lines(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
                             f"total capacity of {printed} GiB of which 1.00 MiB is free.\n"))
    got = _device_memory(ev, "cuda")
    want = DEVICES[snapped].memory_bytes if snapped else round(float(printed) * GiB)
    assert abs(got.value - want) < 1 << 20 and (snapped or "→" not in got.source)
    assert snapped is None or got.source.endswith(f"→ {snapped} ({DEVICES[snapped].source})")
