#!/usr/bin/env python3
"""Build kvaudit/triage/log_formats.json from vLLM's and vllm-ascend's own log and error format strings (run by hand).

    .venv/bin/python scripts/log_catalogue.py

Fetches the sdists of ``VLLM_RELEASES`` into kvaudit's cache (``~/.cache/kvaudit/sdists``; a release that cannot be
had is skipped and named), reads the vllm-ascend sdists already there (``sdists/vllm-ascend-X/``, as kvaudit's own
release fetching keeps them), and parses their Python sources from the tarballs (``ast``; nothing is extracted,
imported or run). A format string is read when its literal text holds one of the ``ANCHORS`` of ``KINDS``; that row
of ``KINDS`` names the fact each placeholder gives (by the text around it, or by the expression it shows), and the
unit each prints is found from what the expression divides by (``/ GiB_bytes``, ``format_gib(...)``, ``/ float(2**30)``
and ``/ 1024 / 1024 / 1024`` are GiB, whatever the message prints; the module's and the function's own assignments
are followed: ``GiB = lambda b: b / GiB_bytes``, ``x_GB = free / (1 << 30)``).

Each entry of the JSON list: ``kind`` (the ``KINDS`` row), ``anchor`` (its anchor as found, ``…`` for a
placeholder), ``fact_keys`` (one per placeholder, ``null`` for one not read), ``units`` (per placeholder: ``GiB``,
``GB``, ``MiB``, ``MB`` or ``bytes`` for a memory figure, ``int``, ``float``, ``ratio`` or ``text``), ``format`` (as
in the source; f-string placeholders as ``{expr}`` / ``{expr:spec}``, literal braces doubled; a plain string is an
f-string without placeholders), ``style`` (``percent``, ``fstring`` or ``brace``), ``source`` (the file in the
newest release holding it), ``package`` (``vllm`` or ``vllm-ascend``), ``releases`` ([first, last] of the scanned
releases holding it: identical formats are one entry). Where present: ``marks`` (facts the message states by
itself, the anchor its value), ``line`` ([i, n]: line i of a message of n lines), ``notes`` (a unit printed otherwise
than computed), ``also_in`` (other files holding the same format).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvaudit.strategies.releases import _sha256, cache_dir  # the sdist cache and its checksum, as kvaudit fetches releases

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "kvaudit" / "triage" / "log_formats.json"

VLLM_RELEASES = ["0.2.7", "0.3.3", "0.4.3", "0.5.5", "0.6.3", "0.6.4", "0.6.5", "0.6.6", "0.7.3", "0.8.1", "0.8.5",
                 "0.9.2", "0.10.2", "0.11.0", "0.13.0", "0.18.0", "0.23.0", "0.24.0", "0.28.0", "0.33.0"]
"""The vLLM releases scanned: a spread from the first V0 memory lines to the V1 profile breakdown."""


def sdists() -> Path:
    return cache_dir() / "sdists"


def _published(page: str, filename: str) -> tuple[str, str] | None:
    """(url, sha256) of ``filename`` on the simple-API project page ``page`` (PEP 691 JSON)."""
    req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - the index pip itself used
        body = json.loads(r.read())
    for f in body.get("files", []):
        if f.get("filename") == filename and (f.get("hashes") or {}).get("sha256"):
            return f["url"], f["hashes"]["sha256"].lower()
    return None


def fetch_vllm(version: str) -> tuple[Path | None, str]:
    """The vLLM ``version`` sdist in ``sdists()``: cached, else ``pip download vllm==X --no-deps --no-binary :all:``.

    pip downloads the file and then prepares its metadata before saving it, which no vLLM sdist survives here
    (``--no-binary :all:`` has pip build the build dependencies, torch among them, from source; without build
    isolation setup.py wants CUDA_HOME or setuptools_rust). Then the file pip found (its log's ``Found link URL
    (from PAGE)``) is fetched from that same index page and kept only when its SHA-256 is the one the page publishes.
    Returns (path or None, how it was had or why not)."""
    name = f"vllm-{version}.tar.gz"
    target = sdists() / name
    if target.is_file():
        return target, "cached"
    sdists().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=sdists()) as tmp:
        log = Path(tmp) / "pip.log"
        env = dict(os.environ, VLLM_TARGET_DEVICE="empty")
        cmd = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "--retries", "1", "--log", str(log), "-d", str(sdists())]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        except subprocess.TimeoutExpired:
            return None, "pip download took over 15 minutes"
        if p.returncode == 0 and target.is_file():
            return target, "pip download"
        text = log.read_text(errors="replace") if log.is_file() else ""
        m = re.search(rf"Found link (?P<url>\S*/{re.escape(name)})\S* \(from (?P<page>\S+?)\)", text)
        if not m:
            tail = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()][-1:]
            return None, f"pip found no sdist ({tail[0] if tail else 'no output'})"
        try:
            found = _published(m["page"], name)
            if found is None:
                return None, f"{m['page']} publishes no sha256 for {name}"
            url, digest = found
            part = Path(tmp) / name
            with urllib.request.urlopen(url, timeout=300) as r, part.open("wb") as f:  # noqa: S310
                for chunk in iter(lambda: r.read(1 << 20), b""):
                    f.write(chunk)
            if _sha256(part) != digest:
                return None, f"{name}: sha256 is not the one {m['page']} publishes"
            os.replace(part, target)
        except (OSError, ValueError) as e:  # no network, a page that is no JSON
            return None, f"{name}: {e}"
        why = re.findall(r"^\S+ +(?:[\w.]+\.)?(\w*(?:Error|Exception): .*)$", text, re.M)
        return target, (f"pip found it but could not prepare its metadata ({why[-1] if why else 'see pip log'}); "
                        "fetched from the same index page, sha256 checked")


def vllm_ascend_sdists() -> list[tuple[str, Path]]:
    """(release, sdist) of each vllm-ascend release in the cache (``sdists/vllm-ascend-X/vllm_ascend-X.tar.gz``, as
    ``kvaudit.strategies.releases.fetch_sdist`` keeps them)."""
    out = []
    for folder in sorted(sdists().glob("vllm-ascend-*")):
        for tar in sorted(folder.glob("*.tar.gz")):
            out.append((folder.name.removeprefix("vllm-ascend-"), tar))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# the message kinds: which format strings are read, and which fact each placeholder gives


@dataclass(frozen=True)
class Rule:
    """A placeholder gives ``key`` when each regex given matches: ``before``, the message's literal text before it
    (other placeholders as ``\\x00``, searched, so anchor with ``$``); ``after``, the text after it (anchor with
    ``^``); ``expr``, the expression it shows (an f-string's, or the argument of a %-format's logger call)."""

    key: str
    before: str | None = None
    after: str | None = None
    expr: str | None = None

    def matches(self, before: str, after: str, expr: str | None) -> bool:
        return ((self.before is None or re.search(self.before, before) is not None)
                and (self.after is None or re.search(self.after, after) is not None)
                and (self.expr is None or (expr is not None and re.search(self.expr, expr) is not None)))


@dataclass(frozen=True)
class Kind:
    """One kind of message: the ANCHOR regexes that pick its format strings (searched in the literal text, each
    placeholder as ``\\x00``), the rules that name its placeholders' facts (the first that matches wins; a
    placeholder no rule names is not read: ``null``), and the facts the message states by itself (``marks``: the
    message's anchor text is the value)."""

    name: str
    anchors: tuple[str, ...]
    rules: tuple[Rule, ...] = ()
    marks: tuple[str, ...] = ()


GIB_AFTER = r"^ ?GiB"
KINDS: tuple[Kind, ...] = (
    # V1 worker, after profiling: "Available KV cache memory: 12.3 GiB" (vllm-ascend's 310P: "... GiB (halved for
    # workspace)"); the KV budget, negative when weights and activations already exceed the utilization budget
    Kind("available_kv", (r"Available KV cache memory: \x00",), (Rule("available_kv", before=r"memory: $"),)),
    # V0 worker (0.6.6-0.10), one message on three lines: "Memory profiling takes S seconds\nthe current vLLM instance
    # can use total_gpu_memory (T GiB) x gpu_memory_utilization (U) = R GiB\nmodel weights take W GiB; non_torch_memory
    # takes N GiB; PyTorch activation peak memory takes P GiB; the rest of the memory reserved for KV Cache is K GiB."
    Kind("v0_memory_profile", (r"the rest of the memory reserved for KV Cache is",), (
        Rule("device_memory", before=r"total_gpu_memory \($"),
        Rule("gpu_memory_utilization", before=r"x gpu_memory_utilization \($"),
        Rule("requested_memory", before=r"\) = $"),
        Rule("weights", before=r"model weights take $"),
        Rule("non_torch", before=r"non_torch_memory takes $"),
        Rule("peak_activation", before=r"activation peak memory takes $"),
        Rule("available_kv", before=r"reserved for KV Cache is $"))),
    # V1 profiler result (debug, 0.9+): "Memory profiling takes S seconds. Total non KV cache memory: X GiB; torch peak
    # memory increase: P GiB; non-torch forward increase memory: N GiB (0.28+: total consumed (from mem_get_info): C
    # GiB); weights memory: W GiB."
    Kind("v1_memory_profile", (r"Total non KV cache memory: ",), (
        Rule("non_kv_memory", before=r"Total non KV cache memory: $"),
        Rule("peak_activation", before=r"torch peak memory increase: $"),
        Rule("non_torch", before=r"non-torch forward increase memory: $"),
        Rule("profiled_consumed", before=r"total consumed \(from mem_get_info\): $"),
        Rule("weights", before=r"weights memory: $"))),
    # the weights' memory after loading: "Model loading took W GiB [memory] and S seconds" (V1, V0 0.8+), "Loading
    # model weights took W GB" (V0 up to 0.7, xpu, and every vllm-ascend release: computed / 2**30, so GiB); the seconds
    # are not read, and "Loading model weights took S seconds" (vllm-ascend's RFork loader) is no memory line
    Kind("weights", (r"Model loading took \x00 ?Gi?B", r"Loading model weights took \x00 ?Gi?B"),
         (Rule("weights", before=r"took $"),)),
    # the peak after loading (0.18+): "Peak GPU memory after loading weights: X GiB"
    Kind("weights_peak", (r"Peak GPU memory after loading weights: ",), (Rule("weights_peak", before=r": $"),)),
    # the KV cache's capacity: "GPU KV cache size: N tokens" (0.8-0.23; 0.28: one line with the concurrency; 0.33:
    # "%s KV cache size" with the device, GPU or NPU, and "+ host"), "Maximum concurrency for L tokens per request: Cx"
    Kind("kv_capacity", (r"KV cache size: \x00 tokens", r"Maximum concurrency for \x00 tokens per request"), (
        Rule("kv_cache_tokens", before=r"KV cache size: $"),
        Rule("max_model_len", before=r"Maximum concurrency for $"),
        Rule("max_concurrency", before=r"tokens per request: $"))),
    # V0 block counts: "# GPU blocks: N, # CPU blocks: M" (0.2-0.6), "# %s blocks: N, # CPU blocks: M" (0.7-0.11, the
    # device name: "# npu blocks" on Ascend), "# GPU blocks: N" (V1 0.6.6-0.7), "# CPU blocks: N" (cpu executor, whose
    # device blocks are the CPU's), "# TPU/HPU blocks", OpenVINO's "# device blocks: N; # swap blocks: M"; by the
    # expression shown
    Kind("blocks", (r"# (?:\x00|[A-Za-z]+) blocks: \x00",), (
        Rule("gpu_blocks", expr=r"\b(?:num_gpu_blocks|num_blocks|device_blocks)\b"),
        Rule("cpu_blocks", expr=r"\b(?:num_cpu_blocks|swap_blocks)\b"))),
    # the model config (0.9+): "Using max model len N"
    Kind("max_model_len", (r"Using max model len \x00",), (Rule("max_model_len", before=r"len $"),)),
    # the block size a platform settles on: "Setting attention block size to N tokens to ensure ...", "Setting kv cache
    # block size to N for X backend."
    Kind("block_size", (r"Setting attention block size to \x00 tokens", r"Setting kv cache block size to \x00 for"),
         (Rule("block_size", before=r"block size to $"),)),
    # V1 worker's profile breakdown (0.10+; vllm-ascend 0.20+): "Free memory on device (F/T GiB) on startup. Desired
    # GPU memory utilization is (U, R GiB). Actual usage is W GiB for weight, P GiB for peak activation, N GiB for
    # non-torch memory, and C GiB for CUDAGraph memory. Replace gpu_memory_utilization config with
    # `--kv-cache-memory=B1` (X GiB) to fit into requested memory, or `--kv-cache-memory=B2` (Y GiB) to fully utilize
    # gpu memory. Current kv cache memory in use is K GiB." (0.10.2: "... is K bytes."; 0.28+: "Actual usage is W GiB
    # for consumed memory (weights + non-torch), P GiB for peak activation, and C GiB for CUDAGraph memory";
    # vllm-ascend: "Actual usage: W GiB for weights, ..., C GiB for NPU graph memory. ... Current KV cache memory: K
    # GiB. After warmup: torch reserved memory ...")
    Kind("profile_breakdown", (r"on startup\. Desired GPU memory utilization is",), (
        Rule("startup_free", before=r"Free memory on device (?:\x00 )?\($"),
        Rule("device_memory", before=r"on device (?:\x00 )?\(\x00/$"),
        Rule("gpu_memory_utilization", before=r"utilization is \($"),
        Rule("requested_memory", before=r"utilization is \(\x00, $"),
        Rule("profiled_weights", after=GIB_AFTER + r" for weights?\b"),
        Rule("profiled_consumed", after=GIB_AFTER + r" for consumed memory"),
        Rule("peak_activation", after=GIB_AFTER + r" for peak activation"),
        Rule("non_torch", after=GIB_AFTER + r" for non-torch memory"),
        Rule("cudagraph_memory", after=GIB_AFTER + r" for (?:CUDAGraph|NPU graph) memory"),
        Rule("kv_cache_memory_to_requested", before=r"--kv-cache-memory=$", after=r"^`(?: \(\x00 GiB\))? to fit"),
        Rule("kv_cache_memory_to_gpu_limit", before=r"--kv-cache-memory=$", after=r"^`(?: \(\x00 GiB\))? to fully"),
        Rule("available_kv", before=r"(?:kv cache memory in use is|KV cache memory:) $"))),
    # the start-up check (V1 0.9+, vllm-ascend 0.18+, the CPU worker): "Free memory on device [D] (F/T GiB) on startup
    # is less than desired GPU memory utilization (U, R GiB)" (0.33 also: "... is less than the engine's budget after
    # excluding external process's weights (U, R GiB)"); the engine refuses to start
    Kind("startup_memory_error", (r"on startup is less than",), (
        Rule("startup_free", after=r"^/"),
        Rule("device_memory", before=r"/$"),
        Rule("gpu_memory_utilization", before=r"(?:utilization|weights) \($"),
        Rule("requested_memory", before=r"\(\x00, $")), marks=("startup_memory_error",)),
    # a KV cache size given by hand (0.10+, vllm-ascend 0.20+): "Initial free memory F GiB, reserved K GiB [memory] for
    # KV Cache as specified by kv_cache_memory_bytes ..."
    Kind("explicit_kv_cache", (r"for KV Cache as specified by kv_cache_memory_bytes",), (
        Rule("startup_free", before=r"Initial free memory $"),
        Rule("kv_cache_memory", before=r"reserved $"))),
    # free memory that grew while profiling (V1; vllm-ascend 0.9-0.13 prints bytes): "Error in memory profiling.
    # Initial free memory F [GiB], current free memory C [GiB]."
    Kind("memory_profiling_error", (r"Error in memory profiling\. Initial free memory",), (
        Rule("startup_free", before=r"Initial free memory $"),
        Rule("free_after_profile", before=r"current free memory $")), marks=("memory_profiling_error",)),
    # the worker's budget (debug): "Initial free memory: F GiB; Requested memory: U (util), R GiB" (0.10+; 0.9:
    # "Initial free memory: F GiB, free memory: C GiB, requested GPU memory: R GiB"), "Free memory after profiling: C
    # GiB (total), X GiB (within requested)"
    Kind("memory_budget", (r"Initial free memory: \x00 GiB[;,]", r"Free memory after profiling: "), (
        Rule("startup_free", before=r"Initial free memory: $"),
        Rule("gpu_memory_utilization", after=r"^ \(util\)"),
        Rule("requested_memory", before=r"(?:\(util\), |requested GPU memory: )$"),
        Rule("free_after_profile", before=r"(?:, free memory: |Free memory after profiling: )$"))),
    # CUDA graph memory, profiled (0.18+): "CUDA graph pool memory: A GiB (actual), E GiB (estimated), difference: ..."
    # and "Estimated CUDA graph memory: E GiB total"
    Kind("cudagraph_memory", (r"CUDA graph pool memory: ", r"Estimated CUDA graph memory: "), (
        Rule("cudagraph_memory", after=GIB_AFTER + r" \(actual\)"),
        Rule("cudagraph_estimate", after=GIB_AFTER + r" \(estimated\)"),
        Rule("cudagraph_estimate", before=r"Estimated CUDA graph memory: $"))),
    # after capture (V0 0.6.6+, V1, vllm-ascend 0.9-0.11): "Graph capturing finished in S secs, took X GiB"
    Kind("graph_capture", (r"Graph capturing finished in \x00 secs?, took",), (Rule("graph_capture", before=r"took $"),)),
    # vllm-ascend 0.9.1 after ACL graph capture: "Post graph compilation, the available memory on each NPU is reduced
    # to merely F GB." (F computed / (1 << 30): GiB)
    Kind("post_graph_free", (r"the available memory on each NPU is reduced to merely",),
         (Rule("free_after_graph", before=r"merely $"),)),
    # 0.18+: "CUDA graph memory profiling is enabled ... The current --gpu-memory-utilization=U is equivalent to
    # --gpu-memory-utilization=E without CUDA graph memory profiling. ... increase --gpu-memory-utilization to S." and
    # 0.18's "... increase --gpu-memory-utilization from U to S ..."
    Kind("cudagraph_util_advice", (r"CUDA graph memory profiling (?:is enabled|will be enabled)",), (
        Rule("gpu_memory_utilization", before=r"(?:The current --gpu-memory-utilization=|utilization from )$"),
        Rule("suggested_gpu_memory_utilization", before=r"(?:utilization to |utilization from \x00 to )$"))),
    # KV capacity refusals: "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` ..."
    # (every release, the budget is at or below zero; also the CPU and OpenVINO workers)
    Kind("no_cache_memory", (r"No available memory for the cache blocks",), marks=("kv_capacity_error",)),
    # V1 (0.7+): "To serve at least one request with the models's max seq len (L), (X GiB KV cache is needed, which is
    # larger than the available KV cache memory (Y GiB). {estimated_msg} Try increasing ..." (0.7.3 prints "GB", computed
    # / 1024 / 1024 / 1024: GiB; 0.23+: "model's")
    Kind("max_seq_len_kv_needed", (r"To serve at least one request with the models?'s max seq len",), (
        Rule("max_model_len", before=r"max seq len \($"),
        Rule("kv_needed", after=r"^ ?Gi?B KV cache is needed"),
        Rule("available_kv", before=r"available KV cache memory \($")), marks=("kv_capacity_error",)),
    # its estimate, a message of its own spliced into it: "Based on the available memory, the estimated maximum model
    # length is E." (0.8.5: " the estimated maximum model length is E.")
    Kind("estimated_max_model_len", (r"the estimated maximum model length is ",),
         (Rule("estimated_max_model_len", before=r"length is $"),)),
    # V0 (and vllm-ascend 0.9.1, the CPU and OpenVINO workers): "The model's max seq len (L) is larger than the maximum
    # number of tokens that can be stored in KV cache (T). Try increasing ..."
    Kind("max_seq_len_kv_tokens", (r"is larger than the maximum number of tokens that can be stored in KV cache",), (
        Rule("max_model_len", before=r"max seq len \($"),
        Rule("kv_cache_tokens", before=r"stored in KV cache \($")), marks=("kv_capacity_error",)),
    # "Insufficient memory for KV cache": kept for its anchor; no scanned release raises it
    Kind("insufficient_kv_memory", (r"Insufficient memory for KV cache",), marks=("kv_capacity_error",)),
    # vllm/config/compilation.py (0.24): a hybrid model whose KV budget holds fewer Mamba states than max_num_seqs,
    # "max_num_seqs (256) exceeds available Mamba cache blocks (243)"
    Kind("mamba_blocks", (r"exceeds available Mamba cache blocks",), (
        Rule("max_num_seqs", before=r"max_num_seqs \($"), Rule("mamba_blocks", before=r"Mamba cache blocks \($")),
         marks=("kv_capacity_error",)),
    # 0.18+: "Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token."
    Kind("auto_fit_refused", (r"Cannot auto-fit max_model_len",), marks=("kv_capacity_error",)),
    # the CPU worker (0.33): "The worker already uses C GiB (model weights and runtime), more than the R GiB of CPU
    # memory reserved for it on node N, leaving none for the KV cache."
    Kind("cpu_no_kv_memory", (r"leaving none for the KV cache",), (
        Rule("profiled_consumed", before=r"The worker already uses $"),
        Rule("requested_memory", before=r"more than the $")), marks=("kv_capacity_error",)),
    # max_model_len=-1 (0.18+): "Auto-fit max_model_len: reduced from M to L to fit in available GPU memory (K GiB
    # available for KV cache)" (0.33: "... in available KV cache memory (K GiB GPU)", a text not read); "Auto-fit
    # max_model_len: full model context length M fits in available KV cache memory (...)"
    Kind("auto_fit", (r"Auto-fit max_model_len: ",), (
        Rule("model_context_len", before=r"(?:reduced from|full model context length) $"),
        Rule("max_model_len", before=r"reduced from \x00 to $"),
        Rule("available_kv", after=GIB_AFTER + r" available for KV cache"))),
    # vllm-ascend's NPU worker (0.9-0.13): "Available memory: A, total memory: T" (bytes; A may be negative)
    Kind("ascend_available_memory", (r"Available memory: \x00, total memory: ",), (
        Rule("available_kv", before=r"Available memory: $"),
        Rule("device_memory", before=r"total memory: $"))),
    # the CPU worker's KV cache (0.13+): "VLLM_CPU_KVCACHE_SPACE not set. Using K GiB for KV cache.", "Explicitly set
    # (K/T) GiB for KV cache on node N.", "Auto set (K/T) GiB for KV cache on node N, with R GiB requested memory for
    # the worker. C GiB memory was consumed by non-kv usages."
    Kind("cpu_kv_cache", (r"set \(\x00/\x00\) GiB for KV cache", r"VLLM_CPU_KVCACHE_SPACE not set\. Using"), (
        Rule("kv_cache_memory", after=r"^/"),
        Rule("kv_cache_memory", before=r"Using $"),
        Rule("device_memory", before=r"\(\x00/$"),
        Rule("requested_memory", after=GIB_AFTER + r" requested memory"),
        Rule("profiled_consumed", after=GIB_AFTER + r" memory was consumed by non-kv"))),
)

ANCHORS = [a for k in KINDS for a in k.anchors]
"""Every anchor: a format string is read when its literal text holds one."""

KEY_TYPES = {
    **dict.fromkeys(("available_kv", "device_memory", "weights", "weights_peak", "peak_activation", "non_torch",
                     "non_kv_memory", "startup_free", "requested_memory", "profiled_weights", "profiled_consumed",
                     "cudagraph_memory", "cudagraph_estimate", "graph_capture", "kv_needed", "kv_cache_memory",
                     "kv_cache_memory_to_requested", "kv_cache_memory_to_gpu_limit", "free_after_profile",
                     "free_after_graph"), "bytes"),
    **dict.fromkeys(("kv_cache_tokens", "gpu_blocks", "cpu_blocks", "max_model_len", "estimated_max_model_len",
                     "block_size", "model_context_len", "max_num_seqs", "mamba_blocks"), "int"),
    "max_concurrency": "float",
    **dict.fromkeys(("gpu_memory_utilization", "suggested_gpu_memory_utilization"), "ratio"),
}
"""What each fact is: bytes (read from GiB, GB, MiB or bytes as printed), a count, a float, a ratio."""
assert {r.key for k in KINDS for r in k.rules} <= set(KEY_TYPES), "a rule names a key KEY_TYPES does not type"


# ---------------------------------------------------------------------------------------------------------------------
# reading format strings out of the sources (ast, no import)


@dataclass
class Slot:
    """One placeholder: the expression it shows (an f-string's; a %-format's argument where the logger call gives it;
    ``None`` where not known) and its AST node, its format spec (``.2f``, ``,``), its conversion (``r``) and how it is
    written in the format (``%.2f``; a brace format's field name)."""

    expr: str | None
    node: ast.expr | None = None
    spec: str = ""
    conv: str = ""
    written: str = ""


@dataclass
class Format:
    """A format string as pieces: literal text (str) and placeholders (Slot), in order."""

    style: str  # "percent" | "fstring" | "brace"
    pieces: list = field(default_factory=list)

    @property
    def slots(self) -> list[Slot]:
        return [p for p in self.pieces if isinstance(p, Slot)]

    def literal(self) -> str:
        return "".join(p if isinstance(p, str) else "\x00" for p in self.pieces)

    def render(self, pieces: list | None = None) -> str:
        """The format as written: %-formats with ``%%`` for a literal %, f-strings with ``{expr!c:spec}``."""
        out = []
        for p in self.pieces if pieces is None else pieces:
            if isinstance(p, str):
                out.append(p.replace("%", "%%") if self.style == "percent" else p.replace("{", "{{").replace("}", "}}"))
            elif self.style == "percent":
                out.append(p.written)
            else:
                name = p.expr if self.style == "fstring" else p.written
                out.append("{" + f"{name}{'!' + p.conv if p.conv else ''}{':' + p.spec if p.spec else ''}" + "}")
        return "".join(out)


PERCENT = re.compile(r"%(?:\((?P<key>\w+)\))?(?P<flags>[-#0 +]*)(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?[hlL]?"
                     r"(?P<type>[diouxXeEfFgGcrsa%])")
BRACE_FIELD = re.compile(r"\{\{|\}\}|\{(?P<name>[^{}!:]*)(?:!(?P<conv>[rsa]))?(?::(?P<spec>[^{}]*))?\}")


def _percent(text: str, args: list[ast.expr] | None) -> Format:
    f = Format("percent")
    pos, n = 0, 0
    for m in PERCENT.finditer(text):
        f.pieces.append(text[pos:m.start()])
        pos = m.end()
        if m["type"] == "%":
            f.pieces.append("%")
            continue
        node = args[n] if args is not None and n < len(args) and not isinstance(args[n], ast.Starred) else None
        n += 1
        spec = f"{m['flags']}{m['width'] or ''}{'.' + m['prec'] if m['prec'] is not None else ''}{m['type']}"
        f.pieces.append(Slot(ast.unparse(node) if node is not None else None, node, spec=spec,
                             conv="r" if m["type"] == "r" else "", written=m.group(0)))
    f.pieces.append(text[pos:])
    f.pieces = _merge(f.pieces)
    return f


def _brace(text: str, args: list[ast.expr], kwargs: dict[str, ast.expr]) -> Format:
    f = Format("brace")
    pos, n = 0, 0
    for m in BRACE_FIELD.finditer(text):
        f.pieces.append(text[pos:m.start()])
        pos = m.end()
        if m.group(0) in ("{{", "}}"):
            f.pieces.append(m.group(0)[0])
            continue
        name = m["name"]
        if name == "":
            node = args[n] if n < len(args) else None
            n += 1
        elif name.isdigit():
            node = args[int(name)] if int(name) < len(args) else None
        else:
            node = kwargs.get(name)
        f.pieces.append(Slot(ast.unparse(node) if node is not None else name or None, node, spec=m["spec"] or "",
                             conv=m["conv"] or "", written=name))
    f.pieces.append(text[pos:])
    f.pieces = _merge(f.pieces)
    return f


def _spec_text(spec: ast.expr | None) -> str:
    if spec is None:
        return ""
    if isinstance(spec, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}" for v in spec.values)
    return ast.unparse(spec)


def _cheap_literal(node: ast.expr) -> str | None:
    """The literal text of a string, an f-string or a ``+`` of them (placeholders as ``\\x00``), without building
    anything: what the anchors are tried on."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "\x00" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _cheap_literal(node.left), _cheap_literal(node.right)
        if a is None and b is None:
            return None
        return (a if a is not None else "\x00") + (b if b is not None else "\x00")
    return None


def _fstring_pieces(node: ast.expr) -> list | None:
    """The pieces of an f-string, a plain string, or a ``+`` of them (other operands become placeholders)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(v.value)
            elif isinstance(v, ast.FormattedValue):
                conv = {-1: "", 115: "s", 114: "r", 97: "a"}[v.conversion]
                out.append(Slot(ast.unparse(v.value), v.value, spec=_spec_text(v.format_spec), conv=conv))
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fstring_pieces(node.left), _fstring_pieces(node.right)
        if left is None and right is None:
            return None
        left = left if left is not None else [Slot(ast.unparse(node.left), node.left)]
        right = right if right is not None else [Slot(ast.unparse(node.right), node.right)]
        return left + right
    return None


def _merge(pieces: list) -> list:
    out: list = []
    for p in pieces:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    return out


def _const_str(node: ast.expr) -> str | None:
    """A plain string, or a ``+`` of plain strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _const_str(node.left), _const_str(node.right)
        return a + b if a is not None and b is not None else None
    return None


LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "info_once", "warning_once",
               "debug_once", "log"}


def formats_in(tree: ast.AST, wanted):
    """Every format string of a module whose literal text ``wanted(text)`` accepts, as (Format, how it is used, node):
    a logger call's message (a %-format, with the call's arguments), ``"..." % args``, ``"...".format(...)``, and any
    other string or f-string (an exception's message; a message built first, ``msg = (f"..." f"...")``, then logged or
    raised). Implicit concatenation across lines is one string to the parser already."""
    taken: set[int] = set()  # nodes read as part of a larger format

    def mark(node):
        for n in ast.walk(node):
            taken.add(id(n))

    for node in ast.walk(tree):
        if id(node) in taken:
            continue
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in LOG_METHODS and node.args:
                first = 1 if func.attr == "log" else 0
                text = _const_str(node.args[first]) if len(node.args) > first else None
                if text is not None:
                    args = node.args[first + 1:]
                    if args or PERCENT.search(text):
                        mark(node.args[first])
                        if wanted(PERCENT.sub(lambda m: "%" if m["type"] == "%" else "\x00", text)):
                            yield _percent(text, args if args else None), "logger", node
                        continue
            if isinstance(func, ast.Attribute) and func.attr == "format" and (text := _const_str(func.value)) is not None:
                mark(func.value)
                if wanted(BRACE_FIELD.sub(lambda m: m.group(0)[0] if m.group(0) in ("{{", "}}") else "\x00", text)):
                    yield _brace(text, node.args, {k.arg: k.value for k in node.keywords if k.arg}), "format", node
                continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and (text := _const_str(node.left)) is not None:
            mark(node.left)
            if wanted(PERCENT.sub(lambda m: "%" if m["type"] == "%" else "\x00", text)):
                args = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
                yield _percent(text, args), "percent", node
            continue
        if isinstance(node, (ast.JoinedStr, ast.BinOp, ast.Constant)):
            lit = _cheap_literal(node)
            if lit is None:
                continue
            mark(node)
            if isinstance(node, ast.Constant) and PERCENT.search(lit) and "%" in lit:
                if wanted(PERCENT.sub(lambda m: "%" if m["type"] == "%" else "\x00", lit)):
                    yield _percent(lit, None), "string", node  # a %-format logged elsewhere with its arguments
                continue
            if wanted(lit):
                pieces = _fstring_pieces(node)
                if pieces is not None:
                    yield Format("fstring", _merge(pieces)), "string", node


def package_sources(tar_path: Path, package_dir: str, keep=None):
    """(path inside the package's tree, source text) of each Python file of ``package_dir`` (``vllm`` or
    ``vllm_ascend``) in an sdist, read from the tarball; with ``keep``, only the files whose text it accepts."""
    with tarfile.open(tar_path) as tar:
        for m in tar:
            if not m.isfile() or not m.name.endswith(".py"):
                continue
            parts = m.name.split("/")
            if len(parts) < 3 or parts[1] != package_dir:
                continue
            data = tar.extractfile(m)
            if data is None:
                continue
            text = data.read().decode("utf-8-sig", "replace")
            if keep is not None and not keep(text):
                continue
            yield "/".join(parts[1:]), text


# ---------------------------------------------------------------------------------------------------------------------
# the unit a placeholder prints: by what its expression divides by (resolving the module's and the function's own
# assignments: ``_GB = 1 << 30``, ``GiB = lambda b: b / GiB_bytes``, ``x_GB = free / (1 << 30)``)

KNOWN = {"GiB_bytes": 1 << 30, "GB_bytes": 10 ** 9, "MiB_bytes": 1 << 20, "MB_bytes": 10 ** 6, "KiB_bytes": 1 << 10}
DIVISORS = {1 << 30: "GiB", 10 ** 9: "GB", 1 << 20: "MiB", 10 ** 6: "MB"}
UNIT_CALLS = {"format_gib": "GiB", "format_mib": "MiB"}


class Scope:
    """Name -> assigned value, in a function and in its module (the last assignment wins)."""

    def __init__(self, module: dict, local: dict | None = None):
        self.module, self.local = module, local or {}

    def get(self, name: str):
        return self.local.get(name, self.module.get(name))


def _assigns(owner: ast.AST) -> dict:
    """Name -> value of the assignments in a module's or a function's own body (not in nested functions or classes;
    a nested ``def`` is kept as itself)."""
    out: dict = {}
    stack = list(ast.iter_child_nodes(owner))
    while stack:
        n = stack.pop(0)
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = n.value
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None:
            out[n.target.id] = n.value
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(n.name, n)
            continue
        if not isinstance(n, (ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(n))
    return out


def _const(node: ast.expr, scope: Scope, depth: int = 0) -> float | None:
    if depth > 6:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in KNOWN:
            return KNOWN[node.id]
        v = scope.get(node.id)
        return _const(v, scope, depth + 1) if isinstance(v, ast.expr) else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("float", "int") and node.args:
        return _const(node.args[0], scope, depth + 1)
    if isinstance(node, ast.BinOp):
        a, b = _const(node.left, scope, depth + 1), _const(node.right, scope, depth + 1)
        if a is None or b is None:
            return None
        try:
            return {ast.Mult: lambda: a * b, ast.Pow: lambda: a ** b, ast.LShift: lambda: int(a) << int(b),
                    ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Div: lambda: a / b}[type(node.op)]()
        except (KeyError, ValueError, ZeroDivisionError, OverflowError):
            return None
    return None


def _divisor(node: ast.BinOp, scope: Scope) -> float | None:
    """What ``x / a / b`` divides ``x`` by: ``a * b``."""
    d = _const(node.right, scope)
    if d is None:
        return None
    if isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Div):
        inner = _divisor(node.left, scope)
        if inner is not None:
            return inner * d
    return d


def unit_of(node: ast.expr | None, scope: Scope, depth: int = 0) -> str | None:
    """The unit an expression's value is in when it is a memory figure converted for printing (GiB, GB, MiB, MB),
    else None (a count, a raw byte figure, a ratio, text)."""
    if node is None or depth > 6:
        return None
    if isinstance(node, ast.JoinedStr) and len(node.values) == 1 and isinstance(node.values[0], ast.FormattedValue):
        return unit_of(node.values[0].value, scope, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
        d = _divisor(node, scope)
        for value, unit in DIVISORS.items():
            if d is not None and abs(d - value) < 1e-6 * value:
                return unit
        return None
    if isinstance(node, ast.Call):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name in UNIT_CALLS:
            return UNIT_CALLS[name]
        if name in ("float", "int", "round", "abs") and node.args:
            return unit_of(node.args[0], scope, depth + 1)
        target = scope.get(name) if isinstance(node.func, ast.Name) else None
        if isinstance(target, ast.Lambda):
            return unit_of(target.body, scope, depth + 1)
        if isinstance(target, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = Scope(scope.module, _assigns(target))
            for r in ast.walk(target):
                if isinstance(r, ast.Return) and (u := unit_of(r.value, inner, depth + 1)):
                    return u
        return None
    if isinstance(node, ast.Name):
        v = scope.get(node.id)
        return unit_of(v, scope, depth + 1) if isinstance(v, ast.expr) else None
    if isinstance(node, ast.IfExp):
        return unit_of(node.body, scope, depth + 1)
    return None


PRINTED = re.compile(r"^ ?(GiB|GB|MiB|MB|bytes)\b")


# ---------------------------------------------------------------------------------------------------------------------
# entries


def _context(fmt: Format) -> list[tuple[str, str]]:
    """(literal text before, literal text after) each placeholder, over the whole message (others as ``\\x00``)."""
    lit = fmt.literal()
    cuts = [i for i, ch in enumerate(lit) if ch == "\x00"]
    return [(lit[:i], lit[i + 1:]) for i in cuts]


def _unit(slot: Slot, key: str | None, after: str, scope: Scope) -> tuple[str, str | None]:
    """The unit a placeholder's printed value is in, and a note where the printed unit says otherwise."""
    mem = unit_of(slot.node, scope)
    printed = m.group(1) if (m := PRINTED.match(after)) else None
    note = None
    if mem and printed and printed != mem and printed != "bytes":
        note = f"printed {printed!r} but computed in {mem} ({slot.expr})"
    kind = KEY_TYPES.get(key) if key else None
    if kind == "bytes" or (kind is None and (mem or printed in ("GiB", "GB", "MiB", "MB"))):
        return mem or ("bytes" if printed in (None, "bytes") else printed), note
    if kind is not None:
        return kind, note
    spec = slot.spec or ""
    if spec[-1:] in ("d", "i", "u"):
        return "int", note
    if spec[-1:] in ("f", "F", "e", "E", "g", "G"):
        return "float", note
    return "text", note


