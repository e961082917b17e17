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
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from kvaudit.errors import ConfigError, MissingDependency, UsageError
from kvaudit.escape import md
from kvaudit.model.deployment import DEVICES, PRESETS, Deployment, load_model, load_preset_spec, preset_for_model
from kvaudit.model.memory import default_gpu_memory_utilization
from kvaudit.model.hub import names_hub_model
from kvaudit.model.spec import ModelSpec
from kvaudit.results import OBSERVED_USE_TOLERANCE
from kvaudit.triage.commands import OWN_READER
from kvaudit.triage.causes import (CAUSES, SAID, asks, cause_of, deciding_terms, phase_of, release_changes,
                                   own_ledger, rests_on, stated_device)
from kvaudit.triage.evidence import Evidence, Fact, clean_lines, extract, looks_like_report
from kvaudit.triage.sourced import Sourced, assumed, from_fact, short, where
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
    """The terms the answer rests on and the report lacks (``kvaudit.triage.causes.DECIDING``: ledger terms, and a
    KV connector's own allocations as "component"): what ``ask_for`` asks first, where no figure decides."""

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
                           f"{md(short(v.source), cell=True)} |")
            out.append("")
        rows = self.ledger.to_dict() if self.ledger is not None else []
        if rows:
            out += ["**Memory ledger** (one rank)", "", "| term | reported | predicted | difference |",
                    "|---|---|---|---|"]
            for r in rows:
                rep = (f"{fmt_bytes(r['reported'])} ({r['reported_at'].split(':', 1)[0]})"
                       if r["reported"] is not None else "—")
                pred = (f"{fmt_bytes(r['predicted'])} ({short(r['predicted_by'], 70)})"
                        if r["predicted"] is not None else "—")
                diff = fmt_bytes(r["difference"], signed=True) if r["difference"] is not None else "—"
                out.append(f"| {md(r['term'], cell=True)} | {md(rep, cell=True)} | {md(pred, cell=True)} | "
                           f"{md(diff, cell=True)} |")
            out.append("")
        if self.inequality:
            out += [f"**What breaks**: {md(self.inequality)}", ""]
        if self.deciding:
            out += [f"**What decides, and the report lacks**: {md(', '.join(SAID.get(t, t) for t in self.deciding))} "
                    "(asked for below)", ""]
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
    if f is not None and not exact:  # "60.96 GiB total capacity": rounded; a known device's exact figure, where the
        for dev in DEVICES.values():  # report prints that device's own figure (not a neighbour's: 94.97 is not 95.01)
            if abs(dev.memory_bytes - f.value) <= (1 << 30) // 200:
                return Sourced(dev.memory_bytes, f"{f.source} → {dev.name} ({dev.source})")
    if f is not None:
        return from_fact(f)
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
        return from_fact(nominal, nominal.value << 30, f" ({nominal.value} GB as sold; torch reports slightly less)")
    if platform == "ascend":
        d = DEVICES["atlas-a2-64g"]
        return assumed(d.memory_bytes, f"a 64 GB Atlas A2 card ({d.source})")
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
        named = _fullest(mentions[0], mentions)  # the title's model, as the body names it most fully
        return Fact("model", named.value.strip(), named.line, named.text), preset_for_model(named.value)
    if url is not None and not (mentions and mentions[0].line in titled):  # where no launch, log or title names one
        return url, preset_for_model(url.value)
    for f in mentions:  # "Running Llama 3 70B on A100": the name with its size
        match = preset_for_model(f.value)
        if match is not None:
            f = _fullest(f, mentions)
            return Fact("model", f.value.strip(), f.line, f.text), preset_for_model(f.value)
    if mentions:  # a model kvaudit ships no config of: named, and its config asked for
        named = _fullest(mentions[0], mentions)
        return Fact("model", named.value.strip(), named.line, named.text), preset_for_model(named.value)
    return None, None


