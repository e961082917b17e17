"""Read what users paste into an issue (logs, tracebacks, smi tables, version lists, commands, prose)
into facts, each with the line it came from. Plain text in; only a launch line imports vLLM, for its parser.

Each kind of line is read by its own definitions: launches by the installed vLLM's argument parser
(``kvaudit.triage.commands``), log lines by vLLM's and vllm-ascend's own format strings (``kvaudit.triage.loglines``),
failures outside the device-memory plan by their programs' wording (``kvaudit.triage.failures``), phases by the
functions of vLLM's and vllm-ascend's tracebacks. What remains here: the issue title; engine config lines;
collect_env, pip lines, container image tags and versions in English or Chinese prose, with the releases a
sentence says work or fail; torch and torch_npu out-of-memory messages; ``npu-smi info`` / ``nvidia-smi``
tables; and facts users state in prose ("works with --enforce-eager", "0.6 works", "TP4 works, TP8 fails",
"another service holds 19 GB", "tensor_parallel_size=4", "PD separation, 2P1D", a model by its size).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.errors import UsageError
from kvaudit.measure.oom import parse_oom
from kvaudit.model.hub import is_hub_id
from kvaudit.server import metrics, smi
from kvaudit.triage.changes import CHANGES
from kvaudit.triage.commands import (BARE_ALIASES, Launch, command_words, config_blocks, expand, read_call, read_config,
                                     read_words, split, stated_settings)
from kvaudit.triage.failures import failures
from kvaudit.triage.lines import Where, Words, lines_holding
from kvaudit.triage.loglines import LEVEL_START, RECORD, anchors, needles, read_line, retyped

MAX_REPORT_BYTES = 16 << 20
"""kvaudit reads at most this much of a report (a startup log is a few hundred KiB)."""
GiB = 1 << 30

_ANSI = re.compile(r"(?:\x1b|#033)\[[0-9;?]{0,32}[ -/]{0,4}[@-~]|\x1b\][^\x07\x1b\n]{0,512}(?:\x07|\x1b\\)")
"""Terminal escape sequences (CSI, OSC), also with the ESC written out as ``#033`` (a log viewer's)."""
_BARE_SGR = re.compile(r"\[[0-9;]{1,12}m")
"""A colour code a paste kept without its ESC (``[1;36m``), unless it follows a word or a bracket (``a[0m``, ``][1m``)."""
_AFTER_WORD = re.compile(r"[\w\]]")
_NUM = r"-?[0-9]{1,18}(?:\.[0-9]{1,18})?"
"""A number as logs print it; longer digit runs are no figure (and would overflow a float, or pass Python's
4,300-digit limit for integers)."""
_VER = r"[0-9]+\.[0-9]+(?:\.[0-9]+){0,2}(?:\.?rc[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+\S*)?"
"""A release version as people write it: 0.8.5, 0.10.1.1, 0.11.0rc3, 0.9.2.post1, 0.14.0rc2.dev119+g52aa9c0."""


def _plausible() -> dict[str, tuple[float, float]]:
    from kvaudit.model.deployment import LIMITS
    from kvaudit.units import MAX_BYTES

    counts = (0, 1 << 40)
    return {
        **dict.fromkeys(("tp", "tp_works", "tp_fails"), (1, LIMITS["tp"])), "pp": (1, LIMITS["pp"]), "dp": (1, 1 << 16),
        "device_count": (1, 1 << 16), **dict.fromkeys(("worker_tp_rank", "rank"), (0, 1 << 16)),
        **dict.fromkeys(("max_model_len", "estimated_max_model_len", "mml_prose"), (1, LIMITS["max_model_len"])),
        **dict.fromkeys(("gpu_memory_utilization", "util_works", "util_fails", "util_prose"), (1e-6, 1.0)),
        "block_size": (1, LIMITS["block_size"]), "max_num_seqs": (1, LIMITS["max_num_seqs"]),
        "max_num_batched_tokens": (1, 1 << 30),
        **dict.fromkeys(("device_memory", "weights", "startup_free", "other_process", "kv_needed", "kv_cache_memory",
                         "profiled_weights", "profiled_consumed", "peak_activation", "non_torch", "cudagraph_memory",
                         "cudagraph_estimate", "graph_capture"), (0, MAX_BYTES)),
        "available_kv": (-MAX_BYTES, MAX_BYTES),
        **dict.fromkeys(("kv_cache_tokens", "gpu_blocks", "cpu_blocks", "mamba_blocks", "max_concurrency"), counts),
        **dict.fromkeys(("requested_memory", "non_kv_memory", "weights_peak", "free_after_profile", "free_after_graph",
                         "kv_cache_memory_to_requested", "kv_cache_memory_to_gpu_limit"), (0, MAX_BYTES)),
        **dict.fromkeys(("hbm_used_mb", "hbm_total_mb", "device_process_mb"), (0, MAX_BYTES >> 20)),
        "device_nominal_gb": (1, 1 << 12),
    }


PLAUSIBLE = _plausible()
"""The range each numeric fact can have (``Evidence.add`` drops the rest): the deployment limits kvaudit takes
(``kvaudit.model.deployment.LIMITS``), byte figures up to ``units.MAX_BYTES``; a KV budget may be negative (vLLM logs
"Available KV cache memory: -2.14 GiB")."""


@dataclass(frozen=True)
class Fact:
    """One value read from the report, with the line it came from."""

    key: str
    value: Any
    line: int
    """1-based line number in the report; 0 for the issue title given apart (``--title``)."""
    text: str
    """That line, cleaned (ANSI codes removed), trimmed to 240 characters."""

    @property
    def source(self) -> str:
        """``line N: <text>`` (``title: <text>`` for a title given apart)."""
        return f"title: {self.text}" if self.line == 0 else f"line {self.line}: {self.text}"


@dataclass
class Evidence:
    """Every fact found in a report, in the order found."""

    facts: dict[str, list[Fact]] = field(default_factory=dict)
    lines: int = 0

    def add(self, key: str, value: Any, line: int, text: str) -> None:
        """Record a fact; a number outside what it can be (``PLAUSIBLE``: a TP of 0, a utilization of 7) is no
        fact and is dropped."""
        bounds = PLAUSIBLE.get(key)
        if bounds is not None and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and not bounds[0] <= value <= bounds[1]:
            return
        self.facts.setdefault(key, []).append(Fact(key, value, line, text.strip()[:240]))

    def first(self, *keys: str) -> Fact | None:
        """The first fact of the first of ``keys`` that has one (keys in order of trust)."""
        for key in keys:
            found = self.facts.get(key)
            if found:
                return found[0]
        return None

    def value(self, key: str) -> Any:
        """The first value of that key, or ``None``."""
        f = self.first(key)
        return f.value if f else None

    def all(self, key: str) -> list[Fact]:
        """Every fact of that key, in report order."""
        return self.facts.get(key, [])

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
            if not p.exists():
                raise UsageError(f"report not found: {path}")
            if not p.is_file():  # a folder, or a device or pipe that may never end (/dev/zero)
                raise UsageError(f"{path}: not a regular file: give the report as a file, or on stdin with -")
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
_SMART_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})
"""Curly quotes, as forums (Discourse) and word processors print a pasted log's straight ones."""


def clean_lines(text: str) -> list[str]:
    """Lines without ANSI colour codes (also the ``[1;36m`` left when a paste loses the ESC), with
    Windows and old-Mac line endings and curly quotes normalised, each cut to ``MAX_LINE`` characters."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if any(chr(q) in text for q in _SMART_QUOTES):  # a forum's typography: a pasted log's quotes made curly
        text = text.translate(_SMART_QUOTES)
    if "\x1b" in text or "#033" in text:
        text = _ANSI.sub("", text)  # (no code spans a line end)
    if "m" in text:
        text = _BARE_SGR.sub(lambda m: m.group(0) if m.start() and _AFTER_WORD.match(text, m.start() - 1) else "", text)
    return [line[:MAX_LINE] for line in text.split("\n")]


_REPORT_WORDS = re.compile(r"out of memory|\boom\b|vllm|\bnpu\b|\bgpu\b|cuda|ascend|traceback|显存|内存|npu-smi|nvidia-smi|"
                           r"\b910[BC]\d?\b|\bnccl\b|\bhccl\b|\bdriver\b|驱动|killed|sigkill|memory|error|报错|failed|"
                           r"\bmodels?\b|\bllms?\b|\binference\b|\btorch\b|模型|推理",
                           re.IGNORECASE)


def looks_like_report(text: str) -> bool:
    """Whether text is a report at all: it mentions an out-of-memory error, vLLM, an NPU or GPU, a model, or a
    traceback. Anything that does is triaged (at worst to insufficient-information), never refused."""
    return _REPORT_WORDS.search(text) is not None


_OOM_WORDS = re.compile(r"out of memory|OutOfMemoryError|(?<![A-Za-z])OOMs?(?![A-Za-z])|Tried to allocate|显存不足|内存不足|"
                        r"显存(?:就|会|也|都|直接|已经|又|还是){0,3}(?:耗尽|溢出|过小|太小|不够|爆了?|满了)|爆显存|"
                        r"(?:not enough|insufficient) (?:(?:gpu|device|npu|cuda) memory|vram|hbm)|"
                        r"(?:cannot|can't|unable to|failed to) allocate (?:(?:gpu|device|npu|cuda) memory|vram|hbm)",
                        re.IGNORECASE)
_NCCL_CUDA_OOM = re.compile(r"Cuda failure '?out of memory'?", re.IGNORECASE)
"""NCCL's report of a CUDA call that failed for lack of device memory (``Last error: Cuda failure 'out of memory'``)."""
_TITLE = re.compile(r"^\s*(?:#+\s*)?\[(?:Bug|Usage|Performance|Feature|Misc|Installation|Doc|RFC|Question)\]",
                    re.IGNORECASE)


def reads_like_title(line: str) -> bool:
    """A GitHub issue title as pasted on the first line: ``[Bug]: ...`` and its siblings."""
    return _TITLE.match(line) is not None


# --- extracting ---------------------------------------------------------------------------------------

_PIP = r"^\s*(?:\[(?:pip3?|conda)\]\s+)?"
_VLLM_VERSION = [
    re.compile(r"vLLM (?:API )?server version (?P<v>[0-9][\w.+-]*)"),
    re.compile(r"Initializing an? (?:V[01] )?LLM engine \(v(?P<v>[0-9][\w.+-]*)\)"),
    re.compile(r"^\s*vLLM Version\s*:\s*(?P<v>[0-9][\w.+-]*)"),
    re.compile(r"▀▄▀ █\s+version (?P<v>[0-9][\w.+-]*)"),
    re.compile(_PIP + r"vllm(?:\s*==\s*|\s+)(?P<v>[0-9][\w.+-]*)(?:\s+/\S+)?\s*$"),
]
_ASCEND_VERSION = [
    re.compile(r"^\s*vLLM Ascend Version\s*:\s*(?P<v>[0-9][\w.+-]*)"),
    re.compile(_PIP + r"vllm[-_]ascend(?:\s*==\s*|\s+)(?P<v>[0-9][\w.+-]*)(?:\s+/\S+)?\s*$"),
]
_TORCH_NPU = re.compile(_PIP + r"torch[-_]npu(?:\s*==\s*|\s+)(?P<v>[0-9][\w.+-]*)")
_PIP_SHOW_NAME = re.compile(r"^\s*Name:\s*(?P<n>vllm(?:[-_]ascend)?)\s*$")
_PIP_SHOW_VERSION = re.compile(r"^\s*Version:\s*(?P<v>[0-9][\w.+-]*)")
# container images: quay.io/ascend/vllm-ascend:v0.11.0rc0, vllm-ascend:v0.12.0rc1-a3-openeuler, vllm/vllm-openai:v0.8.5
_IMAGE_ASCEND = re.compile(rf"vllm-ascend:v?(?P<v>{_VER})(?![\w.])", re.IGNORECASE)
_IMAGE_VLLM = re.compile(rf"vllm-openai:v?(?P<v>{_VER})(?![\w.])", re.IGNORECASE)
# prose: "vllm-ascend 0.13.0", "vLLM-Ascend镜像：0.14.0rc1", "**vLLM Version**: 0.8.5", "vllm版本0.9.1"
_GAP = r"(?:[\s:=：*()（）,，_]|version|版本|镜像|image|is|的|是|为|ver\.?)*"
_PROSE_ASCEND = re.compile(rf"vllm[-_ ]?ascend{_GAP}v?(?P<v>{_VER})(?![\w.])", re.IGNORECASE)
_PROSE_VLLM = re.compile(rf"\bvllm(?![-_ ]?ascend)(?:-(?=v?\d))?{_GAP}v?(?P<v>{_VER})(?![\w.])", re.IGNORECASE)
_BARE_VERSION = re.compile(r"(?<![A-Za-z0-9_.])v?(?P<v>0\.[0-9]+\.[0-9]+(?:\.?rc[0-9]+)?(?:\.post[0-9]+)?)(?![A-Za-z0-9_]|\.\d)")
"""A bare release in prose or a title ("[0.2.7]", "0.18.0版本", "v0.8.4.rc2"): vLLM's and vllm-ascend's are 0.x."""

