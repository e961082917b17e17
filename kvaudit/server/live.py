"""A running server audited against vLLM's plan (``kvaudit live``): the deployment it serves, read from its own
endpoints (``kvaudit.server.endpoints``), planned by vLLM's planner with the server's own ``num_gpu_blocks``, each
strategy's allocation of that plan on ``meta``, and the device memory its processes hold (``kvaudit.server.smi``)
against what the plan predicts.

vLLM sizes the KV cache so that a rank uses ``device memory × gpu_memory_utilization`` (``Worker.
determine_available_memory``), plus the CUDA-graph pool where the release does not subtract its estimate
(``kvaudit.model.memory.subtracts_graph_estimate``); the profile run's activations are released after it and held
again once requests run, so an idle server may use that much less. An allocator that gives the plan's tensors more
than planned adds the excess on top: a strategy's signature is the device use its allocation of the served plan
predicts. The verdict's tolerance is ``kvaudit.results.OBSERVED_USE_TOLERANCE`` of the device."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kvaudit.errors import EXIT_FAIL, EXIT_NOT_MEASURED, EXIT_PASS, KvauditError, NotAuditable, UsageError
from kvaudit.results import DEFAULT_TOLERANCE, OBSERVED_USE_TOLERANCE, AuditResult
from kvaudit.server.endpoints import METRICS, MODELS, SERVER_INFO, VERSION, Served, read_server
from kvaudit.server.metrics import CACHE_CONFIG
from kvaudit.server.smi import SmiProcess, SmiReading
from kvaudit.units import MiB, fmt_bytes
from kvaudit.versions import is_release

MATCHES, OVER, UNDER, DIFFERS, NOT_MEASURED = ("matches the plan", "over-allocated", "below the plan",
                                               "settings differ", "not measured")
"""The verdicts, each a finding of its own; the exit code follows ``audit``'s (``LiveReport.exit_code``)."""
SERVER_PROCESS_WORDS = ("vllm", "python", "ray::", "enginecor", "worker")
"""Words in a process name that mark it as the server's (``VLLM::EngineCore``, ``VLLM::Worker_TP0``, npu-smi's cut
``VLLMEngineCor``, ``python3``, ``ray::RayWorkerWrapper``); any other process on the server's devices is another's."""


@dataclass(frozen=True)
class Setting:
    """A deployment setting: what the server runs with, which endpoint said it, and what the user asked (``None``:
    not asked)."""

    flag: str
    served: Any
    source: str
    asked: Any = None
    option: str | None = None
    """The deployment option it sets (``kvaudit.model.options.DEPLOYMENT_OPTIONS``' name: ``util``)."""

    @property
    def differs(self) -> bool:
        return self.asked is not None and self.served is not None and _same(self.asked) != _same(self.served)


def _same(value: Any) -> Any:
    """A setting as compared: numbers as floats, words lower-case (``True``/``true``, ``0.9``/``0.90``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return float(value)
    return str(value).lower()


@dataclass(frozen=True)
class DeviceUse:
    """One device the server uses, as the smi output shows it."""

    index: int | None
    name: str | None
    used_bytes: int
    """The server's processes on it (or the device's own use where the table gives no process's)."""
    source: str
    others: tuple[SmiProcess, ...] = ()
    """Processes on it that are not the server's."""


@dataclass(frozen=True)
class Signature:
    """The device use one strategy's allocation of the served plan predicts on a rank."""

    strategy: str
    ratio: float
    low_bytes: int
    high_bytes: int


