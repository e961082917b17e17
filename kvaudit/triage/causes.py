"""The cause of an out-of-memory failure whose allocation matches vLLM's plan, as a report's figures and frames show
it: the phase it happened in, the findings tried in order (``FINDINGS``: vLLM's refusals and the inequality of the
ledger first, then what the report says changed or what else holds the device, then the term the phase allocates),
and, where none holds, the ledger terms that decide and the questions that ask for them; where one holds, the terms
it rests on that the report does not state (``RESTS_ON``, ``rests_on``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kvaudit.model.memory import default_gpu_memory_utilization, default_utilization_text
from kvaudit.triage.changes import CHANGES, between, since_before
from kvaudit.triage.evidence import Evidence, Fact
from kvaudit.triage import ledger
from kvaudit.triage.sourced import Sourced, short, where
from kvaudit.units import fmt_bytes
from kvaudit.versions import version_key

CAUSES = {
    "budget-too-small-for-max-model-len": "the KV budget cannot hold one request of the max model length",
    "no-room-for-kv-cache": "the weights and the profile run's activations fill the utilization's share of the "
                            "device, leaving no KV budget",
    "budget-too-small-for-max-num-seqs": "the KV budget holds fewer Mamba states than --max-num-seqs sequences",
    "another-process": "another process holds device memory outside vLLM's profile",
    "outside-budget": "a component vLLM's budget does not hold (a KV connector's buffers, a plugin, a trainer in the "
                      "same process) allocated the memory that ran out",
    "graph-capture": "CUDA/ACL graph capture, after the KV cache was allocated",
    "activations-while-serving": "activations while serving requests, outside the KV cache",
    "memory-profiling": "the profile run's activations, before the KV cache was planned",
    "weights": "the weights do not fit the device, or the share of it the utilization gives vLLM",
    "budget-did-not-fit": "the KV budget itself did not fit the device when allocated",
    "utilization-too-high": "the utilization leaves no room for memory vLLM's profile does not see",
    "device-selection": "CUDA_VISIBLE_DEVICES was set after torch was imported, so it selected nothing",
    "memory-growth": "device memory grows while serving (a leak, or fragmentation), outside the plan",
    "default-changed": "what changed between the release that worked and the one that fails",
    "host-memory": "the host's memory (RAM) ran out, not the device's",
    "collective-library": "the collective library (NCCL/HCCL) failed",
    "driver": "the driver or the device runtime failed",
    "not-out-of-memory": "the report shows no out-of-memory error",
    "unknown": "no phase or figure in the report points at a cause",
    "preallocated": "vLLM reserves the utilization's share of the device at start-up (the weights, the profile run's "
                    "activations, and a KV cache that fills the rest), whatever the load: the memory in use is its budget",
    "over-budget": "this process held more than vLLM's budget: a term vLLM budgeted (the weights, the activations) "
                   "grew past what it planned",
}
"""What an allocation that matches the plan leaves as the cause, as the report's numbers point to it."""


def phase_of(ev: Evidence) -> str | None:
    """The phase the report's error happened in: the out-of-memory traceback's, else the last
    traceback's, else the phase after the last start-up step logged before an out-of-memory error
    (``STARTUP_STEPS``), or where the reporter says the device ran out while graphs were captured."""
    found = ev.first("oom_phase", "error_phase")
    if found is not None:
        return found.value
    oom = ev.first("oom", "oom_mentioned")
    logged = _logged_phase(ev)
    if logged is not None and oom is not None:
        return logged
    if ev.first("capture_oom") is not None:
        return "CUDA/ACL graph capture"
    if ev.first("serving_oom") is not None:  # "test latency with input 20 000, service shows oom"
        return "serving requests"
    if ev.first("kv_capacity_error") is not None:  # vLLM's own refusal is raised where it plans the KV cache
        return "kv-cache planning"
    return None


STARTUP_STEPS = (
    (("weights", "profiled_weights"), "memory profiling"),
    (("capture_started",), "CUDA/ACL graph capture"),
    (("captured", "served"), "serving requests"),
)
"""vLLM's start-up as it logs it, in order (``Worker.load_model``, then ``determine_available_memory``'s profile run,
then graph capture, then serving): the facts of the lines that end or begin a step, and the phase that runs after
them. The KV cache's lines ("Available KV cache memory", "GPU KV cache size", "# GPU blocks") are left out: V0 and V1
log them before and after the allocation."""


def _logged_phase(ev: Evidence) -> str | None:
    """The phase an out-of-memory error with no traceback happened in, from the furthest start-up step logged before
    it (the first such error outside the title; where only the title says so, anywhere in the report)."""
    titled = {f.line for f in ev.all("title")}
    errors = sorted(f.line for f in ev.all("oom") + ev.all("oom_mentioned") if f.line not in titled)
    at = errors[0] if errors else None
    reached = [i for i, (keys, _) in enumerate(STARTUP_STEPS) for key in keys for f in ev.all(key)
               if at is None or f.line < at]
    return STARTUP_STEPS[max(reached)][1] if reached else None  # (the furthest step: workers' lines interleave)


def release_pair(ev: Evidence) -> tuple[str | None, str] | None:
    """(the release that worked, the one that fails) where the report says both, or that earlier ones worked (then
    ``None`` for the first)."""
    fails = ev.first("release_fails")
    if fails is None:
        return None
    works = [f for f in ev.all("release_works") if version_key(f.value) < version_key(fails.value)]
    if works:
        return works[0].value, fails.value
    return (None, fails.value) if ev.first("previous_worked") else None


def release_changes(ev: Evidence) -> list[Any]:
    """The changes of memory use between the release the report says worked and the one that fails."""
    pair = release_pair(ev)
    if pair is None:
        return []
    works, fails = pair
    return between(works, fails) if works else since_before(fails)


def own_ledger(ev: Evidence, values: dict[str, Sourced]) -> ledger.Ledger:
    """The report's own ledger: its figures, the device's memory where it states it, its utilization, and the weights
    its model's name gives where it states none (no deployment planned)."""
    named = weights_per_rank(values) if "weights" not in values else None
    return ledger.build(ev, stated=stated_device(values), utilization=values["gpu_memory_utilization"].value,
                        weights=named)


def report_breach(ev: Evidence, values: dict[str, Sourced], phase: str | None) -> Any:
    """The inequality the report's own ledger (``own_ledger``) breaks."""
    return own_ledger(ev, values).breach(phase)