_ENGINE = re.compile(r"(?:Initializing an? (?:V[01] )?LLM engine|Dumping input data for V1 LLM engine).*with config:")
_ENGINE_KEYS = {
    "model": (re.compile(r"\bmodel='(?P<v>[^']*)'"), str),
    "dtype": (re.compile(r"\bdtype=(?:torch\.)?(?P<v>\w+)"), str),
    "max_model_len": (re.compile(r"\bmax_seq_len=(?P<v>\d{1,18})"), int),
    "tp": (re.compile(r"\btensor_parallel_size=(?P<v>\d{1,18})"), int),
    "pp": (re.compile(r"\bpipeline_parallel_size=(?P<v>\d{1,18})"), int),
    "dp": (re.compile(r"\bdata_parallel_size=(?P<v>\d{1,18})"), int),
    "kv_cache_dtype": (re.compile(r"\bkv_cache_dtype=(?P<v>\w+)"), str),
    "device_type": (re.compile(r"\bdevice_config=(?P<v>\w+)"), str),
    "enforce_eager": (re.compile(r"\benforce_eager=(?P<v>True|False)"), lambda v: v == "True"),
}
_ARGS = re.compile(r"non-default args: (?P<d>\{.*\})")
_NAMESPACE = re.compile(r"\bargs: Namespace\((?P<d>.*)\)")
_CMD = re.compile(r"(?:^|[\s$#>`'\"])(?:vllm\s+serve|-m\s+(?:\w+\.)*\w*vllm\w*(?:\.\w+)*(?=\s+-)|(?:[\w.-]+/)?vllm-(?:openai|ascend)(?::\S+)?(?=\s+-)|vllm\s+bench\s+\w+|-m\s+vllm\.entrypoints\.(?:openai\.)?api_server|"
                  r"(?:[^\s$#>`'\"]*/)?benchmark_\w+\.py)\b(?P<rest>.*)$")
_FLAGS_LINE = re.compile(rf"^\s*(?P<rest>(?:--[a-z][\w-]*|-(?:{'|'.join(BARE_ALIASES)}))[ =].*)$")
"""A launch's flags pasted without its first line (``--gpu-memory-utilization 0.95 --max-model-len ...``; ``-pp 2 \\``
where a terminal wrapped a launch before the parser's short alias)."""
_WORD_REFUSED = re.compile(r"invalid (?:\w+ value|choice): '[A-Za-z]+'")
"""argparse refusing a word of prose as a flag's value (``invalid human_readable_int_or_auto value: 'set'``)."""
_ARGS_VAR = re.compile(r"""^\s*(?:[-*]\s*)?(?:export\s+|(?:-e|--env)\s+)?[A-Z][A-Z0-9_]*ARGS\s*[=:]\s*(?P<rest>["']?\s*--[a-z].*)$""")
"""An argument list in an environment variable (``VLLM_ARGS="--gpu-memory-utilization=0.4 ..."``, a compose file's
``- VLLM_ARGS=...``)."""
_LLM_CALL = re.compile(r"\b(?:LLM|AsyncEngineArgs|EngineArgs)\(")
_WRAPPER_KEYWORDS = ("gpu_memory_utilization", "tensor_parallel_size", "pipeline_parallel_size", "max_model_len",
                     "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "enforce_eager", "cpu_offload_gb",
                     "swap_space")
"""vLLM's own engine arguments (``EngineArgs`` fields) that mark a call as handing them on to vLLM; a line holds one of
them before ``_WRAPPER_CALL`` is tried."""
_WRAPPER_CALL = re.compile(rf"(?<![\w.])[A-Za-z_][\w.]*\((?=[^()\n]*\b(?:{'|'.join(_WRAPPER_KEYWORDS)})\s*=)")
"""A call of another library's class or function that passes vLLM's own engine arguments on (``Bonito("org/model",
gpu_memory_utilization=0.9)``, a trainer's ``Rollout(..., tensor_parallel_size=2)``): a launch of vLLM through it, read
as ``LLM(...)`` is (its first argument the model)."""
_LLM_ENGINE = re.compile(r"(?<![\w.])LLM\(")
"""An offline engine constructed (``llm = LLM(model=...)``): each holds its own device memory until it is freed."""
_ASSIGN = re.compile(r"""^\s*(?:[$#>]\s*)?(?:export\s+)?(?P<k>[A-Za-z_]\w*)\s*=\s*"""
                     r"""(?P<v>"[^"]*"|'[^']*'|\$\(\([^)]*\)\)|[^\s;&|]+)""")
_ARITHMETIC = re.compile(r"^\$\(\(\s*(?P<a>\d{1,18})\s*(?P<op>[*+-])\s*(?P<b>\d{1,18})\s*\)\)$")
"""Shell arithmetic in an assignment: ``max_model_len=$((85 * 1024))``."""
_IMPORT = re.compile(r"^\s*(?:import (?:torch|vllm)\b|from (?:torch|vllm)\b)")
_SET_CVD = re.compile(r"""os\.environ\[\s*["']CUDA_VISIBLE_DEVICES["']\s*\]\s*=""")
_DOWNLOADING = re.compile(r"Downloading Model(?: from \S+)? to directory: (?P<v>\S+)")
_SERVING = re.compile(r"vLLM (?:API )?server version \S+, serving model (?P<v>\S+)")
_MODEL_MENTION = re.compile(r"(?<![A-Za-z0-9_/.])(?<![A-Za-z_/.-]-)(?<!parser )(?<!parser=)(?:/?(?:[\w.-]{1,80}/){1,10}(?=[\w.-]+(?![\w.-]*/)))?(?:Qwen3[ -]Next|Qwen|QwQ|Llama|Meta-Llama|"
                            r"Mixtral|DeepSeek|Kimi|gemma|gpt-oss|GLM|MiniMax|Nemotron|granite|Falcon|Jamba)[A-Za-z0-9_.-]*"
                            r"(?:(?:-\d[\w.]*|[ ](?:\d{1,2}(?:\.\d{1,2})?(?![位个张卡]|[ -]?bit)|\d{1,4}(?:\.\d{1,2})?[BM]|\d{1,2}x\d{1,4}(?:\.\d)?B)|"
                            r"[ -](?:v\d[\w.]*|next|coder|vl|vision|instruct|chat|it|pro|flash))(?![A-Za-z0-9_.]))*", re.IGNORECASE)
"""A model named in prose ("test the inference of Qwen2.5-Math-7B-Instruct on one card"; a numbered heading's
"04-GLM-4-9B-Chat", but not a name's tail, "my-qwen"). After a blank, a version ("Llama 3"), a size ("70B", "8x7B")
or a variant continues the name; a device count or a GPU ("Mixtral 4x 4090") does not."""
_TICKED = re.compile(r"`(?P<v>[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,95})`")
"""A name quoted as code in a sentence; a model where it reads as a Hub id (``kvaudit.model.hub.is_hub_id``)."""
_LSCPU = re.compile(r"^\s*(?:Architecture|CPU op-mode\(s\)|Vendor ID|BIOS Vendor ID|CPU\(s\)):", re.MULTILINE)
"""The fields lscpu prints before "Model name:" (the CPU's), as collect_env.py's CPU section pastes them."""
_PROSE_MODEL = re.compile(r"^\s*(?:[-*]\s*)?(?:\*\*)?(?:Model|Model name|模型|模型名称)(?:\*\*)?\s*[:：]\s*(?:\*\*)?\s*"
                          r"`?(?P<v>[A-Za-z0-9_./-]*[A-Za-z][A-Za-z0-9_./-]*)(?![A-Za-z0-9_./-]|://)", re.IGNORECASE)
def _gib(m: re.Match) -> int:
    """A ``v`` group printed in GiB, in bytes."""
    return round(float(m["v"]) * GiB)


_DEVICE_WORDS = re.compile(r"gpu|npu|vram|显存|hbm|device|cuda|显卡", re.IGNORECASE)
"""Words that put a memory on the device."""
_USED_BEFORE = ("占用", "使用", "用了", "消耗", "需要")
"""Words before "显存 18GB" that make it memory used ("占用显存18GB"), not the device's size."""


def _device_gb(m: re.Match) -> int | None:
    """A device's size as sold, in GB; ``None`` where the words before say it is memory used."""
    if m["v"] and m.string[max(0, m.start() - 2):m.start()] in _USED_BEFORE:
        return None
    return int(m["v"] or m["w"])


_GIB_PER = {"K": 1 / 1024 ** 2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}


def _host_gib(m: re.Match) -> float | str:
    """free's "Mem:" total in GiB where a unit follows it ("503Gi", "1.0Ti"), else the figure as printed."""
    return float(m["v"]) * _GIB_PER[m["u"][0]] if m["u"] else m["v"]


