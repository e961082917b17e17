"""Read what users paste into an issue (logs, tracebacks, smi tables, version lists) into facts,
each with the line it came from. Plain text in, no torch and no vLLM: this stays fast.

The formats are vLLM's and vllm-ascend's own, from the 0.11 era to today (see the README's triage
section): log lines with or without ``(Worker_TP0 pid=N)`` prefixes, ``Initializing a V1 LLM engine``
config lines, ``non-default args: {...}``, ``vllm serve`` command lines, collect_env and pip
output, the memory-profiling lines, torch and torch_npu out-of-memory messages, traceback frames,
and ``npu-smi info`` / ``nvidia-smi`` tables.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.errors import UsageError
from kvaudit.oom import parse_oom

MAX_REPORT_BYTES = 16 << 20
"""kvaudit reads at most this much of a report (a startup log is a few hundred KiB)."""
GiB = 1 << 30

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|(?<![\w\]])\[[0-9;]{1,12}m")
_NUM = r"-?[0-9]+(?:\.[0-9]+)?"


@dataclass(frozen=True)
class Fact:
    """One value read from the report, with the line it came from."""

    key: str
    value: Any
    line: int
    """1-based line number in the report."""
    text: str
    """That line, cleaned (ANSI codes removed), trimmed to 240 characters."""

    @property
    def source(self) -> str:
        """``line N: <text>``."""
        return f"line {self.line}: {self.text}"


@dataclass
class Evidence:
    """Every fact found in a report, in the order found."""

    facts: dict[str, list[Fact]] = field(default_factory=dict)
    lines: int = 0

    def add(self, key: str, value: Any, line: int, text: str) -> None:
        """Record a fact."""
        self.facts.setdefault(key, []).append(Fact(key, value, line, text.strip()[:240]))

    def first(self, key: str) -> Fact | None:
        """The first fact of that key, if any."""
        found = self.facts.get(key)
        return found[0] if found else None

    def value(self, key: str) -> Any:
        """The first value of that key, or ``None``."""
        f = self.first(key)
        return f.value if f else None

    def __len__(self) -> int:
        return sum(len(v) for v in self.facts.values())


# --- reading ----------------------------------------------------------------------------------------


def read_report(path: str) -> str:
    """The report's text: a file, or ``-`` for stdin. Empty, binary or oversized input is refused
    with a one-line message (exit 2)."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_REPORT_BYTES + 1)
            size = len(data)
        else:
            p = Path(path)
            if not p.is_file():
                raise UsageError(f"report not found: {path}")
            size = p.stat().st_size
            with p.open("rb") as f:
                data = f.read(MAX_REPORT_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read report {path}: {e.strerror or e}") from None
    name = "stdin" if path == "-" else path
    if size > MAX_REPORT_BYTES:
        raise UsageError(f"{name} is {size / (1 << 20):.1f} MiB; kvaudit reads reports up to "
                         f"{MAX_REPORT_BYTES >> 20} MiB: give the startup log, the traceback and the smi output")
    if not data.strip():
        raise UsageError(f"{name} is empty: paste the vLLM startup log and the out-of-memory traceback")
    head = data[:65536]
    if b"\x00" in head or sum(b < 9 or 13 < b < 32 for b in head) > len(head) // 20:
        raise UsageError(f"{name} looks like a binary file, not a log: give the text of the report")
    return data.decode("utf-8", errors="replace")


MAX_LINE = 8192
"""Longer lines are cut: the longest lines kvaudit reads (the engine config) are ~2 KiB."""


def clean_lines(text: str) -> list[str]:
    """Lines without ANSI colour codes (also the ``[1;36m`` left when a paste loses the ESC), with
    Windows and old-Mac line endings normalised, each cut to ``MAX_LINE`` characters."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return [_ANSI.sub("", line[:MAX_LINE]) for line in text.split("\n")]


# --- extracting ---------------------------------------------------------------------------------------

_VLLM_VERSION = [
    re.compile(r"vLLM (?:API )?server version (?P<v>[0-9][\w.+-]*)"),
    re.compile(r"Initializing a V1 LLM engine \(v(?P<v>[0-9][\w.+-]*)\)"),
    re.compile(r"^\s*vLLM Version\s*:\s*(?P<v>[0-9][\w.+-]*)"),
    re.compile(r"▀▄▀ █\s+version (?P<v>[0-9][\w.+-]*)"),
    re.compile(r"^\s*(?:\[(?:pip3?|conda)\]\s+)?vllm\s*(?:==|\s)\s*(?P<v>[0-9][\w.+-]*)(?:\s+/\S+)?\s*$"),
]
_ASCEND_VERSION = [
    re.compile(r"^\s*vLLM Ascend Version\s*:\s*(?P<v>[0-9][\w.+-]*)"),
    re.compile(r"^\s*(?:\[(?:pip3?|conda)\]\s+)?vllm[-_]ascend\s*(?:==|\s)\s*(?P<v>[0-9][\w.+-]*)(?:\s+/\S+)?\s*$"),
]
_TORCH_NPU = re.compile(r"^\s*(?:\[(?:pip3?|conda)\]\s+)?torch[-_]npu\s*(?:==|\s)\s*(?P<v>[0-9][\w.+-]*)")
_PIP_SHOW_NAME = re.compile(r"^\s*Name:\s*(?P<n>vllm(?:[-_]ascend)?)\s*$")
_PIP_SHOW_VERSION = re.compile(r"^\s*Version:\s*(?P<v>[0-9][\w.+-]*)")

_ENGINE = re.compile(r"(?:Initializing a V[01] LLM engine|Dumping input data for V1 LLM engine).*with config:")
_ENGINE_KEYS = {
    "model": (re.compile(r"\bmodel='(?P<v>[^']*)'"), str),
    "dtype": (re.compile(r"\bdtype=(?:torch\.)?(?P<v>\w+)"), str),
    "max_model_len": (re.compile(r"\bmax_seq_len=(?P<v>\d+)"), int),
    "tp": (re.compile(r"\btensor_parallel_size=(?P<v>\d+)"), int),
    "pp": (re.compile(r"\bpipeline_parallel_size=(?P<v>\d+)"), int),
    "kv_cache_dtype": (re.compile(r"\bkv_cache_dtype=(?P<v>\w+)"), str),
    "device_type": (re.compile(r"\bdevice_config=(?P<v>\w+)"), str),
}
_ARGS = re.compile(r"non-default args: (?P<d>\{.*\})")
_ARG_KEYS = {
    "model": ("model", str), "model_tag": ("model", str), "tensor_parallel_size": ("tp", int),
    "pipeline_parallel_size": ("pp", int), "max_model_len": ("max_model_len", int),
    "gpu_memory_utilization": ("gpu_memory_utilization", float), "kv_cache_dtype": ("kv_cache_dtype", str),
    "dtype": ("dtype", str), "block_size": ("block_size", int), "kv_cache_memory_bytes": ("kv_cache_memory", int),
}
_CMD = re.compile(r"(?:^|[\s$#>])(?:vllm\s+serve|-m\s+vllm\.entrypoints\.openai\.api_server)\b(?P<rest>.*)$")
_CMD_FLAGS = {
    "tensor-parallel-size": ("tp", int), "tp": ("tp", int), "pipeline-parallel-size": ("pp", int),
    "pp": ("pp", int), "max-model-len": ("max_model_len", int), "gpu-memory-utilization": ("gpu_memory_utilization", float),
    "kv-cache-dtype": ("kv_cache_dtype", str), "dtype": ("dtype", str), "model": ("model", str),
    "block-size": ("block_size", int), "kv-cache-memory": ("kv_cache_memory", int),
}
_SIMPLE = [
    ("available_kv", re.compile(rf"Available KV cache memory: (?P<v>{_NUM}) GiB"), lambda m: round(float(m["v"]) * GiB)),
    ("weights", re.compile(rf"(?:Model loading|Loading model weights) took (?P<v>{_NUM}) (?:GiB|GB)"),
     lambda m: round(float(m["v"]) * GiB)),
    ("kv_cache_tokens", re.compile(r"(?:GPU|NPU|XPU|CPU)(?: \+ host)? KV cache size: (?P<v>[\d,]+) tokens"),
     lambda m: int(m["v"].replace(",", ""))),
    ("max_concurrency", re.compile(rf"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<v>{_NUM})x"),
     lambda m: float(m["v"])),
    ("block_size", re.compile(r"Setting attention block size to (?P<v>\d+) tokens"), lambda m: int(m["v"])),
    ("max_model_len", re.compile(r"Using max model len (?P<v>\d+)"), lambda m: int(m["v"])),
    ("gpu_memory_utilization", re.compile(rf"Desired GPU memory utilization is \((?P<v>{_NUM}),"),
     lambda m: float(m["v"])),
    ("gpu_memory_utilization", re.compile(rf"x gpu_memory_utilization \((?P<v>{_NUM})\)"), lambda m: float(m["v"])),
    ("kv_connector", re.compile(r"""kv_connector['"]?\s*[:=]\s*['"](?P<v>\w+)['"]"""), lambda m: m["v"]),
    ("kv_connector", re.compile(r"Creating v1 connector with name: (?P<v>\w+)"), lambda m: m["v"]),
    ("platform", re.compile(r"Platform plugin ascend is activated"), lambda m: "ascend"),
    ("platform", re.compile(r"Automatically detected platform cuda"), lambda m: "cuda"),
    ("kv_capacity_error", re.compile(r"No available memory for the cache blocks|To serve at least one request with the "
                                     r"models?'s max seq len"), lambda m: m.group(0)),
]
_WORKER_TP = re.compile(r"\(Worker(?:_[A-Z]+\d+)*?_TP(?P<v>\d+)(?:_[A-Z]+\d+)* pid=\d+\)")
_ASCEND_AVAILABLE = re.compile(r"Available memory: (?P<a>-?\d+), total memory: (?P<t>\d+)")
_FREE_ON_STARTUP = re.compile(rf"Free memory on device(?: \S+)? \((?P<free>{_NUM})/(?P<total>{_NUM}) GiB\) on startup")
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<ln>\d+), in (?P<func>[\w<>]+)')
_NPU_SMI_CHIP = re.compile(
    r"^\|\s*\d+(?:\s+\d+)?\s*\|\s*[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*\|\s*\d+\s+\d+\s*/\s*\d+\s+"
    r"(?P<used>\d+)\s*/\s*(?P<total>\d+)\s*\|")
_NPU_SMI_NAME = re.compile(r"^\|\s*(?P<npu>\d+)\s+(?P<name>(?:Ascend)?\w+)\s*\|\s*(?:OK|Warning|Alarm|Critical|\w+)\s*\|")
_NPU_SMI_PROCESS = re.compile(r"^\|\s*(?P<npu>\d+)\s+\d+\s*\|\s*(?P<pid>\d+)\s*\|\s*(?P<name>\S+)\s*\|\s*(?P<mb>\d+)\s*\|")
_NVIDIA_PROCESS = re.compile(r"^\|\s*(?P<gpu>\d+)\s+\S+\s+\S+\s+(?P<pid>\d+)\s+[CG]\s+(?P<name>\S+)\s+(?P<mb>\d+)MiB\s*\|")
_NVIDIA_SMI = re.compile(r"^\|.*?\d+C\s+P\d+.*?\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|")
_NVIDIA_NAME = re.compile(r"^\|\s+(?P<gpu>\d+)\s+(?P<name>NVIDIA .+?|Tesla .+?)\s+(?:On|Off)\s+\|")

PHASES = {
    "kv-cache allocation": ("_allocate_kv_cache_tensors", "initialize_kv_cache_tensors", "allocate_kv_cache",
                            "initialize_kv_cache_tensors_deepseek_mla", "initialize_kv_cache_tensors_deepseek_sfa"),
    "CUDA/ACL graph capture": ("capture_model",),
    "memory profiling": ("profile_run", "_dummy_run", "determine_available_memory", "_dummy_sampler_run"),
    "weight loading": ("load_model", "load_weights"),
    "serving requests": ("execute_model",),
}


def extract(lines: list[str]) -> Evidence:
    """Every fact the report's lines hold."""
    ev = Evidence(lines=len(lines))
    frames: list[tuple[int, str]] = []
    pip_show: str | None = None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        _versions(ev, n, line)
        if pip_show and (m := _PIP_SHOW_VERSION.search(line)):
            ev.add("vllm_ascend_version" if "ascend" in pip_show else "vllm_version", m["v"], n, line)
            pip_show = None
        if m := _PIP_SHOW_NAME.search(line):
            pip_show = m["n"]
        if _ENGINE.search(line):
            for key, (rx, conv) in _ENGINE_KEYS.items():
                if m := rx.search(line):
                    ev.add(key, conv(m["v"]), n, line)
        if m := _ARGS.search(line):
            _non_default_args(ev, n, line, m["d"])
        if m := _CMD.search(line):
            rest, k = m["rest"], n
            while rest.rstrip().endswith("\\") and k < len(lines):  # a command continued with "\"
                rest, k = rest.rstrip()[:-1] + " " + lines[k], k + 1
            _command_line(ev, n, line, rest)
        for key, rx, conv in _SIMPLE:
            if m := rx.search(line):
                ev.add(key, conv(m), n, line)
        if m := _WORKER_TP.search(line):
            ev.add("worker_tp_rank", int(m["v"]), n, line)
        if m := _ASCEND_AVAILABLE.search(line):
            ev.add("available_kv", int(m["a"]), n, line)
            ev.add("device_memory", int(m["t"]), n, line)
            ev.add("platform", "ascend", n, line)
        if m := _FREE_ON_STARTUP.search(line):
            ev.add("startup_free", round(float(m["free"]) * GiB), n, line)
            ev.add("device_memory", round(float(m["total"]) * GiB), n, line)
        if m := _FRAME.search(line):
            frames.append((n, m["func"]))
            if "vllm_ascend" in m["path"]:
                ev.add("platform", "ascend", n, line)
        if "out of memory" in line.lower() and (oom := parse_oom(line)) is not None and oom.tried is not None:
            ev.add("oom", oom, n, line)
            ev.add("platform", "ascend" if (oom.device or "").startswith("NPU") else "cuda", n, line)
            if oom.total:
                ev.add("device_memory", oom.total, n, line)
        _smi(ev, n, line)
    for oom in ev.facts.get("oom", []):
        phase = _phase(frames, oom.line)
        if phase is not None:
            ev.add("oom_phase", phase[0], phase[1], lines[phase[1] - 1])
    return ev


def _versions(ev: Evidence, n: int, line: str) -> None:
    for rx in _ASCEND_VERSION:
        if m := rx.search(line):
            ev.add("vllm_ascend_version", m["v"], n, line)
            ev.add("platform", "ascend", n, line)
            return
    for rx in _VLLM_VERSION:
        if m := rx.search(line):
            ev.add("vllm_version", m["v"], n, line)
            return
    if m := _TORCH_NPU.search(line):
        ev.add("torch_npu_version", m["v"], n, line)
        ev.add("platform", "ascend", n, line)


def _non_default_args(ev: Evidence, n: int, line: str, text: str) -> None:
    for key, (fact, conv) in _ARG_KEYS.items():
        m = re.search(rf"'{key}': (?P<v>'[^']*'|[\w.+-]+)", text)
        if m:
            try:
                ev.add(fact, conv(m["v"].strip("'")), n, line)
            except ValueError:
                pass


def _command_line(ev: Evidence, n: int, line: str, rest: str) -> None:
    tokens = re.findall(r"""'[^']*'|"[^"]*"|\S+""", rest)
    if tokens and not tokens[0].startswith("-"):
        ev.add("model", tokens[0].strip("'\""), n, line)
    for i, tok in enumerate(tokens):
        if not tok.startswith("-"):
            continue
        flag, _, value = tok.lstrip("-").partition("=")
        if not value and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            value = tokens[i + 1]
        flag = flag.replace("_", "-")
        if flag in ("kv-transfer-config",):
            if m := re.search(r"""kv_connector['"]?\s*:\s*['"](?P<v>\w+)""", rest):
                ev.add("kv_connector", m["v"], n, line)
        if flag in _CMD_FLAGS and value:
            fact, conv = _CMD_FLAGS[flag]
            try:
                ev.add(fact, conv(value.strip("'\"")), n, line)
            except ValueError:
                pass


def _phase(frames: list[tuple[int, str]], oom_line: int, reach: int = 80) -> tuple[str, int] | None:
    """The phase of the traceback around an OOM line: its deepest recognised frame. Tracebacks
    usually end with the error; some logs print the error first, so frames after it count too."""
    before = [f for f in frames if oom_line - reach <= f[0] < oom_line]
    after = [f for f in frames if oom_line < f[0] <= oom_line + reach]
    for block in (before, after):
        for n, func in reversed(block):
            for phase, funcs in PHASES.items():
                if func in funcs:
                    return phase, n
    return None


def _smi(ev: Evidence, n: int, line: str) -> None:
    if m := _NPU_SMI_PROCESS.search(line) or _NVIDIA_PROCESS.search(line):
        ev.add("device_process_mb", int(m["mb"]), n, line)
    elif m := _NPU_SMI_NAME.search(line):
        ev.add("device_name", m["name"], n, line)
        ev.add("platform", "ascend", n, line)
    elif m := _NPU_SMI_CHIP.search(line):
        ev.add("hbm_used_mb", int(m["used"]), n, line)
        ev.add("hbm_total_mb", int(m["total"]), n, line)
    elif m := _NVIDIA_NAME.search(line):
        ev.add("device_name", m["name"].strip(), n, line)
        ev.add("platform", "cuda", n, line)
    elif m := _NVIDIA_SMI.search(line):
        ev.add("hbm_used_mb", int(m["used"]), n, line)
        ev.add("hbm_total_mb", int(m["total"]), n, line)