def stated_device(values: dict[str, Sourced]) -> dict[str, tuple[int, str]]:
    """The device's memory where the report states it (a line, the title), as the ledger's reported figure."""
    device = values.get("device memory")
    return {"device memory": (device.value, device.source)} if device is not None and device.reported else {}


DECIDING_OOM = ("the out-of-memory error as torch printed it (\"Tried to allocate X. GPU 0 has a total capacity of T of "
                "which F is free. Process N has P memory in use ...\"), with its traceback: it decides the ledger's last "
                "terms. Other processes holding more than the utilization leaves free: another process is the cause; "
                "the allocation in another package's frames (a KV connector, a trainer): that component; vLLM's own "
                "allocation at a utilization near 1: the utilization")
DECIDING_SMI = ("`nvidia-smi` (or `npu-smi info`) while the engine runs or right after it fails: a process other than "
                "vLLM's holding device memory is memory outside vLLM's budget; none, and the figures above decide")
DECIDING_COMPONENT = ("the KV connector's release and its settings (its `kv_transfer_config`, and the connector's own "
                      "configuration: the CPU or pinned buffers it allocates, any GPU staging buffers): what it "
                      "allocates on the device is outside vLLM's budget and must fit in what the utilization leaves "
                      "free; what it allocates on the host must fit in the host's RAM")
DECIDING_BUDGET = ("the `--gpu-memory-utilization` the engine ran with (kvaudit assumed vLLM's default, "
                   f"{default_utilization_text()}): it sets "
                   "vLLM's budget, and the headroom left for everything outside it")
DECIDING_WEIGHTS = ("the weights each rank loaded (the start-up log's \"Model loading took X GiB\", or the checkpoint "
                    "and its quantization): over vLLM's budget, they are the term that grew (a larger TP, a smaller "
                    "checkpoint); within it, the activations did (a smaller batch)")
DECIDING = {
    "failing allocation": DECIDING_OOM, "outside this process": DECIDING_SMI, "component": DECIDING_COMPONENT,
    "budget": DECIDING_BUDGET, "weights": DECIDING_WEIGHTS,
    "device memory": "the device and the memory torch sees on it (`nvidia-smi`'s Memory-Usage total, or `npu-smi "
                     "info`): vLLM's budget is the utilization's share of it, and the weights must fit in that share",
    "peak activation": "the start-up log's memory profile (the lines after \"Model loading took\": the profile run's "
                       "peak, \"Available KV cache memory\"), or the traceback's phase: the profile run's activations "
                       "grow with `--max-num-seqs`, `--max-num-batched-tokens` and a multimodal model's dummy inputs; "
                       "more than the weights leave of the budget, and they are what ran out",
    "graphs": "the start-up log from \"Capturing CUDA graphs\" on (\"Graph capturing finished in N secs, took X "
              "GiB\"): graphs are captured after the KV cache took its share, so an error after that line is the "
              "graphs' (`--enforce-eager` confirms it)",
    "KV for one request": "the max_model_len the engine ran with and the start-up log's KV lines (\"GPU KV cache size: "
                          "N tokens\", \"Maximum concurrency for N tokens per request\"): a KV budget that holds "
                          "fewer tokens than one request of max_model_len is the cause, and a smaller `--max-model-len` "
                          "the fix",
    "KV budget": "the start-up log's \"Available KV cache memory: X GiB\" (or \"# GPU blocks\"): at or below zero, the "
                 "weights and activations fill the budget (\"No available memory for the cache blocks\"); above it, "
                 "the KV cache was planned, and either one request of max_model_len does not fit it or something later "
                 "ran out",
    "host memory": "the host's memory when it failed (`free -g`, the container's memory limit, `df -h /dev/shm` and "
                   "`--shm-size`), and `dmesg | grep -i oom` (on Kubernetes, `kubectl describe pod`'s Last State: "
                   "Reason OOMKilled, exit code 137): a process the kernel killed, or a full /dev/shm, is the "
                   "host's memory running out, not the device's",
    "release": "the driver's and the runtime's releases (`nvidia-smi`'s header: Driver Version and CUDA Version; or "
               "`npu-smi info` and the CANN version) beside the CUDA or CANN the torch build needs: a driver older "
               "than the build needs, or one with a known fault, is the cause",
}
_ASKED_FOR_CAUSE = {
    ("collective-library", "failing allocation"): "the collective library's own log of the failure (`NCCL_DEBUG=INFO`, "
    "or HCCL's plog on Ascend): which resource it failed to allocate (a /dev/shm segment, device memory, a socket) "
    "decides whether the host's shared memory, the device or the network is short",
}
SAID = {"failing allocation": "the failing allocation", "outside this process": "the memory held outside this process",
         "component": "the KV connector's own allocations", "budget": "the utilization the engine ran with",
         "weights": "the weights each rank loaded", "device memory": "the device's memory",
         "peak activation": "the profile run's activation peak", "graphs": "the graphs' memory",
         "KV for one request": "the KV one request of max_model_len needs", "KV budget": "the KV budget",
         "host memory": "the host's memory", "release": "the driver's and runtime's releases"}
"""The terms that decide an out-of-memory failure where the report lacks them (ledger terms, and the KV connector's
own allocations, the host's memory and the driver's release), and the question that asks for each with what each
answer would mean: the failing allocation with the free memory it met (torch's line), the memory held outside the
process (the smi table), a KV connector's own allocations (its release and settings), and each term of vLLM's
budget as the start-up log states it. ``_ASKED_FOR_CAUSE``: the question where a cause asks for a term otherwise."""

RESTS_ON = {
    "weights": ("weights", "device memory"),
    "no-room-for-kv-cache": ("weights", "peak activation"),
    "budget-too-small-for-max-model-len": ("KV for one request",),
    "another-process": ("outside this process", "budget"),
    "outside-budget": ("failing allocation", "budget"),
    "budget-did-not-fit": ("outside this process", "budget"),
    "utilization-too-high": ("outside this process", "budget"),
    "default-changed": ("failing allocation",),
    "host-memory": ("host memory",),
    "collective-library": ("failing allocation",),
    "driver": ("release",),
    "preallocated": ("budget",),
}
"""The terms each concluded cause (``CAUSES``) rests on: the two sides of its inequality (the weights against the
device; the weights and activations filling the budget; what is held outside against what the utilization leaves),
or the fact a failure outside vLLM's budget turns on. (A cause the phase decides, graph capture or the profile run,
rests on the phase, which the report shows wherever it is concluded.) ``rests_on`` names those the
report does not state: the answer then rests on kvaudit's prediction, or on a reading the report cannot confirm."""