_SIMPLE = [
    ("available_kv", re.compile(rf"Memory profiling results:.*\bkv_cache_size=(?P<v>{_NUM}) ?GiB"),
     _gib, (('memory profiling results',),)),
    ("device_memory", re.compile(rf"total_gpu_memory[=\s(]+(?P<v>{_NUM}) ?GiB"), _gib, (('total_gpu_memory',),)),
    ("gpu_memory_utilization", re.compile(rf"Memory profiling results:.*\bgpu_memory_utilization=(?P<v>{_NUM})"),
     lambda m: float(m["v"]), (('memory profiling results',),)),
    ("kv_connector", re.compile(r"""kv_connector['"]?\s*[:=]\s*['"](?P<v>\w+)['"]"""), lambda m: m["v"],
     (('kv_connector',),)),
    ("kv_connector", re.compile(r"Creating v1 connector with name: (?P<v>\w+)"), lambda m: m["v"],
     (('connector with name',),)),
    ("platform", re.compile(r"Platform plugin ascend is activated"), lambda m: "ascend", (('platform plugin',),)),
    ("platform", re.compile(r"Automatically detected platform cuda"), lambda m: "cuda", (('detected platform',),)),
    ("served", re.compile(r"Avg prompt throughput|Avg generation throughput|\"POST /v1/\S+ HTTP/1\.1\" 200|"
                          r"Application startup complete"), lambda m: m.group(0),
     (('throughput', 'post /v1', 'startup complete'),)),
    ("captured", re.compile(r"Graph capturing finished|Capturing CUDA graphs? .*100%|capturing (?:CUDA|ACL) graphs? took",
                            re.IGNORECASE), lambda m: m.group(0), (('captur',),)),
    ("capture_started", re.compile(r"Capturing (?:cudagraphs|CUDA graphs?|ACL graphs?)", re.IGNORECASE),
     lambda m: m.group(0), (('captur',),)),
    ("platform_prose", re.compile(r"(?<![A-Za-z0-9])(?:NPUs?|Ascend|910[BC]\d?)(?![A-Za-z0-9])|昇腾|npu-smi|vllm[-_]ascend",
                                  re.IGNORECASE), lambda m: "ascend", (('npu', 'ascend', '昇腾', '910'),)),
    ("platform_prose", re.compile(r"(?<![A-Za-z0-9_])(?:CUDA|NVIDIA|GeForce|GPUs?|[AHLPV]\d{2,3}S?|T4|(?:RTX ?)?[2345]0[789]0s?)(?![A-Za-z0-9_])"
                                  r"|nvidia-smi", re.IGNORECASE), lambda m: "cuda",
     (('cuda', 'nvidia', 'geforce', '090', 'a10', 'a800', 'a6000', 'h100', 'h20', 'h800', 'l40', 'l20', 'gpu', 'v100', 't4', 'p100', 'p40', '080', '070'),)),
    ("device_nominal_gb", re.compile(r"(?:显存|VRAM)\s*(?:为|是|[:：])?\s*(?P<v>\d{2,3})\s*G(?:B|iB)?(?![A-Za-z])|(?<![\d.~-])"
                                     r"(?P<w>\d{2,3})\s*G(?:B|iB)?\s*(?:的)?\s*(?:显存|显卡|卡|VRAM(?![A-Za-z])|"
                                     r"(?:v?NPU|GPU|card)s?(?![A-Za-z])(?!\s*(?:memory|mem|usage|显存)))", re.IGNORECASE),
     _device_gb, (('显存', '显卡', 'vram', 'npu', 'gpu', 'card', '卡'),)),
    ("device_count", re.compile(r"(?<![\d.])(?P<v>[1-9]\d?)\s*(?:张?卡|(?:cards|GPUs|NPUs)(?![A-Za-z0-9]))", re.IGNORECASE),
     lambda m: int(m["v"]), (('卡', 'cards', 'gpus', 'npus'),)),
    ("device_count", re.compile(r"(?<![A-Za-z0-9])(?:A100|A800|H100|H800|H20|L40S?|L20|A10G?|[345]090|910B\d?)\s*[*×]\s*"
                                r"(?P<v>[1-9]\d?)(?![\d.])", re.IGNORECASE), lambda m: int(m["v"]), (('*', '×'),)),
    # a count before the device's name, where the deployment runs ("serve ... with 2 A10", "on 8×H100", "2张A10"; not a
    # reply's "you need 2xA100")
    ("device_count", re.compile(r"(?:\b(?:on|with|using|across)\s+|用|在|使用|(?=[1-9]\d?\s*张))(?P<v>[1-9]\d?)\s*"
                                r"(?:[x×*]\s*|张\s*)?(?:NVIDIA\s+)?(?:A100|A800|H100|H800|H200|"
                                r"H20|L40S?|L20|A10G?|A30|A40|V100|T4|(?:RTX\s*)?[345]090)s?(?![\w.])", re.IGNORECASE),
     lambda m: int(m["v"]), (('a100', 'a800', 'h100', 'h800', 'h200', 'h20', 'l40', 'l20', 'a10', 'a30', 'a40', 'v100',
                              't4', '090'), ('on ', 'with ', 'using ', 'across ', '用', '在', '张'))),
    # vLLM refusing a request longer than max_model_len (vllm/renderers/params.py, earlier the OpenAI server's
    # serving_engine.py: "This model's maximum context length is N tokens. However, ..."): an error, no memory's
    ("exception", re.compile(r"This model's maximum context length is \d+ tokens"), lambda m: "VLLMValidationError",
     (("maximum context length",),)),
    # the driver's release as nvidia-smi's header ("Driver Version: 535.54.03"), collect_env ("Nvidia driver version:
    # 535.54.03") and npu-smi's header ("npu-smi 23.0.rc2   Version: 23.0.rc2") print it
    ("driver_version", re.compile(r"(?:\b[Dd]river [Vv]ersion|npu-smi \S+\s+Version)\s*:\s*(?P<v>\d[\w.-]*)"),
     lambda m: m["v"], (('driver version', 'npu-smi'),)),
    # the host's memory as `free` prints it ("Mem:  503Gi  41Gi ..."), in GiB where it prints a unit (`free -h`; no
    # unit is a size in the unit of a flag the report may not show, stated but no figure), and the shared memory a
    # container is given ("--shm-size=10gb", compose's "shm_size: '16gb'"): what states the host's memory
    ("host_memory", re.compile(r"^\s*Mem:\s+(?P<v>\d[\d.]*)\s*(?P<u>[KMGT]i?)?B?(?!\S)"), _host_gib, (('mem:',),)),
    ("shm_size", re.compile(r"--shm-size[= ](?P<s>\d[\w.]*)|\bshm_size\W{1,4}(?P<c>\d[\w.]*)"),
     lambda m: m["s"] or m["c"], (('shm',),)),
    # a KV connector's host buffer per worker: LMCache's max_local_cpu_size (GB; YAML key or LMCACHE_MAX_LOCAL_CPU_SIZE,
    # LMCache's "Configuring LMCache" docs: one LMCache engine, and buffer, per vLLM worker)
    ("connector_cpu_gb", re.compile(r"\b(?:max_local_cpu_size|LMCACHE_MAX_LOCAL_CPU_SIZE)\s*[:=]\s*['\"]?"
                                    r"(?P<v>\d{1,6}(?:\.\d{1,3})?)"), lambda m: float(m["v"]),
     (('max_local_cpu_size',),)),
    # the host's memory as a spec sheet gives it ("Memory size: 768GB", "内存：64g"), in GB; not where the line is about
    # a device's memory
    ("host_memory", re.compile(r"(?:\b(?:system |host |cpu )?(?:memory|ram)(?: size)?|内存)\s*[:：=]\s*(?P<v>\d{1,5})"
                               r"\s*(?:GB|GiB|G)\b", re.IGNORECASE),
     lambda m: None if _DEVICE_WORDS.search(m.string) else float(m["v"]),
     (('memory:', 'memory :', 'memory size', 'memory=', 'ram:', 'ram :', 'ram=', '内存：', '内存:', '内存 :'),)),
    # which memory the reporter means: the host's ("CPU memory", "RAM", ps's RSS and top's RES columns, "内存", the
    # RAM of Chinese usage) or the device's ("VRAM", "显存", "GPU memory", "CUDA out of memory", "each A10 GPU has 24G
    # RAM")
    ("host_memory_named", re.compile(r"\b(?:cpu|host|system|physical|container)(?:'s)?\s+(?:ram|memory)\b|"
                                     r"(?<![A-Za-z])RAM(?![A-Za-z])|\bRSS\b|(?-i:\bVIRT\s+RES\b)|"
                                     r"(?<!GPU)(?<!NPU)(?<!CUDA)(?<!显卡)内存", re.IGNORECASE), lambda m: m.group(0),
     (('cpu', 'host', 'system', 'physical', 'container', 'ram', 'rss', 'virt', '内存'),)),
    ("device_memory_named", re.compile(r"VRAM|显存|\bHBM\b|(?:GPU|NPU|CUDA|device|video|显卡)\s*(?:memory|mem|内存)|"
                                       r"(?:CUDA|NPU) out of memory|\b(?:GPU|NPU|card)s?\b[^.\n?]{0,20}?\b(?:RAM|memory)\b",
                                       re.IGNORECASE), lambda m: m.group(0),
     (('vram', '显存', 'hbm', 'mem', '内存', ' ram', 'ram ', 'ram?'),)),
]
"""Facts one line states, by a pattern of its own: (key, pattern, value, the words one of which a line must hold,
lower-cased, before the pattern is tried; most log lines hold none, and a substring test costs a fraction of a regex
search)."""
_WORKER_TP = re.compile(r"\(Worker(?:_[A-Z]+\d+)*?_TP(?P<v>\d{1,18})(?:_[A-Z]+\d+)* pid=\d+\)")
_RANK = re.compile(r"^\s*\[rank(?P<v>\d{1,18})\]:|\brank=(?P<w>\d{1,18})\b")
_ASCEND_AVAILABLE = re.compile(r"Available memory: (?P<a>-?\d{1,18}), total memory: (?P<t>\d{1,18})")
_FREE_ON_STARTUP = re.compile(rf"Free memory on device(?: \S+)? \((?P<free>{_NUM})/(?P<total>{_NUM}) GiB\) on startup")
_FRAME = re.compile(r'File "(?P<path>[^"]{1,1024})", line (?P<ln>\d{1,9}), in (?P<func>[\w<>]+)')
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_EXECUTOR_METHOD = re.compile(r"(?:while processing method|Error executing method) '?(?P<func>\w+)'?")
"""vLLM's executors naming the worker method an exception left (vllm/executor/multiproc_worker_utils.py: "Exception in
worker %s while processing method %s"; vllm/worker/worker_base.py: "Error executing method {method!r}. This might cause
deadlock in distributed execution.")."""
_GROWTH = re.compile(r"(?:memory|usage|显存|内存|HBM)[^.\n]{0,30}?(?:keeps?|kept|continu\w*|gradual\w*|slow\w*|steadi\w*|"
                     r"constant\w*)?[ \t]*(?:grow\w*|increas\w*|ris(?:es|ing)|climb\w*|goes up|going up)(?:[^.\n]|\.\d){0,50}?"
                     r"(?:over time|hours?|days?|requests?|each|every|until|after|continu\w*|per (?:request|inference|"
                     r"iteration|step|call|batch))|memory leak|leaks? memory|"
                     r"\b(?:continu\w*|steady|gradual|constant|unbounded)\s+(?:(?:device|GPU|NPU)\s+)?memory\s+(?:growth|increase)|"
                     r"(?:显存|内存)(?:占用)?.{0,8}?(?:一直|持续|不断|逐渐|缓慢|慢慢|渐渐|越来越|会)(?:继续)?.{0,12}?"
                     r"(?:上涨|增长|增加|增大|变大|上升|提升|升高)|(?:显存|内存)(?:泄漏|泄露)|"
                     r"(?:\bOOM\b|out of memory)[^.\n]{0,40}?after (?:running |serving )?(?:for )?(?:\w+ )?(?:hours?|days?|weeks?)\b",
                     re.IGNORECASE)
"""Device memory said to grow while serving ("memory usage keeps increasing over time", "显存占用持续上涨", "continuous
memory growth")."""
_HUB_URL = re.compile(r"(?:huggingface\.co|hf-mirror\.com|modelscope\.cn/models)/(?P<id>[A-Za-z0-9][\w.-]{0,95}/"
                      r"[A-Za-z0-9][\w.-]{0,95})")
"""A model's page on the Hub (or its mirrors): its id."""
_SIZED_MODEL = re.compile(r"(?<![A-Za-z0-9_/.-])(?:/?(?:[\w.-]{1,80}/){1,10}(?=[\w.-]+(?![\w.-]*/)))?[A-Za-z][A-Za-z0-9.]{1,30}(?:[-_][A-Za-z0-9.]{1,20}){0,4}?[-_]?"
                          r"\d{1,4}(?:\.\d)?[BbMm](?:[-_][A-Za-z0-9.]{1,20}){0,4}(?![A-Za-z0-9_.])")
"""A model as people name it, by its parameter count ("baichuan-13b", "qwen2VL-7b-awq", "vicuna7b_v1.3",
"Qwen3-30B-A3B"): a name, then the size in billions (B) or millions (M)."""
_TP_PROSE = re.compile(r"(?<![A-Za-z0-9_-])(?:TP|tp|tensor[ _-]parallel(?:[ _-]size)?)(?:[ \t]*[=:：][ \t]*|[ \t]+)"
                       r"(?P<v>[1-9]\d{0,2})(?![\d.])")
"""A TP the reporter states ("with tensor_parallel_size=4", "TP: 8", "TP 4, model len 1000")."""
_MEMORY_QUESTION = re.compile(r"(?:(?:gpu|npu|device|vram|cuda|video)[ \t]+memory|\bvram\b|显存|memory (?:usage|consumption|"
                              r"footprint)).{0,80}?(?:\?|？|\bnormal\b|\bexpected\b|为什么|正常吗|[吗呢](?=\s*(?:[。！!]|$)))|(?:question|why|为什么|是否正常)"
                              r".{0,100}?(?:(?:gpu|npu|device|vram|video)[ \t]+memory|\bvram\b|显存|memory (?:usage|consumption))|"
                              r"\b(?:why|how come)\b[^?\n]{0,80}?\b(?:consum\w*|uses?|using|takes?|taking|occup\w*|"
                              r"reserv\w*|allocat\w*|requir\w*|needs?|costs?)\b[^?\n]{0,40}?\b(?:memory|gpu ram|vram)\b[^?\n]{0,60}"
                              r"\?|\b(?:allocat\w*|reserv\w*|takes?|occup\w*|uses?|consum\w*)\s+(?:all|most|\d+\s*%\s*of)\s+(?:of\s+)?"
                              r"(?:(?:the|available|free)\s+)*(?:gpu|device|npu|cuda)\s+memory|"
                              r"^(?=[^\n]{0,300}?(?:huggingface|transformers|\bHF\b))(?=[^\n]{0,300}?\bvllm\b)[^\n]{0,150}?"
                              r"\b\d+(?:\.\d+)?\s*G(?:i?B|b)?\b[^\n]{0,150}?\b\d+(?:\.\d+)?\s*G(?:i?B|b)?\b",
                              re.IGNORECASE)
"""The reporter asking about device memory use, with no failure ("why does vLLM take 90 % of the GPU memory?", "Why
vLLM - GPTQ deployment consumes high memory?", "Why using LLM class to load models requires much more memory than
using huggingface from_pretrained method?"), or stating it against what it expected ("vLLM allocates all available GPU
memory after loading model weights"; "takes only 18Gb when run by using hugggingface code, but the same model takes 38 GB
GPU memory with VLM")."""
_SERVING_OOM = re.compile(r"(?:requests?|inputs?|prompts?|concurren\w*|stress test|load test|benchmark\w*|long context|"
                          r"long (?:input|prompt|text)s?|while serving|during (?:inference|serving)|压测|并发|请求|推理时|长文本)"
                          r"[^.\n]{0,60}?(?:\boom\b|out of memory|显存不足|爆显存)|"
                          r"(?:\boom\b|out of memory)[^.\n]{0,40}?(?:when|while|during|after) (?:serving|inference|"
                          r"(?:sending |processing )?requests?|running (?:the )?benchmark)", re.IGNORECASE)
"""The reporter saying the device ran out while the server answered requests ("test latency with input 20 000, service
shows oom")."""
_CAPTURE_OOM = re.compile(r"(?:\bOOMs?\b|out of memory|OutOfMemoryError)[^.\n]{0,60}?(?:during|in|while|at|inside)\s+(?:the\s+)?"
                          r"(?:(?:cuda|acl)[- ]?graphs?\s+captur\w*|graph\s+captur\w*|captur\w+\s+(?:cuda|acl)?[- ]?graphs?|"
                          r"`?capture_model)|(?:during|while|in)\s+(?:the\s+)?(?:(?:cuda|acl)[- ]?graphs?\s+|graph\s+)captur\w*"
                          r"(?:[^.\n]|\.(?=\w)){0,40}?(?:\bOOMs?\b|out of memory|OutOfMemoryError)", re.IGNORECASE)
"""The reporter saying the device ran out while CUDA/ACL graphs were captured ("OOM during `capture_model()`")."""
_EXCEPTION = re.compile(r"(?:^|[\]>|]\s*|\s)(?P<v>(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception))(?::\s|:?\s*$)")
"""The line a traceback ends in (``RuntimeError: ...``, ``torch.OutOfMemoryError: ...``), by Python's naming of
exception classes."""
_LOG_PREFIX = re.compile(rf"{LEVEL_START.pattern}|^\s*\[?(?:pip3?|conda)\]?\s")
"""A line a program printed (a log record, a package list), not a sentence of the reporter's."""
_DEVICE_NAMES = [  # device kinds named in prose, the kvaudit device they map to (deployment.DEVICES)
    (re.compile(r"\bH100\b", re.IGNORECASE), "h100-80g"),
    (re.compile(r"\bH200\b", re.IGNORECASE), "h200-141g"),
]
_NOMINAL = re.compile(r"\b(?P<name>A100|A800|H800|H20|L40S?|L20|L4|A6000|A10G?|A30|A40|V100|P100|P40|T4|910B\d?|"
                      r"(?:RTX ?)?[2345]0[6-9]0(?: ?Ti)?)\b"
                      r"(?:[^\n\d]{0,16}?(?P<gb>\d{2,3}) ?G(?:B|iB)?\b)?", re.IGNORECASE)
_NOMINAL_GB = {"l40": 48, "l40s": 48, "l20": 48, "l4": 24, "3090": 24, "4090": 24, "5090": 32, "a6000": 48, "a10": 24,
               "a10g": 24, "a30": 24, "a40": 48, "p40": 24, "t4": 16, "h20": 96}