@dataclass(frozen=True)
class LiveReport:
    """The served deployment, its plan, each strategy's allocation of it, the devices, and the verdict."""

    url: str
    served: Served
    settings: tuple[Setting, ...]
    deployment: Any
    vllm_version: str | None
    """The vLLM that planned (installed)."""
    served_blocks: int
    planned_blocks: int | None
    """vLLM's num_blocks for the served settings from kvaudit's memory model (no ``num_gpu_blocks`` given)."""
    capacity: Any
    audits: tuple[AuditResult, ...]
    signatures: tuple[Signature, ...]
    smi: SmiReading | None
    devices: tuple[DeviceUse, ...]
    verdict: str
    findings: tuple[str, ...]
    matching: tuple[str, ...] = ()
    """Strategies whose signature the observed use matches."""
    factor: float | None = None
    """The served KV cache's size on the device over its plan, where the device is above the plan."""
    notes: tuple[str, ...] = field(default=())
    blocks_by_era: dict[str, int] = field(default_factory=dict)
    """Where the served num_gpu_blocks is off its own release's plan: vLLM's num_blocks under each era's budget
    formula (the first release of each era)."""

    @property
    def nearest_era(self) -> tuple[tuple[str, ...], int] | None:
        """The eras whose budget gives the served num_gpu_blocks most nearly, and their figure (``None`` where none
        was planned)."""
        if not self.blocks_by_era:
            return None
        n = min(self.blocks_by_era.values(), key=lambda v: abs(v - self.served_blocks))
        return tuple(era for era, v in self.blocks_by_era.items() if v == n), n

    @property
    def exit_code(self) -> int:
        """As ``audit``'s: 0 the device holds what vLLM planned, 1 a finding (over or below the plan; settings other
        than asked, whatever the device holds), 3 nothing measured (no device memory read)."""
        return {MATCHES: EXIT_PASS, NOT_MEASURED: EXIT_NOT_MEASURED}.get(self.verdict, EXIT_FAIL)

    @property
    def tolerance_bytes(self) -> int:
        return observed_tolerance_bytes(self.deployment)

    def to_dict(self) -> dict:
        """JSON form (``kvaudit live --format json``)."""
        d, cap = self.deployment, self.capacity
        engine = self.served.metrics.engines[0]
        return {
            "kvaudit_live": 1, "url": self.url, "verdict": self.verdict, "exit_code": self.exit_code,
            "findings": list(self.findings), "matching_strategies": list(self.matching),
            "factor": None if self.factor is None else round(self.factor, 4),
            "server": {"version": self.served.version,
                       "models": [dataclasses.asdict(m) for m in self.served.models],
                       "engines": [{"engine": e.engine, "cache_config": e.cache_config,
                                    "kv_cache_usage": e.kv_cache_usage, "running": e.running, "waiting": e.waiting}
                                   for e in self.served.metrics.engines],
                       "engine_config": self.served.engine_config, "notes": list(self.served.notes)},
            "settings": [{"flag": s.flag, "served": s.served, "source": s.source, "asked": s.asked,
                          "differs": s.differs} for s in self.settings],
            "planned_by": {"vllm_version": self.vllm_version, "meter": "meta", "emulated_release": d.vllm_version},
            "deployment": d.to_dict(),
            "num_gpu_blocks": {"served": self.served_blocks, "planned": self.planned_blocks,
                               "by_era": self.blocks_by_era},
            "capacity": cap.to_dict(),
            "kv_cache_usage": engine.kv_cache_usage,
            "strategies": [{"strategy": r.strategy, "expected_bytes": r.expected_bytes,
                            "allocated_bytes": r.allocated_bytes, "ratio": round(r.ratio, 6),
                            "verdict": r.verdict.value, "projected_bytes": r.projected_bytes,
                            "device_low_bytes": s.low_bytes, "device_high_bytes": s.high_bytes}
                           for r, s in zip(self.audits, self.signatures)],
            "smi": None if self.smi is None else self.smi.tool,
            "devices": [{"index": u.index, "name": u.name, "used_bytes": u.used_bytes, "source": u.source,
                         "others": [dataclasses.asdict(p) for p in u.others]} for u in self.devices],
            "tolerance_bytes": self.tolerance_bytes,
            "notes": list(self.notes),
        }


def observed_tolerance_bytes(d: Any) -> int:
    """How far a device's observed use may be from a signature: ``OBSERVED_USE_TOLERANCE`` of its memory."""
    return int(OBSERVED_USE_TOLERANCE * d.device_memory_bytes)


# -- the served deployment ---------------------------------------------------------------------------------------