def deciding_terms(ev: Evidence, values: dict[str, Sourced]) -> list[str]:
    """The ledger terms (``DECIDING``) that decide the verdict and the report lacks, first in what to ask: the failing
    allocation where no torch line shows it (whether or not the report says the device ran out), the memory outside
    this process where neither that line nor a smi table tells it, and with either, the KV connector's own
    allocations where the report runs one and the failing frames do not show them. Where the figures show what was
    held outside and nothing breaks, the utilization decides if the report does not state it; where this process held
    more than vLLM's budget, the failing allocation's traceback and the weights decide which budgeted term grew; where
    the report shows no launch, the terms its settings decide (``_launch_terms``); where it shows no phase, the terms
    the phase decides (``_phase_terms``)."""
    if any(f.value <= 0 for f in ev.all("available_kv")):
        return []  # vLLM's refusal decides: nothing ran out at run time
    if ev.first("kv_capacity_error") is not None:  # (one refusal decides; two that exclude each other, the budget)
        return (["KV budget", "KV for one request"] if refusals_disagree(ev) and ev.first("available_kv") is None
                else [])
    u = values.get("gpu_memory_utilization")
    over = report_breach(ev, values, phase_of(ev)) if u is not None and u.value else None
    if over is not None and over.cause == "over-budget":
        return ["failing allocation", "weights"]  # which budgeted term grew: the traceback's phase, the weights' figure
    terms = _runtime_terms(ev)
    if terms and ev.first("kv_connector") is not None and ev.first("oom_package") is None:
        terms.append("component")  # (a connector's allocation in the failing frames already decides)
    if not terms and _figures_shown(ev) and not _reported(values, "gpu_memory_utilization"):
        return ["budget"] + _phase_terms(ev)  # what is held outside is known; the headroom is the utilization's
    if "host memory" not in terms:  # (which memory, first)
        terms += _phase_terms(ev)
    if terms and ev.first("launch_parser") is None and "host memory" not in terms:  # (which memory, first)
        terms += [t for t in _launch_terms(ev, values) if t not in terms]
    return terms


def _phase_terms(ev: Evidence) -> list[str]:
    """Where the report says the device ran out and shows neither a traceback nor a start-up step that places it
    (``phase_of``), the terms of vLLM's budget its phase decides (``PHASE_DECIDES``): the weights (loading them), the
    profile run's or a batch's activations, and the graphs, unless the launch runs eager (no graph is captured)."""
    if ev.first("oom", "oom_mentioned") is None or phase_of(ev) is not None:
        return []
    eager = any(f.value for f in ev.all("enforce_eager"))
    return [t for t in PHASE_DECIDES if not (eager and t == "graphs")]


def _launch_terms(ev: Evidence, values: dict[str, Sourced]) -> list[str]:
    """Where the report shows no launch at all (no command line, ``LLM(...)`` call or engine-config line), the terms
    of vLLM's budget its settings decide and the report does not state otherwise: the budget (the utilization), the
    KV one request needs (max_model_len) and the profile run's activation peak (max_num_seqs and
    max_num_batched_tokens). A launch that leaves a setting out runs vLLM's default, which is then known."""
    return ([] if _reported(values, "gpu_memory_utilization") else ["budget"]) + (
        [] if _reported(values, "max model len") else ["KV for one request"]) + (
        [] if ev.first("max_num_seqs", "max_num_batched_tokens") is not None else ["peak activation"])


def _reported(values: dict[str, Sourced], key: str) -> bool:
    """Whether the report itself states the deployment's ``key`` (``Sourced.reported``)."""
    return key in values and values[key].reported


def _figures_shown(ev: Evidence) -> bool:
    """Whether the report shows what was held when it ran out: torch's line with the memory outside the process, or a
    smi table."""
    oom = ev.value("oom")
    return (oom is not None and oom.held_outside is not None) or ev.first("device_process_mb", "hbm_used_mb") is not None


def _runtime_terms(ev: Evidence) -> list[str]:
    """The terms that decide a runtime out-of-memory failure the report lacks: torch's line where it has none (and
    what is held outside the process where no smi table shows it either), what is held outside where the line cannot
    tell it; none where the error is no out-of-memory error at all."""
    shown = _figures_shown(ev)
    if ev.value("oom") is not None:
        return [] if shown else ["outside this process"]
    said = ev.first("oom_mentioned", "not_released", "memory_growth") is not None
    if not said and ev.first("exception", "outside") is not None:
        return []  # an error that is no out-of-memory error: it decides, not the ledger
    which = ["host memory"] if _which_memory_unsaid(ev, said) else []
    return which + ["failing allocation"] + ([] if shown else ["outside this process"])


def _which_memory_unsaid(ev: Evidence, said: bool) -> bool:
    """Whether the host's memory may be what ran out, the report not saying which memory: memory said to grow with
    neither the device's nor the host's named ("memory usage is growing slowly"), or a container Kubernetes keeps
    restarting with no error shown (its last state says whether its memory limit killed it)."""
    if ev.first("device_memory_named", "host_memory_named", "oom_mentioned", "hbm_used_mb") is not None:
        return False
    grows = ev.all("memory_growth")
    return (bool(grows) and not any(_DEVICE_GROWTH.search(f.text) for f in grows)
            or not said and ev.first("restarting") is not None)


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


DECIDING_LAUNCH = ("the launch: the `vllm serve` command line or the `LLM(...)` call with every argument (or the start-up "
                   "log's \"non-default args\" line): its `--gpu-memory-utilization` sets vLLM's budget, "
                   "`--max-model-len` the KV cache one request needs, and `--max-num-seqs` / `--max-num-batched-tokens` "
                   "the profile run's activation peak; a setting it leaves out is vLLM's default")
LAUNCH_TERMS = ("budget", "KV for one request", "peak activation")
"""The terms of vLLM's budget a launch's settings decide (``_launch_terms``), asked for as one question."""

