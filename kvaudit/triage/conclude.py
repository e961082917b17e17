"""Triage a pasted out-of-memory report: read it (``kvaudit.triage.evidence``), reconstruct the deployment
(each value with its source), audit every release the report could be running with vLLM's planner
and the allocation strategies, set the prediction against what was observed, conclude with the
audit's own verdict policy, and say what to do.

Parsing imports neither torch nor vLLM; the audit step does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from kvaudit.errors import ConfigError, MissingDependency, UsageError
from kvaudit.escape import md, md_code
from kvaudit.model.deployment import DEVICES, PRESETS, Deployment, load_model, load_preset_spec, preset_for_model
from kvaudit.model.hub import names_hub_model
from kvaudit.model.spec import ModelSpec
from kvaudit.triage.changes import CHANGES, between, since_before
from kvaudit.triage.commands import OWN_READER
from kvaudit.triage.evidence import Evidence, Fact, clean_lines, extract, looks_like_report
from kvaudit.units import fmt_bytes
from kvaudit.versions import version_key

SCHEMA_VERSION = 1
OVER_ALLOCATION = "allocator-over-allocation"
MISMATCH = "allocator-mismatch"
MATCHES_PLAN = "allocation-matches-plan"
INSUFFICIENT = "insufficient-information"
PLAN_NOT_INVOLVED = "plan-not-involved"
"""The failure is not the device running out of memory: the host's memory, the collective library, the driver, or a
crash that is no memory error at all. vLLM's device-memory plan is not involved."""

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
}
"""What an allocation that matches the plan leaves as the cause, as the report's numbers point to it."""


@dataclass(frozen=True)
class Sourced:
    """A deployment value and where it came from: a report line, a derivation, or an assumption."""

    value: Any
    source: str

    def to_dict(self) -> dict:
        """JSON form."""
        return {"value": self.value, "source": self.source}


def _from(f: Fact, value: Any = None, note: str = "") -> Sourced:
    return Sourced(f.value if value is None else value, f.source + note)


def _assumed(value: Any, why: str) -> Sourced:
    return Sourced(value, f"assumed: {why}")


@dataclass(frozen=True)
class Triage:
    """The triage of one report."""

    verdict: str
    factor: float | None
    """Allocated over planned KV bytes for the release the report runs, or ``None``."""
    headline: str
    evidence: tuple[str, ...]
    deployment: dict[str, Sourced]
    comparison: tuple[tuple[str, ...], ...] = ()
    """Rows of (quantity, predicted per audited release..., reported)."""
    comparison_header: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    ask_for: tuple[str, ...] = ()
    recommended_utilization: float | None = None
    recommended_kv_cache_memory_bytes: int | None = None
    fixed_in: str | None = None
    cause: str | None = None
    """Key of ``CAUSES`` when the allocation matches the plan."""
    version_needed: bool | None = None
    """Whether the verdict depends on which release the report runs (``None``: nothing was audited)."""
    releases: tuple[dict, ...] = ()
    """Each candidate release audited: label, strategy, ratio, verdict."""
    planned_with: str | None = None
    """The vLLM whose planner made the plans (this environment's)."""
    phase: str | None = None
    """Where the report's error happened (``kvaudit.triage.evidence.PHASES``), when the report shows it."""
    audits: tuple[Any, ...] = field(default=(), repr=False)
    not_audited: str | None = None
    """Why the audit step did not run here (vLLM is not installed), when it did not."""
    not_parsed: tuple[str, ...] = ()
    """Launch lines read by kvaudit's own flag reader because vLLM's parser is not installed here: aliases, JSON flags
    and flags kvaudit does not know may be missed in them."""
    ledger: Any = None
    """The memory ledger (``kvaudit.triage.ledger.Ledger``): each term reported beside predicted."""
    inequality: str | None = None
    """The inequality of vLLM's budget the figures break (``kvaudit.triage.ledger.Breach``), where one does."""
    deciding: tuple[str, ...] = ()
    """The ledger terms (``kvaudit.triage.ledger.TERMS``) the answer rests on and the report lacks: what
    ``ask_for`` asks first, where no figure decides."""

    def to_dict(self) -> dict:
        """The JSON contract (``schema_version`` 1)."""
        return {
            "schema_version": SCHEMA_VERSION, "verdict": self.verdict, "factor": self.factor,
            "headline": self.headline, "evidence": list(self.evidence),
            "deployment": {k: v.to_dict() for k, v in self.deployment.items()},
            "comparison": [dict(zip(self.comparison_header, row)) for row in self.comparison],
            "actions": list(self.actions), "ask_for": list(self.ask_for),
            "recommended_utilization": self.recommended_utilization,
            "recommended_kv_cache_memory_bytes": self.recommended_kv_cache_memory_bytes,
            "fixed_in": self.fixed_in, "cause": self.cause, "version_needed": self.version_needed,
            "releases": list(self.releases), "planned_with_vllm": self.planned_with, "phase": self.phase,
            "not_audited": self.not_audited, "not_parsed": list(self.not_parsed),
            "ledger": self.ledger.to_dict() if self.ledger is not None else [], "inequality": self.inequality,
            "deciding": list(self.deciding),
        }

    def to_json(self) -> str:
        """The JSON contract as text."""
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        """A report ready to paste into an issue."""
        out = [f"### kvaudit triage: {self.verdict}" + (f" ({self.factor:.2f}×)" if self.factor else ""), "",
               md(self.headline), ""]
        if self.not_audited:
            out += [f"> kvaudit did not audit the allocator: {md(self.not_audited)}", ""]
        if self.not_parsed:
            out += ["> vLLM's argument parser is not installed here, so kvaudit's own flag reader read these launches "
                    "(aliases, JSON flags and other flags may be missed): " + "; ".join(md(x) for x in self.not_parsed),
                    ""]
        if self.evidence:
            out += ["**Evidence**", ""] + [f"- {md(e)}" for e in self.evidence] + [""]
        if self.deployment:
            out += ["**Deployment, as reconstructed**", "", "| | value | source |", "|---|---|---|"]
            for k, v in self.deployment.items():
                out.append(f"| {md(k, cell=True)} | {md(_show(k, v.value), cell=True)} | "
                           f"{md(_short(v.source), cell=True)} |")
            out.append("")
        rows = self.ledger.to_dict() if self.ledger is not None else []
        if rows:
            out += ["**Memory ledger** (one rank)", "", "| term | reported | predicted | difference |",
                    "|---|---|---|---|"]
            for r in rows:
                rep = (f"{fmt_bytes(r['reported'])} ({r['reported_at'].split(':', 1)[0]})"
                       if r["reported"] is not None else "—")
                pred = (f"{fmt_bytes(r['predicted'])} ({_short(r['predicted_by'], 70)})"
                        if r["predicted"] is not None else "—")
                diff = fmt_bytes(r["difference"], signed=True) if r["difference"] is not None else "—"
                out.append(f"| {md(r['term'], cell=True)} | {md(rep, cell=True)} | {md(pred, cell=True)} | "
                           f"{md(diff, cell=True)} |")
            out.append("")
        if self.inequality:
            out += [f"**What breaks**: {md(self.inequality)}", ""]
        if self.deciding:
            out += [f"**What decides, and the report lacks**: {md(', '.join(self.deciding))} (asked for below)", ""]
        if self.comparison:
            out += ["**Prediction vs report**", "", "| " + " | ".join(md(h, cell=True) for h in self.comparison_header)
                    + " |", "|" + "---|" * len(self.comparison_header)]
            out += ["| " + " | ".join(md(c, cell=True) for c in row) + " |" for row in self.comparison] + [""]
        if self.actions:
            out += ["**What to do**", ""] + [f"- {md(a)}" for a in self.actions] + [""]
        if self.ask_for:
            out += ["**Please add to the issue**", ""] + [f"- {md(a)}" for a in self.ask_for] + [""]
        reported = self.deployment.get("vLLM")
        planner = (f"planned by vLLM {self.planned_with}'s own planner"
                   + (f" (the report's vLLM: {reported.value})" if reported else "") if self.planned_with
                   else "nothing planned")
        out.append(f"<sub>{md(f'kvaudit triage: {planner}; allocation strategies run on the meta meter (accounting, not a device measurement).')}</sub>")
        return "\n".join(out) + "\n"


def _short(text: str, limit: int = 150) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show(key: str, value: Any) -> str:
    if isinstance(value, int) and ("bytes" in key or key in ("device memory", "weights", "KV budget", "other non-KV")):
        return f"{fmt_bytes(value)} ({value:,} B)"
    return str(value)


# --- reconstruction ---------------------------------------------------------------------------------


def _platform(ev: Evidence) -> str | None:
    kinds = {f.value for f in ev.all("platform")} | {
        {"npu": "ascend", "cuda": "cuda"}.get(f.value, "") for f in ev.all("device_type")}
    if "ascend" in kinds:
        return "ascend"
    if "cuda" in kinds:
        return "cuda"
    prose = {f.value for f in ev.all("platform_prose")}  # "NPU", "910B4", "nvidia-smi", "A100" in the text
    return "ascend" if "ascend" in prose else "cuda" if "cuda" in prose else None


def _platform_source(ev: Evidence, platform: str | None) -> str:
    for f in ev.all("platform") + ev.all("device_type") + ev.all("platform_prose"):
        if f.value in (platform, {"ascend": "npu"}.get(platform or "")):
            return f.source
    return "assumed"