def served_settings(served: Served, asked: Any) -> tuple[list[Setting], dict[str, Any], int]:
    """The settings the server states (each with its endpoint) beside those the user asked (``asked``: the command
    line's deployment options, ``None`` where not given), the deployment options to plan with (the server's where it
    states one, else the user's), and the served ``num_gpu_blocks``."""
    engines = served.metrics.engines
    config = next((e for e in engines if e.cache_config), None)
    if config is None:
        raise UsageError(f"{served.url}{METRICS} has no {CACHE_CONFIG} (the CacheConfig vLLM publishes since 0.4): a "
                         "vLLM too old, or not vLLM")
    blocks = config.config_int("num_gpu_blocks")
    if blocks is None:
        raise UsageError(f"{served.url}{METRICS}: {CACHE_CONFIG} says num_gpu_blocks=None: the engine has not "
                         "planned its KV cache yet (still starting?), or a release that does not publish it")
    others = sorted({e.config_int("num_gpu_blocks") for e in engines if e.cache_config} - {blocks, None})
    cache = f"{METRICS} {CACHE_CONFIG}"
    info = served.engine_config
    model = served.base_model
    settings: list[Setting] = []

    def add(flag: str, name: str, value: Any, source: str) -> None:
        settings.append(Setting(flag, value, source, getattr(asked, name, None), name))

    add("--gpu-memory-utilization", "util", config.config_float("gpu_memory_utilization"), cache)
    add("--block-size", "block_size", config.config_int("block_size"), cache)
    dtype = config.cache_config.get("cache_dtype")
    add("--kv-cache-dtype", "kv_cache_dtype", dtype, cache)
    prefix = config.cache_config.get("enable_prefix_caching")
    add("--enable-prefix-caching", "enable_prefix_caching", None if prefix in (None, "None") else prefix == "True",
        cache)
    kv_memory = config.config_int("kv_cache_memory_bytes") or config.config_int("kv_cache_memory")
    if kv_memory:
        add("--kv-cache-memory", "kv_cache_memory", kv_memory, cache)
    length = model.max_model_len if model and model.max_model_len else _int(info.get("max_seq_len"))
    add("--max-model-len", "max_model_len", length,
        MODELS if model and model.max_model_len else f"{SERVER_INFO} max_seq_len")
    for flag, name, key in (("--tensor-parallel-size", "tp", "tensor_parallel_size"),
                            ("--pipeline-parallel-size", "pp", "pipeline_parallel_size"),
                            ("--data-parallel-size", "dp", "data_parallel_size")):
        if _int(info.get(key)) is not None:
            add(flag, name, _int(info.get(key)), f"{SERVER_INFO} {key}")
    if info.get("dtype"):
        add("--dtype", "dtype", info["dtype"].removeprefix("torch."), f"{SERVER_INFO} dtype")
    if info.get("quantization") not in (None, "None"):
        add("--quantization", "quantization", info["quantization"], f"{SERVER_INFO} quantization")
    if served.version and is_release(served.version):  # (a build's own string, "dev", is no release to emulate)
        add("vLLM", "vllm_version", served.version, VERSION)
    options = {o: getattr(asked, o) for o in vars(asked) if getattr(asked, o) is not None} if asked else {}
    options.update({s.option: s.served for s in settings if s.served is not None})
    options["num_blocks"] = blocks
    if others:
        settings.append(Setting("num_gpu_blocks (other engines)", others, cache))
    return settings, options, blocks


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def device_kind(smi: SmiReading | None, asked: str | None) -> tuple[str | None, str | None]:
    """The kvaudit device kind (``kvaudit.model.deployment.DEVICES``) the server's devices are, and why: ``--device``
    where given, else the kind whose name and memory match the smi table's first device the server uses."""
    from kvaudit.model.deployment import DEVICES

    if asked or smi is None:
        return asked, None
    used = {p.device for p in smi.processes} or {d.index for d in smi.devices}
    device = next((d for d in smi.devices if d.index in used and d.total_mb), None)
    if device is None:
        return None, None
    words = {w.lower() for w in (device.name or "").replace("-", " ").split() if w.lower() not in ("nvidia", "tesla")}
    best = None
    for kind in DEVICES.values():
        if kind.platform != smi.platform:
            continue
        off = abs(kind.memory_bytes - device.total_mb * MiB) / (device.total_mb * MiB)
        if off > 0.12:  # (torch sees 1-7 % less than the tool's total)
            continue
        title = kind.title.lower().replace("-", " ")
        score = (sum(1 for w in words if w in title.split() or w in kind.name), -off)
        best = max(best or (score, kind.name), (score, kind.name))
    if best is None:
        return None, None
    return best[1], f"{smi.tool}'s {device.name or 'device'} with {device.total_mb:,} MiB (line {device.line})"