_PHASE_MEANS = ("the phase it failed in decides which term ran out. Loading the weights (`load_model`, before \"Model "
                "loading took\"): the weights (a larger TP, a quantized checkpoint); the profile run (`profile_run`, "
                "`_dummy_run`, before \"Available KV cache memory\"): its activations (a smaller "
                "`--max-num-batched-tokens` / `--max-num-seqs`); graph capture (`capture_model`, after \"Capturing CUDA "
                "graphs\"): the graphs (`--enforce-eager`); a request while serving: that batch's activations (fewer or "
                "shorter concurrent requests)")
DECIDING_PHASE = "the start-up log up to the error, or the error's traceback: " + _PHASE_MEANS
DECIDING_OOM_PHASE = DECIDING_OOM + ". In its traceback (or the start-up log up to it), " + _PHASE_MEANS
PHASE_DECIDES = ("weights", "peak activation", "graphs")
"""The terms of vLLM's budget the failing phase decides (``_phase_terms``): two or more of them are asked for as one
question, the phase."""


def asks(terms: list[str], cause: str | None = None) -> list[str]:
    """The question for each deciding term (where ``cause`` asks for it otherwise, that question; two or more terms
    the failing phase decides where no cause is concluded, the phase, once, with the failing allocation where it is
    asked for too; two or more others a launch decides, the launch, once)."""
    phase = [t for t in terms if t in PHASE_DECIDES]
    phase = phase if len(phase) > 1 and cause in (None, "unknown") else []  # (a concluded cause's are its two sides)
    launch = [t for t in terms if t in LAUNCH_TERMS and t not in phase]
    out = []
    for t in terms:
        if t == "failing allocation" and phase:
            out.append(DECIDING_OOM_PHASE)  # (one traceback shows both)
            continue
        if t in phase:
            if t == phase[0] and "failing allocation" not in terms:
                out.append(DECIDING_PHASE)
            continue
        if len(launch) > 1 and t in LAUNCH_TERMS:
            if t == launch[0]:
                out.append(DECIDING_LAUNCH)
            continue
        out.append(_ASKED_FOR_CAUSE.get((cause, t), DECIDING[t]))
    return out


def rests_on(ev: Evidence, values: dict[str, Sourced], cause: str | None) -> list[str]:
    """The terms an answer rests on and the report does not state: for an undecided one (``cause`` "unknown"), those
    that decide it (``deciding_terms``); for a concluded one, those of ``RESTS_ON``; none for the allocator's verdict
    (``cause`` ``None``), which kvaudit's audit decides."""
    if cause == "unknown":
        return deciding_terms(ev, values)
    return [t for t in RESTS_ON.get(cause or "", ()) if not _stated(ev, values, t)]


def _stated(ev: Evidence, values: dict[str, Sourced], term: str) -> bool:
    """Whether the report states ``term``: a line of vLLM's log (``kvaudit.triage.ledger.REPORTED``), torch's
    out-of-memory line or a smi table, the launch's utilization, the device's memory, the host's memory (`free`,
    `--shm-size`), the driver's release."""
    if term in ledger.REPORTED and ledger.reported(ev, term) is not None:
        return True
    checks = {"budget": lambda: _reported(values, "gpu_memory_utilization"),
              "weights": lambda: _reported(values, "weights"),
              "device memory": lambda: _reported(values, "device memory"),
              "KV for one request": lambda: ev.first("kv_capacity_error") is not None,
              "failing allocation": lambda: ev.value("oom") is not None,
              "outside this process": lambda: _figures_shown(ev),
              "host memory": lambda: ev.first("host_memory", "shm_size") is not None,
              "release": lambda: ev.first("driver_version") is not None}
    return checks[term]() if term in checks else False


@dataclass
class _Case:
    """What the cause of a report whose allocation matches the plan is read from: its facts and settings, the
    device's memory ``T`` and the utilization ``u``, and what follows from them, computed once."""

    ev: Evidence
    values: dict[str, Sourced]
    T: int | None
    u: float
    oom: Any
    phase: str | None
    weights: tuple[int, str] | None
    A: int | None
    """The KV budget, as the report logs it or kvaudit derives it."""
    breach: Any
    """The inequality the report's own figures break (``kvaudit.triage.ledger.Breach``), if any."""
    running: bool
    """The deployment got past start-up: it captured graphs, served, or its memory grew while serving."""

    @property
    def capacity(self) -> Fact | None:
        return self.ev.first("kv_capacity_error")

    @property
    def no_room(self) -> bool:
        return (self.A is not None and self.A <= 0
                or self.capacity is not None and _says_no_room(self.capacity))

    @property
    def refusals_disagree(self) -> bool:
        return self.A is None and refusals_disagree(self.ev)

    @property
    def room_counted_elsewhere(self) -> Fact | None:
        """Another instance of the engine named on the same devices where vLLM found no room for the KV cache though
        the weights fill less than half of the budget: the instance's profile counted the other's memory."""
        second = self.ev.first("second_instance")
        if (second is None or not self.no_room or self.refusals_disagree or self.weights is None or not self.T
                or self.weights[0] >= 0.5 * self.u * self.T):
            return None
        return second

    @property
    def stated_u(self) -> bool:
        return _reported(self.values, "gpu_memory_utilization")

    @property
    def default_u(self) -> float:
        """vLLM's default utilization in the report's release (the newest era's where it names none)."""
        release = self.values.get("vLLM") or self.values.get("vllm-ascend")
        return default_gpu_memory_utilization(release.value if release else None)


@dataclass
class _Finding:
    """A cause (a key of ``CAUSES``), the sentence that says why, what to do, and a utilization that fixes it."""

    cause: str
    text: str
    actions: list[str] = field(default_factory=list)
    rec_u: float | None = None


def _preallocated(c: _Case) -> _Finding | None:
    if c.ev.first("memory_question") is None or c.ev.first(
            "oom", "oom_mentioned", "kv_capacity_error", "memory_growth", "not_released", "serving_oom",
            "capture_oom", "outside", "failure_said") is not None:
        return None  # (a question about memory use, where nothing failed)
    cause, u, T = "preallocated", c.u, c.T
    share = f"{u} × {fmt_bytes(T)} = {fmt_bytes(int(u * T))}" if T else f"{u} of the device"
    return _Finding(cause, f"nothing failed: {CAUSES[cause]} ({share} at `--gpu-memory-utilization {u}`).", [
        "To use less, lower `--gpu-memory-utilization` to what the deployment needs (`kvaudit plan` gives the KV "
        "budget and tokens each value leaves), or size the KV cache in bytes with `--kv-cache-memory`."])


