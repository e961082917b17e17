"""Round trip of triage's reading and ledger: deployments and faults drawn at random, rendered as a report the way vLLM
logs it (the catalogue of vLLM's own format strings, ``kvaudit/triage/log_formats.json``; torch's out-of-memory message
as ``c10/cuda/CUDACachingAllocator.cpp`` words it), with the settings written the way users write them (a command
line, ``=`` forms and aliases, backticks in a sentence, a Chinese sentence, ``LLM(...)``, an argument list in an
environment variable) and the noise of a paste (ANSI colours, log prefixes with timestamps, lines wrapped at 80-120
columns, excerpts cut with ``[...]``). Triage must recover the stated settings and the injected fault (the inequality
of vLLM's budget it breaks) on 99 % of them; a miss must name the term it could not read.

This tests the reading and the ledger; it is not a substitute for real reports (``tests/test_triage_threads.py``)."""

from __future__ import annotations

import json
import random
import re
import textwrap

import pytest

from conftest import ROOT
from kvaudit.triage import ledger
from kvaudit.triage.causes import deciding_terms
from kvaudit.triage.conclude import _model
from kvaudit.triage.evidence import clean_lines, extract
from kvaudit.triage.loglines import pieces, placeholders

GiB = 1 << 30
CATALOGUE = json.loads((ROOT / "kvaudit" / "triage" / "log_formats.json").read_text())
FAULTS = ("none", "no-room-for-kv-cache", "budget-too-small-for-max-model-len", "another-process", "outside-budget",
          "undecided")
"""The injected faults: each inequality of the ledger broken by the report's figures; none broken (the title still says
the device ran out); "undecided": the device ran out with none of the figures that decide why (no torch line, no smi
table). Where nothing breaks, triage must not conclude, and names the terms that would decide instead
(``kvaudit.triage.causes.DECIDING``)."""
N = 10_000


def _entries(*keys: str) -> list[dict]:
    """The catalogue's formats whose first read placeholder is one of ``keys`` (every release's wording)."""
    return [e for e in CATALOGUE if e["fact_keys"] and e["fact_keys"][0] in keys and e["fact_keys"][0] is not None]


BUDGET = [e for e in _entries("available_kv") if len([k for k in e["fact_keys"] if k]) == 1]
WEIGHTS = [e for e in _entries("weights") if [k for k in e["fact_keys"] if k] == ["weights"]]
REFUSAL = [e for e in CATALOGUE if e["kind"] == "max_seq_len_kv_needed"]


def _gib(b: int, spec: str, expr: str) -> str:
    """A byte figure as vLLM's placeholder prints it: ``format_gib`` (two decimals, trailing zeros dropped) or a
    fixed-point spec."""
    if "format_gib" in expr or spec in ("", "s"):
        return f"{round(b / GiB, 2):.2f}".rstrip("0").rstrip(".")
    digits = int(re.search(r"\.(\d+)f", spec)[1]) if re.search(r"\.(\d+)f", spec) else 2
    return f"{b / GiB:.{digits}f}"


def render(entry: dict, values: list) -> str:
    """An entry's message with ``values`` in its placeholders, in order (bytes for GiB units)."""
    values = list(values) + [12.5] * (len(entry["units"]) - len(values))  # (a duration, where no figure is read)
    out, slots = [], iter(zip(placeholders(entry), entry["units"], values))
    for piece in pieces(entry):
        if piece is not None:
            out.append(piece)
            continue
        (expr, _conv, spec), unit, value = next(slots)
        if spec.startswith("%"):  # a %-format's directive
            spec = spec[1:]
        out.append(_gib(value, spec, expr) if unit == "GiB" else f"{value:,}" if spec == "," else
                   f"{value:.6f}" if unit == "float" else str(value))
    return "".join(out)


MODELS = sorted(p.name.replace("--", "/", 1) for p in (ROOT / "fixtures" / "architectures").iterdir() if p.is_dir())
"""The models drawn: the Hub ids of fixtures/architectures (every family kvaudit reads configs of)."""
RELEASES = ("0.6.3.post1", "0.8.5", "0.10.1.1", "0.11.0", "0.23.0", "0.33.0")