"""Memory of GPU kinds that come in one size, in GB as sold (a figure for weights, not for the budget)."""

# facts people state in prose
_WORKS = r"(?:works?|worked|working|runs? fine|ran fine|is fine|fine|ok\b|okay|succeed(?:s|ed)?|successful(?:ly)?|" \
         r"solved|fixe[sd]|resolved|run normally|runs normally|started normally|it startup|it starts|starts up|started up|" \
         r"can run|能拉|正常|成功|解决|可以)"
_FAILS = r"(?:fails?|failed|OOMs?|crash(?:es|ed)?|errors?|does(?:n't| not) work|out of memory|报错|失败|跑不起来|起不来|" \
         r"无法(?:运行|启动)|不能(?:运行|启动)|can(?:'|no)t (?:run|start|load)|won't (?:run|start|load)|" \
         r"does(?:n't| not) (?:run|start|load))"
"""The reporter saying something fails, in any words ("OOM", "报错", "跑不起来": will not run, "can't start")."""
_WORKS_RX = re.compile(_WORKS, re.IGNORECASE)
_FAILS_RX = re.compile(_FAILS, re.IGNORECASE)
_WORKING = ("work", " fine", " ok", "okay", "succe", "solved", "fixe", "resolved", "normally", "it start", "starts up",
            "can run",
            "started up", "正常", "成功", "解决", "可以", "能拉")
"""Words of ``_WORKS`` to look for first (" ok", not "ok": every log line with "tokens" holds that)."""
_TP = (" tp", "\ntp", "-tp", "(tp", "tensor")
_FAILING = ("fail", "oom", "crash", "error", "not work", "n't work", "out of memory", "报错", "失败", "跑不起来", "起不来", "无法",
            "不能", "can't", "cannot", "won't", "doesn't", "does not")
"""Words of ``_FAILS`` to look for first."""
_FIGURE = r"(\d{1,6}(?:\.\d{1,3})?)\s*(G|GB|GiB|M|MB|MiB)\b"
_RISING = re.compile(rf"(?:显存|memory|VRAM|HBM)[^\n]{{0,60}}?{_FIGURE}[^\n]{{0,60}}?(?:小时|分钟|天|hours?|minutes?|days?)"
                     rf"[^\n]{{0,30}}?{_FIGURE}", re.IGNORECASE)
"""The device's memory stated at a figure, then, after a time, at another."""


_KV_SHORT = re.compile(r"\bKV[ -]?cache\b[^|\n]{0,40}?\bneed(?:s|ed)?\s+(?:about\s+|~)?(?P<need>\d{1,4}(?:\.\d{1,3})?)\s*GiB"
                       r"[^|\n]{0,30}?\b(?:only|but|available|have|has)\s+(?:only\s+)?(?P<have>\d{1,4}(?:\.\d{1,3})?)\s*"
                       r"GiB", re.IGNORECASE)
"""The KV one request needs and the KV budget, as a sentence retells vLLM's refusal (GiB, as vLLM prints them)."""


def _rising(m: re.Match) -> str | None:
    """The sentence of ``_RISING`` where its second figure is the larger (memory that grew), else ``None``."""
    a, b = (float(m[i]) * (1024 if m[i + 1].upper().startswith("G") else 1) for i in (1, 3))
    return m.group(0) if b > a else None


_PROSE_FACTS = [
    ("eager_works", re.compile(rf"(?:(?:--)?enforce[-_]eager|enforce_eager\s*=\s*True|eager mode)[^.\n]{{0,60}}?{_WORKS}|"
                               rf"{_WORKS}[^.\n]{{0,30}}?(?:with|using|when|加)\s*`?(?:(?:--)?enforce[-_]eager|eager mode)|(?:don't|do not|didn't|no) (?:get )?OOM when `?--enforce[-_]eager", re.IGNORECASE),
     lambda m: True, (("eager",), _WORKING + ("oom",))),
    ("tp_works", re.compile(rf"\b(?:TP|tensor[ _-]parallel(?:[ _-]size)?)\s*[=:]?\s*(?P<v>\d{1,18})\b[^.\n,;]{{0,20}}?{_WORKS}",
                            re.IGNORECASE), lambda m: int(m["v"]), (_TP, _WORKING)),
    ("tp_fails", re.compile(rf"\b(?:TP|tensor[ _-]parallel(?:[ _-]size)?)\s*[=:]?\s*(?P<v>\d{1,18})\b[^.\n,;]{{0,20}}?{_FAILS}",
                            re.IGNORECASE), lambda m: int(m["v"]), (_TP, _FAILING)),
    ("util_works", re.compile(rf"(?:utili[sz]ation|util|为|成|to|=)\s*(?P<v>0\.\d+)\s*(?:(?:后|then|and|,|，)\s*)?"
                              rf"(?:it\s+|the service\s+|服务)?{_WORKS}", re.IGNORECASE), lambda m: float(m["v"]),
     (("0.",), _WORKING)),
    ("util_works", re.compile(rf"(?:utili[sz]ation|util)\W{{0,3}}\s+is\s+(?P<v>0\.\d+)[^.\n]{{0,50}}?{_WORKS}",
                              re.IGNORECASE), lambda m: float(m["v"]), (("0.",), ("util",), _WORKING)),
    ("util_works", re.compile(rf"{_WORKS}[^.\n]{{0,40}}?(?:utili[sz]ation|util)\W{{0,3}}\s+from\s+0\.\d+\s+to\s+"
                              r"(?P<v>0\.\d+)", re.IGNORECASE), lambda m: float(m["v"]),
     (("0.",), ("util",), ("from",), _WORKING)),
    ("util_fails", re.compile(rf"(?:utili[sz]ation|util)\W{{0,3}}[^.\n]{{0,30}}?\bto\s+(?P<v>1\.0|0\.\d+)[^.\n]{{0,60}}?"
                              rf"{_FAILS}", re.IGNORECASE), lambda m: float(m["v"]), (("util",), _FAILING)),
    ("util_fails", re.compile(r"(?:utili[sz]ation|util)\W{0,3}\s+from\s+(?P<v>1\.0|0\.\d+)\s+to\s+0\.\d+",
                              re.IGNORECASE), lambda m: float(m["v"]), (("util",), ("from",))),
    ("other_process", re.compile(r"(?:another|other|second|一个其他的?|其他)\s*(?:process|service|program|application|"
                                 r"model|instance|container|job|进程|服务|程序)[^.\n]{0,60}?(?P<v>\d+(?:\.\d+)?)\s*"
                                 r"(?:GB|GiB|G)\b", re.IGNORECASE), _gib, (("other", "second", "其他"),)),
    ("not_released", re.compile(r"(?:doesn't|does not|didn't|did not|not|never|can't|cannot|fails? to|failed to)"
                                r"(?: seem to| appear to)? (?:release|free|clear)s?\b[^.\n]{0,30}?"
                                r"(?:memory|kv|cache|blocks)|不释放|没有释放|未释放|"
                                r"(?:how (?:to |do I |can I |we are suppose[d]? to )?|can't |cannot |unable to )unload (?:the |a )?"
                                r"(?:model|llm|engine)|unload (?:the |a )?(?:model|llm)[^.\n]{0,60}?(?:does nothing|doesn't|does not|"
                                r"not (?:freed|released))", re.IGNORECASE), lambda m: m.group(0),
     (("release", "free", "释放", "unload"),)),
    # a second instance of the engine on the same devices, said in prose ("the second instance fails", "以相同的参数配置
    # 运行两个7B模型，第二个实例报错", "two vLLM servers on one GPU", "multiple LLM classes": vLLM's engine class): the first
    # one's memory is outside the second's budget
    ("second_instance", re.compile(r"\b(?:second|2nd|another|other) (?:vllm |vLLM )?(?:instance|engine|server|container|"
                                   r"replica|deployment)s?\b|\b(?:two|2|multiple|several) (?:vllm |identical |same )?"
                                   r"(?:instances|engines|servers|containers|replicas|LLM (?:instances|objects|classes))\b|第二个(?:实例|服务|容器|进程)|"
                                   r"(?:两|2|多)个[^，。,\n]{0,10}?(?:实例|服务|容器)", re.IGNORECASE),
     lambda m: m.group(0), (("second", "2nd", "another", "other", "two", "2 ", "multiple", "several", "第二个", "两个",
                             "2个", "多个"), ("instance", "engine", "server", "container", "replica", "deployment", "llm ",
                                            "实例", "服务", "容器", "进程"))),
    # a next model loaded after the first in the same program ("GPU OOM when switching to next generative model",
    # "the second model fails to load after the first one finishes", "切换到下一个模型时OOM"), or the engine built again for
    # each request ("the model is initialised with every request"): the first engine's memory is still held where the
    # program does not free it (a benchmark or evaluation harness looping over models, an engine made in a handler)
    ("next_model", re.compile(r"\b(?:switch\w*|mov\w*|go\w*|chang\w*)\s+(?:on\s+)?to\s+(?:the\s+)?(?:next|second|another)"
                              r"\s+(?:[\w-]+\s+)?model\b|\b(?:next|second)\s+(?:[\w-]+\s+)?model\b[^.\n]{0,30}?\b(?:begins|starts|"
                              r"loads?|runs?|is (?:loaded|started|run|benchmarked|evaluated)|fails? to load)\b|切换(?:到)?(?:下一个|第二个|另一个)模型|"
                              r"\b(?:model|engine|LLM)\b[^.\n]{0,20}?\b(?:re-?)?(?:initiali[sz]ed|loaded|created|instantiated|"
                              r"constructed)\b[^.\n]{0,20}?\b(?:every|each)\s+(?:request|call|query|iteration|time)\b|"
                              r"每次(?:请求|调用)都?(?:会)?(?:重新)?(?:加载|初始化)模型",
                              re.IGNORECASE), lambda m: m.group(0), (("next", "second", "another", "切换", "every", "each",
                                                                      "每次"), ("model", "模型", "engine", "llm"))),
    # a container Kubernetes restarts over and over (kubelet's "CrashLoopBackOff", "Back-off restarting failed
    # container"): why it ended, its memory limit (Reason: OOMKilled) or its own error, is in its last state
    ("restarting", re.compile(r"crash\s?loop\s?back(?:\s?off)?|Back-off restarting failed container", re.IGNORECASE),
     lambda m: m.group(0), (("crashloop", "crash loop", "back-off restarting"),)),
    # a device another model or process already holds, as a platform refuses a second model on it ("GPU index 0 has
    # been occupied with a vLLM model: ..., therefore cannot allocate GPU memory for a new model": Xinference) or as
    # the reporter says it ("the GPU is already used by another process", "显卡被其他进程占用")
    ("device_occupied", re.compile(r"\b(?:GPU|NPU|device|card)s?\b[^.\n]{0,40}?\b(?:has|have|is|are|was|were|been|\s)*"
                                   r"(?:already\s+)?(?:occupied|taken|held|in use|used)\s+(?:by|with)\s+(?:a |an |another |"
                                   r"other |the )?(?:vLLM |other |different |second )?(?:model|process|instance|service|"
                                   r"program|engine|job|container|LLM)\b(?!\s*(?:weights?|parameters|activations?)\b)|"
                                   r"(?:显存|显卡|卡|GPU|NPU)[^。，,\n]{0,10}?被[^。，,\n]{0,10}?"
                                   r"(?:进程|模型|服务|程序|容器)[^。，,\n]{0,4}?占用", re.IGNORECASE), lambda m: m.group(0),
     (("occupied", "taken by", "taken with", "held by", "held with", "in use by", "in use with", "used by", "used with",
       "占用"),)),
    ("cvd_after_import", re.compile(r"CUDA_VISIBLE_DEVICES[^\n]{0,80}?\bafter\b[^\n]{0,40}?import|import[^\n]{0,60}?"
                                    r"\bbefore\b[^\n]{0,40}?CUDA_VISIBLE_DEVICES", re.IGNORECASE), lambda m: True,
     (("cuda_visible_devices",),)),
    ("observed_utilization", re.compile(r"(?:utili[sz]ation\W{0,6}\s+(?:of|=|at)\s+(?P<asked>0\.\d+)\b.{0,20}?)?"
                                        r"(?:actual|real|memory)\s+(?:memory\s+)?(?:usage|use|utili[sz]ation)\s+"
                                        r"(?:reaches|reached|is|was|of|goes to|went to)\s+(?P<v>0\.\d+)",
                                        re.IGNORECASE),
     lambda m: (float(m["asked"]) if m["asked"] else None, float(m["v"])),
     (("0.",), ("actual", "real", "usage", "use"))),
    # the weights' memory the reporter states ("Weights take 22 GB", "model weights took 13.3677 * 2 = 27 GB": the
    # figure vLLM's "Loading model weights took %.4f GB" line prints, in GiB whatever it says)
    ("weights", re.compile(r"\bweights?\s+(?:take|took|takes|use[sd]?|occup(?:y|ies|ied)|consume[sd]?)\s+(?:about\s+|"
                           r"roughly\s+|~\s*)?(?P<v>\d{1,4}(?:\.\d{1,4})?)\s*(?:GiB|GB|G)\b", re.IGNORECASE), _gib,
     (("weight",), ("take", "took", "use", "occup", "consum"))),
    ("failure_said", re.compile(_FAILS, re.IGNORECASE), lambda m: m.group(0), (_FAILING,)),
    # vLLM's refusal of one request of max_model_len as people retell it ("KV cache OOM (need 8.33 GiB, only 8.29
    # GiB)", "the KV cache needs 4.38 GiB but only 4.00 GiB is available"): its two figures, in GiB
    ("kv_needed", _KV_SHORT, lambda m: round(float(m["need"]) * GiB), (("kv",), ("need",))),
    ("available_kv", _KV_SHORT, lambda m: round(float(m["have"]) * GiB), (("kv",), ("need",))),
    # device memory measured rising over time: a figure, a time, a larger figure ("一段时间内显存占用固定为14G ... 1个多小时之后
    # 显存占用变成了18G，2个小时后占用变成了20G", "memory was 30 GB, after 2 hours it is 38 GB")
    ("memory_growth", _RISING, _rising, (("显存", "memory", "vram", "hbm"), ("小时", "分钟", "hour", "minute", "day", "天"))),
]
"""As ``_SIMPLE`` for what reporters write in sentences; the words in groups that must all be met (one word of each)."""