def _mamba_states(c: _Case) -> _Finding | None:
    if c.capacity is None or "Mamba cache blocks" not in c.capacity.text:
        return None
    cause = "budget-too-small-for-max-num-seqs"
    return _Finding(cause, f"vLLM refused to start because {CAUSES[cause]} ({where(c.capacity, 120)}).", [
        "Lower `--max-num-seqs` to the Mamba cache blocks vLLM reports, or give the KV cache more memory (a higher "
        "`--gpu-memory-utilization`, a larger TP)."])


def refusals_disagree(ev: Evidence) -> bool:
    """Whether the report quotes both of vLLM's refusals of the KV cache, which exclude each other: "No available
    memory for the cache blocks" where the KV budget is not positive, "To serve at least one request with the model's
    max seq len ..." (V0: "... larger than the maximum number of tokens that can be stored in KV cache") where it is
    positive but short of one request (vllm/v1/core/kv_cache_utils.py): the KV budget's sign decides which ran."""
    kinds = {_says_no_room(f) for f in ev.all("kv_capacity_error")}
    return kinds == {True, False}


def _says_no_room(refusal: Fact) -> bool:
    """Whether a refusal of the KV cache is vLLM's "No available memory for the cache blocks" (its anchor, the fact's
    value, however the report cased or wrapped it), not one of the refusals of a budget short of one request."""
    return "No available memory" in str(refusal.value)


def _no_room(c: _Case) -> _Finding | None:
    if not c.no_room or c.refusals_disagree or (release_changes(c.ev) and release_pair(c.ev)):
        return None
    if c.room_counted_elsewhere is not None:
        return None  # (another instance's memory was counted in this one's profile: ``_another_process``)
    cause, T, u, A, weights = "no-room-for-kv-cache", c.T, c.u, c.A, c.weights
    share = f"{u} of {fmt_bytes(T)} is {fmt_bytes(int(u * T))}" if T else f"the utilization {u}"
    text = ((f"vLLM refused to start because {CAUSES[cause]}" if c.capacity is not None else
             f"the KV budget vLLM logged is not positive: {CAUSES[cause]}") + f" ({share}"
            + (f"; the weights alone take {fmt_bytes(weights[0])} per rank ({weights[1]})" if weights else "")
            + (f"; the KV budget logged is {fmt_bytes(A)}" if A is not None and A <= 0 else "") + ").")
    found = _Finding(cause, text, [
        f"Give the KV cache room: a higher `--gpu-memory-utilization` (the default is {c.default_u:g}), a larger "
        "`--tensor-parallel-size`, a smaller or quantized model, or a smaller profile batch "
        "(`--max-num-batched-tokens`, `--max-num-seqs`)."])
    if A is not None and A <= 0 and T:
        rec_u = round(u + (-A + (2 << 30)) / T, 2)  # the shortfall and 2 GiB of KV cache
        if rec_u <= 0.95:
            found.rec_u = rec_u
            found.actions.append(f"The budget is short by {fmt_bytes(-A)}: `--gpu-memory-utilization {rec_u}` "
                                 "leaves about 2 GiB for the KV cache, if the device has that room.")
    return found


def _short_of_one_request(c: _Case) -> _Finding | None:
    retold = c.breach is not None and c.breach.cause == "budget-too-small-for-max-model-len"  # (its figures, retold)
    if c.capacity is None and not retold or c.no_room or c.refusals_disagree:
        return None
    ev, cause = c.ev, "budget-too-small-for-max-model-len"
    est = ev.first("estimated_max_model_len")
    need, have = ev.value("kv_needed"), ev.value("available_kv")
    mml = c.values["max model len"].value or ev.value("max_model_len")
    found = _Finding(cause, f"vLLM refused to start because {CAUSES[cause]} ("
                     + (f"{mml:,} tokens" if isinstance(mml, int) else "the report gives no max model length")
                     + (f": {fmt_bytes(need)} needed, {fmt_bytes(have)} available" if need and have else "") + ").")
    if est is not None:
        found.actions.append(f"`--max-model-len {est.value}` (vLLM's own estimate, {where(est, 80)}), or more memory "
                             "for the KV cache (a higher `--gpu-memory-utilization`, a larger TP).")
    else:
        found.actions.append("Lower `--max-model-len`, or give the KV cache more memory: a higher "
                             "`--gpu-memory-utilization` or a larger TP.")
    if need and have and c.T and need > have:  # (figures of two lines that disagree give no advice)
        rec_u = round(min(1.0, c.u + (need - have) / c.T + 0.0005), 3)
        if 0.0 < rec_u < 1.0:
            found.rec_u = rec_u
            found.actions.append(f"At this max model len the budget must grow by {fmt_bytes(need - have)}: "
                                 f"`--gpu-memory-utilization {rec_u}` if the device has that room.")
    return found


def _component(c: _Case) -> _Finding | None:
    if c.breach is None or c.breach.cause != "outside-budget":
        return None
    cause, name = c.breach.cause, c.ev.value("oom_package")
    return _Finding(cause, f"the device ran out in {name}'s code: {c.breach.inequality}. {CAUSES[cause][0].upper()}"
                    f"{CAUSES[cause][1:]}: vLLM's profile does not see it, so the KV cache took the room it needed.", [
                        f"Leave {name} its memory: lower `--gpu-memory-utilization` by what {name} allocates on the "
                        f"device (its buffer settings), or move its buffers off the device; then check {name}'s "
                        "release notes for the allocation that failed."])


def _release_change(c: _Case) -> _Finding | None:
    changes, pair = release_changes(c.ev), release_pair(c.ev)
    if not changes or pair is None:
        return None
    last = changes[-1]
    return _Finding(last.cause, f"the launch worked on {pair[0] or 'earlier releases'} and fails on {pair[1]} "
                    f"({where(c.ev.first('release_fails'), 100)}): from {last.release} on, {last.what} "  # type: ignore[arg-type]
                    f"({last.source})." + ("" if len(changes) == 1 else " Also between them: " + "; ".join(
                        f"{x.release}: {x.what}" for x in changes[:-1]) + "."),
                    [last.fix[0].upper() + last.fix[1:] + "."])