def _settings(rng: random.Random, s: dict) -> list[str]:
    """The deployment's settings, in one of the ways users write them."""
    m, u, mml, tp, pp, dt = s["model"], s["util"], s["mml"], s["tp"], s["pp"], s["dtype"]
    form = rng.randrange(7)
    if form == 0:
        return [f"vllm serve {m} --gpu-memory-utilization {u} --max-model-len {mml} --tensor-parallel-size {tp} "
                f"--pipeline-parallel-size {pp} --dtype {dt}"]
    if form == 1:
        return [f"$ vllm serve {m} --gpu-memory-utilization={u} --max-model-len={mml} -tp {tp} -pp {pp} \\",
                f"    --dtype={dt} --trust-remote-code"]
    if form == 2:
        return [f"I serve `{m}` with `--gpu-memory-utilization={u}` and `--max-model-len {mml}` on TP={tp}, PP={pp}, "
                f"`--dtype {dt}`."]
    if form == 3:
        return [f"模型 `{m}`，我使用了--gpu-memory-utilization {u} 参数启动，--max-model-len {mml}，TP={tp}，PP={pp}，"
                f"--dtype {dt}，还是报错"]
    if form == 4:
        return ["from vllm import LLM", f'llm = LLM(model="{m}", gpu_memory_utilization={u}, max_model_len={mml},',
                f'          tensor_parallel_size={tp}, pipeline_parallel_size={pp}, dtype="{dt}")']
    if form == 5:
        return [f'VLLM_ARGS="--model {m} --gpu-memory-utilization={u} --max-model-len={mml} --tensor-parallel-size={tp} '
                f'--pipeline-parallel-size={pp} --dtype={dt}"']
    return [f"settings: model: {m}, gpu_memory_utilization: {u}, max_model_len={mml}, tensor_parallel_size: {tp}, "
            f"pipeline_parallel_size={pp}, dtype: {dt}"]


def _release(rng: random.Random, v: str) -> str:
    """The release, as a report states it: pip's pin, collect_env's line, or the user's own words."""
    return rng.choice([f"vllm=={v}", f"vLLM Version: {v}", f"I'm on vllm {v}"])


def _oom(s: dict, tried: int, free: int, processes: list[int]) -> str:
    held = " ".join(f"Process {1000 + i} has {p / GiB:.2f} GiB memory in use." for i, p in enumerate(processes))
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried / GiB:.2f} GiB. GPU 0 has a total "
            f"capacity of {s['T'] / GiB:.2f} GiB of which {free / GiB:.2f} GiB is free. {held} Of the allocated memory "
            f"{(processes[0] - GiB) / GiB:.2f} GiB is allocated by PyTorch, and 0.50 GiB is reserved by PyTorch but "
            "unallocated.")


_PREFIX = "(EngineCore_DP0 pid={pid}) {level} 12-05 {h:02d}:{m:02d}:{sec:02d} [{file}] "


def _logged(rng: random.Random, message: str, file: str, level: str = "INFO") -> str:
    prefix = _PREFIX.format(pid=rng.randrange(100, 9999), level=level, h=rng.randrange(24), m=rng.randrange(60),
                            sec=rng.randrange(60), file=file)
    if rng.random() < 0.3:  # a terminal's colours
        prefix = prefix.replace(level, f"\x1b[32m{level}\x1b[0m")
    return prefix + message


