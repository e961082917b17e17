"""kvaudit.triage.loglines against its own catalogue: every format rendered with generated values reads back as those
values, prose and tracebacks give no facts, and a 1 MB paste reads fast."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvaudit.triage import loglines
from kvaudit.triage.loglines import CATALOGUE, read_line
from kvaudit.versions import version_key

from conftest import ROOT

pytestmark = pytest.mark.fast

SCALE = {"GiB": float(1 << 30), "GB": 1e9, "MiB": float(1 << 20), "MB": 1e6}
NEGATIVE = {"available_kv", "kv_cache_memory_to_requested", "kv_cache_memory_to_gpu_limit", None}
"""Facts a log may print below zero (a KV budget that weights and activations already overran)."""
TEXTS = ["GPU", "NPU", "decode", "FULL_AND_PIECEWISE", "cuda:0", "Qwen/Qwen3-8B", "0"]
IDS = [f"{i}-{e['package']}-{e['kind']}-{e['releases'][0]}" for i, e in enumerate(CATALOGUE)]


def _value(unit: str, key: str | None):
    """A strategy for one placeholder's value."""
    low = key in NEGATIVE
    if unit in SCALE:
        return st.floats(-64.0 if low else 0.0, 2048.0, allow_nan=False, allow_infinity=False)
    if unit == "bytes":
        return st.integers(-(1 << 40) if low else 0, 1 << 42)
    if unit == "int":
        return st.integers(0, 10 ** 8)
    if unit == "float":
        return st.floats(0.0, 1e4, allow_nan=False, allow_infinity=False)
    if unit == "ratio":
        return st.floats(0.01, 1.0, allow_nan=False)
    return st.sampled_from(TEXTS)


def _printed(value, unit: str, expr: str, spec: str, commas: bool) -> str:
    """A value as the source prints it: by its spec, else as ``format_gib`` (two decimals) or ``str`` would."""
    if spec and spec not in ("s", "r"):
        return format(int(value) if spec[-1] in "di" else value, spec)
    if unit == "text":
        return str(value)
    if unit in SCALE and (expr.startswith("format_gib(") or spec == "s"):
        return str(round(value, 2))
    if unit in ("int", "bytes") and commas:
        return f"{value:,}"
    return str(value)


def render(entry: dict, values: list, commas: bool) -> tuple[str, list[str]]:
    """The line an entry's format prints for ``values`` (a %-format by Python's ``%`` with each argument of its
    directive's type; an f-string by each value formatted with its spec), and each value's printed text."""
    slots = loglines.placeholders(entry)
    printed = [_printed(v, u, expr, spec, commas) for v, u, (expr, _conv, spec) in zip(values, entry["units"], slots)]
    if entry["style"] == "percent":
        args = []
        for (directive, _conv, spec), text, v in zip(slots, printed, values):
            kind = spec[-1]
            args.append(int(v) if kind in "diu" else float(v) if kind in "eEfFgG" else text)
        return entry["format"] % tuple(args), printed
    out, n = [], 0
    for p in loglines.pieces(entry):
        if p is None:
            out.append(printed[n])
            n += 1
        else:
            out.append(p)
    return "".join(out), printed


def _expected(value, unit: str, printed: str):
    """The value a reader should give, and how far off the printed precision lets it be."""
    if unit == "text":
        return value, 0
    mantissa = printed.lower().split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    step = 0.5 * 10 ** -decimals
    if unit in SCALE:
        return value * SCALE[unit], (max(step, abs(value) * 1e-9) + 1e-12) * SCALE[unit] + 1
    if unit in ("int", "bytes"):
        return int(value), 0
    return float(value), max(step, abs(float(value)) * 1e-9) + 1e-12