def _named_change(c: _Case) -> _Finding | None:
    named = [(x, f) for f in c.ev.all("change_named") for x in CHANGES if x.release == f.value and x.named_by]
    if not named:
        return None
    x, f = named[-1]
    return _Finding(x.cause, f"the report names {where(f, 100)}: from {x.release} on, {x.what} ({x.source}).",
                    [x.fix[0].upper() + x.fix[1:] + "."])


def _device_selection(c: _Case) -> _Finding | None:
    f = c.ev.first("cvd_after_import")
    if f is None:
        return None
    cause = "device-selection"
    return _Finding(cause, f"the device ran out because {CAUSES[cause]} ({where(f, 80)}): the engine used the first "
                    "visible device, which other work may hold.",
                    ["Set CUDA_VISIBLE_DEVICES in the shell, or before the first `import torch` / `import vllm`."])


def _second_engine(c: _Case) -> _Finding | None:
    second = c.ev.first("second_engine", "next_model")
    if second is None:
        return None
    return _Finding("another-process", f"a second engine starts in the same process ({where(second, 100)}): "
                    "the first engine's weights and KV cache are still held (a new `LLM` does not free the old one), "
                    "outside the new engine's profile.", [
                        "Free the first engine before the second (`del llm`, `gc.collect()`, `torch.cuda.empty_cache()`, "
                        "and vLLM's distributed cleanup), or run each model in its own process."])


def _not_released(c: _Case) -> _Finding | None:
    kept = c.ev.first("not_released")
    if kept is None or c.ev.first("memory_growth") is not None:
        return None  # (memory said to grow as well: what is kept is a leak in this process, ``_memory_growth``)
    return _Finding("another-process", f"the device ran out because memory was not released ({where(kept, 120)}): "
                    "what an earlier engine or request left behind is held outside vLLM's profile.", [
                        "Free what is held (a fix of the release path, or a restart) before planning the next engine; "
                        "until then, leave room for it with a lower `--gpu-memory-utilization`."])


def _weights_over_device(c: _Case) -> _Finding | None:
    if c.weights is None or not c.T or c.weights[0] <= c.T or c.running:
        return None
    cause = "weights"
    return _Finding(cause, f"the device ran out because {CAUSES[cause]}: {fmt_bytes(c.weights[0])} per rank "
                    f"({c.weights[1]}) on a {fmt_bytes(c.T)} device.",
                    ["Spread the weights: a larger `--tensor-parallel-size` (or PP), or a quantized checkpoint."])


def _weights_over_budget(c: _Case) -> _Finding | None:
    if (c.weights is None or not c.T or not c.u or c.weights[0] <= c.u * c.T or c.running
            or c.phase not in (None, "weight loading", "memory profiling", "kv-cache planning")):
        return None
    cause, (w, how) = "weights", c.weights
    rec_u = min(c.default_u, round((w / c.T) + 0.1, 2))
    return _Finding(cause, f"{CAUSES[cause]}: at `--gpu-memory-utilization {c.u}` vLLM may use "
                    f"{fmt_bytes(int(c.u * c.T))} of the {fmt_bytes(c.T)} device, and the weights alone take "
                    f"{fmt_bytes(w)} per rank ({how}).", [
                        f"Raise `--gpu-memory-utilization` (vLLM's default is {c.default_u:g}; {rec_u} leaves the weights room "
                        "and some for the KV cache), or spread the weights with a larger TP."], rec_u)


def _host_program(c: _Case) -> _Finding | None:
    host = c.ev.first("host_package")
    if host is None or c.phase not in (None, "kv-cache allocation"):
        return None
    cause, name, u, T = "outside-budget", host.value, c.u, c.T
    left = f" ({fmt_bytes(int((1 - u) * T))} of {fmt_bytes(T)})" if T else ""
    return _Finding(cause, f"vLLM runs inside {name} ({where(host, 100)}), and the device ran out as vLLM allocated "
                    f"what its plan holds within {u} of the device: {name}'s own tensors on this device (a trainer's "
                    f"weights, gradients, optimizer state) are outside vLLM's budget, which leaves them only 1 − "
                    f"{u}{left}. {CAUSES[cause][0].upper()}{CAUSES[cause][1:]}.", [
                        f"Give {name} its share of the device: a lower vLLM `gpu_memory_utilization` in {name}'s "
                        f"settings, so that it plus what {name} holds stays under the device; or free or offload "
                        f"{name}'s tensors before vLLM allocates (its offload options, vLLM's sleep mode)."])


def _another_process(c: _Case) -> _Finding | None:
    ev = c.ev
    others = [f for f in ev.all("device_process_mb") if "vllm" not in f.text.lower()]
    other, startup, occupied = ev.first("other_process"), ev.first("startup_free"), ev.first("device_occupied")
    second = c.room_counted_elsewhere
    over = c.breach is not None and c.breach.cause == "another-process"
    if others:
        held = f"{max(o.value for o in others):,} MB ({where(others[0], 100)})"
    elif other:
        held = f"{fmt_bytes(other.value)} ({where(other, 100)})"
    elif over:
        held = f"more than the utilization leaves it ({c.breach.inequality})"
    elif startup is not None and c.T and startup.value < c.u * c.T:
        held = f"all but {fmt_bytes(startup.value)} free at start-up ({where(startup, 100)})"
    elif occupied is not None:
        held = f"the device ({where(occupied, 160)})"
    elif second is not None:
        held = (f"its share of the devices, as another instance of the engine on them ({where(second, 160)}): the "
                f"weights ({fmt_bytes(c.weights[0])} per rank) fill less than half of this instance's budget "
                f"({c.u} × {fmt_bytes(c.T)}), yet vLLM found no room for the KV cache, so its profile counted memory "
                "that is not its own (vLLM measures the device's memory in use as it profiles, another instance's "
                "included where that one is starting or growing meanwhile)")
    else:
        return None
    return _Finding("another-process", f"the device ran out because another process holds {held}, outside vLLM's "
                    "profile.", ["Free the device (stop the other process, or give each service its own devices), or "
                                 "lower `--gpu-memory-utilization` by the other process's share of the device."])