_NOMINAL_WORDS = ("a100", "a800", "h800", "h20", "l40", "l20", "l4", "060", "070", "080", "090", "a6000", "a10", "a30",
                  "a40", "v100", "p100", "p40", "t4", "910b")
_MODEL_WORDS = ("qwen", "qwq", "llama", "mixtral", "deepseek", "kimi", "gemma", "gpt-oss", "glm", "minimax", "nemotron",
                "granite", "falcon", "jamba")
_FAMILIES = tuple(f for f in json.loads((Path(__file__).with_name("model_families.json")).read_text())["families"]
                  if not any(f.startswith(w) for w in _MODEL_WORDS))
"""The model families of vLLM's own registry (``scripts/model_families.py``) beside those ``_MODEL_MENTION`` names."""
_FAMILY_MENTION = re.compile(r"(?<![A-Za-z0-9_/.-])(?:" + "|".join(sorted(_FAMILIES, key=len, reverse=True))
                             + r")(?:(?=[\w.-]*\d)[\w.-]*|[\w.-]*[ ]v?\d{1,2}(?:\.\d{1,2})?(?![\w.]|\s*(?:[xX×*]|GPU|NPU|"
                               r"card|G\b|GB|GiB|%|位|个|张|卡)))", re.IGNORECASE)
"""A model of one of vLLM's families named in prose, with a digit in the name ("whisper-large-v3-turbo",
"opt-125m") or a version after a blank ("MiniCPM-o 2.6", not "Aria 2 GPUs"): the family alone ("Aria", "solar") is a
word."""
_WORDS = tuple(sorted({w for words in (_NOMINAL_WORDS, _MODEL_WORDS, _FAMILIES) for w in words} |
                     {w for *_, groups in _SIMPLE + _PROSE_FACTS for words in groups for w in words}))
def _nominal_gb(m: re.Match) -> int | None:
    return int(m["gb"]) if m["gb"] else _NOMINAL_GB.get(m["name"].lower().replace("rtx", "").strip())


_RULES = tuple((key, rx, conv, tuple(map(frozenset, groups))) for key, rx, conv, groups in (
    *_SIMPLE, *_PROSE_FACTS,
    ("device_nominal_gb", _NOMINAL, _nominal_gb, (_NOMINAL_WORDS,)),
    ("model_mention", _MODEL_MENTION, lambda m: m.group(0).rstrip(".-"), (_MODEL_WORDS,)),
    ("model_mention", _FAMILY_MENTION, lambda m: m.group(0).rstrip(".-"), (_FAMILIES,))))
"""Every line pattern with the words (groups of alternatives, all groups met) a line must hold first."""

PHASES = {
    "kv-cache allocation": ("wake_up", "_allocate_kv_cache_tensors", "initialize_kv_cache_tensors", "allocate_kv_cache",
                            "initialize_kv_cache_tensors_deepseek_mla", "initialize_kv_cache_tensors_deepseek_sfa",
                            "initialize_kv_cache", "_allocate_kv_cache", "initialize_cache", "_init_cache_engine",
                            "initialize_from_config"),
    "kv-cache planning": ("check_enough_kv_cache_memory", "_check_enough_kv_cache_memory", "get_kv_cache_config",
                          "get_kv_cache_configs", "_raise_insufficient_kv_cache_memory"),
    "CUDA/ACL graph capture": ("capture_model", "_capture_cudagraphs", "capture_graph", "_capture_aclgraphs"),
    "memory profiling": ("profile_run", "_dummy_run", "determine_available_memory", "_dummy_sampler_run",
                         "determine_num_available_blocks", "_dummy_pooler_run"),
    "weight loading": ("load_model", "load_weights", "initialize_model", "_initialize_model", "create_weights",
                       "weight_loader", "process_weights_after_loading"),
    "serving requests": ("execute_model", "execute_model_async", "_model_forward", "sample_tokens"),
    "warm-up": ("compile_or_warm_up_model",),
}
"""Traceback phases by the functions that run them, vLLM's and vllm-ascend's (V0 and V1)."""
_SHARED_WITH_WARM_UP = frozenset(("_dummy_run", "_dummy_sampler_run", "_dummy_pooler_run"))
"""The dummy runs of the profile run that V1's worker runs again after the KV cache is allocated and graphs captured
(``Worker.compile_or_warm_up_model``: "warm up sampler and preallocate memory buffer for logits"): logged after the
capture, a traceback through one of them is that warm-up's, not the profile's."""


@dataclass
class _Command:
    """A launch in the paste (``vllm serve``, the api_server, ``LLM(...)``) and what it set."""

    line: int
    text: str
    facts: list[tuple[str, Any]]
    outcome: str | None
    """``works`` or ``fails`` where the paste says so next to the command."""
    rest: str = ""
    """Its words after the program, as read (a launch's flags; the next line's where a terminal wrapped it)."""
    last: int = 0
    """The last line it takes."""


def _all_words() -> tuple[str, ...]:
    from kvaudit.triage.failures import WORDINGS

    return tuple(sorted(set(_WORDS) | _NEEDLES | {w for _, _, groups in _PROSE_FACTS_RX for g in groups for w in g}
                        | {name for change in CHANGES for name in change.named_by} | set(_MESSAGE_STARTS)
                        | {w for _, _, words, _ in WORDINGS for w in words} | {"`", _CACHE_CONFIG}))


def extract(lines: list[str], title: str | None = None) -> Evidence:
    """Every fact the report's lines hold. ``title`` is the issue's title, given apart; without it a
    first line that reads like one (``[Bug]: ...``) is taken as the title."""
    ev = Evidence(lines=len(lines))
    if title is not None:
        _title(ev, 0, title)
    else:
        first = next((i for i, line in enumerate(lines) if line.strip()), None)
        if first is not None and reads_like_title(lines[first]):
            _title(ev, first + 1, lines[first])
    title_line = next((f.line for f in ev.all("title")), -1)
    frames: list[tuple[int, str]] = []
    packages: dict[int, str | None] = {}
    tracebacks: list[int] = []
    commands: list[_Command] = []
    variables: dict[str, str] = {}
    pip_show: str | None = None
    stated: list[tuple[int, str, Any]] = []
    quoted: set[int] = set()
    imported = 0
    lows = [line.lower() for line in lines]
    where = lines_holding(lows, _ALL)  # every word any reader gates on, found in one pass over the text
    ruled = _rule_facts(lines, lows, where)
    logged = where.any_of(_NEEDLES)
    opened = where.any_of(_MESSAGE_STARTS)
    prosed: list[int] = []
    for n, line in enumerate(lines, start=1):
        low = lows[n - 1]
        if not low.strip():
            continue
        frame = _FRAME.search(line) if 'file "' in low else None
        if frame is None and ('file "' in low or low.strip() == "file") and n < len(lines):  # wrapped onto 2 more
            frame = _FRAME.search(line.rstrip() + " " + lines[n].strip()) or (
                n + 1 < len(lines) and _FRAME.search(" ".join(x.strip() for x in lines[n - 1:n + 2]))) or None
        if "vllm" in low or "torch" in low or "version" in low or "llm engine (v" in low:
            _versions(ev, n, line, frame is not None)
        if ("huggingface.co/" in low or "hf-mirror.com/" in low or "modelscope.cn/models/" in low) and (
                m := _HUB_URL.search(line)):
            ev.add("model_url", m["id"], n, line)
        prose = frame is None and not _LOG_PREFIX.match(line)
        if prose:
            prosed.append(n)
            if "0." in line and n != title_line and any(w in low for w in _CLAIM_WORDS) and (
                    _BARE_VERSION.search(line) or "than" in low or "since" in low or "from" in low or "升级" in line):
                _release_claims(ev, n, line)
        if pip_show and (m := _PIP_SHOW_VERSION.search(line)):
            ev.add("vllm_ascend_version" if "ascend" in pip_show else "vllm_version", m["v"], n, line)
            pip_show = None
        if "name:" in low and (m := _PIP_SHOW_NAME.search(line)):
            pip_show = m["n"]
        if "=" in line and (m := _ASSIGN.search(line)):
            variables[m["k"]] = _shell_value(m["v"])
        if "import" in low and _IMPORT.search(line):
            imported = imported or n
        if imported and "cuda_visible_devices" in low and _SET_CVD.search(line):
            ev.add("cvd_after_import", True, n, line)  # torch has seen the devices already: the setting is ignored
        if "llm engine" in low and _ENGINE.search(line):
            for k in range(n, min(n + 4, len(lines) + 1)):  # the config, or the lines a paste wrapped it onto
                held = lines[k - 1]
                found = False
                for key, (rx, conv) in _ENGINE_KEYS.items():
                    if m := rx.search(held):
                        ev.add(key, conv(m["v"]), k, held)  # (digit runs bounded by the patterns)
                        found = True
                if found and k > n or "model=" in held:
                    break
        if "non-default args" in low and (m := _ARGS.search(line)):
            _read_launch(ev, n, line, read_call(m["d"], {}), add=True)
        if "namespace(" in low and (m := _NAMESPACE.search(line)):
            _read_launch(ev, n, line, read_call("Namespace(" + m["d"] + ")", {}), add=True)
        logical, k = line, n
        continued = _continues(lines, n) or n in quoted
        if not continued:
            while k < len(lines) and k < n + 60:
                if logical.rstrip().endswith("\\"):  # a command continued with "\"
                    logical, k = logical.rstrip()[:-1] + " " + lines[k].rstrip(), k + 1
                elif lines[k].strip() == "\\" and "--" in logical:  # the "\" a terminal wrapped onto a line alone
                    logical, k = logical.rstrip() + " \\", k + 1
                elif "--" in logical and (_open_quote(logical) or _FLAG_AT_END.search(logical)) and (
                        _ARGS_VAR.search(line) or _CMD.search(line) or (  # (or flags wrapped below a launch)
                            commands and commands[-1].last == n - 1 and line.lstrip().startswith("--"))
                ) and not _NEW_RECORD.match(lines[k]):
                    quoted.add(k + 1)  # a quoted argument list goes on, as a shell reads it, on the next line
                    logical, k = logical.rstrip() + " " + lines[k].strip(), k + 1
                else:
                    break
        lowl = logical.lower() if k > n else low
        if not continued and (("vllm serve" in lowl or "api_server" in lowl or "benchmark_" in lowl
                                          or "vllm bench" in lowl or "vllm-openai" in lowl or "vllm_worker" in lowl
                                          or "-m vllm" in lowl) and (m := _CMD.search(logical))
                                         or ("--" in line or line.lstrip()[:1] == "-") and (
                                             m := _FLAGS_LINE.search(logical) or _ARGS_VAR.search(logical) or (
                                             commands and commands[-1].last == n - 1 and _FLAG_ONLY.search(logical)))):
            rest = m["rest"]
            wraps = m.re in (_FLAGS_LINE, _FLAG_ONLY) and commands and commands[-1].last == n - 1
            if wraps:  # flags alone right below a launch: the launch, wrapped at the terminal's width
                rest = commands[-1].rest + " " + rest
            launch = _launch(expand(rest, variables), m.re is _ARGS_VAR)
            if m.re is _FLAGS_LINE and any(_WORD_REFUSED.search(u) for u in launch.unread):
                launch = Launch((), (), launch.parser)  # a sentence that begins with a flag: "--max-model-len set to 512"
            elif m.re is _FLAGS_LINE and any(k == "model" and not _names_model(v) for k, v in launch.facts):
                launch = Launch((), (), launch.parser)  # a word of a sentence left over as the positional model:
                # "--max-ctx-size does not take effect ..." (flags alone name a model only by --model, a Hub id or path)
            _read_launch(ev, n, line, launch)
            if wraps:
                commands[-1] = dataclasses.replace(commands[-1], facts=list(launch.facts) or commands[-1].facts,
                                                   rest=rest, last=k)
            elif launch.facts:
                commands.append(_Command(n, line, list(launch.facts), _outcome(lines, n, k), rest, k))
        elif frame is None and (("llm(" in low or "engineargs(" in low) and (m := _LLM_CALL.search(line)) or "=" in low
                                and "(" in low and any(w in low for w in _WRAPPER_KEYWORDS)
                                and (m := _WRAPPER_CALL.search(line))):
            call, k = line[m.start():], n
            while call.count("(") > call.count(")") and k < len(lines) and k < n + 30 \
                    and not _FRAME.search(lines[k]) and not _TRACEBACK.search(lines[k]):
                call, k = call + "\n" + lines[k], k + 1
            launch = read_call(call, variables)
            _read_launch(ev, n, line, launch)
            commands.append(_Command(n, line, list(launch.facts), _outcome(lines, n, k)))
        elif prose and not continued and ("-" in line or "=" in line or ":" in line or "：" in line):
            said = line
            if n < len(lines) and _VALUE_WRAPPED.search(line) and lines[n].strip():
                said += " " + lines[n].split()[0]  # a value a paste wrapped away from its name ("tp:" / "8, ...")
            stated.extend((n, key, value) for key, value in stated_settings(said).facts)
        if "model" in low or "模型" in line:
            for rx in (_DOWNLOADING, _SERVING, _PROSE_MODEL):
                if (m := rx.search(line)) and rx is _PROSE_MODEL and _LSCPU.search(
                        "\n".join(lines[max(0, n - 12):n - 1])):
                    break  # lscpu's "Model name:" in collect_env's CPU section names the CPU, not the model
                if m:
                    ev.add("model_prose" if rx is _PROSE_MODEL else "model", m["v"], n, line)
                    break
        if "worker" in low and (m := _WORKER_TP.search(line)):
            ev.add("worker_tp_rank", int(m["v"]), n, line)
        if "rank" in low and (m := _RANK.search(line)):
            ev.add("rank", int(m["v"] or m["w"]), n, line)
        if frame is None and (n in logged or n in opened or n < len(lines) and RECORD.match(line)
                              and not _NEW_RECORD.match(lines[n])):
            for key, value in _log_facts(lines, n, line, opened):  # vLLM's and vllm-ascend's own formats
                ev.add(key, value, n, line)
        if "available memory" in low and (m := _ASCEND_AVAILABLE.search(line)):
            ev.add("available_kv", int(m["a"]), n, line)
            ev.add("device_memory", int(m["t"]), n, line)
            ev.add("platform", "ascend", n, line)
        if "on startup" in low and (m := _FREE_ON_STARTUP.search(line)):
            ev.add("startup_free", round(float(m["free"]) * GiB), n, line)
            ev.add("device_memory", round(float(m["total"]) * GiB), n, line)
        if ("error" in low or "exception" in low) and frame is None and (m := _EXCEPTION.search(line)):
            ev.add("exception", m["v"], n, line)
        if "traceback" in low and _TRACEBACK.search(line):
            tracebacks.append(n)
        if frame is None and "method" in low and (m := _EXECUTOR_METHOD.search(line)):
            frames.append((n, m["func"]))  # (the worker method that raised, as its executor names it: a frame)
        if frame is not None:
            frames.append((n, frame["func"]))
            packages[n] = _package(frame["path"])
            if "vllm_ascend" in frame["path"]:
                ev.add("platform", "ascend", n, line)
        if "out of memory" in low and (oom := parse_oom(_wrapped(lines, n))) is not None and oom.tried is not None:
            ev.add("oom", oom, n, line)
            ev.add("platform", "ascend" if (oom.device or "").startswith("NPU") else "cuda", n, line)
            if oom.total:
                ev.add("device_memory", oom.total, n, line)
        elif ("oom" in low or "out of memory" in low or "outofmemory" in low or "tried to allocate" in low
              or "显存" in line or "内存" in line or "not enough" in low or "insufficient" in low
              or "allocate " in low) and _OOM_WORDS.search(line):
            ev.add("oom_mentioned", True, n, line)
            if "cuda failure" in low and _NCCL_CUDA_OOM.search(line):
                ev.add("collective_saw_oom", True, n, line)  # NCCL reporting the device out of memory: the device's
        if frame is None:
            for rx, device in _DEVICE_NAMES if "h100" in low or "h200" in low else ():
                if rx.search(line):
                    ev.add("device_named", device, n, line)
                    break
        if line.lstrip().startswith("|"):
            _smi(ev, n, line)
    _prose(ev, lines, set(prosed), where)
    for n, key, value in ruled:
        ev.add(key, value, n, lines[n - 1])
    for key in {key for _, key, _ in ruled} & set(ev.facts):  # (a fact out of its range was dropped)
        ev.facts[key].sort(key=lambda f: f.line)  # in report order, as every other fact
    for first, last, text in config_blocks(lines):  # a YAML config or container spec pasted as such
        if (launch := read_config(text)) is not None:
            stated = [f for f in stated if not first <= f[0] <= last]  # (read as the config it is, not as sentences)
            _read_launch(ev, first, lines[first - 1], launch)
            if launch.facts:
                commands.append(_Command(first, lines[first - 1], list(launch.facts), _outcome(lines, first, last)))
                if "unread_flag" in ev.facts:  # the config file a launch names is the one pasted
                    ev.facts["unread_flag"] = [f for f in ev.facts["unread_flag"] if not f.value.startswith("--config")]
    commands.sort(key=lambda c: c.line)
    _launches(ev, commands, lines)
    last = _last_assignments(lines, {n for n, _, _ in stated})
    for n, key, value in stated:  # settings stated in sentences, after any launch's (which say what ran)
        if last.get(n, n) == n:
            ev.add(key, value, n, lines[n - 1])
    _named_changes(ev, lines, where)
    _pasted_metrics(ev, lines, where)
    for kind, what, n in failures(lines, where):
        ev.add("outside", (kind, what), n, lines[n - 1])
    captured = [f.line for f in ev.all("captured")]
    at = [f[0] for f in frames]  # (once: a report of 100,000 tracebacks has as many out-of-memory lines)
    funcs = dict(frames)
    for oom in ev.all("oom") or ev.all("oom_mentioned")[:1]:
        phase = _after_capture(_phase(frames, oom.line, at=at), funcs, captured)
        if phase is not None:
            ev.add("oom_phase", phase[0], phase[1], lines[phase[1] - 1])
    for oom in ev.all("oom")[:1]:
        owner = _allocating_package(packages, oom.line)
        if owner is not None:
            ev.add("oom_package", owner[0], owner[1], lines[owner[1] - 1])
    for oom in (ev.all("oom") or ev.all("oom_mentioned"))[:1]:
        host = _host_package(packages, oom.line)
        if host is not None:
            ev.add("host_package", host[0], host[1], lines[host[1] - 1])
    if tracebacks:  # the phase of the last traceback, with or without an out-of-memory line
        last = [f for f in frames if f[0] > tracebacks[-1]]
        phase = _after_capture(_phase(last, last[-1][0] + 1), funcs, captured) if last else None
        if phase is not None:
            ev.add("error_phase", phase[0], phase[1], lines[phase[1] - 1])
    return ev