def _fullest(f: Fact, mentions: list[Fact]) -> Fact:
    """The mention that names ``f``'s model most fully, where the report's longer names of it agree ("Qwen3.5-35B" in
    a title, "cyankiwi/Qwen3.5-35B-A3B-AWQ-4bit" in the text: its quantization and its Hub id); ``f`` where none is
    longer, or two longer ones differ ("Qwen" beside "Qwen2-7B" and "Qwen2-72B")."""
    key = _letters(f.value)
    longer = {_letters(m.value): m for m in mentions if key in _letters(m.value) and _letters(m.value) != key}
    if not longer:
        return f
    fullest = max(longer, key=len)
    return longer[fullest] if all(k in fullest for k in longer) else f


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
        values["vLLM"] = from_fact(vllm)
    if platform == "ascend":
        if ascend:
            values["vllm-ascend"] = from_fact(ascend)
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
        return from_fact(tp)
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
                return from_fact(count, note=f" (one rank per device the report names; {whats} up to {top.value} seen, "
                                         f"{where(top, 60)})")
            tp = 1 << top.value.bit_length()  # TP sizes are powers of two: ranks 0..4 seen means TP 8
            return from_fact(top, tp, f" (at least {top.value + 1}: the highest {what} in the report + 1; TP sizes are "
                                  f"powers of two, so {tp})")
    fails = ev.first("tp_fails")
    if fails:
        return from_fact(fails, note=" (the TP the report says fails)")
    if count is not None:
        return from_fact(count, note=" (assumed: one rank per device the report names)")
    if preset:
        return assumed(PRESETS[preset].tp, f"the {preset} preset's (as its tutorial deploys it)")
    return assumed(1, "no TP in the report")


def reconstruct(ev: Evidence, config: str | None = None) -> tuple[dict[str, Sourced], list[str], _Inputs]:
    """Deployment values with their sources, the questions the report leaves open, and the audit's inputs."""
    values: dict[str, Sourced] = {}
    missing: list[str] = []
    platform = _platform(ev)
    values["platform"] = (Sourced(platform, _platform_source(ev, platform)) if platform
                          else assumed(None, "no Ascend or CUDA marker found: every platform is audited"))
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
        values["model"] = from_fact(model, spec.name, " → its config.json from the Hugging Face cache or the Hub")  # type: ignore[arg-type]
        preset = None  # the model's own config: no preset's sizes or deployment stand in
    elif match and match[1]:
        spec = load_preset_spec(PRESETS[preset])  # type: ignore[index]
        values["model"] = from_fact(model, spec.name, f" → kvaudit's {preset} preset config")  # type: ignore[arg-type]
    elif match:
        spec = load_preset_spec(PRESETS[preset])  # type: ignore[index]
        family_of = preset
        values["model"] = from_fact(model, model.value,  # type: ignore[union-attr, arg-type]
                                f" → same layer kinds as kvaudit's {preset} preset (its sizes are not this model's)")
        missing.append(f"the model's config.json, for figures in bytes (then: kvaudit triage REPORT --config "
                       f"config.json); the verdict needs only its layer kinds, which it shares with {preset}")
    elif model:
        values["model"] = from_fact(model)
        missing.append(f"the config.json of {model.value!r} (then: kvaudit triage REPORT --config config.json): "
                       + (hub_note if hub_note else "kvaudit ships no config of that family"))
    else:
        missing.append("which model: the `vllm serve` command line, or the model's name and its config.json")
    exact = None if family_of else preset
    values["tensor parallel size"] = _tp(ev, exact)
    for key, name in (("pp", "pipeline parallel size"), ("dp", "data parallel size"),
                      ("enable_expert_parallel", "expert parallel")):
        if f := ev.first(key):
            values[name] = from_fact(f)
    p = PRESETS.get(exact) if exact else None
    mml = ev.first("max_model_len", "mml_prose")
    values["max model len"] = (from_fact(mml) if mml else assumed(p.max_model_len, f"the {exact} preset's") if p
                               else assumed(spec.max_position_embeddings if spec else None, "vLLM's default"))
    util = ev.first("gpu_memory_utilization", "util_fails", "util_prose")
    said = values.get("vLLM") or values.get("vllm-ascend")  # (vllm-ascend pairs with the vLLM of its number)
    release = said.value if said is not None and len(version_key(str(said.value))) > 1 else None
    default_u = default_gpu_memory_utilization(release)
    values["gpu_memory_utilization"] = (assumed(default_u, f"vLLM {release}'s default (not in the report)" if release
                                                else "vLLM's default (not in the report)") if util is None else
                                        from_fact(util, note=" (the utilization the report says fails)")
                                        if util.key == "util_fails" else from_fact(util))
    dev = _device_memory(ev, platform)
    if dev is not None:
        values["device memory"] = dev
    for key, name in (("dtype", "dtype"), ("kv_cache_dtype", "kv-cache dtype"), ("weights", "weights"),
                      ("available_kv", "KV budget"), ("enforce_eager", "enforce eager"), ("quantization", "quantization"),
                      ("weight_bits", "weight bits")):
        if f := ev.first(key):
            values[name] = from_fact(f)
    conn = ev.first("kv_connector")
    pd = ev.first("disaggregated")
    values["KV transfer"] = (Sourced(True, f"{conn.source} ({conn.value})") if conn
                             else Sourced(True, f"{pd.source} (prefill/decode disaggregation)") if pd
                             else assumed(False, "no KV connector in the report"))
    ran = ev.first("served", "captured", "kv_cache_tokens") or next(
        (f for f in ev.all("error_phase") + ev.all("oom_phase")
         if f.value in ("CUDA/ACL graph capture", "serving requests", "kv-cache allocation", "warm-up")), None)
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
                kv_cache_dtype=v.get("kv-cache dtype") or "auto", pp=v.get("pipeline parallel size") or 1,
                dp=v.get("data parallel size") or 1,
                # (vLLM uses expert parallelism only for routed experts over more than one rank, and ignores it else)
                enable_expert_parallel=bool(v.get("expert parallel")) and (v.get("data parallel size") or 1) * (
                    v["tensor parallel size"] or 1) > 1 and spec.routed_experts > 0)
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
    own = tuple(dict.fromkeys(where(f, 120) for f in ev.all("launch_parser") if f.value == OWN_READER))
    return dataclasses.replace(t, not_parsed=own) if own else t