def _device_growth(c: _Case) -> _Finding | None:
    grows = next((f for f in c.ev.all("memory_growth") if _DEVICE_GROWTH.search(f.text)), None)
    if grows is None:
        return None
    cause = "memory-growth"
    return _Finding(cause, f"{CAUSES[cause]} ({where(grows, 120)}): the KV cache is allocated once at start-up, so "
                    "memory that keeps growing is held by something else (caches of inputs, a leak in a release).", [
                        "Compare `npu-smi info` / `nvidia-smi` over time with the start-up figures; upgrade to a "
                        "release that fixes the leak, or restart the engine periodically; a lower "
                        "`--gpu-memory-utilization` buys time."])


def _graphs_at_a_high_utilization(c: _Case) -> _Finding | None:
    if c.phase != "CUDA/ACL graph capture" or c.u <= 0.95 or not c.stated_u or c.ev.first("eager_works") is not None:
        return None
    cause = "utilization-too-high"
    return _Finding(cause, f"the device ran out capturing graphs at `--gpu-memory-utilization {c.u}`: {CAUSES[cause]} "
                    "(the graphs are captured after the KV cache takes its share).", [
                        f"Lower `--gpu-memory-utilization` (vLLM's default is {c.default_u:g}) to leave the graphs room, or "
                        "`--enforce-eager` at some decode speed."])


_PHASE_CAUSE = {phase: cause for phase, (_, cause, _) in ledger.PHASE_TERMS.items()}
"""The cause an out-of-memory error in each phase is, where nothing before it in ``FINDINGS`` holds: the ledger's
(``kvaudit.triage.ledger.PHASE_TERMS``), one mapping for the ledger's phase breach and these findings."""


def _graphs(c: _Case) -> _Finding | None:
    eager = c.ev.first("eager_works")
    if c.phase != "CUDA/ACL graph capture" and eager is None:
        return None
    cause = _PHASE_CAUSE["CUDA/ACL graph capture"]
    return _Finding(cause, f"the device ran out during {CAUSES[cause]}" + (
        f" (the report says it works with --enforce-eager: {where(eager, 80)})" if eager else "") + ".", [
        "Leave graph memory room: a lower `--gpu-memory-utilization`, a smaller `--max-num-seqs` (fewer capture "
        "sizes), or `--enforce-eager` at some decode speed."])


def _serving(c: _Case) -> _Finding | None:
    if c.phase != "serving requests" and not (c.phase is None and c.ev.first("serving_oom") is not None):
        return None
    cause = _PHASE_CAUSE["serving requests"]
    return _Finding(cause, f"the device ran out during {CAUSES[cause]}.", [
        "Leave activations room: a lower `--gpu-memory-utilization`, or smaller `--max-num-batched-tokens` / "
        "`--max-num-seqs`; very long prompts need chunked prefill."])


def _warm_up(c: _Case) -> _Finding | None:
    if c.phase != "warm-up" or not c.stated_u or c.u < 0.95:
        return None  # (below 0.95, the warm-up's batch or the utilization: the launch decides, ``deciding_terms``)
    cause = _PHASE_CAUSE["warm-up"]
    return _Finding(cause, f"the device ran out in {ledger.PHASE_TERMS['warm-up'][2]}, after the KV cache took "
                    f"{c.u} of the device: {CAUSES[cause]}.", [
                        f"Lower `--gpu-memory-utilization` ({c.default_u:g} leaves the warm-up its room), or `--max-num-seqs` (the "
                        "warm-up's dummy requests)."])


def _profiling(c: _Case) -> _Finding | None:
    if c.phase != "memory profiling":
        return None
    cause = _PHASE_CAUSE["memory profiling"]
    return _Finding(cause, f"the device ran out during {CAUSES[cause]}.", [
        "Lower `--max-num-batched-tokens` or `--max-num-seqs` (the profile run's batch), or free the device of other "
        "memory."])


def _loading(c: _Case) -> _Finding | None:
    if c.phase != "weight loading" and not (c.weights is not None and c.T and c.weights[0] > c.T):
        return None
    cause = _PHASE_CAUSE["weight loading"]
    size = f" ({c.weights[1]})" if c.weights is not None else ""
    return _Finding(cause, f"the device ran out during weight loading: {CAUSES[cause]} at this TP{size}.",
                    ["Spread the weights: a larger `--tensor-parallel-size` (or PP), or a quantized checkpoint."])


def _kv_allocation(c: _Case) -> _Finding | None:
    if c.phase != "kv-cache allocation":
        return None
    cause = _PHASE_CAUSE["kv-cache allocation"]
    return _Finding(cause, f"the device ran out in the KV-cache allocation: {CAUSES[cause]}; memory outside vLLM's "
                    "profile (non-torch allocations, another process) or a utilization too close to 1.")


def _over_budget(c: _Case) -> _Finding | None:
    if c.breach is None or c.breach.cause != "over-budget":
        return None
    return _Finding("unknown", f"{c.breach.inequality}: {CAUSES['over-budget']}. Which one the traceback of the "
                    "failing allocation and the weights' figure tell (asked for below); the utilization is not what "
                    "ran out.", ["Find the term that grew (the traceback's phase, `Model loading took` in the start-up "
                                 "log) before changing `--gpu-memory-utilization`: weights over the budget need a "
                                 "larger TP or a smaller checkpoint, activations a smaller batch."])


def _small_utilization(c: _Case) -> _Finding | None:
    if c.u > 0.5 or not c.stated_u or (c.oom is None and c.ev.first("oom_mentioned") is None):
        return None
    source = c.values["gpu_memory_utilization"].source
    return _Finding("no-room-for-kv-cache", f"the report sets `--gpu-memory-utilization {c.u}` ({short(source, 90)}): "
                    "vLLM keeps weights, activations and the KV cache within that share of the device, and a share "
                    "this small leaves it no room.", [
                        f"Raise `--gpu-memory-utilization` toward vLLM's default {c.default_u:g} (what the device has free); to "
                        "share a device, give each engine its share and keep their sum under 1."])


def _works_lower(c: _Case) -> _Finding | None:
    return _utilization_too_high(c) if any(f.value < c.u for f in c.ev.all("util_works")) else None


def _high_utilization(c: _Case) -> _Finding | None:
    if c.u < 0.95 or c.ev.first("oom", "oom_mentioned", "serving_oom", "capture_oom") is None:
        return None  # (an error that is not said to be the device's memory: the utilization alone decides nothing)
    return _utilization_too_high(c)