@dataclass
class Piece:
    """One line of a message (a message with ``\\n`` is several lines of a log)."""

    pieces: list
    slots: list[int]  # indices into the message's slots


def _lines(fmt: Format) -> list[Piece]:
    out, cur, idx, n = [], [], [], 0
    for p in fmt.pieces:
        if isinstance(p, str):
            parts = p.split("\n")
            for j, part in enumerate(parts):
                if j:
                    out.append(Piece(cur, idx))
                    cur, idx = [], []
                if part:
                    cur.append(part)
        else:
            cur.append(p)
            idx.append(n)
            n += 1
    out.append(Piece(cur, idx))
    for piece in out:  # a log line's own edges: no leading or trailing blanks
        if piece.pieces and isinstance(piece.pieces[0], str):
            piece.pieces[0] = piece.pieces[0].lstrip()
        if piece.pieces and isinstance(piece.pieces[-1], str):
            piece.pieces[-1] = piece.pieces[-1].rstrip()
        piece.pieces = [p for p in piece.pieces if p != ""]
    return [p for p in out if p.pieces]


def _anchor_text(kind: Kind, literal: str) -> str | None:
    for a in kind.anchors:
        if m := re.search(a, literal):
            return m.group(0).replace("\x00", "…")
    return None


def entries_of(fmt: Format, kind: Kind, scope: Scope) -> list[dict]:
    """The catalogue entries of one message: one per line of it that gives a fact or states one (``marks``)."""
    slots = fmt.slots
    keys: list[str | None] = []
    units: list[str] = []
    notes: list[str] = []
    for slot, (before, after) in zip(slots, _context(fmt)):
        key = next((r.key for r in kind.rules if r.matches(before, after, slot.expr)), None)
        unit, note = _unit(slot, key, after, scope)
        keys.append(key)
        units.append(unit)
        if note and key:
            notes.append(note)
    lines = _lines(fmt)
    out = []
    for i, line in enumerate(lines):
        line_fmt = Format(fmt.style, line.pieces)
        anchor = _anchor_text(kind, line_fmt.literal())
        line_keys = [keys[j] for j in line.slots]
        if not any(line_keys) and not (kind.marks and anchor):
            continue
        e = {"kind": kind.name, "anchor": anchor or _anchor_text(kind, fmt.literal()), "fact_keys": line_keys,
             "units": [units[j] for j in line.slots], "format": line_fmt.render(), "style": fmt.style}
        if kind.marks and anchor:
            e["marks"] = list(kind.marks)
        if len(lines) > 1:
            e["line"] = [i + 1, len(lines)]
        line_notes = [n for n in notes if any(slots[j].expr and slots[j].expr in n for j in line.slots)]
        if line_notes:
            e["notes"] = line_notes
        out.append(e)
    return out