def check_report(text: str, title: str | None = None) -> None:
    """Refuse text that is not a report at all (no out-of-memory error, vLLM, NPU/GPU or traceback in it): a usage
    error, told before anything slow runs."""
    if not looks_like_report(text + (title or "")):
        raise UsageError("nothing in the text mentions an out-of-memory error, vLLM, an NPU or GPU, or a traceback: "
                         "give the issue's text, startup log or traceback")


def _triage(ev: Evidence, text: str, config: str | None, title: str | None, tolerance: float | None) -> Triage:
    check_report(text, title)
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

    if predicted is None:  # no deployment of kvaudit's (or a stand-in's, whose bytes are not the model's)
        return own_ledger(ev, values)
    stated_budget = ledger.reported(ev, "KV budget")
    budget = stated_budget.value if stated_budget is not None else None
    rule = _planning_rule(inputs)
    try:
        need = request_need(predicted, rule, budget=budget)
    except (ConfigError, NotAuditable):
        need = None
    return ledger.build(ev, predicted, need, stated=stated_device(values),
                        utilization=values["gpu_memory_utilization"].value)


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
    terms = rests_on(ev, values, breach.cause)
    return Triage(MATCHES_PLAN, None, headline, tuple(evidence), values, actions=tuple(actions),
                  ask_for=tuple(dict.fromkeys(asks(terms, breach.cause) + list(missing))), recommended_utilization=rec_u,
                  cause=breach.cause, phase=phase_of(ev), planned_with=vllm_version(), ledger=led,
                  inequality=breach.inequality, deciding=tuple(terms))


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
            actions.append(f"`--max-model-len {mml}`: vLLM's own estimate of what the budget holds ({short(led.fits_at, 60)}).")
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
            grown = _kv_budget_at(K, u, u2, T)
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


def _kv_budget_at(kv_budget: int, u: float, u2: float, T: int) -> int:
    """The KV budget at utilization ``u2`` of one that is ``kv_budget`` at ``u`` on a device of ``T`` bytes: vLLM's
    budget moves by (u2 − u) × T, and the weights, activations and graphs it holds stay (``Worker.determine_available_
    memory``)."""
    return kv_budget + int((u2 - u) * T)