_NOT_IN_FRAMES = {"device_nominal_gb", "model_mention"}
_EVERY_MATCH = {"model_mention"}
_FIRST_ONLY = {"platform_prose"}


def _rule_facts(lines: list[str], lows: list[str], where: Where) -> list[tuple[int, str, Any]]:
    """The facts of ``_SIMPLE`` and ``_PROSE_FACTS``: each pattern tried only on the lines that hold its
    words, found by substring search over the whole lower-cased text (fast where most lines hold none)."""
    out: list[tuple[int, str, Any]] = []
    unions: dict[frozenset[str], set[int]] = {}  # (several patterns share a group of words)
    for key, rx, conv, groups in _RULES:
        hits = []
        for group in groups:
            held = unions.get(group)
            if held is None:
                held = unions[group] = where.any_of(group)
            if not held:
                break  # (a group no line meets: the pattern has no line to run on)
            hits.append(held)
        else:
            candidates = set.intersection(*sorted(hits, key=len)) if len(hits) > 1 else hits[0]
            _rule_lines(out, lines, lows, key, rx, conv, candidates)
    out.sort(key=lambda f: f[0])
    return out


def _rule_lines(out: list[tuple[int, str, Any]], lines: list[str], lows: list[str], key: str, rx: re.Pattern,
                conv: Any, candidates: set[int]) -> None:
    """``_rule_facts``' pattern ``rx`` on its ``candidates`` lines, each fact appended to ``out``."""
    before = len(out)
    for n in sorted(candidates):
        if key in _FIRST_ONLY and len(out) > before:
            break  # a platform named once says as much as named on every line
        line = lines[n - 1]
        if key in _NOT_IN_FRAMES and 'file "' in lows[n - 1] and _FRAME.search(line):
            continue  # a path in a traceback names no device and no model
        for m in (rx.finditer(line) if key in _EVERY_MATCH else filter(None, [rx.search(line)])):
            try:
                value = conv(m)
            except (ValueError, OverflowError):  # a figure no float or integer holds: no fact
                continue
            if value is not None:
                out.append((n, key, value))


def _title(ev: Evidence, n: int, title: str) -> None:
    """The issue title: a bare version in it ("0.13.0 qwen3-next-80b oom": the release the reporter
    runs; "from v0.11.2 to v0.14.1": the last). A title given apart (line 0) is also read for the
    versions and out-of-memory words any line holds; a title that is line ``n`` is read as one below."""
    text = title.strip()
    named = Evidence()
    _versions(named, n, text)
    if not named.facts and (found := list(_BARE_VERSION.finditer(text))):
        ev.add("title_version", found[-1]["v"], n, text)
    ev.add("title", text, n, text)
    _release_claims(ev, n, text)
    if n == 0:
        for facts in named.facts.values():
            for f in facts:
                ev.add(f.key, f.value, f.line, f.text)
        if _OOM_WORDS.search(text):
            ev.add("oom_mentioned", True, n, text)


_VERSION_WORDS = (("server version",), ("llm engine (v",), ("vllm version",), ("▀▄▀",), ())
"""Words a line must hold before each ``_VLLM_VERSION`` pattern is tried (``()``: a pip/conda line)."""


_DOT_RC = re.compile(r"(?<=\d)\.rc(?=\d)")


def _versions(ev: Evidence, n: int, line: str, is_frame: bool = False) -> None:
    if ".rc" in line:
        line = _DOT_RC.sub("rc", line)  # "v0.8.4.rc2" is 0.8.4rc2
    low = line.lower()
    listing = low.lstrip().startswith(("vllm", "torch", "[pip", "[conda"))  # pip list / conda list / collect_env
    for rx in _ASCEND_VERSION:
        if ("ascend version" in low or listing) and (m := rx.search(line)):
            ev.add("vllm_ascend_version", m["v"], n, line)
            ev.add("platform", "ascend", n, line)
            return
    for rx, words in zip(_VLLM_VERSION, _VERSION_WORDS):
        if (any(w in low for w in words) if words else listing) and (m := rx.search(line)):
            ev.add("vllm_version", m["v"], n, line)
            return
    if listing and "torch" in low and (m := _TORCH_NPU.search(line)):
        ev.add("torch_npu_version", m["v"], n, line)
        ev.add("platform", "ascend", n, line)
        return
    if is_frame:
        return  # a traceback frame's path (site-packages/vllm/...) names no release
    images = [("vllm_ascend_image", m) for m in _IMAGE_ASCEND.finditer(line)] if "vllm-ascend:" in low else []
    images += [("vllm_image", m) for m in _IMAGE_VLLM.finditer(line)] if "vllm-openai:" in low else []
    for key, m in images:
        ev.add(key, m["v"], n, line)
        if key == "vllm_ascend_image":
            ev.add("platform", "ascend", n, line)
    if images:
        return
    # "upgraded from vllm0.7.3 to vllm0.8.2": the last version a line names is the one that runs
    if "ascend" in low and (found := list(_PROSE_ASCEND.finditer(line))):
        ev.add("vllm_ascend_prose", found[-1]["v"], n, line)
        ev.add("platform", "ascend", n, line)
    elif "vllm" in low and (found := list(_PROSE_VLLM.finditer(line))) and not _CMD.search(line):
        ev.add("vllm_prose", found[-1]["v"], n, line)


_CLAIM_VER = r"[0-9]{1,3}\.[0-9]{1,3}(?:\.[0-9]{1,3})?(?:\.?rc[0-9]{1,3})?(?:\.post[0-9]{1,3})?"
"""A release in a sentence (no ``.dev`` tail: a claim names a release)."""
_CLAUSE = re.compile(r"[,，;；。()（）\[\]!?！？：]|\.\s|\s(?:but|while|whereas|however|then|and now|yet)\s|但是?|而|可是|却",
                     re.IGNORECASE)
_CLAUSE_WORKS = re.compile(r"\b(?:works?|worked|working|fine|ok|okay|succe\w*|normal(?:ly)?|no (?:errors?|problems?|issues?|"
                           r"oom)|without (?:errors?|problems?|issues?|oom)|can (?:load|run|start|serve))\b|正常|成功|没问题|"
                           r"可以|能跑|能用|能拉", re.IGNORECASE)
_CLAUSE_FAILS = re.compile(r"\b(?:ooms?|out of memory|errors?|fail\w*|crash\w*|cannot|can't|unable|broken|regression)\b|"
                           r"\b(?:\w+\.)*(?:OutOfMemory|[A-Z]\w*)Error\b|"  # an exception named: torch.OutOfMemoryError
                           r"报错|失败|不能|无法|不行|显存不足|爆显存", re.IGNORECASE)
_MORE_THAN = re.compile(rf"v?(?P<a>{_CLAIM_VER})\b[^,，;。\n]{{0,40}}?\b(?:needs?|uses?|takes?|requires?|consumes?|occupies)"
                        rf"\s+(?:much\s+|far\s+)?more (?:gpu |npu |device )?memory than\b[^,，;。\n]{{0,20}}?v?"
                        rf"(?P<b>{_CLAIM_VER})", re.IGNORECASE)
_UPGRADE = re.compile(rf"\bfrom\s+(?:vllm[-_ ]?(?:ascend)?\s*)?v?(?P<a>{_CLAIM_VER})\s+to\s+(?:vllm[-_ ]?(?:ascend)?\s*)?v?"
                      rf"(?P<b>{_CLAIM_VER})|升级到\s*v?(?P<c>{_CLAIM_VER})", re.IGNORECASE)