def _anchor_words() -> list[tuple[str, ...]]:
    """The words of each anchor (its literal runs between spaces): a source file is parsed only when it holds every
    word of one anchor (a message split across implicitly concatenated strings is split at its spaces)."""
    out = []
    for a in ANCHORS:
        plain = re.sub(r"\\.|\(\?:[^)]*\)\??|\[[^]]*\][?*+]?|.\?|[*+]", " ", a)
        out.append(tuple(sorted({w for w in plain.split() if not w.isdigit() and (len(w) > 1 or w == "#")})))
    return out


def scan(tar: Path, package_dir: str) -> list[tuple[str, dict]]:
    """(source path, entry) for every entry found in one sdist."""
    compiled = [(k, [re.compile(a) for a in k.anchors]) for k in KINDS]

    def kind_of(text: str) -> Kind | None:
        return next((k for k, rxs in compiled if any(rx.search(text) for rx in rxs)), None)

    out = []
    words = _anchor_words()
    for path, src in package_sources(tar, package_dir, lambda text: any(all(w in text for w in ws) for ws in words)):
        try:
            tree = ast.parse(src)
        except SyntaxError as e:
            print(f"  {tar.name}: {path}: not parsed ({e.msg})", file=sys.stderr)
            continue
        module = None
        parents: dict[int, ast.AST] | None = None
        for fmt, _how, node in formats_in(tree, lambda text: kind_of(text) is not None):
            kind = kind_of(fmt.literal())
            if kind is None:
                continue
            if module is None:
                module = _assigns(tree)
                parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
            func, up = None, node
            while (up := parents.get(id(up))) is not None:
                if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    func = up
                    break
            scope = Scope(module, _assigns(func) if func is not None else None)
            out.extend((path, e) for e in entries_of(fmt, kind, scope))
    return out