def _planned_again(d: Deployment, u: float, values: dict[str, Sourced], inputs: _Inputs) -> str:
    """A lower utilization recommended, planned again with vLLM: whether its KV budget still holds one request of
    max_model_len (vLLM's start-up check), and the max_model_len it holds where it does not."""
    from kvaudit.errors import NotAuditable
    from kvaudit.plan.planner import request_need

    stated = values.get("KV budget")
    budget = (_kv_budget_at(stated.value, d.gpu_memory_utilization, u, d.device_memory_bytes)
              if stated is not None and isinstance(stated.value, int) and stated.reported
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
    """Whether the report shows the device's memory running out, or vLLM refusing for lack of it (memory said to grow
    on a line that names it the host's is the host's)."""
    from kvaudit.triage.failures import HOST

    hosts = {f.line for f in ev.all("outside") if f.value[0] == HOST}
    return (ev.first("oom", "kv_capacity_error", "startup_memory_error", "serving_oom", "collective_saw_oom") is not None
            or any(f.line not in hosts for f in ev.all("memory_growth"))
            or any(f.value <= 0 for f in ev.all("available_kv")))


_SPEAKS_OF_MEMORY = re.compile(r"\ballocat\w*|\bOOM\b|out of memory|\bfree memory\b|(?:not enough|insufficient|no "
                               r"available) memory|显存|内存|\bKV cache\b|\bcache blocks\b", re.IGNORECASE)
"""An error whose own message speaks of memory running short ("... therefore cannot allocate GPU memory for a new
model", "Free memory on device ... on startup"): never "no memory error", whatever else the report lacks ("an illegal
memory access" is no shortage)."""
_DEFERS = re.compile(r"See root cause above|See stack trace (?:\(above\) )?for the root cause", re.IGNORECASE)
"""vLLM's errors that only point at another ("Engine core initialization failed. See root cause above.", "EngineCore
encountered an issue. See stack trace (above) for the root cause.": vllm/v1/engine/utils.py, core_client.py): not the
error itself, which a report that cut it does not show (a worker's "failed with error X, please check the stack trace
above" carries its own)."""
_USE = re.compile(r"占用|usage|\bused\b|consum|occup|leak|泄|增长|\bgrow|allocat|exceed|分配|申请|超出|超过|开了?\s*\d",
                  re.IGNORECASE)
"""A line that says how much of a memory is used or taken, or that it grows ("宿主机RAM占用过高", "一行代码开1T cpu内存"),
not a spec sheet's size."""


def _host_only(ev: Evidence, u: float) -> Fact | None:
    """The line naming the host's memory where the report says memory ran out, grew or is used (there, or anywhere)
    and names only the host's ("CPU memory", "RAM", ps's RSS, top's RES, "内存"): no device's memory named, no torch
    out-of-memory line, no figure of the device's (its KV budget, vLLM's refusal, a smi table that shows more held
    than vLLM's budget ``u``: one at or under it is vLLM's own preallocation, as planned). ``None`` otherwise."""
    named = ev.all("host_memory_named")
    said = ev.first("oom_mentioned", "memory_growth", "memory_question", "not_released")
    host = named[0] if said is not None and named else next((f for f in named if _USE.search(f.text)), None)
    if host is None:
        return None
    device = ev.first("device_memory_named", "oom", "available_kv", "kv_capacity_error", "gpu_blocks",
                      "collective_saw_oom")
    totals = {f.line: f.value for f in ev.all("hbm_total_mb")}
    over = any(f.value > (u + 0.05) * totals.get(f.line, 0) > 0 for f in ev.all("hbm_used_mb"))
    return host if device is None and not over else None


def _connector_buffers(ev: Evidence, values: dict[str, Sourced]) -> Fact | None:
    """A KV connector's host buffers over the host's memory: LMCache's ``max_local_cpu_size`` (GB) once per vLLM
    worker (TP × PP × DP of them) against the host's memory the report states (GB), as a host-memory failure; ``None``
    where either figure is missing or the buffers fit."""
    from kvaudit.triage.failures import HOST

    size = ev.first("connector_cpu_gb")
    total = next((f for f in ev.all("host_memory") if isinstance(f.value, float)), None)
    if size is None or total is None or ev.first("kv_connector") is None:
        return None
    spread = [(label, values[key].value) for key, label in (("tensor parallel size", "TP"),
                                                            ("pipeline parallel size", "PP"), ("data parallel size", "DP"))
              if key in values and isinstance(values[key].value, int)]
    workers = math.prod(n for _, n in spread)
    if size.value * workers <= total.value:
        return None
    spread_text = " × ".join(f"{label} {n}" for label, n in spread if n > 1) or "one worker"
    what = (f"the KV connector's host buffers: max_local_cpu_size {size.value:g} GB × {workers} worker(s) ({spread_text}) = "
            f"{size.value * workers:g} GB, more than the host's {total.value:g} GB (line {total.line})")
    return Fact("outside", (HOST, what), size.line, size.text)


def _outside(ev: Evidence, values: dict[str, Sourced], evidence: list[str]) -> Triage | None:
    """A failure that is not the device running out (``kvaudit.triage.failures``: the host's memory, NCCL/HCCL, the
    driver; or an error that is no memory error at all): the plan is not involved, and what is, said plainly."""
    from kvaudit.triage.failures import ACTIONS, DRIVER, HOST, WHAT_IS, blames_driver

    host = _host_only(ev, values["gpu_memory_utilization"].value)
    if _device_ran_out(ev) and host is None:
        return None
    changed = bool(release_changes(ev))
    found = [f for f in ev.all("outside")  # a SIGKILL where a release change explains more memory: no host finding
             if not (changed and f.value[0] == HOST and f.value[1].startswith("kernel"))]
    if not found and (buffers := _connector_buffers(ev, values)) is not None:
        found = [buffers]
    if not found and host is not None:
        found = [Fact("outside", (HOST, "the host's memory named, and no device's"), host.line, host.text)]
    title = ev.first("title")
    errors = ev.all("exception")
    if found:
        f = found[0]
        kind, what = f.value
        cause_text = f"{WHAT_IS[kind]} ({what}: {where(f, 140)})"
    elif title is not None and blames_driver(title.value) and not changed:
        kind, f = DRIVER, title
        cause_text = f"the reporter suspects the driver ({where(title, 140)}) and no line shows the device running out"
    elif (errors := [e for e in errors if not _SPEAKS_OF_MEMORY.search(e.text) and not _DEFERS.search(e.text)]) \
            and ev.first("oom_mentioned") is None \
            and not changed:
        kind, f = "not-out-of-memory", errors[-1]
        cause_text = f"the error is no memory error: {where(f, 160)}"
    else:
        return None
    shown = {k: v for k, v in values.items() if v.value is not None}
    plain = (f"Fix the error the traceback ends in ({where(f, 100)}); the KV cache plan and its allocation play no "
             "part.")
    action = ACTIONS.get(kind, plain) if found or kind != "not-out-of-memory" else plain  # (a device's advice only
    # where a device's failure was read)
    terms = rests_on(ev, values, kind)
    return Triage(PLAN_NOT_INVOLVED, None, f"Not a device out-of-memory failure, so vLLM's KV-cache plan and its "
                  f"allocator are not involved: {cause_text}.", tuple(evidence), shown, actions=(action,),
                  ask_for=tuple(asks(terms, kind)), cause=kind, phase=phase_of(ev), deciding=tuple(terms))


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
    elif inputs.platform != "ascend" and (_device_ran_out(ev) or ev.first("oom_mentioned") or release_changes(ev)
                                          or ev.first("memory_question") or ev.first("not_released")
                                          or ev.first("util_works", "util_fails")  # (a failure the budget decides)
                                          or ev.first("device_memory_named")):
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
    cause, text, actions, rec_u, rec_kv = cause_of(ev, values, T, u)
    headline = f"The allocation is not the cause: {why}; {text}"
    return Triage(MATCHES_PLAN, None, headline, tuple(evidence), values, actions=tuple(actions),
                  ask_for=tuple(dict.fromkeys(asks(terms := rests_on(ev, values, cause), cause) + list(missing))),
                  recommended_utilization=rec_u, recommended_kv_cache_memory_bytes=rec_kv,
                  cause=cause, phase=phase_of(ev), deciding=tuple(terms))


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
    ``kvaudit.triage.causes.deciding_terms``; none where what is missing is vLLM's planner here), then what the
    deployment lacks."""
    terms = deciding_terms(ev, values) if deciding and not ask else []
    ask_for = (list(ask) if ask else asks(terms)) + list(missing)
    if (ev.first("oom") is not None or ev.first("oom_mentioned") is not None) and ev.first("oom_phase") is None:
        ask_for.append("the whole traceback of the out-of-memory error (which function allocated)")
    if "vLLM" not in values and "vllm-ascend" not in values:
        ask_for.append("the versions: `pip list | grep -E 'vllm|torch'` or the collect_env output")
    shown = {k: v for k, v in values.items() if v.value is not None}
    return Triage(INSUFFICIENT, None, headline, tuple(evidence), shown, ask_for=tuple(dict.fromkeys(ask_for)),
                  phase=phase_of(ev), deciding=tuple(terms), **more)


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
            out.append(f"{what}{': ' + str(shown) if shown != '' else ''} — {where(f)}")
    for key, what in (("util_works", "works at gpu_memory_utilization"), ("tp_works", "works at TP"),
                      ("tp_fails", "fails at TP")):
        for f in ev.all(key):
            out.append(f"{what} {f.value} — {where(f)}")
    for f in ev.all("working_launch"):
        out.append(f"a launch the report says works — {where(f)}")
    parsers = {f.line: f.value for f in ev.all("launch_parser")}
    for f in ev.all("unread_flag")[:12]:  # another vLLM's flags, a frontend's, or a value the parser refused
        out.append(f"not an engine argument to {parsers.get(f.line, 'the parser')}: {f.value} — line {f.line}")
    used = ev.all("hbm_used_mb")
    if used:
        top = max(used, key=lambda f: f.value)
        out.append(f"device memory in use when the smi table was taken: up to {top.value:,} MB — {where(top, 120)}")
    for f in ev.all("device_process_mb"):
        out.append(f"a process holds {f.value:,} MB of device memory — {where(f, 120)}")
    for f in ev.all("other_process"):
        out.append(f"another process holds {fmt_bytes(f.value)} — {where(f)}")
    return out


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
        stated = values.get("vLLM")
        which = (f"whether vLLM {stated.value} ({short(stated.source, 60)}) runs on a GPU, or under vllm-ascend on "
                 "an NPU, and then which vllm-ascend release" if inputs.platform is None and stated is not None
                 and stated.reported else
                 f"which {'vllm-ascend' if inputs.platform == 'ascend' else 'vLLM / vllm-ascend'} release runs")
        ask = [f"{which}: `pip show vllm-ascend vllm`, or the container image tag; the verdict depends on it ("
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
        cause, text, actions, rec_u, rec_kv = cause_of(ev, values, T, d.gpu_memory_utilization)
        if rec_u is not None and rec_u < d.gpu_memory_utilization and not inputs.family_of:
            actions.append(_planned_again(d, rec_u, values, inputs))
        headline = (f"{cand.label}'s allocator allocates exactly what vLLM planned ({factor:.2f}×); {text}")
        fixed_in = None
    else:
        cause = None
        headline, actions, rec_u, rec_kv, fixed_in = _allocator_finding(cand, r, fixed, d, inputs, verdict)
    return Triage(verdict, round(r.ratio, 4), " ".join([headline] + notes), tuple(evidence), values, tuple(rows),
                  header, tuple(actions),
                  tuple(dict.fromkeys(asks(terms := rests_on(ev, values, cause), cause) + list(missing))),
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
        near = [(c, r) for c, r in audited if abs(use[c.label] - observed) <= OBSERVED_USE_TOLERANCE]
        if near and len({_answer(r) for _, r in near}) == 1:
            at = f" at {asked}" if asked is not None else ""
            return _merged(near), (f"The release is inferred from the use the report observed ({observed} of the device{at}, "
                             f"{where(seen, 120)}): {', '.join(x.label for x, _ in near)} would use "
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
        return f"{observed}" + (f" at {asked}" if asked is not None else "") + f" ({where(seen, 60)})"
    top = max(used, key=lambda f: f.value)
    b = top.value << 20
    return f"{fmt_bytes(b)} ({b / total:.3f}) in the smi snapshot (line {top.line})"