def report(seed: int) -> tuple[str, dict, str]:
    """A report drawn from ``seed``: its text, the settings it states, and the fault it holds."""
    rng = random.Random(seed)
    T = rng.choice([24, 40, 48, 64, 80, 96, 141]) * GiB
    s = dict(T=T, util=rng.choice([0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.92, 0.95]),
             mml=rng.choice([2048, 4096, 8192, 16384, 32768, 65536, 131072]), tp=rng.choice([1, 2, 4, 8]),
             pp=rng.choice([1, 2]), model=rng.choice(MODELS), dtype=rng.choice(["auto", "bfloat16", "float16"]),
             vllm=rng.choice(RELEASES))
    fault = FAULTS[seed % len(FAULTS)]
    budget = int(T * s["util"])
    lines = [f"[Bug]: OOM with vLLM on {T // GiB} GB", _release(rng, s["vllm"]), *_settings(rng, s), "```"]
    weights = rng.randrange(budget // 10, budget // 2)
    if fault == "no-room-for-kv-cache":  # the weights and the profile's terms take the whole budget, or more
        weights = rng.randrange(budget - 4 * GiB, budget + budget // 5)
    lines.append(_logged(rng, render(rng.choice(WEIGHTS), [weights, 12.5]), "gpu_model_runner.py:2007"))
    kv = budget - weights - rng.randrange(GiB, 4 * GiB)
    if fault == "no-room-for-kv-cache":
        kv = min(kv, 0)
    need = rng.randrange(kv // 4, kv // 2) if kv > 4 else GiB
    if fault == "budget-too-small-for-max-model-len":
        need = kv + rng.randrange(GiB // 4, 20 * GiB)
    lines.append(_logged(rng, render(rng.choice(BUDGET), [kv]), "gpu_worker.py:276"))
    if rng.random() < 0.5:
        lines.append("[...]")
    if fault == "budget-too-small-for-max-model-len":
        entry = rng.choice(REFUSAL)
        message = render(entry, [s["mml"], need, kv, "Try increasing `gpu_memory_utilization`"][:len(entry["units"])])
        lines.append(_logged(rng, "ValueError: " + message, "core.py:1195", "ERROR"))
    elif fault in ("another-process", "outside-budget"):
        others = [rng.randrange(GiB, T // 16) for _ in range(rng.randrange(1, 4))]
        if fault == "another-process":  # what the other processes hold breaks the headroom the utilization leaves
            others[0] += int((1 - s["util"]) * T) + GiB
        mine = T - sum(others) - GiB // 2
        if fault == "outside-budget":
            others = []
            mine = T - GiB // 2
            lines += ["Traceback (most recent call last):",
                      '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 1203,'
                      " in execute_model",
                      '  File "/usr/local/lib/python3.12/dist-packages/lmcache/v1/memory_management.py", line 1285, '
                      "in allocate",
                      "    buffer = torch.empty(size, dtype=torch.uint8, device=self.device)"]
        lines.append(_oom(s, rng.randrange(GiB, 3 * GiB), GiB // 2, [mine] + others))
    elif fault == "undecided":  # the error without torch's figures: vLLM's frame, then the runtime's bare line
        lines += ["Traceback (most recent call last):",
                  '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 1203,'
                  " in execute_model",
                  rng.choice(["RuntimeError: CUDA error: out of memory",
                              "torch.OutOfMemoryError: CUDA out of memory.",
                              "RuntimeError: NPU out of memory."])]
    lines.append("```")
    width = rng.randrange(80, 121)
    if rng.random() < 0.5:  # a paste wrapped at the terminal's width
        lines = [part for line in lines for part in (textwrap.wrap(line, width, break_long_words=True,
                                                                   break_on_hyphens=False) or [""])]
    return "\n".join(lines), s, fault


def triaged(text: str) -> tuple[dict, ledger.Breach | None, ledger.Ledger]:
    """What triage reads of a report's settings and the breach its ledger finds ("undecided" where none breaks and the
    report lacks a deciding term)."""
    ev = extract(clean_lines(text))
    model = _model(ev)[0]
    got = {"util": ev.value("gpu_memory_utilization"), "mml": ev.value("max_model_len"), "tp": ev.value("tp"),
           "pp": ev.value("pp"), "model": model.value if model is not None else None, "dtype": ev.value("dtype"),
           "vllm": ev.value("vllm_version") or ev.value("vllm_prose")}
    oom = ev.value("oom")
    stated = {"device memory": (oom.total, "line 1: oom")} if oom is not None and oom.total else {}
    led = ledger.build(ev, stated=stated, utilization=got["util"])
    breach = led.breach()
    if breach is None and deciding_terms(ev, {}):
        breach = ledger.Breach("undecided", "", deciding_terms(ev, {})[0])
    return got, breach, led


def test_a_drawn_report_is_what_it_says():
    """The generator itself: each fault's figures break its inequality, and the rest do not."""
    for seed in range(50):
        text, s, fault = report(seed)
        assert f"{s['mml']}" in text and fault in FAULTS


def test_triage_recovers_the_settings_and_the_fault_of_10000_drawn_reports():
    misses = []
    for seed in range(N):
        text, s, fault = report(seed)
        got, breach, led = triaged(text)
        want = {k: s[k] for k in ("util", "mml", "tp", "pp", "model", "dtype", "vllm")}
        cause = breach.cause if breach is not None else "none"
        if got != want or cause != ("undecided" if fault == "none" else fault):  # (an OOM titled, nothing broken)
            misses.append((seed, fault, cause, {k: (want[k], got[k]) for k in want if got[k] != want[k]}))
    assert len(misses) <= N // 100, f"{len(misses)} of {N} missed; the first: {misses[:5]}"