def _device_memory(ev: Evidence, platform: str | None) -> Sourced | None:
    found = ev.all("device_memory")
    exact = [f for f in found if isinstance(f.value, int) and "total memory:" in f.text]
    f = exact[0] if exact else (found[0] if found else None)
    if f is not None and not exact:  # "60.96 GiB total capacity": rounded; a known device's exact figure
        for dev in DEVICES.values():
            if abs(dev.memory_bytes - f.value) < 0.0005 * dev.memory_bytes:
                return Sourced(dev.memory_bytes, f"{f.source} → {dev.name} ({dev.source})")
    if f is not None:
        return _from(f)
    total = ev.first("hbm_total_mb")
    if total is not None and platform == "ascend":
        for dev in DEVICES.values():
            if abs(dev.memory_bytes / (1 << 20) - total.value) < 0.1 * total.value:
                return Sourced(dev.memory_bytes, f"{total.source} → {dev.name}: {dev.source}")
    if total is not None:
        return Sourced(total.value << 20, f"{total.source} (MiB; torch reports slightly less)")
    named = ev.first("device_named")
    if named is not None:
        dev = DEVICES[named.value]
        return Sourced(dev.memory_bytes, f"{named.source} → {dev.name} ({dev.source})")
    nominal = ev.first("device_nominal_gb")
    if nominal is not None:  # the size the report states, never an assumed one: an Ascend card of it, or the size
        for dev in DEVICES.values():
            if platform == "ascend" == dev.platform and 0.9 * (nominal.value << 30) < dev.memory_bytes <= (
                    nominal.value << 30):
                return Sourced(dev.memory_bytes, f"{nominal.source} → {dev.name} ({dev.source})")
        return _from(nominal, nominal.value << 30, f" ({nominal.value} GB as sold; torch reports slightly less)")
    if platform == "ascend":
        d = DEVICES["atlas-a2-64g"]
        return _assumed(d.memory_bytes, f"a 64 GB Atlas A2 card ({d.source})")
    return None


@dataclass(frozen=True)
class _Inputs:
    """What the audit needs besides the deployment values."""

    spec: ModelSpec | None
    platform: str | None
    release: str | None
    """The release the report runs: vllm-ascend's on Ascend, vLLM's on CUDA."""
    family_of: str | None
    """The preset whose layer kinds stand in for a model kvaudit does not ship (its bytes are not the model's)."""
    ran: Fact | None
    """A line showing the deployment got past vLLM's checks (it planned, captured graphs or served)."""


def _model(ev: Evidence) -> tuple[Fact | None, tuple[str, bool] | None]:
    """The model fact and the preset it names; a title or prose naming a known model counts too."""
    for f in ev.all("model") + ev.all("model_prose"):
        match = preset_for_model(f.value)
        if match is not None:
            return f, match
    named = ev.first("model", "model_prose")
    if named is not None:
        return named, None
    titled = {f.line for f in ev.all("title")}
    mentions = sorted(ev.all("model_mention"), key=lambda f: (f.line not in titled, f.line))
    url = ev.first("model_url")  # a model's Hub page: the title's "Llama 3", with no size, is the page's ...-8b-instruct
    if (url is not None and mentions and mentions[0].line in titled and not _SIZED.search(mentions[0].value)
            and _letters(mentions[0].value) in _letters(url.value)):
        return url, preset_for_model(url.value)
    if mentions and mentions[0].line in titled and preset_for_model(mentions[0].value) is None:
        return Fact("model", mentions[0].value.strip(), mentions[0].line, mentions[0].text), None  # the title's model
    if url is not None and not (mentions and mentions[0].line in titled):  # where no launch, log or title names one
        return url, preset_for_model(url.value)
    for f in mentions:  # "Running Llama 3 70B on A100": the name with its size
        match = preset_for_model(f.value)
        if match is not None:
            return Fact("model", f.value.strip(), f.line, f.text), match
    if mentions:  # a model kvaudit ships no config of: named, and its config asked for
        return Fact("model", mentions[0].value.strip(), mentions[0].line, mentions[0].text), None
    return None, None


_SIZED = re.compile(r"\d(?:\.\d+)?\s*[BbMm](?![A-Za-z])")
"""A parameter count in a model's name ("70B", "0.6B")."""


def _letters(name: str) -> str:
    """A model's name without case, blanks or punctuation ("Llama 3" → "llama3")."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _release(ev: Evidence, platform: str | None, values: dict[str, Sourced]) -> str | None:
    vllm = ev.first("vllm_version", "vllm_image")
    ascend = ev.first("vllm_ascend_version", "vllm_ascend_image")
    fails = ev.first("release_fails")  # "OOM in 0.8.3 (ok in 0.7.2)": the release that fails is the one to triage
    if platform == "ascend":
        ascend = ascend or fails or ev.first("vllm_ascend_prose")
        vllm = vllm or ev.first("vllm_prose")
    else:
        vllm = vllm or fails or ev.first("vllm_prose")
    title = ev.first("title_version")
    if platform == "ascend" and ascend is None and title is not None:
        ascend = title  # "[Bug]: 0.13.0 qwen3-next-80b oom" in the vllm-ascend tracker
    elif platform != "ascend" and vllm is None and title is not None:
        vllm = title
    if vllm:
        values["vLLM"] = _from(vllm)
    if platform == "ascend":
        if ascend:
            values["vllm-ascend"] = _from(ascend)
            return ascend.value
        if vllm:
            values["vllm-ascend"] = Sourced(vllm.value, f"assumed: vllm-ascend releases pair with the vLLM of the "
                                                        f"same version ({vllm.source})")
            return vllm.value
        return None
    return vllm.value if vllm else None


def _tp(ev: Evidence, preset: str | None) -> Sourced:
    tp = ev.first("tp", "tp_prose")
    if tp:
        return _from(tp)
    count = ev.first("device_count")
    if count is not None and count.value & (count.value - 1):
        count = None  # TP sizes are powers of two: "6 cards" says nothing about TP
    for key, what, whats in (("worker_tp_rank", "TP rank", "TP ranks"),
                             ("rank", "rank (no PP or DP given)", "ranks (no PP or DP given)")):
        ranks = ev.all(key)
        if key == "rank" and ev.first("pp", "dp"):
            break
        if ranks and max(f.value for f in ranks) > 0:  # a paste often shows rank 0 alone: no inference then
            top = max(ranks, key=lambda f: f.value)
            if count is not None and count.value > top.value:
                return _from(count, note=f" (one rank per device the report names; {whats} up to {top.value} seen, "
                                         f"{_where(top, 60)})")
            tp = 1 << top.value.bit_length()  # TP sizes are powers of two: ranks 0..4 seen means TP 8
            return _from(top, tp, f" (at least {top.value + 1}: the highest {what} in the report + 1; TP sizes are "
                                  f"powers of two, so {tp})")
    fails = ev.first("tp_fails")
    if fails:
        return _from(fails, note=" (the TP the report says fails)")
    if count is not None:
        return _from(count, note=" (assumed: one rank per device the report names)")
    if preset:
        return _assumed(PRESETS[preset].tp, f"the {preset} preset's (as its tutorial deploys it)")
    return _assumed(1, "no TP in the report")


def reconstruct(ev: Evidence, config: str | None = None) -> tuple[dict[str, Sourced], list[str], _Inputs]:
    """Deployment values with their sources, the questions the report leaves open, and the audit's inputs."""
    values: dict[str, Sourced] = {}
    missing: list[str] = []
    platform = _platform(ev)
    values["platform"] = (Sourced(platform, _platform_source(ev, platform)) if platform
                          else _assumed(None, "no Ascend or CUDA marker found: every platform is audited"))
    release = _release(ev, platform, values)
    model, match = _model(ev)
    spec: ModelSpec | None = None
    family_of = None
    preset = match[0] if match else None
    hub_note = None
    if config is None and model is not None and not (match and match[1]) and names_hub_model(str(model.value)):
        try:  # the model the report names, from the Hugging Face cache (or the Hub, where it can be reached)
            spec = load_model(None, str(model.value))[0]
        except (ConfigError, UsageError, MissingDependency) as e:
            hub_note = e.message
    if config:
        spec = load_model(None, config)[0]  # a Hub id, a model folder or a config.json
        values["model"] = Sourced(spec.name, f"--config {config}" + (f" (report: {model.source})" if model else ""))
    elif spec is not None:
        values["model"] = _from(model, spec.name, " → its config.json from the Hugging Face cache or the Hub")  # type: ignore[arg-type]
        preset = None  # the model's own config: no preset's sizes or deployment stand in
    elif match and match[1]:
        spec = load_preset_spec(PRESETS[preset])  # type: ignore[index]
        values["model"] = _from(model, spec.name, f" → kvaudit's {preset} preset config")  # type: ignore[arg-type]
    elif match:
        spec = load_preset_spec(PRESETS[preset])  # type: ignore[index]
        family_of = preset
        values["model"] = _from(model, model.value,  # type: ignore[union-attr, arg-type]
                                f" → same layer kinds as kvaudit's {preset} preset (its sizes are not this model's)")
        missing.append(f"the model's config.json, for figures in bytes (then: kvaudit triage REPORT --config "
                       f"config.json); the verdict needs only its layer kinds, which it shares with {preset}")
    elif model:
        values["model"] = _from(model)
        missing.append(f"the config.json of {model.value!r} (then: kvaudit triage REPORT --config config.json): "
                       + (hub_note if hub_note else "kvaudit ships no config of that family"))
    else:
        missing.append("which model: the `vllm serve` command line, or the model's name and its config.json")
    exact = None if family_of else preset
    values["tensor parallel size"] = _tp(ev, exact)
    for key, name in (("pp", "pipeline parallel size"), ("dp", "data parallel size")):
        if f := ev.first(key):
            values[name] = _from(f)
    p = PRESETS.get(exact) if exact else None
    mml = ev.first("max_model_len", "mml_prose")
    values["max model len"] = (_from(mml) if mml else _assumed(p.max_model_len, f"the {exact} preset's") if p
                               else _assumed(spec.max_position_embeddings if spec else None, "vLLM's default"))
    util = ev.first("gpu_memory_utilization", "util_fails", "util_prose")
    values["gpu_memory_utilization"] = (_assumed(0.9, "vLLM's default (not in the report)") if util is None else
                                        _from(util, note=" (the utilization the report says fails)")
                                        if util.key == "util_fails" else _from(util))
    dev = _device_memory(ev, platform)
    if dev is not None:
        values["device memory"] = dev
    for key, name in (("dtype", "dtype"), ("kv_cache_dtype", "kv-cache dtype"), ("weights", "weights"),
                      ("available_kv", "KV budget"), ("enforce_eager", "enforce eager"), ("quantization", "quantization"),
                      ("weight_bits", "weight bits")):
        if f := ev.first(key):
            values[name] = _from(f)
    conn = ev.first("kv_connector")
    pd = ev.first("disaggregated")
    values["KV transfer"] = (Sourced(True, f"{conn.source} ({conn.value})") if conn
                             else Sourced(True, f"{pd.source} (prefill/decode disaggregation)") if pd
                             else _assumed(False, "no KV connector in the report"))
    ran = ev.first("served", "captured", "kv_cache_tokens") or next(
        (f for f in ev.all("error_phase") + ev.all("oom_phase")
         if f.value in ("CUDA/ACL graph capture", "serving requests", "kv-cache allocation")), None)
    return values, missing, _Inputs(spec, platform, release, family_of, ran)