@pytest.mark.parametrize("entry", CATALOGUE, ids=IDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_format_reads_back_what_it_prints(entry, data):
    values = [data.draw(_value(u, k), label=f"slot {i} ({k}, {u})")
              for i, (u, k) in enumerate(zip(entry["units"], entry["fact_keys"]))]
    commas = data.draw(st.booleans(), label="thousands separators where %s or a bare {} prints an int")
    line, printed = render(entry, values, commas)
    prefix = data.draw(st.sampled_from(["", "INFO 12-01 10:11:12 [gpu_worker.py:321] ",
                                        "(EngineCore_DP0 pid=4242) WARNING 12-01 10:11:12 [core.py:88] ",
                                        "[vllm-ascend] [worker] ", "ValueError: ", "> "]), label="log prefix")
    found = [facts for e, facts in loglines.match_line(prefix + line) if e is entry]
    assert found, f"{entry['format']!r} does not read its own line {prefix + line!r}"
    facts = found[0]
    want = [(k, *_expected(v, u, p)) for k, u, v, p in zip(entry["fact_keys"], entry["units"], values, printed) if k]
    want += [(k, entry["anchor"], 0) for k in entry.get("marks", [])]
    assert [k for k, _ in facts] == [k for k, _, _ in want], line
    for (key, got), (_, value, tol) in zip(facts, want):
        if isinstance(value, str):
            assert got == value, (key, line)
        else:
            assert abs(got - value) <= tol, (key, got, value, tol, line)
    for key, got in facts:  # and read_line gives them too, each once
        assert (key, got) in read_line(prefix + line)


def test_negative_budgets_and_gib_printed_as_gb():
    assert read_line("INFO 01-02 03:04:05 [gpu_worker.py:1] Available KV cache memory: -2.14 GiB") == [
        ("available_kv", round(-2.14 * (1 << 30)))]
    assert read_line("Available memory: -123456789, total memory: 65452113920") == [
        ("available_kv", -123456789), ("device_memory", 65452113920)]
    # vLLM up to 0.7 and every vllm-ascend release print "GB" for a figure divided by float(2**30)
    assert read_line("INFO [model_runner.py:1] Loading model weights took 1.0000 GB") == [("weights", 1 << 30)]
    gb = [e for e in CATALOGUE if e["format"] == "Loading model weights took %.4f GB"]
    assert gb and all(e["units"] == ["GiB"] and "float(2 ** 30)" in e["notes"][0] for e in gb)


def test_a_refusal_reads_whole_even_cut_short():
    line = ("ValueError: To serve at least one request with the model's max seq len (262144), (24.00 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (11.52 GiB). Based on the available memory, "
            "the estimated maximum model length is 125728. Try increasing `gpu_memory_utilization` (which also ...")
    facts = dict(read_line(line))
    assert facts == {"max_model_len": 262144, "kv_needed": 24 << 30, "available_kv": round(11.52 * (1 << 30)),
                     "kv_capacity_error": "To serve at least one request with the model's max seq len",
                     "estimated_max_model_len": 125728}
    assert dict(read_line("  RuntimeError: No available memory for the cache blocks. Try increas")) == {
        "kv_capacity_error": "No available memory for the cache blocks"}


PROSE = [
    "the weather is nice today, and the GPU has 80 GiB of memory",
    "I set gpu_memory_utilization to 0.9 and the KV cache is too small, 12 GiB available",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/site-packages/vllm/v1/worker/gpu_worker.py", line 277, in '
    "determine_available_memory",
    '  File "/usr/local/lib/python3.11/site-packages/vllm_ascend/worker/worker.py", line 381, in '
    "determine_available_memory",
    "    available_kv_cache_memory = total_npu_memory * self.cache_config.gpu_memory_utilization - peak_memory",
    '    logger.info("Available KV cache memory: %s GiB", format_gib(self.available_kv_cache_memory_bytes))',
    '    f"Available memory: {available_kv_cache_memory}, total memory: {total_npu_memory}"',
    "INFO 12-01 10:11:12 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
    "throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%",
    "vllm                              0.11.0",
    "| 0     910B3               | OK            | 95.2        45                0    / 0             |",
    "",
]


@pytest.mark.parametrize("line", PROSE)
def test_prose_and_traceback_frames_give_no_facts(line):
    assert read_line(line) == []


def test_the_catalogue_spans_the_releases_and_vllm_ascend():
    seen: dict[str, set[str]] = {}
    for e in CATALOGUE:
        seen.setdefault(e["package"], set()).update(e["releases"])
    assert len(seen.get("vllm", ())) >= 8, sorted(seen.get("vllm", ()), key=version_key)
    assert seen.get("vllm-ascend")
    kinds = {e["kind"] for e in CATALOGUE if e["package"] == "vllm-ascend"}
    assert {"available_kv", "ascend_available_memory", "weights", "profile_breakdown"} <= kinds


def test_every_entry_is_well_formed_and_compiles():
    raw = json.loads((ROOT / "kvaudit" / "triage" / "log_formats.json").read_text())
    assert raw == CATALOGUE and len(raw) > 50
    documented = set(re.findall(r"``(\w+)``", loglines.__doc__ or ""))
    units = {"GiB", "GB", "MiB", "MB", "bytes", "int", "float", "ratio", "text"}
    formats = set()
    for e in raw:
        assert e["style"] in ("percent", "fstring", "brace") and e["package"] in ("vllm", "vllm-ascend")
        assert len(e["fact_keys"]) == len(e["units"]) == len(loglines.placeholders(e)), e["format"]
        assert set(e["units"]) <= units, e["units"]
        assert any(e["fact_keys"]) or e.get("marks"), e["format"]
        assert {k for k in e["fact_keys"] if k} | set(e.get("marks", [])) <= documented, e["format"]
        lo, hi = e["releases"]
        assert version_key(lo) <= version_key(hi)
        assert e["source"].startswith(("vllm/", "vllm_ascend/")) and e["source"].endswith(".py")
        assert loglines.compile_entry(e).pattern
        formats.add((e["package"], e["format"], tuple(e["fact_keys"])))
    assert len(formats) == len(raw), "a format is listed twice: its releases should be one range"
    assert loglines.anchors() and all(isinstance(a, str) for a in loglines.anchors())


def _paste(n: int = 10_000) -> list[str]:
    """A pasted start-up log of ``n`` lines (about 1 MB): the catalogue's own lines among ordinary ones."""
    filler = [
        "INFO 12-01 10:11:12 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
        "throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%",
        "(EngineCore_DP0 pid=4242) INFO 12-01 10:11:12 [parallel_state.py:1165] rank 0 in world size 1 is assigned "
        "as DP rank 0, PP rank 0, TP rank 0, EP rank 0",
        '  File "/usr/local/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 83, in __init__ xxxxxxxxxxxx',
        "(Worker_TP1 pid=777) INFO 12-01 10:11:13 [default_loader.py:267] Loading weights took 12.34 seconds and so on",
        "Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01,  1.62it/s] ..................",
        "I am running Qwen3-Next-80B on 4 x 910B3 with --gpu-memory-utilization 0.9 and it runs out of memory.....",
    ]
    rendered = []
    for e in CATALOGUE:
        values = [TEXTS[0] if u == "text" else 0.5 if u == "ratio" else 1234 if u in ("int", "bytes") else 12.5
                  for u in e["units"]]
        rendered.append("INFO 12-01 10:11:12 [x.py:1] " + render(e, values, commas=True)[0])
    lines = []
    i = 0
    while len(lines) < n:
        lines.append(rendered[i % len(rendered)] if i % 20 == 0 else filler[i % len(filler)])
        i += 1
    return lines


def test_every_catalogued_line_of_a_1mb_paste_is_read():
    """(Its speed is bench/triage_parse.py's to measure, not a test's.)"""
    lines = _paste()
    assert 0.8e6 < sum(len(x) + 1 for x in lines) < 1.6e6
    facts = [read_line(x) for x in lines]
    assert sum(map(bool, facts)) >= 400


def test_reading_imports_neither_torch_nor_vllm():
    code = ("import sys, kvaudit.triage.loglines as l; l.read_line('Available KV cache memory: 1.0 GiB'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'vllm_ascend')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_a_line_cut_short_gives_the_figures_before_the_cut_and_none_after():
    """vLLM 0.18-0.24's profile breakdown (vllm/v1/worker/gpu_worker.py) as a paste cuts it: each figure read with
    the words that say what it is ("GiB for weight"); a figure whose words were cut is not read."""
    gib = 1 << 30
    line = ("(Worker_TP1 pid=1) INFO [gpu_worker.py:857] Free memory on device (77.78/79.33 GiB) on startup. Desired GPU "
            "memory utilization is (0.85, 67.43 GiB). Actual usage is 16.92 GiB for weight, 5.66 GiB for peak "
            "activation, 0.13 GiB for non-torch memory, and 1.34 GiB for CUDAGraph memory.")
    got = dict(read_line(line))
    assert {k: round(v / gib, 2) for k, v in got.items() if k in ("profiled_weights", "cudagraph_memory")} == {
        "profiled_weights": 16.92, "cudagraph_memory": 1.34}
    cut = dict(read_line(line[:line.index("for weight") + len("for wei")]))
    assert round(cut["requested_memory"] / gib, 2) == 67.43 and "profiled_weights" not in cut


def test_a_string_inside_a_replacement_field_is_skipped_whole():
    """f-string fields hold string literals (``{d['}']}``, ``{x!r:>{w}}``): a brace or quote inside one ends nothing."""
    from kvaudit.triage.loglines import _field_end, _split_field

    fmt = "used {d['}'] + \"a'\"} GiB"
    assert fmt[_field_end(fmt, fmt.index("{"))+1:] == " GiB"
    assert _split_field("stats['a:b']!r:>8") == ("stats['a:b']", "r", ">8")


@pytest.mark.parametrize("line, marked", [
    # QwenLM/Qwen3#110: V0's refusal retyped by hand, with a typo and no figure of the KV cache's tokens
    ("ValueError : the model's max seq len (32768) is larger than the maxinum number of tokens that can be stored in "
     "KV cache, Try increasing 'gpu_memory_utilization' or decreasing 'max_model_len' when initializing the engine",
     True),
    ("the model's max seq len is larger than what the KV cache holds", False),  # a paraphrase of a few of its words
    ("the KV cache uses a lot of memory on my GPU", False),
    # pat-jj/s3#10 (held-out-14): the refusal's anchor, the phrase it is known by, retold in lower case in a sentence
    ("I ran train_s3.sh using 30904 and received the error no available memory for the cache blocks during allocation.",
     True),
    ("there is available memory for the cache blocks, yet it fails", False),  # (the anchor's "no" is one of its words)
])
def test_a_refusal_retyped_by_hand_is_read_as_vllms_by_four_in_five_of_its_words(line, marked):
    from kvaudit.triage.evidence import extract

    assert any(key == "kv_capacity_error" for key, _ in loglines.retyped(line)) is marked
    assert (extract([line]).first("kv_capacity_error") is not None) is marked  # (read where no format matches)