_SINCE = re.compile(rf"\b(?:since|starting (?:from|with)|from)\s+(?:vllm[-_ ]?(?:ascend)?\s*)?v?(?P<v>{_CLAIM_VER})\s*(?:on)?\s*[,，]",
                    re.IGNORECASE)
_PREVIOUS_WORKED = re.compile(r"(?:work\w*|fine|ok)\b[^.\n]{0,30}?\b(?:previous|older|earlier|last) (?:versions?|releases?)|"
                              r"(?:previous|older|earlier) (?:versions?|releases?)[^.\n]{0,20}?\b(?:work\w*|fine|ok)\b|"
                              r"之前的?版本.{0,6}?(?:正常|可以|没问题)", re.IGNORECASE)


def _release_claims(ev: Evidence, n: int, text: str) -> None:
    """Releases a sentence says work or fail ("OOM in 0.8.3 (ok in 0.7.2)", "v0.6.4 needs more memory than v0.6.3",
    "works well in vllm 0.2.6 but run out of memory using 0.2.7", "from 0.7.3 to 0.8.2"): each clause's release
    takes the clause's own word, else the sentence's."""
    text = text[:2000]  # a sentence, not a log pasted onto one line
    low = text.lower()
    if "more" in low and "than" in low and (m := _MORE_THAN.search(text)):
        ev.add("release_fails", m["a"].replace(".rc", "rc"), n, text)
        ev.add("release_works", m["b"].replace(".rc", "rc"), n, text)
        return
    if ("previous" in low or "older" in low or "earlier" in low or "last" in low or "之前" in text) and \
            _PREVIOUS_WORKED.search(text):
        ev.add("previous_worked", True, n, text)
    sentence_fails = _CLAUSE_FAILS.search(_CLAUSE_WORKS.sub(" ", text)) is not None
    # "Since vLLM 0.2.5, we can't even run ...": earlier ones did
    if ("since" in low or "from" in low) and (m := _SINCE.search(text)) and sentence_fails:
        ev.add("release_fails", m["v"].replace(".rc", "rc"), n, text)
        ev.add("previous_worked", True, n, text)
        return
    if ("from" in low or "升级" in text) and (m := _UPGRADE.search(text)) and sentence_fails:
        if m["a"]:
            ev.add("release_works", m["a"].replace(".rc", "rc"), n, text)
        ev.add("release_fails", (m["b"] or m["c"]).replace(".rc", "rc"), n, text)
        return
    claims: list[tuple[str, str | None]] = []
    for clause in _CLAUSE.split(text):
        if not clause:
            continue
        found = [m["v"] for m in _BARE_VERSION.finditer(clause)]
        if not found:
            continue
        works = _CLAUSE_WORKS.search(clause) is not None
        fails = _CLAUSE_FAILS.search(_CLAUSE_WORKS.sub(" ", clause)) is not None  # "no error" is no failure
        claims += [(v.replace(".rc", "rc"), "works" if works and not fails else "fails" if fails and not works else None)
                   for v in found]
    said = {c for _, c in claims}
    if said >= {"works", "fails"} or said == {"fails"} and "previous_worked" in ev.facts:
        for version, claim in claims:
            if claim is not None:
                ev.add(f"release_{claim}", version, n, text)


_DISAGGREGATED = re.compile(r"(?<![A-Za-z0-9])(?:PD|P/D|P-D)[ \t]*(?:separation|disaggregat\w*|分离|分离部署)|"
                            r"(?<![A-Za-z0-9])[1-9]\d?P[1-9]\d?D(?![A-Za-z0-9])|prefill[ \t/-]*decode[ \t]+(?:disaggregat\w*|"
                            r"separation)|disaggregated (?:prefill|serving)|预填充.{0,6}解码.{0,4}分离", re.IGNORECASE)
"""Prefill/decode disaggregation named in prose ("PD separation, 2P1D", "4P1D"): the KV cache is transferred."""
_SIZE_HINT = re.compile(r"\d[BbMm](?![A-Za-z])")
"""A parameter count ("7b", "30B", "350M"): the lines a model may be named on by its size."""
_CLAIM_WORDS = ("oom", "error", "fail", "work", "fine", " ok", "okay", "succe", "normal", "than", "since", "from", "crash",
                "unable", "can't", "cannot", "no ", "memory", "broke", "regress", "升级", "报错", "失败", "正常", "成功",
                "问题", "可以", "不能", "无法", "不行", "显存", "却")
"""Words a sentence that says a release works or fails holds one of."""
_GROWTH_WORDS = ("grow", "increas", "rising", "rises", "climb", "goes up", "going up", "leak", "上涨", "增长", "增加",
                 "增大", "变大", "上升", "提升", "升高", "泄", " hour", " day", " week")
_UTIL_PROSE = re.compile(r"(?<![A-Za-z0-9_-])(?:gpu[_ -]memory[_ -]utili[sz]ation|utili[sz]ation|util|利用率)[ \t]*(?:(?:is[ \t]+)?set[ \t]+)?(?:=|:|：|to|is|of|at|"
                         r"为|设置为|设为|设置成|改为)?[ \t]*(?P<v>0?\.\d{1,3}|1\.0)(?![\d.])", re.IGNORECASE)
"""A utilization the reporter states ("I set gpu_memory_utilization to 0.95", "utilization 0.4")."""
_MML_PROSE = re.compile(r"(?<![A-Za-z0-9_-])(?:--max[_-]model[_-]len[ \t]+(?:is[ \t]+)?set[ \t]+(?:to[ \t]+)?|(?:max[_ -])?model[_ -]len(?:gth)?"
                        r"[ \t]*(?:(?:is[ \t]+)?set[ \t]+)?(?:=|:|：|to|is|of|at|为|设置为|设为)?[ \t]*)"
                        r"(?P<v>[1-9]\d{2,7})(?![\d.])", re.IGNORECASE)
"""A max model length the reporter states ("max_model_len=16000", "max model len to 32768")."""
_WEIGHT_BITS = re.compile(r"(?<![A-Za-z0-9])[wW](?P<v>4|8)[aA](?:4|8|16)(?![0-9])|"
                          r"(?<![\w.])(?P<b>4|8)\s*(?:位|-?\s?bits?)\s*(?:的)?\s*(?:量化|quantiz)", re.IGNORECASE)
"""The weights' bits in the quantization schemes written wXaY ("w4a8", "W8A8"): vllm-ascend's and compressed-tensors';
and in a sentence ("4位量化模型", "an 8-bit quantized model")."""
_HOST_NAMED = re.compile(r"\b(?:RAM|RSS|host|CPU memory|system memory)\b|(?<!显)内存|主机", re.IGNORECASE)
"""A sentence about the host's memory, not the device's ("内存" without "显": RAM)."""
_PROSE_FACTS_RX: tuple[tuple[str, re.Pattern, tuple[tuple[str, ...], ...]], ...] = (
    ("util_prose", _UTIL_PROSE, (("util", "利用率"),)),
    ("mml_prose", _MML_PROSE, (("model_len", "model len", "model-len", "model_length", "model length"),)),
    ("disaggregated", _DISAGGREGATED, (("pd", "p/d", "p-d", "prefill", "disaggregat", "预填充", "分离") + tuple(
        f"{i}d" for i in range(1, 10)),)),
    ("memory_question", _MEMORY_QUESTION, (("gpu memory", "npu memory", "device memory", "vram", "cuda memory",
                                            "video memory", "memory usage", "memory consumption", "memory footprint",
                                            "显存", "memory?", "memory ?", "more memory", "much memory", "gpu ram",
                                            "huggingface", " hf "),)),
    ("tp_prose", _TP_PROSE, (("tp=", "tp:", "tp :", "tp =", "tp：", "tp\t", "tp ", "parallel"),)),
    ("model_mention", _SIZED_MODEL, ()),  # (its lines: those with a size, ``_SIZE_HINT``)
    ("memory_growth", _GROWTH, (_GROWTH_WORDS,)),
    ("serving_oom", _SERVING_OOM, (("oom", "out of memory", "显存"), (
        "request", "input", "prompt", "concurren", "stress test", "load test", "benchmark", "long ", "serving",
        "inference", "压测", "并发", "请求", "推理", "长文本"))),
    ("capture_oom", _CAPTURE_OOM, (("captur",), ("memory", "oom", "显存"))),
    ("weight_bits", _WEIGHT_BITS, (("w4a", "w8a", "位量化", "位的量化", "bit quant", "bits quant", "bit 量化"),)),
)
"""The facts of the reporter's sentences, each pattern with the words its lines must hold first (lower-cased): groups
of alternatives, every group met, as ``_RULES``'s."""


def _prose(ev: Evidence, lines: list[str], prose: set[int], where: Where) -> None:
    """What the reporter's sentences (``prose``: lines no program printed) say: prefill/decode disaggregation, the
    TP, a model by its size, memory that grows, an out-of-memory while serving, a question about memory use. Each
    pattern runs only on the prose lines that hold one of its words."""
    if not prose:
        return
    text = "\n".join(lines)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    sized = {bisect.bisect_right(starts, m.start()) for m in _SIZE_HINT.finditer(text)}
    found: list[tuple[int, str, Any]] = []
    for key, rx, groups in _PROSE_FACTS_RX:
        lines_of = set.intersection(*(where.any_of(g) for g in groups)) if groups else sized
        for n in sorted(lines_of & prose):
            if key == "memory_growth" and _HOST_NAMED.search(lines[n - 1]) and "显存" not in lines[n - 1]:
                continue  # the host's memory growing ("内存（RAM）", "RSS"): kvaudit.triage.failures says so
            if m := rx.search(lines[n - 1]):
                found.append((n, key, int(m["v"] or m["b"]) if key == "weight_bits" else int(m["v"])
                              if key in ("tp_prose", "mml_prose") else float(m["v"])
                              if key == "util_prose" else m.group(0) if key == "model_mention" else True))
    for n in sorted(where.any_of(("`",)) & prose):  # a Hub id quoted as code in a sentence: "I serve `org/name`"
        for m in _TICKED.finditer(lines[n - 1]):
            if is_hub_id(m["v"]):
                found.append((n, "model_prose", m["v"]))
                break
    for n, key, value in sorted(found, key=lambda f: f[0]):
        ev.add(key, value, n, lines[n - 1])


_NEEDLES = needles()
def _opening(anchor: str) -> str:
    """A catalogued message's first three words (four where three are shorter than 10 characters), lower-cased: what
    the first line of the message holds wherever a paste wrapped it."""
    words = anchor.split("…")[0].split()
    head = " ".join(words[:3])
    return (head if len(head) >= 10 else " ".join(words[:4])).lower()


_MESSAGE_STARTS = frozenset(o for o in map(_opening, anchors()) if len(o) >= 10)
"""The opening words of each catalogued message (``kvaudit.triage.loglines.anchors``): a line holding one may be a message a
paste wrapped onto the next lines."""
_CONTINUED = re.compile(r"^\s*(?:\(\w+ pid=\d+\)\s*)?(?:\[rank\d+\]:\s*)?(?:(?:INFO|WARNING|ERROR|DEBUG) \S+ \S+ "
                        r"\[[\w.]+:\d+\]\s*)?[^\w(\[-]*")
"""What a continued line starts with before the message goes on: a log prefix, a quote bar (``▎``), blanks."""


def _log_facts(lines: list[str], n: int, line: str, starts: set[int]) -> list[tuple[str, Any]]:
    """The facts of line ``n`` by the catalogue of vLLM's and vllm-ascend's own formats (``kvaudit.triage.loglines``;
    where none matches, a refusal the line retypes by hand, ``retyped``); a message the paste wrapped onto the next
    lines (a terminal's width, a quoted block) is read whole where the line is one of ``starts``, those holding a
    message's opening words."""
    got = read_line(line) or retyped(line)
    if got:
        return got
    if n not in starts:  # a log record a terminal wrapped: its message goes on over the lines that start no record
        if n >= len(lines) or _NEW_RECORD.match(lines[n]):
            return []
        taken = _continuation(lines, n)
        alone = {f for k in range(n, n + taken) for f in read_line(lines[k])}
        return [f for f in read_line(_wrapped(lines, n, taken)) if f not in alone]
    joined, alone = line.rstrip(), set()
    for k in range(n, min(n + 3, len(lines))):
        more = _CONTINUED.sub("", lines[k], count=1).strip()
        joined += " " + more
        alone |= set(read_line(more))
        got = [f for f in read_line(joined) if f not in alone]  # what the start line adds, not the next lines' own
        if got:
            return got
    return []


_NEW_RECORD = re.compile(r"^\s*(?:$|```|\(\w+ pid=\d+\)|\[rank\d+\]|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\b|Traceback|File \"|"
                         r"\[\.\.\.\]|\w+(?:\.\w+)*(?:Error|Exception):|\d{4}-\d\d-\d\d[T ]\d\d:\d\d|\$ |[|+]|#)")
"""A line that starts a record of its own (a log record, a traceback, a cut, a fence), not the rest of a message."""


def _continuation(lines: list[str], n: int, most: int = 8) -> int:
    """How many lines after line ``n`` a paste wrapped its message onto (up to ``most``): each next line that starts
    no record of its own."""
    taken = 0
    for k in range(n, min(n + most, len(lines))):
        if _NEW_RECORD.match(lines[k]):
            break
        taken += 1
    return taken