@contextlib.contextmanager
def _as_it_ran(ran: Fact | None) -> Iterator[None]:
    """A deployment that evidently ran got past vLLM's max-model-len check (RoPE scaling given on its
    command line, ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``): kvaudit must not refuse it for that."""
    if ran is None:
        yield
        return
    old = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VLLM_ALLOW_LONG_MAX_MODEL_LEN", None)
        else:
            os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = old


def _deployment_args(values: dict[str, Sourced], inputs: _Inputs) -> dict[str, Any]:
    """``make_deployment``'s arguments for the values (a family stand-in: its preset's deployment)."""
    spec = inputs.spec
    assert spec is not None
    v = {k: s.value for k, s in values.items()}
    if inputs.family_of:
        p = PRESETS[inputs.family_of]
        return dict(tp=p.tp, max_model_len=p.max_model_len, device=p.device,
                    gpu_memory_utilization=v["gpu_memory_utilization"], kv_transfer=bool(v["KV transfer"]))
    args = dict(tp=v["tensor parallel size"], max_model_len=v["max model len"] or spec.max_position_embeddings,
                gpu_memory_utilization=v["gpu_memory_utilization"], device_memory_bytes=v.get("device memory"),
                dtype=v.get("dtype") or "auto", weights_bytes=v.get("weights"), kv_transfer=bool(v.get("KV transfer")),
                kv_cache_dtype=v.get("kv-cache dtype") or "auto", pp=v.get("pipeline parallel size") or 1)
    if args["device_memory_bytes"] is None:
        args.pop("device_memory_bytes")
    args["device"] = "h100-80g" if inputs.platform == "cuda" else "atlas-a2-64g"  # (and whose worker budgets)
    return args


def _predicted(values: dict[str, Sourced], inputs: _Inputs) -> Deployment | None:
    """The deployment kvaudit predicts from the report's settings alone (its own weighing of the model, its memory
    model's terms), even where it leaves no KV budget; ``None`` where vLLM refuses the settings themselves or the
    model is a family stand-in (whose bytes are not the model's)."""
    from kvaudit.plan.planner import make_deployment

    if inputs.family_of:
        return None
    try:
        return make_deployment(inputs.spec, **{**_deployment_args(values, inputs), "weights_bytes": None},  # type: ignore[arg-type]
                               allow_no_kv_budget=True)
    except (ConfigError, UsageError):
        return None


def _deployment(values: dict[str, Sourced], inputs: _Inputs) -> Deployment:
    """The deployment the values describe. A reported KV budget fixes the other non-KV memory:
    vLLM's budget is device memory × utilization − weights − the rest. A family stand-in is planned as
    its preset deploys it: only its layer kinds, hence its allocation ratio, carry over."""
    from kvaudit.plan.planner import make_deployment

    spec = inputs.spec
    assert spec is not None
    args = _deployment_args(values, inputs)
    d = make_deployment(spec, **args)
    budget = values["KV budget"].value if "KV budget" in values else None
    if inputs.family_of or budget is None or budget <= 0:
        return d
    overhead = max(0, int(d.device_memory_bytes * d.gpu_memory_utilization) - budget - d.weights_bytes)
    return make_deployment(spec, **args, overhead_bytes=overhead, kv_cache_memory_bytes=budget)


# --- the audit, the comparison, the conclusion ------------------------------------------------------


def triage(text: str, config: str | None = None, title: str | None = None,
           tolerance: float | None = None) -> Triage:
    """Read a report, reconstruct its deployment, audit, compare, conclude. Text that is not a report at
    all (no out-of-memory error, vLLM, NPU/GPU or traceback in it) is a usage error."""
    ev = extract(clean_lines(text), title)
    t = _triage(ev, text, config, title, tolerance)
    own = tuple(dict.fromkeys(_where(f, 120) for f in ev.all("launch_parser") if f.value == OWN_READER))
    return dataclasses.replace(t, not_parsed=own) if own else t


def _triage(ev: Evidence, text: str, config: str | None, title: str | None, tolerance: float | None) -> Triage:
    if not looks_like_report(text + (title or "")):
        raise UsageError("nothing in the text mentions an out-of-memory error, vLLM, an NPU or GPU, or a traceback: "
                         "give the issue's text, startup log or traceback")
    values, missing, inputs = reconstruct(ev, config)
    evidence = _evidence_lines(ev)
    own = _ledger(ev, values, inputs, None)  # the report's own figures: every answer shows them
    breach = own.breach(phase_of(ev))
    stated = dict(ledger=own, inequality=breach.inequality if breach is not None else None)
    outside = _outside(ev, values, evidence)
    if outside is not None:
        return dataclasses.replace(outside, **stated)
    if inputs.spec is None:
        return dataclasses.replace(_without_plan(ev, values, inputs, evidence, missing), **stated)
    from kvaudit.plan.planner import vllm_version

    if vllm_version() is None:  # the reading stands; only what needs vLLM's planner is left out
        why = "vLLM is not installed where kvaudit ran (pip install vllm, or run kvaudit in the serving environment)"
        t = _without_plan(ev, values, inputs, evidence, missing, f"The report was read; {why}, so the deployment "
                          "was not planned and its allocator not audited.", planner_missing=True)
        return dataclasses.replace(t, not_audited=why, **stated)
    with _as_it_ran(inputs.ran):
        predicted = _predicted(values, inputs)
        led = _ledger(ev, values, inputs, predicted)
        breach = led.breach(phase_of(ev))
        found = dict(ledger=led, inequality=breach.inequality if breach is not None else None)
        if breach is not None and breach.cause in START_REFUSALS and (_reported(led, breach) or _agrees(ev, breach)):
            return _refused_start(ev, values, inputs, evidence, missing, predicted, led, breach)
        try:
            d = _deployment(values, inputs)
        except (ConfigError, UsageError) as e:  # kvaudit's reconstruction, not the user's deployment, is at fault
            return dataclasses.replace(_without_plan(ev, values, inputs, evidence, missing + [
                "the full startup log, from `vllm serve` to the error"],
                f"The deployment as reconstructed cannot be planned ({e.message})."), **found)
        if not inputs.family_of:
            _derived_memory(values, d, ev)
        t = _conclude(ev, d, values, inputs, evidence, missing, tolerance)
        chosen = [r for r in t.audits if t.factor is not None and round(r.ratio, 4) == t.factor]
        if chosen and not inputs.family_of:  # (a stand-in's bytes are not the model's)
            r = chosen[0]
            found["ledger"] = led.with_allocation(r.allocated_bytes, r.expected_bytes,
                                                  f"{r.strategy}'s allocator on the meta meter",
                                                  r.oom.request_bytes if r.oom is not None else None)
        return dataclasses.replace(t, **found)


START_REFUSALS = ("weights", "no-room-for-kv-cache", "budget-too-small-for-max-model-len")
"""The breaches vLLM refuses to start on (or runs out loading): no KV cache is allocated, so no allocator is
involved."""


def _ledger(ev: Evidence, values: dict[str, Sourced], inputs: _Inputs, predicted: Deployment | None) -> Any:
    """The report's ledger beside kvaudit's prediction: the deployment as the settings alone give it, and what one
    request of its max_model_len needs (vLLM's own function, on the rank's layer specs under the platform's rule,
    against the KV budget the report states, else the predicted one)."""
    from kvaudit.errors import NotAuditable
    from kvaudit.plan.planner import request_need
    from kvaudit.triage import ledger

    stated = _stated_device(values)
    u = values["gpu_memory_utilization"].value
    if predicted is None:  # no deployment of kvaudit's (or a stand-in's, whose bytes are not the model's)
        named = _weights(values) if "weights" not in values else None  # (the model's own name, not a stand-in's)
        return ledger.build(ev, stated=stated, utilization=u, weights=named)
    stated_budget = ledger.reported(ev, "KV budget")
    budget = stated_budget.value if stated_budget is not None else None
    rule = _planning_rule(inputs)
    try:
        need = request_need(predicted, rule, budget=budget)
    except (ConfigError, NotAuditable):
        need = None
    return ledger.build(ev, predicted, need, stated=stated, utilization=u)


def _planning_rule(inputs: _Inputs) -> str:
    """The block-size rule the report's first candidate release plans under (what one request needs depends on it)."""
    return _candidates(inputs.platform, inputs.release)[0].strategy.platform


def _agrees(ev: Evidence, breach: Any) -> bool:
    """Whether a breach of kvaudit's predicted figures is the failure the report shows: a start-up refusal where vLLM
    refused (its message, or a traceback in its planning), weights that do not fit where the device ran out loading
    them. A report that shows another failure (an out-of-memory error elsewhere, a server that ran) contradicts it."""
    phase = phase_of(ev)
    if breach.cause == "weights":
        return phase == "weight loading"
    return phase == "kv-cache planning"


def _ledger_breach(ev: Evidence, values: dict[str, Sourced], u: float, phase: str | None) -> Any:
    """The inequality the report's own figures break (no prediction: where kvaudit does not plan)."""
    from kvaudit.triage import ledger

    return ledger.build(ev, stated=_stated_device(values), utilization=u).breach(phase)


def _stated_device(values: dict[str, Sourced]) -> dict[str, tuple[int, str]]:
    """The device's memory where the report states it (a line, the title), as the ledger's reported figure."""
    device = values.get("device memory")
    return {"device memory": (device.value, device.source)} if device is not None and device.source.startswith(
        ("line ", "title")) else {}