def _release_key(r: str) -> tuple:
    sys.path.insert(0, str(ROOT))
    from kvaudit.versions import version_key

    return version_key(r)


def build() -> tuple[list[dict], dict]:
    """Scan every release; entries deduplicated across releases (the release range widened)."""
    found: dict[tuple, dict] = {}
    report: dict = {"skipped": {}, "scanned": {}, "anchors_unseen": set(ANCHORS)}
    sources = []
    for v in VLLM_RELEASES:
        path, how = fetch_vllm(v)
        if path is None:
            report["skipped"][f"vllm {v}"] = how
            print(f"vllm {v}: skipped ({how})", file=sys.stderr)
            continue
        sources.append(("vllm", v, path, "vllm"))
    for v, path in vllm_ascend_sdists():
        sources.append(("vllm-ascend", v, path, "vllm_ascend"))
    for package, release, path, package_dir in sources:
        rows = scan(path, package_dir)
        report["scanned"][f"{package} {release}"] = len(rows)
        print(f"{package} {release}: {len(rows)} entries", file=sys.stderr)
        for source, e in rows:
            key = (package, e["style"], e["format"], tuple(e["fact_keys"]), tuple(e["units"]))
            have = found.get(key)
            if have is None:
                have = found[key] = {**e, "source": source, "package": package, "releases": [release, release],
                                     "_sources": {source}}
            have["_sources"].add(source)
            lo, hi = have["releases"]
            if _release_key(release) < _release_key(lo):
                have["releases"][0] = release
            if _release_key(release) > _release_key(hi):
                have["releases"][1] = release
                have["source"] = source  # the newest release's file
    order = {k.name: i for i, k in enumerate(KINDS)}
    entries = []
    for e in found.values():
        others = sorted(e.pop("_sources") - {e["source"]})
        if others:
            e["also_in"] = others
        for a in list(report["anchors_unseen"]):
            if e["anchor"] and re.search(a, e["anchor"].replace("…", "\x00")):
                report["anchors_unseen"].discard(a)
        entries.append(e)
    entries.sort(key=lambda e: (order[e["kind"]], e["package"] != "vllm", _release_key(e["releases"][0]), e["format"]))
    fields = ["kind", "anchor", "fact_keys", "units", "format", "style", "source", "package", "releases", "line",
              "marks", "notes", "also_in"]
    return [{f: e[f] for f in fields if f in e} for e in entries], report


def write(entries: list[dict]) -> None:
    OUT.write_text("[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n]\n")


def main() -> int:
    entries, report = build()
    write(entries)
    keys = sorted({k for e in entries for k in e["fact_keys"] if k} | {m for e in entries for m in e.get("marks", [])})
    print(f"wrote {len(entries)} entries to {OUT.relative_to(ROOT)}", file=sys.stderr)
    print(f"fact keys: {', '.join(keys)}", file=sys.stderr)
    if report["skipped"]:
        print(f"skipped: {report['skipped']}", file=sys.stderr)
    if report["anchors_unseen"]:
        print(f"anchors no scanned source holds: {sorted(report['anchors_unseen'])}", file=sys.stderr)
    notes = sorted({n for e in entries for n in e.get("notes", [])})
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