def _wrapped(lines: list[str], n: int, taken: int | None = None) -> str:
    """Line ``n`` with the lines a paste wrapped its message onto (``taken`` of them, where already counted). torch's
    out-of-memory message is one line, which terminals wrap."""
    taken = _continuation(lines, n) if taken is None else taken
    return " ".join([lines[n - 1]] + [x.strip() for x in lines[n:n + taken]])


def _shell_value(text: str) -> str:
    """An assigned value without its quotes, with ``$((a * b))`` worked out."""
    if m := _ARITHMETIC.match(text):
        a, b = int(m["a"]), int(m["b"])
        return str(a * b if m["op"] == "*" else a + b if m["op"] == "+" else a - b)
    return text.strip("'\"")


def _named_changes(ev: Evidence, lines: list[str], where: Where) -> None:
    """vLLM's memory changes the report names by their switch or log line (``kvaudit.triage.changes``: "Model Runner V2",
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS): the first line naming each."""
    for change in CHANGES:
        named = where.any_of(change.named_by)
        if named:
            n = min(named)
            ev.add("change_named", change.release, n, lines[n - 1])


_FLAG_ONLY = re.compile(r"^\s*(?P<rest>--[a-z][\w-]*)\s*$")
"""A line that holds one switch alone: a launch's, where it follows one (``--enforce-eager`` on a line of its own)."""
_FLAG_AT_END = re.compile(r"\s--?[A-Za-z][\w-]*\s*$")
"""A launch line that ends with a flag: its value is on the next line (a paste wrapped at the terminal's width)."""
_VALUE_WRAPPED = re.compile(r"(?:[A-Za-z_]\w*[ \t]*[=:：]|(?<![\w-])--?[A-Za-z][\w-]*)[ \t]*$")
"""A line that ends with a setting's name or flag (one that begins a word, as in "`--max-model-len": not the "-chat-hf"
of a model's name), its value on the next line."""


def _open_quote(text: str) -> bool:
    """Whether ``text`` leaves a shell quote open (an odd count of unescaped ``"``, or of ``'`` outside them)."""
    double = len(re.findall(r'(?<!\\)"', text))
    if double % 2:
        return True
    return len(re.findall(r"'", re.sub(r'"[^"]*"', "", text))) % 2 == 1


def _continues(lines: list[str], n: int) -> bool:
    """Whether line ``n`` continues a command begun above it (the previous line ends with a backslash)."""
    return n >= 2 and lines[n - 2].rstrip().endswith("\\")


_LAUNCHES: dict[tuple[str, bool], Launch] = {}


def _launch(text: str, in_variable: bool) -> Launch:
    """A launch's words (shlex, then vLLM's parser), read once per text (a paste repeats its commands)."""
    key = (text, in_variable)
    if key not in _LAUNCHES:
        words = split(text)
        if in_variable:  # the variable's value, unquoted, is the argument list
            words = [w for quoted in words for w in split(quoted)]
        if len(_LAUNCHES) > 4096:
            _LAUNCHES.clear()
        _LAUNCHES[key] = read_words(command_words(words))
    return _LAUNCHES[key]


def _read_launch(ev: Evidence, n: int, line: str, launch: Launch, add: bool = False) -> None:
    """Record which parser read a launch and what it did not take; ``add``: its facts are the deployment's (a
    logged ``non-default args`` line, not a launch that may be another than the failing one)."""
    ev.add("launch_parser", launch.parser, n, line)
    for flag in launch.unread:
        ev.add("unread_flag", flag, n, line)
    for key, value in launch.facts if add else ():
        ev.add(key, value, n, line)


def _outcome(lines: list[str], first: int, last: int) -> str | None:
    """``works`` / ``fails`` where the paste says so next to a launch: the nearest line of prose above it
    ("this one works:", "无法拉起报OOM的指令："), else the two lines below it."""
    above = []
    for k in range(first - 2, max(-1, first - 9), -1):
        text = lines[k].strip()
        if text and not text.startswith("```") and not _ASSIGN.search(text):
            above = [text]
            break
    for near in (above, lines[last:last + 2]):
        said = " ".join(near)
        works = _WORKS_RX.search(said)
        fails = _FAILS_RX.search(said)
        if works and not fails:
            return "works"
        if fails and not works:
            return "fails"
    return None


def _launches(ev: Evidence, commands: list[_Command], lines: list[str]) -> None:
    """The launch that failed sets the deployment; a launch the paste says works is evidence; a second ``LLM(...)`` in
    one Python paste (no code fence between them) is a second engine in the same process."""
    if not commands:
        return
    engines = [c for c in commands if _LLM_ENGINE.search(c.text)]
    for first, second in zip(engines, engines[1:]):  # (two code blocks are two programs, not one)
        if not any(lines[k].lstrip().startswith(("```", "~~~")) for k in range(first.line, second.line - 1)):
            ev.add("second_engine", second.line, second.line, second.text)
            break
    titled = {f.line for f in ev.all("title")}
    errors = sorted(f.line for f in ev.all("oom") + ev.all("oom_mentioned") + ev.all("kv_capacity_error")
                    if f.line not in titled)
    failing = [c for c in commands if c.outcome == "fails"]
    if failing:
        chosen = failing[-1]
    else:
        pending = [c for c in commands if c.outcome != "works"] or commands
        before = [c for c in pending if errors and c.line < errors[0]]
        chosen = before[-1] if before else pending[-1] if not errors else pending[0]  # the launch the error follows
    for key, value in chosen.facts:
        ev.add(key, value, chosen.line, chosen.text)
    for c in commands:
        if c is not chosen and c.outcome == "works":
            ev.add("working_launch", dict(c.facts), c.line, c.text)


_RUNTIME = {"torch", "torch_npu", "vllm", "vllm_ascend", "triton", "transformers", "accelerate", "safetensors",
            "huggingface_hub", "ray", "uvloop", "asyncio", "concurrent", "threading", "multiprocessing", "runpy",
            "fastapi", "starlette", "uvicorn", "typing_extensions", "contextlib", "functools"}
"""Packages whose frames allocate on vLLM's behalf (vLLM itself, torch, the model's libraries) or only run code
(Python's and the server's machinery): none of them is a component outside vLLM's budget."""


def _package(path: str) -> str | None:
    """The package a traceback frame's file belongs to (``.../site-packages/lmcache/v1/...`` -> ``lmcache``; a source
    checkout's ``.../vllm/v1/worker/...`` -> ``vllm``, ``/verl/verl/...`` -> ``verl``; a Ray job's working_dir,
    ``.../runtime_resources/working_dir_files/_ray_pkg_<hash>/openrlhf/...`` -> ``openrlhf``), or ``None`` for a
    script of the reporter's."""
    parts = path.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return parts[parts.index(marker) + 1].removesuffix(".py").split("-")[0]
    for known in ("vllm_ascend", "vllm", "torch_npu", "torch"):
        if known in parts[:-1]:
            return known
    folders = parts[:-1]
    for outer, inner in zip(folders, folders[1:]):
        if outer.startswith("_ray_pkg_") and inner.isidentifier():  # a Ray job's working_dir, unpacked by Ray
            return inner
    for outer, inner in zip(folders, folders[1:]):  # a source checkout: ``/verl/verl/workers/...``
        if outer == inner and inner.isidentifier():
            return inner
    return None


def _allocating_package(packages: dict[int, str | None], oom_line: int, reach: int = 80) -> tuple[str, int] | None:
    """The component whose code asked for the allocation that ran out: the deepest frame above the out-of-memory line
    (within ``reach`` lines) in a package that is not vLLM's runtime (``_RUNTIME``), where that frame is deeper than
    vLLM's own last frame (a connector vLLM calls, not vLLM calling torch)."""
    above = sorted(n for n in packages if oom_line - reach <= n < oom_line)
    for n in reversed(above):
        package = packages[n]
        if package in ("vllm", "vllm_ascend"):
            return None  # vLLM's own frame is the deepest that is not torch's: vLLM allocated
        if package is not None and package not in _RUNTIME:
            return package, n
    return None


def _host_package(packages: dict[int, str | None], oom_line: int, reach: int = 80) -> tuple[str, int] | None:
    """The program vLLM runs inside (an RL trainer that drives an ``LLM``): the outermost frame of the traceback
    around the out-of-memory line (``reach`` lines above it, else below it, as ``_phase`` reads) in a package that is
    not vLLM's runtime, where vLLM's own frames are deeper. Its tensors share the device with vLLM's budget."""
    for block in (sorted(n for n in packages if oom_line - reach <= n < oom_line),
                  sorted(n for n in packages if oom_line < n <= oom_line + reach)):
        for i, n in enumerate(block):
            package = packages[n]
            if package is not None and package not in _RUNTIME:
                if any(packages[m] in ("vllm", "vllm_ascend") for m in block[i + 1:]):
                    return package, n
                break
    return None


def _names_model(value: Any) -> bool:
    """Whether a launch's model reads as one vLLM takes, not a word of prose: a Hub id (``org/name``) or a path (a
    ``/`` in it, or ``~``)."""
    text = str(value)
    return "/" in text or text.startswith("~")


_ENV_LINE = re.compile(r"^\s*(?:export\s+)?(?P<k>[A-Za-z_]\w*)=\S*\s*$")
"""A line that is one shell or ``.env`` assignment, ``NAME=value`` and nothing else."""


def _last_assignments(lines: list[str], at: set[int]) -> dict[int, int]:
    """For each line of ``at`` that assigns a variable (``_ENV_LINE``), the last line of the paste that assigns the same
    variable: a shell script or ``.env`` file that sets it twice runs with the later value
    (``TENSOR_PARALLEL_SIZE=2`` ... ``TENSOR_PARALLEL_SIZE=1``: 1)."""
    names = {n: m["k"] for n in at if (m := _ENV_LINE.match(lines[n - 1]))}
    if not names:
        return {}
    last = {m["k"]: n for n, line in enumerate(lines, start=1) if "=" in line and (m := _ENV_LINE.match(line))}
    return {n: last[k] for n, k in names.items()}


def _phase(frames: list[tuple[int, str]], oom_line: int, reach: int = 80, at: list[int] | None = None
           ) -> tuple[str, int] | None:
    """The phase of the traceback around an error line: its deepest recognised frame. Tracebacks
    usually end with the error; some logs print the error first, so frames after it count too; last, the method the
    error's own line names (``_EXECUTOR_METHOD``), the outermost. ``at``: the frames' line numbers, where the caller
    asks for many error lines of the same frames."""
    at = [f[0] for f in frames] if at is None else at
    lo, mid, hi = (bisect.bisect_left(at, oom_line - reach), bisect.bisect_left(at, oom_line),
                   bisect.bisect_right(at, oom_line + reach))
    before = frames[lo:mid]
    after = [f for f in frames[mid:hi] if f[0] != oom_line]
    named = [f for f in frames[mid:hi] if f[0] == oom_line]
    for block in (before, after, named):
        for n, func in reversed(block):
            for phase, funcs in PHASES.items():
                if func in funcs:
                    return phase, n
    return None


def _after_capture(phase: tuple[str, int] | None, funcs: dict[int, str],
                   captured: list[int]) -> tuple[str, int] | None:
    """The profile run's phase, read from a dummy run's frame (``_SHARED_WITH_WARM_UP``), is the warm-up's where graph
    capture finished before that frame was logged (``funcs``: each frame's function by its line)."""
    if phase is None or phase[0] != "memory profiling" or not captured or min(captured) >= phase[1]:
        return phase
    func = funcs.get(phase[1])
    return ("warm-up", phase[1]) if func in _SHARED_WITH_WARM_UP else phase


def _smi(ev: Evidence, n: int, line: str) -> None:
    """A line of a smi table, read by ``kvaudit.server.smi`` (as ``kvaudit live`` reads the tables whole)."""
    for kind, value in smi.read_line(line):
        if kind == "process":
            ev.add("device_process_mb", value[3], n, line)
        elif kind == "device_name":
            ev.add("device_name", value[1], n, line)
            ev.add("platform", value[2], n, line)
        elif kind == "usage":
            ev.add("hbm_used_mb", value[0], n, line)
            ev.add("hbm_total_mb", value[1], n, line)


_CACHE_CONFIG = metrics.CACHE_CONFIG


def _pasted_metrics(ev: Evidence, lines: list[str], where: Where) -> None:
    """A server's ``/metrics`` pasted into the report, read by ``kvaudit.server.metrics`` (as ``kvaudit live`` reads
    it): the CacheConfig the server ran with (``vllm:cache_config_info``: utilization, num_gpu_blocks, block size, KV
    cache dtype), each with the sample's line."""
    at = sorted(where[_CACHE_CONFIG])
    if not at:
        return
    sample = next((n for n in at if "{" in lines[n - 1]), at[0])
    line = lines[sample - 1]
    found: list[tuple[str, Any]] = []
    try:
        for engine in metrics.read_metrics("\n".join(lines), "the pasted /metrics").engines[:1]:
            found = [("gpu_memory_utilization", engine.config_float("gpu_memory_utilization")),
                     ("gpu_blocks", engine.config_int("num_gpu_blocks")), ("block_size", engine.config_int("block_size"))]
            dtype = engine.cache_config.get("cache_dtype")
            found.append(("kv_cache_dtype", None if dtype in (None, "None", "auto") else dtype))
    except UsageError:  # (a sample cut or a figure that is none: the report's other lines still count)
        return
    for key, value in found:
        if value is not None:
            ev.add(key, value, sample, line)


_ALL_WORDS = _all_words()
"""Every word a reader of this module (or ``kvaudit.triage.failures``) gates its patterns on."""
_ALL = Words(_ALL_WORDS)