def _reported(led: Any, breach: Any) -> bool:
    """Whether the report's own figures decide the breach (its deciding term is reported, not predicted)."""
    return led.row(breach.term).reported is not None


def _refused_start(ev: Evidence, values: dict[str, Sourced], inputs: _Inputs, evidence: list[str],
                   missing: list[str], d: Deployment | None, led: Any, breach: Any) -> Triage:
    """vLLM's budget breaks before any KV cache is allocated: the inequality, and fixes each planned again."""
    from kvaudit.plan.planner import vllm_version

    actions, rec_u = _fixes(inputs, d, values["gpu_memory_utilization"].value, led, breach)
    if _reported(led, breach):  # the report's own figures decide: nothing more to ask for the verdict
        missing = []
    when = ("vLLM refuses to start" if breach.cause != "weights" else "the weights do not fit")
    headline = (f"{when}: {breach.inequality}. {CAUSES[breach.cause][0].upper()}{CAUSES[breach.cause][1:]}; no KV "
                "cache was allocated, so no allocator is involved.")
    return Triage(MATCHES_PLAN, None, headline, tuple(evidence), values, actions=tuple(actions),
                  ask_for=tuple(missing), recommended_utilization=rec_u, cause=breach.cause, phase=phase_of(ev),
                  planned_with=vllm_version(), ledger=led, inequality=breach.inequality)