def _utilization_too_high(c: _Case) -> _Finding:
    works = [f for f in c.ev.all("util_works") if f.value < c.u]
    cause = "utilization-too-high"
    return _Finding(cause, f"the device ran out at `--gpu-memory-utilization {c.u}`: {CAUSES[cause]} (non-torch "
                    "allocations, communication buffers, fragmentation)" + (
                        f"; the report says {max(w.value for w in works)} works ({where(works[0], 80)})"
                        if works else "") + ".", [
                        f"Keep `--gpu-memory-utilization` at {c.default_u:g}-0.95 (vLLM's default is {c.default_u:g}), or lower it until the "
                        "device keeps a few GiB free."])


FINDINGS = (_preallocated, _mamba_states, _no_room, _short_of_one_request, _component, _release_change, _named_change,
            _device_selection, _second_engine, _not_released, _weights_over_device, _weights_over_budget,
            _host_program, _another_process, _device_growth, _graphs_at_a_high_utilization, _graphs, _warm_up, _serving,
            _profiling, _loading, _kv_allocation, _small_utilization, _works_lower, _over_budget, _high_utilization)
"""The causes of an allocation that matches the plan, in the order they are tried: vLLM's own refusals and the
inequality the report's figures break first, then what the report says changed or what else holds the device, then
the term the phase allocates, then what the utilization alone suggests. The first that holds is the answer; where none
does, the cause is undecided and the deciding terms are named (``_deciding``)."""


def cause_of(ev: Evidence, values: dict[str, Sourced], T: int | None,
           u: float) -> tuple[str, str, list[str], float | None, int | None]:
    """What the numbers point to when the allocator is not the cause (device memory ``T``, utilization
    ``u``), and what to do about it: the first of ``FINDINGS`` that holds, with the utilization that frees what the
    failing allocation lacked."""
    oom = ev.value("oom")
    phase = phase_of(ev)
    budget = values.get("KV budget")
    c = _Case(ev, values, T, u, oom, phase, weights_per_rank(values), budget.value if budget is not None else None,
              report_breach(ev, values, phase),
              ev.first("served", "captured", "memory_growth", "serving_oom") is not None
              or phase in ("CUDA/ACL graph capture", "serving requests", "warm-up"))
    found = next((f for f in (find(c) for find in FINDINGS) if f is not None), None)
    if found is None:
        terms = deciding_terms(ev, values)
        found = _Finding("unknown", "nothing in the allocator to fix; the cause rests on ledger terms the report does "
                         "not show: " + _listed([SAID[t] for t in terms]) + " (asked for below)." if terms
                         else f"nothing in the allocator to fix; {CAUSES['unknown']}.")
    cause, text, actions, rec_u, rec_kv, A = found.cause, found.text, found.actions, found.rec_u, None, c.A
    shortfall = (oom.tried - oom.free) if oom is not None and oom.free is not None else None
    if shortfall is not None and shortfall > 0 and A is not None and T and cause != "budget-too-small-for-max-model-len":
        margin = int(shortfall * 1.1) + (256 << 20)
        rec_kv = A - margin
        if rec_kv > 0 and round(u - margin / T - 0.0005, 3) > 0:
            rec_u = round(u - margin / T - 0.0005, 3)
            actions.append(f"Free {fmt_bytes(margin)} for it (the failing request needed {fmt_bytes(shortfall)} "
                           f"more than was free, plus 10 % and 256 MiB): `--gpu-memory-utilization {rec_u}`, or "
                           f"`--kv-cache-memory={rec_kv}` ({fmt_bytes(rec_kv)}).")
        else:
            rec_kv = None
    works = [f.value for f in ev.all("util_works") if f.value < u]
    if works and rec_u is None and T:
        actions.append(f"The report says it works at `--gpu-memory-utilization {max(works)}`; that leaves "
                       f"{fmt_bytes(int((u - max(works)) * T))} for what ran out.")
    if not actions:
        actions.append("Nothing in the allocator to fix; if memory use still looks wrong, compare "
                       "`npu-smi info`/`nvidia-smi` with the 'device memory in use' prediction above.")
    return cause, text, actions, rec_u, rec_kv


_DEVICE_GROWTH = re.compile(r"\b(?:gpu|npu|vram|hbm|cuda|device)\b|显存|\d(?:\.\d+)?\s*(?:[GM]i?B?|g)\b", re.IGNORECASE)
"""A sentence about growing memory that places it on the device (it names the device's memory) or measures it: a
bare "memory leak" may be the host's, and decides nothing about the device's ledger."""


def weights_per_rank(values: dict[str, Sourced]) -> tuple[int, str] | None:
    """Weights per rank, with what says so: the report's or vLLM's figure where there is one, else the
    parameter count the model's name states ("Llama 3 70B": 70e9 × 2 bytes in 16 bits) over the TP;
    ``None`` when neither is known."""
    known = values.get("weights")
    if known is not None:
        return known.value, f"{fmt_bytes(known.value)} of weights per device ({short(known.source, 80)})"
    model = values.get("model")
    if model is None or not isinstance(model.value, str):
        return None
    name = model.value.lower()
    m = re.search(r"(?<![a-z\d.])(?:(\d{1,3})x)?(\d{1,4}(?:\.\d{1,3})?)b(?![a-z])", name)  # (no model has 10^13)
    if m is None:
        return None
    params = float(m.group(2)) * 1e9 * (int(m.group(1)) if m.group(1) else 1)
    width = (values["weight bits"].value / 8 if "weight bits" in values  # the scheme the report states ("w4a8")
             else 0.5 if re.search(r"awq|gptq|int4|4[-_ ]?bit|w4a\d+|[a-z]*fp4|q4_|bnb", name)
             else 1 if re.search(r"fp8|int8|8[-_ ]?bit|w8a\d+|q8_", name) else 2)
    tp = values["tensor parallel size"].value if "tensor parallel size" in values else 1
    pp = values["pipeline parallel size"].value if "pipeline parallel size" in values else 1
    per_rank = int(params * width / (tp * pp))
    spread = f"TP {tp}" + (f" × PP {pp}" if pp > 1 else "")
    return per_rank, (f"{m.group(0).upper()} parameters × {width:g} bytes / {spread} = {fmt_bytes(per_rank)} per device, "
                      f"from the model's name")