def device_use(smi: SmiReading) -> tuple[DeviceUse, ...]:
    """Each device the server's processes hold memory on: their sum, and any other process there; where the table
    lists no process's memory (a container hides it: every row 0 MiB, or none), each device's own use."""
    ours = [p for p in smi.processes if any(w in p.name.lower() for w in SERVER_PROCESS_WORDS) and p.used_mb > 0]
    if ours:
        out = []
        for index in sorted({p.device for p in ours}, key=lambda i: -1 if i is None else i):
            here = [p for p in ours if p.device == index]
            others = tuple(p for p in smi.processes if p.device == index and p not in ours and p.used_mb > 0)
            dev = smi.device(index) if index is not None else None
            out.append(DeviceUse(index, dev.name if dev else None, sum(p.used_mb for p in here) * MiB,
                                 f"{smi.tool} process rows " + ", ".join(f"{p.name} pid {p.pid} (line {p.line})"
                                                                         for p in here), others))
        return tuple(out)
    return tuple(DeviceUse(d.index, d.name, d.used_mb * MiB, f"{smi.tool} device row, memory used (line {d.line}): "
                           "no process row gives memory")
                 for d in smi.devices if d.used_mb)


# -- the audit ---------------------------------------------------------------------------------------------------


def signatures(d: Any, audits: list[AuditResult]) -> list[Signature]:
    """Each strategy's predicted device use on a rank: the server's budget (device memory × utilization, or the
    weights, non-KV terms and ``--kv-cache-memory``), the graph pool the release does not budget (kvaudit's term
    within its spread against vLLM's own estimate: ``GRAPH_ESTIMATE_SPREAD``), and what the strategy allocates beyond
    the plan; as low as that less the profile run's activations (released until requests run)."""
    if d.kv_cache_memory_bytes is not None:
        budget = d.weights_bytes + d.overhead_bytes + d.kv_cache_memory_bytes
    else:
        budget = int(d.device_memory_bytes * d.gpu_memory_utilization)
    from kvaudit.model.memory import GRAPH_ESTIMATE_SPREAD

    low_graphs, high_graphs = (int(d.unbudgeted_bytes / f) for f in reversed(GRAPH_ESTIMATE_SPREAD))
    released = sum(t.bytes for t in d.overhead_terms if t.key == "peak_activation")
    return [Signature(r.strategy, r.ratio, budget + low_graphs - released + r.allocated_bytes - r.expected_bytes,
                      budget + high_graphs + r.allocated_bytes - r.expected_bytes) for r in audits]


def judge(d: Any, audits: list[AuditResult], sigs: list[Signature], devices: tuple[DeviceUse, ...],
          settings: list[Setting]) -> tuple[str, list[str], list[str], float | None]:
    """The verdict, its findings, the strategies whose signature matches, and the factor of the KV cache the device
    holds over its plan (where above it)."""
    tol = observed_tolerance_bytes(d)
    findings = [f"{s.flag}: the server runs {s.served} ({s.source}); you asked {s.asked}" for s in settings
                if s.differs]
    for u in devices:
        for p in u.others:
            findings.append(f"another process on device {u.index}: {p.name} pid {p.pid} holds "
                            f"{fmt_bytes(p.used_mb * MiB)} (line {p.line}), outside the server's plan")
    differs = DIFFERS if any(s.differs for s in settings) else None
    if not devices:
        return differs or NOT_MEASURED, findings, [], None
    plan = next((s for s, r in zip(sigs, audits) if r.allocated_bytes == r.expected_bytes), sigs[0])
    planned_kv = max(1, next((r.expected_bytes for r in audits), 1))
    top = max(devices, key=lambda u: u.used_bytes)
    matching = [s.strategy for s in sigs if s.low_bytes - tol <= top.used_bytes <= s.high_bytes + tol]
    where = f"device {top.index}" if top.index is not None else "the device"
    if top.used_bytes > plan.high_bytes + tol:
        factor = (top.used_bytes - plan.high_bytes + planned_kv) / planned_kv
        findings.insert(0, f"{where} holds {fmt_bytes(top.used_bytes)}, {fmt_bytes(top.used_bytes - plan.high_bytes)} "
                           f"above the plan's {fmt_bytes(plan.high_bytes)}: a KV cache at least {factor:.2f}× its plan"
                           + (f", as {', '.join(matching)} allocate{'s' if len(matching) == 1 else ''} it"
                              if matching else ", as none of the audited strategies allocates it"))
        return OVER, findings, matching, factor
    if top.used_bytes < plan.low_bytes - tol:
        findings.insert(0, f"{where} holds {fmt_bytes(top.used_bytes)}, below the plan's {fmt_bytes(plan.low_bytes)} "
                           f"to {fmt_bytes(plan.high_bytes)}: the server is not the deployment planned (another "
                           "device, model or setting), or the table does not show its memory")
        return UNDER, findings, matching, None
    return differs or MATCHES, findings, matching, None