def _fixes(inputs: _Inputs, d: Deployment | None, u: float, led: Any,
           breach: Any) -> tuple[list[str], float | None]:
    """What fits, each fix checked by planning it again with vLLM (``request_need``, ``make_deployment``): the
    max_model_len vLLM's estimate gives for the budget, the utilization that holds one request, the TP whose weights
    fit."""
    from kvaudit.errors import NotAuditable
    from kvaudit.plan.planner import make_deployment, request_need

    rule = _planning_rule(inputs)
    T, K, R = led.value("device memory"), led.value("KV budget"), led.value("KV for one request")
    actions: list[str] = []
    rec_u = None
    if breach.cause in ("budget-too-small-for-max-model-len", "no-room-for-kv-cache") and K is not None and R:
        mml = led.fits_max_model_len
        if breach.cause == "budget-too-small-for-max-model-len" and mml and led.fits_at:
            actions.append(f"`--max-model-len {mml}`: vLLM's own estimate of what the budget holds ({_short(led.fits_at, 60)}).")
        elif breach.cause == "budget-too-small-for-max-model-len" and mml and d is not None:
            try:
                again = request_need(dataclasses.replace(d, max_model_len=mml), rule, budget=K)
            except (ConfigError, NotAuditable):
                again = None
            if again is not None and again.fits:
                actions.append(f"`--max-model-len {mml}` fits: one request of it needs {fmt_bytes(again.bytes)} of "
                               f"the {fmt_bytes(K)} KV budget (planned again with vLLM {_planner()}).")
        want = -(-(R - K) * 100 // T) / 100 if T else 1.0  # the utilization the shortfall takes, rounded up to 0.01
        if u + want <= 0.98:
            u2 = round(u + want, 2)
            grown = K + int((u2 - u) * T)
            again = None
            if d is not None:  # (without kvaudit's own deployment: the report's figures alone)
                try:
                    again = request_need(d, rule, budget=grown)
                except (ConfigError, NotAuditable):
                    pass
            if again.fits if again is not None else grown >= R:
                rec_u = u2
                length = f" of {led.max_model_len:,} tokens" if led.max_model_len else ""
                actions.append(f"`--gpu-memory-utilization {u2}` holds one request{length}: a KV budget of "
                               f"{fmt_bytes(grown)} for the {fmt_bytes(again.bytes if again else R)} it needs, if the "
                               "device has that room" + (" (planned again)." if again else " (the report's figures)."))
    if breach.cause in ("weights", "no-room-for-kv-cache") and T and d is not None:
        stated = led.row("weights").reported  # the report's weights, spread: kvaudit's weighing may differ from them
        for tp in (2 * d.tp, 4 * d.tp, 8 * d.tp):
            try:
                wider = make_deployment(d.model, tp=tp, gpu_memory_utilization=u, max_model_len=d.max_model_len,
                                        device="atlas-a2-64g" if d.platform == "ascend" else "h100-80g",
                                        device_memory_bytes=T, dtype=d.requested_dtype,
                                        kv_cache_dtype=d.kv_cache_dtype, pp=d.pp, quantization=d.quantization,
                                        weights_bytes=stated * d.tp // tp if stated else None)
                if not request_need(wider, rule).fits:
                    continue
            except (ConfigError, UsageError, NotAuditable):
                continue
            actions.append(f"`--tensor-parallel-size {tp}` fits: {fmt_bytes(wider.weights_bytes)} of weights and a "
                           f"KV budget of {fmt_bytes(wider.kv_budget_bytes)} per rank (planned again).")
            break
    if not actions:
        actions.append({"weights": "Spread the weights: a larger `--tensor-parallel-size` (or PP), or a quantized "
                                   "checkpoint.",
                        "no-room-for-kv-cache": "Give the KV cache room: a higher `--gpu-memory-utilization`, a larger "
                                                "`--tensor-parallel-size`, or a smaller or quantized model.",
                        }.get(breach.cause, "Lower `--max-model-len`, or give the KV cache more memory."))
    return actions, rec_u


def _planned_again(d: Deployment, u: float, values: dict[str, Sourced], inputs: _Inputs) -> str:
    """A lower utilization recommended, planned again with vLLM: whether its KV budget still holds one request of
    max_model_len (vLLM's start-up check), and the max_model_len it holds where it does not."""
    from kvaudit.errors import NotAuditable
    from kvaudit.plan.planner import request_need

    stated = values.get("KV budget")
    budget = (stated.value - int((d.gpu_memory_utilization - u) * d.device_memory_bytes)
              if stated is not None and isinstance(stated.value, int) and not stated.source.startswith("derived")
              else dataclasses.replace(d, gpu_memory_utilization=u).kv_budget_bytes)
    try:
        need = request_need(d, _planning_rule(inputs), budget=budget)
    except (ConfigError, NotAuditable):
        return f"At `--gpu-memory-utilization {u}` the KV budget is {fmt_bytes(budget)}; kvaudit could not plan it again."
    if need.fits:
        return (f"Planned again at `--gpu-memory-utilization {u}` (vLLM {_planner()}): a KV budget of "
                f"{fmt_bytes(budget)} still holds one request of {d.max_model_len:,} tokens ({fmt_bytes(need.bytes)}).")
    return (f"Planned again at `--gpu-memory-utilization {u}` (vLLM {_planner()}): a KV budget of {fmt_bytes(budget)} "
            f"no longer holds one request of {d.max_model_len:,} tokens ({fmt_bytes(need.bytes)}), and vLLM would "
            "refuse to start; with it, " + (f"`--max-model-len {need.fits_max_model_len}`." if need.fits_max_model_len
                                            else "no max_model_len fits: free the memory instead."))


def _device_ran_out(ev: Evidence) -> bool:
    """Whether the report shows the device's memory running out, or vLLM refusing for lack of it."""
    return (ev.first("oom", "kv_capacity_error", "memory_growth", "serving_oom", "collective_saw_oom") is not None
            or any(f.value <= 0 for f in ev.all("available_kv")))


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


def _changes(ev: Evidence) -> list[Any]:
    """The changes of memory use between the release the report says worked and the one that fails."""
    pair = release_pair(ev)
    if pair is None:
        return []
    works, fails = pair
    return between(works, fails) if works else since_before(fails)


def _outside(ev: Evidence, values: dict[str, Sourced], evidence: list[str]) -> Triage | None:
    """A failure that is not the device running out (``kvaudit.triage.failures``: the host's memory, NCCL/HCCL, the
    driver; or an error that is no memory error at all): the plan is not involved, and what is, said plainly."""
    from kvaudit.triage.failures import ACTIONS, DRIVER, HOST, WHAT_IS, blames_driver

    if _device_ran_out(ev):
        return None
    changed = bool(_changes(ev))
    found = [f for f in ev.all("outside")  # a SIGKILL where a release change explains more memory: no host finding
             if not (changed and f.value[0] == HOST and f.value[1].startswith("kernel"))]
    title = ev.first("title")
    errors = ev.all("exception")
    if found:
        f = found[0]
        kind, what = f.value
        cause_text = f"{WHAT_IS[kind]} ({what}: {_where(f, 140)})"
    elif title is not None and blames_driver(title.value) and not changed:
        kind, f = DRIVER, title
        cause_text = f"the reporter suspects the driver ({_where(title, 140)}) and no line shows the device running out"
    elif errors and ev.first("oom_mentioned") is None and not changed:
        kind, f = "not-out-of-memory", errors[-1]
        cause_text = f"the error is no memory error: {_where(f, 160)}"
    else:
        return None
    shown = {k: v for k, v in values.items() if v.value is not None}
    plain = (f"Fix the error the traceback ends in ({_where(f, 100)}); the KV cache plan and its allocation play no "
             "part.")
    action = ACTIONS.get(kind, plain) if found or kind != "not-out-of-memory" else plain  # (a device's advice only
    # where a device's failure was read)
    return Triage(PLAN_NOT_INVOLVED, None, f"Not a device out-of-memory failure, so vLLM's KV-cache plan and its "
                  f"allocator are not involved: {cause_text}.", tuple(evidence), shown, actions=(action,),
                  cause=kind, phase=phase_of(ev))


def _without_plan(ev: Evidence, values: dict[str, Sourced], inputs: _Inputs, evidence: list[str],
                  missing: list[str], unplanned: str = "Not enough information to reconstruct the deployment and "
                                                         "audit its allocator.", planner_missing: bool = False) -> Triage:
    """A report kvaudit cannot plan (no model it knows) still has a verdict when it shows the allocator
    was not involved: vLLM refused before allocating, the device ran out before the KV cache existed,
    the out-of-memory line shows the memory held outside this process, or the allocator is upstream
    vLLM's, which allocates each planned tensor once. Otherwise: the questions to ask."""
    from kvaudit.strategies.releases import FIX_PR, FIXED_IN, is_before_fix

    oom = ev.value("oom")
    phase = phase_of(ev) if ev.first("oom", "oom_mentioned") else None
    outside = oom.held_outside if oom is not None else None
    if ev.first("kv_capacity_error") is not None:
        why = "vLLM refused to start before allocating any KV cache, so no allocator was involved"
    elif phase in ("weight loading", "memory profiling", "kv-cache planning"):
        why = f"the device ran out during {phase}, before any KV cache was allocated, so no allocator was involved"
    elif outside is not None and oom is not None and outside > 0.5 * oom.total:
        why = (f"when it ran out, this process held {fmt_bytes(oom.held_here)} of the device's "
               f"{fmt_bytes(oom.total)}; {fmt_bytes(outside)} was held outside it, more than any allocator of this "
               "process could account for")
    elif inputs.platform != "ascend" and (_device_ran_out(ev) or ev.first("oom_mentioned") or _changes(ev)
                                          or ev.first("memory_question") or ev.first("not_released")):
        where = "on CUDA" if inputs.platform == "cuda" else "with no Ascend marker in the report"
        why = (f"{where} the allocator is upstream vLLM's, which allocates each tensor of the plan once, whatever the "
               "model (kvaudit measures 1.00× for every family it ships); this model's config would let kvaudit plan it")
    elif (inputs.platform == "ascend" and inputs.release and not is_before_fix(inputs.release)
          and (ev.first("oom") or ev.first("oom_mentioned"))):
        why = (f"vllm-ascend {inputs.release} is not older than v{FIXED_IN} ({FIX_PR}), whose allocator allocates each "
               "tensor of the plan once (kvaudit measures 1.00× for every family it ships and can audit); this model's "
               "config would let kvaudit plan it")
    else:
        return _insufficient(ev, values, missing, evidence, unplanned, deciding=not planner_missing)
    u = values["gpu_memory_utilization"].value
    T = values["device memory"].value if "device memory" in values else None
    cause, text, actions, rec_u, rec_kv = _cause(ev, values, T, u)
    headline = f"The allocation is not the cause: {why}; {text}"
    return Triage(MATCHES_PLAN, None, headline, tuple(evidence), values, actions=tuple(actions),
                  ask_for=tuple(dict.fromkeys(_asks(terms := _deciding(ev, values) if cause == "unknown" else [])
                                              + list(missing))),
                  recommended_utilization=rec_u, recommended_kv_cache_memory_bytes=rec_kv,
                  cause=cause, phase=phase_of(ev), deciding=tuple(terms))


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


def _derived_memory(values: dict[str, Sourced], d: Deployment, ev: Evidence) -> None:
    values["KV budget"] = values.get("KV budget") or Sourced(
        d.kv_budget_bytes, "derived: device memory × utilization − weights − other non-KV")
    if "weights" not in values:
        values["weights"] = Sourced(d.weights_bytes, f"derived: {d.weights_source}")
    values["other non-KV"] = Sourced(d.non_kv_bytes - d.weights_bytes, "derived: device memory × utilization − "
                                     "weights − KV budget" if "available_kv" in ev.facts
                                     else "derived: vLLM's profile run as kvaudit models it (peak activation, "
                                     "non-torch, CUDA graphs)")


def _insufficient(ev: Evidence, values: dict[str, Sourced], missing: list[str], evidence: list[str], headline: str,
                  ask: list[str] | None = None, deciding: bool = True, **more: Any) -> Triage:
    """The answer that cannot conclude: what decides first (the caller's question, else the ledger's missing terms,
    ``_deciding``; none where what is missing is vLLM's planner here), then what the deployment lacks."""
    terms = _deciding(ev, values) if deciding and not ask else []
    ask_for = (list(ask) if ask else _asks(terms)) + list(missing)
    if (ev.first("oom") is not None or ev.first("oom_mentioned") is not None) and ev.first("oom_phase") is None:
        ask_for.append("the whole traceback of the out-of-memory error (which function allocated)")
    if "vLLM" not in values and "vllm-ascend" not in values:
        ask_for.append("the versions: `pip list | grep -E 'vllm|torch'` or the collect_env output")
    shown = {k: v for k, v in values.items() if v.value is not None}
    return Triage(INSUFFICIENT, None, headline, tuple(evidence), shown, ask_for=tuple(dict.fromkeys(ask_for)),
                  phase=phase_of(ev), deciding=tuple(terms), **more)


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
DECIDING_BUDGET = ("the `--gpu-memory-utilization` the engine ran with (kvaudit assumed vLLM's default 0.9): it sets "
                   "vLLM's budget, and the headroom left for everything outside it")
DECIDING = {"failing allocation": DECIDING_OOM, "outside this process": DECIDING_SMI, "component": DECIDING_COMPONENT,
            "budget": DECIDING_BUDGET}
_SAID = {"failing allocation": "the failing allocation", "outside this process": "the memory held outside this process",
         "component": "the KV connector's own allocations", "budget": "the utilization the engine ran with"}
"""The ledger terms that decide a runtime out-of-memory failure where the report lacks them, and the question that
asks for each with what each answer would mean: the failing allocation with the free memory it met (torch's line),
the memory held outside the process (the smi table), and a KV connector's own allocations (its release and
settings), which vLLM's budget does not hold."""


def _deciding(ev: Evidence, values: dict[str, Sourced]) -> list[str]:
    """The ledger terms (``DECIDING``) that decide the verdict and the report lacks, first in what to ask: the failing
    allocation where no torch line shows it (whether or not the report says the device ran out), the memory outside
    this process where neither that line nor a smi table tells it, and with either, the KV connector's own
    allocations where the report runs one and the failing frames do not show them. Where the figures show what was
    held outside and nothing breaks, the utilization decides if the report does not state it."""
    if ev.first("kv_capacity_error") is not None or any(f.value <= 0 for f in ev.all("available_kv")):
        return []  # vLLM's refusal decides: nothing ran out at run time
    terms = _runtime_terms(ev)
    if terms and ev.first("kv_connector") is not None and ev.first("oom_package") is None:
        terms.append("component")  # (a connector's allocation in the failing frames already decides)
    u = values.get("gpu_memory_utilization")
    if not terms and _figures_shown(ev) and (u is None or u.source.startswith("assumed")):
        return ["budget"]  # what is held outside is known; the headroom it must fit in is the utilization's
    return terms


def _figures_shown(ev: Evidence) -> bool:
    """Whether the report shows what was held when it ran out: torch's line with the memory outside the process, or a
    smi table."""
    oom = ev.value("oom")
    return (oom is not None and oom.held_outside is not None) or ev.first("device_process_mb", "hbm_used_mb") is not None


def _runtime_terms(ev: Evidence) -> list[str]:
    oom = ev.value("oom")
    if oom is None:
        said = ev.first("oom_mentioned", "not_released", "memory_growth") is not None
        smi = ev.first("device_process_mb", "hbm_used_mb") is not None
        if not said and ev.first("exception", "outside") is not None:
            return []  # an error that is no out-of-memory error: it decides, not the ledger
        return ["failing allocation"] + ([] if smi else ["outside this process"])
    if oom.held_outside is None and not ev.first("device_process_mb", "hbm_used_mb"):
        return ["outside this process"]  # (the line alone cannot tell what is held outside this process)
    return []


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _asks(terms: list[str]) -> list[str]:
    """The question for each deciding term."""
    return [DECIDING[t] for t in terms]


def _evidence_lines(ev: Evidence) -> list[str]:
    out = []
    for key, what in (("title", "title"), ("vllm_ascend_version", "vllm-ascend"), ("vllm_ascend_image", "vllm-ascend "
                      "image"), ("vllm_ascend_prose", "vllm-ascend"), ("vllm_version", "vLLM"), ("vllm_image", "vLLM "
                      "image"), ("vllm_prose", "vLLM"), ("title_version", "release in the title"),
                      ("oom", "out of memory"), ("oom_mentioned", "out of memory"), ("oom_phase", "the traceback is in"),
                      ("error_phase", "the last traceback is in"), ("kv_cache_tokens", "KV cache tokens"),
                      ("gpu_blocks", "KV cache blocks (V0)"), ("available_kv", "KV budget"),
                      ("kv_capacity_error", "vLLM refused the budget"), ("served", "it served requests"),
                      ("captured", "it captured graphs"), ("eager_works", "works with --enforce-eager"),
                      ("observed_utilization", "observed use of the device"), ("cvd_after_import",
                      "CUDA_VISIBLE_DEVICES set after import")):
        f = ev.first(key)
        if f is not None:
            shown = (f"{f.value[1]}" + (f" at --gpu-memory-utilization {f.value[0]}" if f.value[0] else "")
                     if key == "observed_utilization" else f.value) if key not in ("oom", "available_kv", "title", "oom_mentioned", "served", "captured",
                                           "eager_works", "kv_capacity_error", "cvd_after_import") else ""
            out.append(f"{what}{': ' + str(shown) if shown != '' else ''} — {_where(f)}")
    for key, what in (("util_works", "works at gpu_memory_utilization"), ("tp_works", "works at TP"),
                      ("tp_fails", "fails at TP")):
        for f in ev.all(key):
            out.append(f"{what} {f.value} — {_where(f)}")
    for f in ev.all("working_launch"):
        out.append(f"a launch the report says works — {_where(f)}")
    parsers = {f.line: f.value for f in ev.all("launch_parser")}
    for f in ev.all("unread_flag")[:12]:  # another vLLM's flags, a frontend's, or a value the parser refused
        out.append(f"not an engine argument to {parsers.get(f.line, 'the parser')}: {f.value} — line {f.line}")
    used = ev.all("hbm_used_mb")
    if used:
        top = max(used, key=lambda f: f.value)
        out.append(f"device memory in use when the smi table was taken: up to {top.value:,} MB — {_where(top, 120)}")
    for f in ev.all("device_process_mb"):
        out.append(f"a process holds {f.value:,} MB of device memory — {_where(f, 120)}")
    for f in ev.all("other_process"):
        out.append(f"another process holds {fmt_bytes(f.value)} — {_where(f)}")
    return out


def _where(f: Fact, width: int = 160) -> str:
    return ("title" if f.line == 0 else f"line {f.line}") + f": {md_code(f.text[:width])}"


@dataclass(frozen=True)
class _Candidate:
    """A release the report may run, and the strategy that allocates as it does."""

    label: str
    strategy: Any
    era: tuple[str | None, str | None] | None = None
    """The releases it stands for, from the first to before the second, when no release was reported."""


def _candidates(platform: str | None, release: str | None) -> list[_Candidate]:
    from kvaudit.strategies.builtin import STRATEGIES
    from kvaudit.strategies.releases import builtin_strategy_for, era_range, eras, platform_for

    if platform == "ascend" and release:
        s = dataclasses.replace(STRATEGIES[builtin_strategy_for(release)], platform=platform_for(release))
        return [_Candidate(f"vllm-ascend {release}", s)]
    cuda = [_Candidate(f"vLLM {release}" if release else "vLLM (any release)", STRATEGIES["vllm"])]
    if platform == "cuda":
        return cuda
    ascend = [_Candidate(era_range(start, end), dataclasses.replace(STRATEGIES[strategy], platform=rule), (start, end))
              for start, end, rule, strategy in eras()]
    return ascend if platform == "ascend" else cuda + ascend


def _answer(r: Any) -> tuple[str, float]:
    """The audit's verdict as triage words it, and the ratio to two decimals."""
    from kvaudit.results import Verdict

    if r.verdict is Verdict.PASS:
        return MATCHES_PLAN, round(r.ratio, 2)
    return (OVER_ALLOCATION if r.over_allocated else MISMATCH), round(r.ratio, 2)


def _conclude(ev: Evidence, d: Deployment, values: dict[str, Sourced], inputs: _Inputs, evidence: list[str],
              missing: list[str], tolerance: float | None) -> Triage:
    from kvaudit.measure.audit import audit_all
    from kvaudit.measure.meters import MetaMeter
    from kvaudit.plan.planner import vllm_version
    from kvaudit.results import DEFAULT_TOLERANCE

    tol = DEFAULT_TOLERANCE if tolerance is None else tolerance
    planned_with = vllm_version()
    values["vLLM (planned with)"] = Sourced(planned_with, "derived: kvaudit plans with this environment's vLLM"
                                            + (f"; the report runs {values['vLLM'].value}" if "vLLM" in values else ""))
    cands = _candidates(inputs.platform, inputs.release)
    audited: list[tuple[_Candidate, Any]] = []
    refused: list[str] = []
    for c in cands:
        skipped: list[tuple[str, str]] = []
        try:
            got = audit_all(d, [c.strategy], MetaMeter(), tol, skipped)
        except ConfigError as e:
            refused.append(f"{c.label}: {e.message}")
            continue
        if got:
            audited.append((c, got[0]))
        else:
            refused.append(f"{c.label}: {skipped[0][1]}")
    if not audited:
        return _insufficient(ev, values, missing, evidence, "vLLM's planner refuses the reconstructed deployment: "
                             + "; ".join(refused), ask=["the startup log lines with 'Available KV cache memory' or "
                                                         "'Available memory'"], planned_with=planned_with)
    releases = tuple({"release": c.label, "strategy": c.strategy.name, "platform_rule": c.strategy.platform,
                      "ratio": round(r.ratio, 4), "verdict": _answer(r)[0]} for c, r in audited)
    answers = {_answer(r) for _, r in audited}
    version_needed = len(answers) > 1
    chosen, why = (audited[0], None) if not version_needed else _choose(ev, audited, d)
    if chosen is None:
        rows, header = _comparison(ev, d, audited, inputs)
        ask = [f"which {'vllm-ascend' if inputs.platform == 'ascend' else 'vLLM / vllm-ascend'} release runs: "
               "`pip show vllm-ascend vllm`, or the container image tag; the verdict depends on it ("
               + "; ".join(f"{c.label}: {r.ratio:.2f}×" for c, r in audited) + ")"]
        return _insufficient(ev, values, missing, evidence, "The verdict depends on the release, and the report does "
                             "not say which one runs.", ask=ask, comparison=tuple(rows), comparison_header=header,
                             version_needed=True, releases=releases, planned_with=planned_with,
                             audits=tuple(r for _, r in audited))
    cand, r = chosen
    verdict, factor = _answer(r)
    fixed = _fixed(audited, inputs, d, tol) if verdict != MATCHES_PLAN else None
    shown = [chosen] + ([fixed] if fixed is not None and fixed[1] is not r else [])
    rows, header = _comparison(ev, d, shown, inputs)
    notes = []
    if not version_needed and len(audited) > 1:
        notes.append("The release is not needed for this verdict: every release audited ("
                     + ", ".join(c.label for c, _ in audited) + f") allocates {factor:.2f}× the plan.")
    elif not version_needed and inputs.release is None and inputs.platform == "cuda":
        notes.append("The vLLM release is not needed for this verdict: upstream vLLM allocates each planned tensor "
                     "once in every release kvaudit audits.")
    if why:
        notes.append(why)
    if inputs.family_of:
        notes.append(f"The model is not one kvaudit ships; the ratio is that of kvaudit's {inputs.family_of} preset, "
                     "whose layer kinds it shares, so figures in bytes are that preset's, not the model's.")
    if refused:
        notes.append("Not audited: " + "; ".join(refused) + ".")
    if verdict == MATCHES_PLAN:
        T = (values["device memory"].value if "device memory" in values
             else None if inputs.family_of else d.device_memory_bytes)
        cause, text, actions, rec_u, rec_kv = _cause(ev, values, T, d.gpu_memory_utilization)
        if rec_u is not None and rec_u < d.gpu_memory_utilization and not inputs.family_of:
            actions.append(_planned_again(d, rec_u, values, inputs))
        headline = (f"{cand.label}'s allocator allocates exactly what vLLM planned ({factor:.2f}×); {text}")
        fixed_in = None
    else:
        cause = None
        headline, actions, rec_u, rec_kv, fixed_in = _allocator_finding(cand, r, fixed, d, inputs, verdict)
    return Triage(verdict, round(r.ratio, 4), " ".join([headline] + notes), tuple(evidence), values, tuple(rows),
                  header, tuple(actions),
                  tuple(dict.fromkeys(_asks(terms := _deciding(ev, values) if cause == "unknown" else []) + list(missing))),
                  rec_u, rec_kv, fixed_in,
                  cause, version_needed, releases, planned_with, phase_of(ev), tuple(r for _, r in audited),
                  deciding=tuple(terms))


def _choose(ev: Evidence, audited: list[tuple[_Candidate, Any]],
            d: Deployment) -> tuple[tuple[_Candidate, Any] | None, str | None]:
    """Where releases disagree and the report names none, the report's own figures may tell them apart:
    the KV-cache size it logged, or the share of the device it says was used."""
    from kvaudit.plan.capacity import capacity

    tokens = ev.first("kv_cache_tokens")
    if tokens is not None:
        hits = [(c, r) for c, r in audited if abs(capacity(r.plan).tokens - tokens.value) <= 0.005 * tokens.value]
        if hits and len({_answer(r) for _, r in hits}) == 1:
            return _merged(hits), (f"The release is inferred from the report's KV cache size ({tokens.value:,} tokens, "
                             f"line {tokens.line}): only the plan of {', '.join(c.label for c, _ in hits)} holds that.")
    seen = ev.first("observed_utilization")
    if seen is not None:
        asked, observed = seen.value
        use = {c.label: _projected_use(c.strategy, r, d, asked) for c, r in audited}
        near = [(c, r) for c, r in audited if abs(use[c.label] - observed) <= 0.03]
        if near and len({_answer(r) for _, r in near}) == 1:
            at = f" at {asked}" if asked is not None else ""
            return _merged(near), (f"The release is inferred from the use the report observed ({observed} of the device{at}, "
                             f"{_where(seen, 120)}): {', '.join(x.label for x, _ in near)} would use "
                             f"{use[near[0][0].label]:.3f}{at}; " + ", ".join(
                                 f"{x.label} {use[x.label]:.3f}" for x, _ in audited if (x, _) not in near) + ".")
    return None, None


def _merged(found: list[tuple[_Candidate, Any]]) -> tuple[_Candidate, Any]:
    """Neighbouring eras that give the same answer, as one candidate (``before 0.11.0rc2`` and
    ``0.11.0rc2 to before 0.12.0rc1`` are ``before 0.12.0rc1``)."""
    from kvaudit.strategies.releases import era_range

    first, last = found[0][0], found[-1][0]
    if len(found) == 1 or first.era is None or last.era is None:
        return found[0]
    return dataclasses.replace(first, label=era_range(first.era[0], last.era[1])), found[0][1]


def _projected_use(strategy: Any, r: Any, d: Deployment, util: float | None) -> float:
    """The share of the device a strategy's allocation of vLLM's plan takes at ``util`` (the audited one
    when ``None``): each planned by vLLM and allocated on ``meta``."""
    from kvaudit.measure.utilization import projected_bytes

    if util is None or util == d.gpu_memory_utilization:
        return r.projected_utilization
    at = dataclasses.replace(d, gpu_memory_utilization=util, kv_cache_memory_bytes=None)
    return projected_bytes(at, strategy) / at.device_memory_bytes


def _fixed(audited: list[tuple[_Candidate, Any]], inputs: _Inputs, d: Deployment,
           tol: float) -> tuple[_Candidate, Any] | None:
    """The release that fixes an allocator finding (the newest era), audited on the same deployment."""
    from kvaudit.measure.audit import audit_all
    from kvaudit.measure.meters import MetaMeter

    if inputs.platform != "ascend":
        return None
    newest = _candidates("ascend", None)[-1]
    for c, r in audited:
        if (c.strategy.name, c.strategy.platform) == (newest.strategy.name, newest.strategy.platform):
            return c, r
    got = audit_all(d, [newest.strategy], MetaMeter(), tol, [])
    return (newest, got[0]) if got else None


def _allocator_finding(cand: _Candidate, r: Any, fixed: tuple[_Candidate, Any] | None, d: Deployment,
                       inputs: _Inputs, verdict: str) -> tuple[str, list[str], float | None, int | None, str | None]:
    from kvaudit.strategies.releases import FIX_PR, FIXED_IN, is_before_fix

    T, u, non_kv = d.device_memory_bytes, d.gpu_memory_utilization, d.non_kv_bytes
    factor = r.ratio
    if verdict == OVER_ALLOCATION:
        effect = (f"it would need {r.projected_utilization:.3f} of the device, so the device runs out of memory "
                  "while allocating the KV cache" if r.oom else
                  f"the {u} asked for becomes {r.projected_utilization:.3f} of the device")
        what = (f"gives this model {factor:.2f}× the memory vLLM planned ({fmt_bytes(r.allocated_bytes)} for a plan "
                f"of {fmt_bytes(r.expected_bytes)}), the class of vllm-ascend issue #3368: {effect}.")
    else:
        what = "does not allocate what vLLM planned: " + "; ".join(r.reasons) + "."
    headline = f"{cand.label}'s KV-cache allocator {what}"
    before_fix = inputs.platform == "ascend" and fixed is not None and fixed[1].verdict.value == "PASS" and (
        is_before_fix(inputs.release) if inputs.release else cand.strategy.name != fixed[0].strategy.name)
    fixed_in = f"vllm-ascend v{FIXED_IN} ({FIX_PR})" if before_fix else None
    actions: list[str] = []
    rec_u = rec_kv = None
    if fixed_in:
        actions.append(f"Upgrade to {fixed_in}; it allocates exactly the plan ({fixed[1].ratio:.2f}×).")  # type: ignore[index]
        if cand.strategy.name == "ascend-0.11":
            actions.append("vllm-ascend v0.12.0rc1 (PR #3760) already halves the waste (2×), but does not remove it.")
    else:
        actions.append("The release the report runs is not older than kvaudit's known fix; report the audit "
                       "(`kvaudit audit` with this deployment) to the allocator's maintainers.")
    if verdict == OVER_ALLOCATION and not inputs.family_of:
        rec_kv = int((u * T - non_kv) / factor)
        if rec_kv > 0:
            rec_u = round((non_kv + rec_kv) / T - 0.0005, 3)
            actions.append(f"With the installed release, keep the real use at the {u} asked for: "
                           f"`--gpu-memory-utilization {rec_u}`, or `--kv-cache-memory={rec_kv}` "
                           f"({fmt_bytes(rec_kv)}) where the release supports that flag; the KV cache then holds "
                           f"{1 / factor:.0%} of the blocks it would with the fix.")
        else:
            rec_kv = None
            actions.append(f"With the installed release no utilization keeps the real use at {u} (the weights and "
                           f"other non-KV memory alone take {fmt_bytes(non_kv)}).")
    return headline, actions, rec_u, rec_kv, fixed_in


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
                or self.capacity is not None and "No available memory" in self.capacity.text)

    @property
    def stated_u(self) -> bool:
        return not self.values["gpu_memory_utilization"].source.startswith("assumed")


@dataclass
class _Finding:
    """A cause (a key of ``CAUSES``), the sentence that says why, what to do, and a utilization that fixes it."""

    cause: str
    text: str
    actions: list[str] = field(default_factory=list)
    rec_u: float | None = None


def _mamba_states(c: _Case) -> _Finding | None:
    if c.capacity is None or "Mamba cache blocks" not in c.capacity.text:
        return None
    cause = "budget-too-small-for-max-num-seqs"
    return _Finding(cause, f"vLLM refused to start because {CAUSES[cause]} ({_where(c.capacity, 120)}).", [
        "Lower `--max-num-seqs` to the Mamba cache blocks vLLM reports, or give the KV cache more memory (a higher "
        "`--gpu-memory-utilization`, a larger TP)."])


def _no_room(c: _Case) -> _Finding | None:
    if not c.no_room or (_changes(c.ev) and release_pair(c.ev)):
        return None
    cause, T, u, A, weights = "no-room-for-kv-cache", c.T, c.u, c.A, c.weights
    share = f"{u} of {fmt_bytes(T)} is {fmt_bytes(int(u * T))}" if T else f"the utilization {u}"
    text = ((f"vLLM refused to start because {CAUSES[cause]}" if c.capacity is not None else
             f"the KV budget vLLM logged is not positive: {CAUSES[cause]}") + f" ({share}"
            + (f"; the weights alone take {fmt_bytes(weights[0])} per rank ({weights[1]})" if weights else "")
            + (f"; the KV budget logged is {fmt_bytes(A)}" if A is not None and A <= 0 else "") + ").")
    found = _Finding(cause, text, [
        "Give the KV cache room: a higher `--gpu-memory-utilization` (the default is 0.9), a larger "
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
    if c.capacity is None or c.no_room:
        return None
    ev, cause = c.ev, "budget-too-small-for-max-model-len"
    est = ev.first("estimated_max_model_len")
    need, have = ev.value("kv_needed"), ev.value("available_kv")
    mml = c.values["max model len"].value or ev.value("max_model_len")
    found = _Finding(cause, f"vLLM refused to start because {CAUSES[cause]} ("
                     + (f"{mml:,} tokens" if isinstance(mml, int) else "the report gives no max model length")
                     + (f": {fmt_bytes(need)} needed, {fmt_bytes(have)} available" if need and have else "") + ").")
    if est is not None:
        found.actions.append(f"`--max-model-len {est.value}` (vLLM's own estimate, {_where(est, 80)}), or more memory "
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
    changes, pair = _changes(c.ev), release_pair(c.ev)
    if not changes or pair is None:
        return None
    last = changes[-1]
    return _Finding(last.cause, f"the launch worked on {pair[0] or 'earlier releases'} and fails on {pair[1]} "
                    f"({_where(c.ev.first('release_fails'), 100)}): from {last.release} on, {last.what} "  # type: ignore[arg-type]
                    f"({last.source})." + ("" if len(changes) == 1 else " Also between them: " + "; ".join(
                        f"{x.release}: {x.what}" for x in changes[:-1]) + "."),
                    [last.fix[0].upper() + last.fix[1:] + "."])


def _named_change(c: _Case) -> _Finding | None:
    named = [(x, f) for f in c.ev.all("change_named") for x in CHANGES if x.release == f.value and x.named_by]
    if not named:
        return None
    x, f = named[-1]
    return _Finding(x.cause, f"the report names {_where(f, 100)}: from {x.release} on, {x.what} ({x.source}).",
                    [x.fix[0].upper() + x.fix[1:] + "."])


def _device_selection(c: _Case) -> _Finding | None:
    f = c.ev.first("cvd_after_import")
    if f is None:
        return None
    cause = "device-selection"
    return _Finding(cause, f"the device ran out because {CAUSES[cause]} ({_where(f, 80)}): the engine used the first "
                    "visible device, which other work may hold.",
                    ["Set CUDA_VISIBLE_DEVICES in the shell, or before the first `import torch` / `import vllm`."])


def _second_engine(c: _Case) -> _Finding | None:
    second = c.ev.first("second_engine")
    if second is None:
        return None
    return _Finding("another-process", f"the paste starts a second engine in the same process ({_where(second, 100)}): "
                    "the first engine's weights and KV cache are still held (a new `LLM` does not free the old one), "
                    "outside the new engine's profile.", [
                        "Free the first engine before the second (`del llm`, `gc.collect()`, `torch.cuda.empty_cache()`, "
                        "and vLLM's distributed cleanup), or run each model in its own process."])


def _not_released(c: _Case) -> _Finding | None:
    kept = c.ev.first("not_released")
    if kept is None:
        return None
    return _Finding("another-process", f"the device ran out because memory was not released ({_where(kept, 120)}): "
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
    rec_u = min(0.9, round((w / c.T) + 0.1, 2))
    return _Finding(cause, f"{CAUSES[cause]}: at `--gpu-memory-utilization {c.u}` vLLM may use "
                    f"{fmt_bytes(int(c.u * c.T))} of the {fmt_bytes(c.T)} device, and the weights alone take "
                    f"{fmt_bytes(w)} per rank ({how}).", [
                        f"Raise `--gpu-memory-utilization` (vLLM's default is 0.9; {rec_u} leaves the weights room "
                        "and some for the KV cache), or spread the weights with a larger TP."], rec_u)


def _host_program(c: _Case) -> _Finding | None:
    host = c.ev.first("host_package")
    if host is None or c.phase not in (None, "kv-cache allocation"):
        return None
    cause, name, u, T = "outside-budget", host.value, c.u, c.T
    left = f" ({fmt_bytes(int((1 - u) * T))} of {fmt_bytes(T)})" if T else ""
    return _Finding(cause, f"vLLM runs inside {name} ({_where(host, 100)}), and the device ran out as vLLM allocated "
                    f"what its plan holds within {u} of the device: {name}'s own tensors on this device (a trainer's "
                    f"weights, gradients, optimizer state) are outside vLLM's budget, which leaves them only 1 − "
                    f"{u}{left}. {CAUSES[cause][0].upper()}{CAUSES[cause][1:]}.", [
                        f"Give {name} its share of the device: a lower vLLM `gpu_memory_utilization` in {name}'s "
                        f"settings, so that it plus what {name} holds stays under the device; or free or offload "
                        f"{name}'s tensors before vLLM allocates (its offload options, vLLM's sleep mode)."])


def _another_process(c: _Case) -> _Finding | None:
    ev = c.ev
    others = [f for f in ev.all("device_process_mb") if "vllm" not in f.text.lower()]
    other, startup = ev.first("other_process"), ev.first("startup_free")
    over = c.breach is not None and c.breach.cause == "another-process"
    if others:
        held = f"{max(o.value for o in others):,} MB ({_where(others[0], 100)})"
    elif other:
        held = f"{fmt_bytes(other.value)} ({_where(other, 100)})"
    elif over:
        held = f"more than the utilization leaves it ({c.breach.inequality})"
    elif startup is not None and c.T and startup.value < c.u * c.T:
        held = f"all but {fmt_bytes(startup.value)} free at start-up ({_where(startup, 100)})"
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
    return _Finding(cause, f"{CAUSES[cause]} ({_where(grows, 120)}): the KV cache is allocated once at start-up, so "
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
                        "Lower `--gpu-memory-utilization` (vLLM's default is 0.9) to leave the graphs room, or "
                        "`--enforce-eager` at some decode speed."])


def _graphs(c: _Case) -> _Finding | None:
    eager = c.ev.first("eager_works")
    if c.phase != "CUDA/ACL graph capture" and eager is None:
        return None
    cause = "graph-capture"
    return _Finding(cause, f"the device ran out during {CAUSES[cause]}" + (
        f" (the report says it works with --enforce-eager: {_where(eager, 80)})" if eager else "") + ".", [
        "Leave graph memory room: a lower `--gpu-memory-utilization`, a smaller `--max-num-seqs` (fewer capture "
        "sizes), or `--enforce-eager` at some decode speed."])


def _serving(c: _Case) -> _Finding | None:
    if c.phase != "serving requests" and not (c.phase is None and c.ev.first("serving_oom") is not None):
        return None
    cause = "activations-while-serving"
    return _Finding(cause, f"the device ran out during {CAUSES[cause]}.", [
        "Leave activations room: a lower `--gpu-memory-utilization`, or smaller `--max-num-batched-tokens` / "
        "`--max-num-seqs`; very long prompts need chunked prefill."])


def _profiling(c: _Case) -> _Finding | None:
    if c.phase != "memory profiling":
        return None
    cause = "memory-profiling"
    return _Finding(cause, f"the device ran out during {CAUSES[cause]}.", [
        "Lower `--max-num-batched-tokens` or `--max-num-seqs` (the profile run's batch), or free the device of other "
        "memory."])


def _loading(c: _Case) -> _Finding | None:
    if c.phase != "weight loading" and not (c.weights is not None and c.T and c.weights[0] > c.T):
        return None
    cause = "weights"
    size = f" ({c.weights[1]})" if c.weights is not None else ""
    return _Finding(cause, f"the device ran out during weight loading: {CAUSES[cause]} at this TP{size}.",
                    ["Spread the weights: a larger `--tensor-parallel-size` (or PP), or a quantized checkpoint."])


def _kv_allocation(c: _Case) -> _Finding | None:
    if c.phase != "kv-cache allocation":
        return None
    cause = "budget-did-not-fit"
    return _Finding(cause, f"the device ran out in the KV-cache allocation: {CAUSES[cause]}; memory outside vLLM's "
                    "profile (non-torch allocations, another process) or a utilization too close to 1.")


def _small_utilization(c: _Case) -> _Finding | None:
    if c.u > 0.5 or not c.stated_u or (c.oom is None and c.ev.first("oom_mentioned") is None):
        return None
    source = c.values["gpu_memory_utilization"].source
    return _Finding("no-room-for-kv-cache", f"the report sets `--gpu-memory-utilization {c.u}` ({_short(source, 90)}): "
                    "vLLM keeps weights, activations and the KV cache within that share of the device, and a share "
                    "this small leaves it no room.", [
                        "Raise `--gpu-memory-utilization` toward vLLM's default 0.9 (what the device has free); to "
                        "share a device, give each engine its share and keep their sum under 1."])


def _high_utilization(c: _Case) -> _Finding | None:
    works = [f for f in c.ev.all("util_works") if f.value < c.u]
    if c.u < 0.95 and not works:
        return None
    cause = "utilization-too-high"
    return _Finding(cause, f"the device ran out at `--gpu-memory-utilization {c.u}`: {CAUSES[cause]} (non-torch "
                    "allocations, communication buffers, fragmentation)" + (
                        f"; the report says {max(w.value for w in works)} works ({_where(works[0], 80)})"
                        if works else "") + ".", [
                        "Keep `--gpu-memory-utilization` at 0.9-0.95 (vLLM's default is 0.9), or lower it until the "
                        "device keeps a few GiB free."])


FINDINGS = (_mamba_states, _no_room, _short_of_one_request, _component, _release_change, _named_change,
            _device_selection, _second_engine, _not_released, _weights_over_device, _weights_over_budget,
            _host_program, _another_process, _device_growth, _graphs_at_a_high_utilization, _graphs, _serving,
            _profiling, _loading, _kv_allocation, _small_utilization, _high_utilization)
"""The causes of an allocation that matches the plan, in the order they are tried: vLLM's own refusals and the
inequality the report's figures break first, then what the report says changed or what else holds the device, then
the term the phase allocates, then what the utilization alone suggests. The first that holds is the answer; where none
does, the cause is undecided and the deciding terms are named (``_deciding``)."""


def _cause(ev: Evidence, values: dict[str, Sourced], T: int | None,
           u: float) -> tuple[str, str, list[str], float | None, int | None]:
    """What the numbers point to when the allocator is not the cause (device memory ``T``, utilization
    ``u``), and what to do about it: the first of ``FINDINGS`` that holds, with the utilization that frees what the
    failing allocation lacked."""
    oom = ev.value("oom")
    phase = phase_of(ev)
    budget = values.get("KV budget")
    c = _Case(ev, values, T, u, oom, phase, _weights(values), budget.value if budget is not None else None,
              _ledger_breach(ev, values, u, phase),
              ev.first("served", "captured", "memory_growth", "serving_oom") is not None
              or phase in ("CUDA/ACL graph capture", "serving requests"))
    found = next((f for f in (find(c) for find in FINDINGS) if f is not None), None)
    if found is None:
        terms = _deciding(ev, values)
        found = _Finding("unknown", "nothing in the allocator to fix; the cause rests on ledger terms the report does "
                         "not show: " + _listed([_SAID[t] for t in terms]) + " (asked for below)." if terms
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


def _weights(values: dict[str, Sourced]) -> tuple[int, str] | None:
    """Weights per rank, with what says so: the report's or vLLM's figure where there is one, else the
    parameter count the model's name states ("Llama 3 70B": 70e9 × 2 bytes in 16 bits) over the TP;
    ``None`` when neither is known."""
    known = values.get("weights")
    if known is not None:
        return known.value, f"{fmt_bytes(known.value)} of weights per device ({_short(known.source, 80)})"
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


def _comparison(ev: Evidence, d: Deployment, audited: list[tuple[_Candidate, Any]],
                inputs: _Inputs) -> tuple[list[tuple[str, ...]], tuple[str, ...]]:
    """Rows of predicted figures per audited release beside what the report shows."""
    from kvaudit.plan.capacity import capacity

    header = ("quantity", *(f"predicted: {c.label} ({c.strategy.name})" for c, _ in audited), "reported")
    rows = [("allocated / planned", *(f"{r.ratio:.2f}×" for _, r in audited), "—")]
    if inputs.family_of:  # bytes would be the stand-in preset's, not the model's
        return rows, header
    T = d.device_memory_bytes
    oom, phase = ev.value("oom"), ev.value("oom_phase")
    rows += [("KV cache allocated", *(fmt_bytes(r.allocated_bytes) for _, r in audited), "—"),
             ("device memory in use", *(f"{fmt_bytes(r.projected_bytes)} ({r.projected_utilization:.3f})"
                                        for _, r in audited), _reported_use(ev, T)),
             ("out of memory", *(_projected_oom(r) for _, r in audited), _reported_oom(oom, phase))]
    tokens = ev.first("kv_cache_tokens")
    said = f"{tokens.value:,} (line {tokens.line})" if tokens else "—"
    rows.insert(1, (f"KV cache size (tokens): vLLM {_planner()}'s get_kv_cache_capacity",
                    *(f"{capacity(r.plan).tokens:,}" for _, r in audited), said))
    if any(len(r.plan.groups) > 1 for _, r in audited):  # hybrids: older vLLM logged another figure
        rows.insert(2, ("KV cache size (tokens): num_blocks // groups × smallest block, as vLLM logged it until "
                        "vllm#40691", *(f"{legacy_logged_tokens(r.plan):,}" for _, r in audited), said))
    return rows, header


def legacy_logged_tokens(plan: Any) -> int:
    """The "GPU KV cache size" older vLLM releases logged (0.19 among them, vllm issue #40691):
    ``num_blocks // len(groups) × smallest block size``, which is not the capacity for hybrid models."""
    return plan.num_blocks // len(plan.groups) * min(g.block_size for g in plan.groups)


def _planner() -> str:
    from kvaudit.plan.planner import vllm_version

    return vllm_version() or "?"


def _projected_oom(r: Any) -> str:
    o = r.oom
    if o is None:
        return "fits"
    return (f"at allocation {o.allocation} of {r.allocations}: {fmt_bytes(o.request_bytes)} for tensor {o.tensor} "
            f"with {fmt_bytes(o.allocated_before_bytes)} of KV cache allocated")


def _reported_oom(oom: Any, phase: str | None) -> str:
    if oom is None:
        return "none reported"
    parts = [f"tried to allocate {fmt_bytes(oom.tried)}"]
    if oom.allocated is not None:
        parts.append(f"{fmt_bytes(oom.allocated)} allocated")
    if oom.free is not None:
        parts.append(f"{fmt_bytes(oom.free)} free")
    return ", ".join(parts) + (f" (in {phase})" if phase else "")


def _reported_use(ev: Evidence, total: int) -> str:
    used = ev.all("hbm_used_mb")
    seen = ev.first("observed_utilization")
    if not used:
        if seen is None:
            return "—"
        asked, observed = seen.value
        return f"{observed}" + (f" at {asked}" if asked is not None else "") + f" ({_where(seen, 60)})"
    top = max(used, key=lambda f: f.value)
    b = top.value << 20
    return f"{fmt_bytes(b)} ({b / total:.3f}) in the smi snapshot (line {top.line})"