def live_audit(served: Served, smi: SmiReading | None, asked: Any, spec: Any, preset: Any, strategies: list[Any],
               tolerance: float, broken: list[tuple[str, str]] | tuple = ()) -> LiveReport:
    """The server's deployment planned with its own ``num_gpu_blocks``, each strategy's allocation of that plan on
    ``meta``, and the devices' use against each strategy's signature."""
    from kvaudit.measure.audit import audit_all
    from kvaudit.measure.meters import select_meter
    from kvaudit.model.options import DeploymentOptions
    from kvaudit.plan.capacity import capacity
    from kvaudit.plan.planner import deploy, plan_for, vllm_version

    settings, options, blocks = served_settings(served, asked)
    kind, why = device_kind(smi, getattr(asked, "device", None))
    notes = list(served.notes)
    if kind:
        options["device"] = kind
        if why:
            notes.append(f"device kind {kind}: from {why}")
    elif smi is None:
        notes.append("no smi output (--smi): the device's memory was not read; the device kind is "
                     f"{'--device' if getattr(asked, 'device', None) else 'the default'}")
    if smi is not None:
        platform = smi.platform
        strategies = [s for s in strategies if s.platform.startswith(platform)] or strategies
    d = deploy(spec, preset, DeploymentOptions.of(options))
    if d.pp > 1:
        notes.append(f"pipeline parallel {d.pp}: the first stage is planned and compared")
    skipped: list[tuple[str, str]] = list(broken)
    audits = audit_all(d, strategies, select_meter("meta"), tolerance, skipped)
    if not audits:
        raise NotAuditable("no strategy could allocate the served plan: " + "; ".join(f"{name}: {why}"
                                                                                    for name, why in skipped))
    notes += [f"{name}: not audited ({why})" for name, why in skipped]
    planned, by_era = None, {}
    try:
        planned = plan_for(dataclasses.replace(d, num_blocks_override=None), strategies[0]).num_blocks
    except KvauditError as e:  # a budget vLLM refuses is a note here, not the audit's end
        notes.append(f"vLLM's plan for the served settings without num_gpu_blocks: {e}")
    if planned is None or abs(planned - blocks) > OBSERVED_USE_TOLERANCE * blocks:
        by_era = _blocks_by_era(spec, preset, options, strategies[0], d.vllm_version)
        near = [era for era, n in by_era.items() if abs(n - blocks) <= OBSERVED_USE_TOLERANCE * blocks]
        if near:
            listed = ", ".join(near[:-1]) + " and " + near[-1] if len(near) > 1 else near[0]
            notes.append(f"the served num_gpu_blocks ({blocks:,}) follows the KV budget of vLLM {listed} "
                         f"(within {OBSERVED_USE_TOLERANCE:.0%}), not vLLM {d.vllm_version or 'as installed'}'s "
                         f"({'no plan' if planned is None else f'{planned:,}'}): the server's release or its "
                         "settings differ from what /version and /metrics say")
    sigs = signatures(d, audits)
    devices = device_use(smi) if smi is not None else ()
    verdict, findings, matching, factor = judge(d, audits, sigs, devices, settings)
    return LiveReport(served.url, served, tuple(settings), d, vllm_version(), blocks, planned,
                      capacity(audits[0].plan), tuple(audits), tuple(sigs), smi, devices, verdict, tuple(findings),
                      tuple(matching), factor, tuple(notes), by_era)


def _blocks_by_era(spec: Any, preset: Any, options: dict[str, Any], strategy: Any,
                   served_release: str | None) -> dict[str, int]:
    """vLLM's num_blocks for the served settings under each era's budget formula (``kvaudit.model.memory.
    budget_eras``), other than the served release's own: which budget the server's figure follows."""
    from kvaudit.model.memory import budget_eras
    from kvaudit.model.options import DeploymentOptions
    from kvaudit.plan.planner import deploy, plan_for

    out = {}
    for release in budget_eras():
        if release == served_release:
            continue
        try:
            d = deploy(spec, preset, DeploymentOptions.of({**options, "vllm_version": release, "num_blocks": None}))
            out[release] = plan_for(d, strategy).num_blocks
        except KvauditError:
            continue
    return out


def served_model(served: Served, model: str | None = None, revision: str | None = None,
                 trust_remote_code: bool = False) -> tuple[Any, Any]:
    """The served model's spec, loaded as ``kvaudit MODEL`` loads a model: ``model`` where given, else what the server
    loaded (``/v1/models``' root, or ``/server_info``'s model); a shipped config where one is exactly that model, else
    by Hub id. A server that loaded a path on its host needs ``model``."""
    from kvaudit.model.deployment import get_preset, load_model, load_preset_spec, preset_for_model
    from kvaudit.model.hub import names_hub_model

    base = served.base_model
    root = model or ((base.root or base.id) if base else served.engine_config.get("model"))
    if not root:
        raise UsageError(f"{served.url} names no model (no {MODELS}, no {SERVER_INFO}): give --model")
    shipped = preset_for_model(root)
    if shipped and shipped[1] and revision is None:
        return load_preset_spec(get_preset(shipped[0])), None
    if model is None and not names_hub_model(root):
        raise UsageError(f"the server loaded {root!r}, a path on its host: give --model (a Hub id, the model's folder "
                         "or its config.json)")
    return load_model(None, root, revision, trust_remote_code)[0], None


def smi_output(url: str, path: Any = None) -> tuple[str | None, str]:
    """The smi output to judge the server at ``url`` by, and where it came from: the file at ``path`` (nvidia-smi or
    npu-smi output from the server's host), else the tool run here where ``url`` is this machine; ``(None, why)``
    where there is none."""
    from kvaudit.jsonfile import read_bytes
    from kvaudit.server.endpoints import is_local
    from kvaudit.server.smi import SMI_LIMIT, run_smi

    if path is not None:
        raw = read_bytes(path, "smi output", "run nvidia-smi or npu-smi info on the server's host into a file",
                         limit=SMI_LIMIT)
        return raw.decode("utf-8", errors="replace"), str(path)
    if not is_local(url):
        return None, (f"{url} is not this machine: give its nvidia-smi / npu-smi output with --smi to judge its device "
                      "memory")
    text, source = run_smi()
    if text is None:
        return None, f"{source}: give the output from the server's host with --smi to judge its device memory"
    return text, source


def read_live(url: str, api_key: str | None = None, smi_text: str | None = None,
              smi_source: str = "the smi output") -> tuple[Served, SmiReading | None]:
    """What ``kvaudit live`` reads before it plans: the server (one whose ``/metrics`` will not do is told here, before
    its model is loaded) and its smi output."""
    from kvaudit.server.smi import read_smi

    served = read_server(url, api_key)
    served_settings(served, None)
    return served, (read_smi(smi_text, smi_source) if smi_text is not None else None)


def audit_served(served: Served, smi: SmiReading | None, *, model: str | None = None, revision: str | None = None,
                 trust_remote_code: bool = False, asked: Any = None, strategies: list[str] | None = None,
                 tolerance: float = DEFAULT_TOLERANCE, note: Any = None) -> LiveReport:
    """``kvaudit live``'s audit, for the command and the pytest plugin: the served model, the strategies named
    (default: the built-ins; each one's note to ``note``), and ``live_audit``. ``asked``: the deployment options given
    (an attribute per option, ``None`` where not given)."""
    from kvaudit.strategies.builtin import STRATEGIES
    from kvaudit.strategies.resolve import resolve_strategies

    spec, preset = served_model(served, model, revision, trust_remote_code)
    resolved, broken = resolve_strategies(strategies or list(STRATEGIES))
    for s in resolved:
        if s.note and note:
            note(f"kvaudit: {s.note}")
    return live_audit(served, smi, asked, spec, preset, resolved, tolerance, broken)
