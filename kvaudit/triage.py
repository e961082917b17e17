"""Triage a pasted out-of-memory report: reconstruct the deployment (each value with its source),
audit the reported release's allocator and the fixed one, set the prediction against what was
observed, conclude, and say what to do.

Parsing (``kvaudit.evidence``) imports neither torch nor vLLM; the audit step does.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.deployment import DEVICES, PRESETS, Deployment, load_preset_spec
from kvaudit.errors import ConfigError, UsageError
from kvaudit.evidence import Evidence, Fact, clean_lines, extract
from kvaudit.spec import ModelSpec, load_model_spec
from kvaudit.units import fmt_bytes

SCHEMA_VERSION = 1
OVER_ALLOCATION = "allocator-over-allocation"
MATCHES_PLAN = "allocation-matches-plan"
INSUFFICIENT = "insufficient-information"
FIXED_RELEASE = "vllm-ascend v0.16.0rc1 (PR #6887: one buffer per shared tensor)"


@dataclass(frozen=True)
class Sourced:
    """A deployment value and where it came from: a report line, a derivation, or an assumption."""

    value: Any
    source: str

    def to_dict(self) -> dict:
        """JSON form."""
        return {"value": self.value, "source": self.source}


def _from(f: Fact, value: Any = None) -> Sourced:
    return Sourced(f.value if value is None else value, f.source)


def _assumed(value: Any, why: str) -> Sourced:
    return Sourced(value, f"assumed: {why}")


@dataclass(frozen=True)
class Triage:
    """The triage of one report."""

    verdict: str
    factor: float | None
    """Allocated over planned KV bytes for the reported release, or ``None``."""
    headline: str
    evidence: tuple[str, ...]
    deployment: dict[str, Sourced]
    comparison: tuple[tuple[str, ...], ...] = ()
    """Rows of (quantity, predicted for the reported release, predicted for the fix, reported)."""
    comparison_header: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    ask_for: tuple[str, ...] = ()
    recommended_utilization: float | None = None
    recommended_kv_cache_memory_bytes: int | None = None
    fixed_in: str | None = None
    audits: tuple[Any, ...] = field(default=(), repr=False)

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
            "fixed_in": self.fixed_in,
        }

    def to_json(self) -> str:
        """The JSON contract as text."""
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        """A report ready to paste into an issue."""
        out = [f"### kvaudit triage: {self.verdict}" + (f" ({self.factor:.2f}×)" if self.factor else ""), "",
               self.headline, ""]
        if self.evidence:
            out += ["**Evidence**", ""] + [f"- {e}" for e in self.evidence] + [""]
        if self.deployment:
            out += ["**Deployment, as reconstructed**", "", "| | value | source |", "|---|---|---|"]
            for k, v in self.deployment.items():
                out.append(f"| {k} | {_md(_show(k, v.value))} | {_md(_short(v.source))} |")
            out.append("")
        if self.comparison:
            out += ["**Prediction vs report**", "", "| " + " | ".join(self.comparison_header) + " |",
                    "|" + "---|" * len(self.comparison_header)]
            out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in self.comparison] + [""]
        if self.actions:
            out += ["**What to do**", ""] + [f"- {a}" for a in self.actions] + [""]
        if self.ask_for:
            out += ["**Please add to the issue**", ""] + [f"- {a}" for a in self.ask_for] + [""]
        out.append("<sub>kvaudit triage: figures from vLLM's own planner and kvaudit's allocation strategies on the "
                   "meta meter (accounting, not a device measurement).</sub>")
        return "\n".join(out) + "\n"


def _short(text: str, limit: int = 150) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _show(key: str, value: Any) -> str:
    if isinstance(value, int) and ("bytes" in key or key in ("device memory", "weights", "KV budget", "other non-KV")):
        return f"{fmt_bytes(value)} ({value:,} B)"
    return str(value)


# --- reconstruction ---------------------------------------------------------------------------------


def _platform(ev: Evidence) -> str | None:
    kinds = {f.value for f in ev.facts.get("platform", [])} | {
        {"npu": "ascend", "cuda": "cuda"}.get(f.value, "") for f in ev.facts.get("device_type", [])}
    if "ascend" in kinds:
        return "ascend"
    return "cuda" if "cuda" in kinds else None


def _preset_for(model: str | None) -> str | None:
    if not model:
        return None
    name = re.sub(r"[^a-z0-9.]+", "-", Path(model.rstrip("/")).name.lower())
    if "qwen3-next" in name:
        return "qwen3-next"
    if "llama-3.1-8b" in name or "llama-3-1-8b" in name:
        return "llama-3.1-8b"
    return None


def _device_memory(ev: Evidence, platform: str | None) -> Sourced | None:
    found = ev.facts.get("device_memory", [])
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
    if platform == "ascend":
        d = DEVICES["atlas-a2-64g"]
        return _assumed(d.memory_bytes, f"a 64 GB Atlas A2 card ({d.source})")
    return None


def reconstruct(ev: Evidence, config: str | None = None) -> tuple[dict[str, Sourced], list[str], dict]:
    """Deployment values with their sources, what is missing, and the inputs for the audit."""
    values: dict[str, Sourced] = {}
    missing: list[str] = []
    platform = _platform(ev)
    values["platform"] = (Sourced(platform, _platform_source(ev, platform)) if platform
                          else _assumed(None, "no Ascend or CUDA marker found"))
    vllm = ev.first("vllm_version")
    if vllm:
        values["vLLM"] = _from(vllm)
    release = None
    if platform == "ascend":
        va = ev.first("vllm_ascend_version")
        if va:
            values["vllm-ascend"] = _from(va)
            release = va.value
        elif vllm:
            values["vllm-ascend"] = Sourced(vllm.value, f"assumed: vllm-ascend releases pair with the vLLM of the "
                                                        f"same version ({vllm.source})")
            release = vllm.value
        else:
            missing.append("the vLLM and vllm-ascend versions (`pip list | grep -E 'vllm|torch'`, or the "
                           "collect_env output)")
    elif platform == "cuda":
        release = vllm.value if vllm else None
        if not vllm:
            missing.append("the vLLM version (`pip show vllm`)")
    else:
        missing.append("the platform and versions: `pip list | grep -E 'vllm|torch'` and the `npu-smi info` or "
                       "`nvidia-smi` output")
    model = ev.first("model")
    preset = _preset_for(model.value if model else None)
    spec: ModelSpec | None = None
    if config:
        spec = load_model_spec(config)
        values["model"] = Sourced(spec.name, f"--config {config}" + (f" (report: {model.source})" if model else ""))
    elif preset:
        spec = load_preset_spec(PRESETS[preset])
        values["model"] = Sourced(spec.name, f"{model.source} → kvaudit's {preset} preset config")  # type: ignore[union-attr]
    else:
        what = f"the model {model.value!r}" if model else "the model"
        missing.append(f"{what}'s config.json (then: kvaudit triage REPORT --config config.json)"
                       if model else "the model name and its config.json (the `vllm serve` command line)")
    p = PRESETS.get(preset) if preset else None
    tp = ev.first("tp")
    ranks = ev.facts.get("worker_tp_rank", [])
    if tp:
        values["tensor parallel size"] = _from(tp)
    elif ranks and max(f.value for f in ranks) > 0:  # a paste often shows rank 0 alone: no inference then
        top = max(ranks, key=lambda f: f.value)
        values["tensor parallel size"] = Sourced(top.value + 1, f"{top.source} (at least: the highest TP rank "
                                                                "in the report + 1)")
    elif p:
        values["tensor parallel size"] = _assumed(p.tp, f"the {preset} preset's (as its tutorial deploys it)")
    else:
        values["tensor parallel size"] = _assumed(1, "no TP in the report")
    mml = ev.first("max_model_len")
    values["max model len"] = (_from(mml) if mml else _assumed(p.max_model_len, f"the {preset} preset's") if p
                               else _assumed(spec.max_position_embeddings if spec else None, "vLLM's default"))
    util = ev.first("gpu_memory_utilization")
    values["gpu_memory_utilization"] = _from(util) if util else _assumed(0.9, "vLLM's default (not in the report)")
    dev = _device_memory(ev, platform)
    if dev is not None:
        values["device memory"] = dev
    elif not missing:
        missing.append("the device memory (`nvidia-smi` or `npu-smi info`)")
    dtype = ev.first("dtype")
    if dtype:
        values["dtype"] = _from(dtype)
    weights = ev.first("weights")
    if weights:
        values["weights"] = _from(weights)
    avail = ev.first("available_kv")
    if avail:
        values["KV budget"] = _from(avail)
    conn = ev.first("kv_connector")
    values["KV transfer"] = (Sourced(True, f"{conn.source} ({conn.value})") if conn
                             else _assumed(False, "no KV connector in the report"))
    inputs = {"spec": spec, "release": release, "platform": platform}
    return values, missing, inputs


def _platform_source(ev: Evidence, platform: str | None) -> str:
    for f in ev.facts.get("platform", []) + ev.facts.get("device_type", []):
        if f.value in (platform, {"ascend": "npu"}.get(platform or "")):
            return f.source
    return "assumed"


def _deployment(values: dict[str, Sourced], spec: ModelSpec) -> Deployment:
    """The deployment the values describe. A reported KV budget fixes the other non-KV memory:
    vLLM's budget is device memory × utilization − weights − the rest."""
    v = {k: s.value for k, s in values.items()}
    args = dict(tp=v["tensor parallel size"], max_model_len=v["max model len"] or spec.max_position_embeddings,
                gpu_memory_utilization=v["gpu_memory_utilization"], device_memory_bytes=v.get("device memory"),
                dtype=v.get("dtype") or "auto", weights_bytes=v.get("weights"), kv_transfer=bool(v.get("KV transfer")))
    from kvaudit.plan import make_deployment

    d = make_deployment(spec, **args)
    budget = v.get("KV budget")
    if budget is None:
        return d
    overhead = max(0, int(d.device_memory_bytes * d.gpu_memory_utilization) - budget - d.weights_bytes)
    return make_deployment(spec, **args, overhead_bytes=overhead, kv_cache_memory_bytes=budget)


# --- the audit, the comparison, the conclusion ------------------------------------------------------


def triage(text: str, config: str | None = None) -> Triage:
    """Read a report, reconstruct its deployment, audit, compare, conclude."""
    ev = extract(clean_lines(text))
    if len(ev) == 0:
        raise UsageError("nothing in the report looks like a vLLM log, a traceback, an smi table or a version list")
    values, missing, inputs = reconstruct(ev, config)
    evidence = _evidence_lines(ev)
    if missing or inputs["spec"] is None or inputs["release"] is None:
        if ev.first("oom") is not None and ev.first("oom_phase") is None:
            missing.append("the whole traceback of the out-of-memory error (which function allocated)")
        missing.append("the full startup log, from the `vllm serve` command line to the error")
        shown = {k: v for k, v in values.items() if v.value is not None}
        return Triage(INSUFFICIENT, None, "Not enough information to reconstruct the deployment and audit its "
                      "allocator.", tuple(evidence), shown, ask_for=tuple(missing))
    try:
        d = _deployment(values, inputs["spec"])
    except (ConfigError, UsageError) as e:
        return Triage(INSUFFICIENT, None, f"The reconstructed deployment is not usable: {e.message}",
                      tuple(evidence), values, ask_for=("the full startup log, from `vllm serve` to the error",))
    values["KV budget"] = values.get("KV budget") or Sourced(
        d.kv_budget_bytes, "derived: device memory × utilization − weights − other non-KV")
    if "weights" not in values:
        values["weights"] = Sourced(d.weights_bytes, f"derived: {d.weights_source}")
    values["other non-KV"] = Sourced(d.non_kv_bytes - d.weights_bytes, "derived: device memory × utilization − "
                                     "weights − KV budget" if "available_kv" in ev.facts
                                     else "assumed: kvaudit's default allowance (activations, non-torch)")
    return _conclude(ev, d, values, inputs, evidence)


def _evidence_lines(ev: Evidence) -> list[str]:
    out = []
    for key, what in (("vllm_ascend_version", "vllm-ascend"), ("vllm_version", "vLLM"), ("oom", "out of memory"),
                      ("oom_phase", "the traceback is in"), ("kv_cache_tokens", "KV cache tokens"),
                      ("available_kv", "KV budget"), ("kv_capacity_error", "vLLM refused the budget")):
        f = ev.first(key)
        if f is not None:
            shown = f.value if key not in ("oom", "available_kv") else ""
            out.append(f"{what}{': ' + str(shown) if shown != '' else ''} — line {f.line}: `{f.text[:160]}`")
    used = ev.facts.get("hbm_used_mb", [])
    if used:
        top = max(used, key=lambda f: f.value)
        out.append(f"device memory in use when the smi table was taken: up to {top.value:,} MB — line {top.line}: "
                   f"`{top.text[:120]}`")
    for f in ev.facts.get("device_process_mb", []):
        out.append(f"a process holds {f.value:,} MB of device memory — line {f.line}: `{f.text[:120]}`")
    return out


def _conclude(ev: Evidence, d: Deployment, values: dict[str, Sourced], inputs: dict, evidence: list[str]) -> Triage:
    from kvaudit.audit import audit_all
    from kvaudit.meters import MetaMeter
    from kvaudit.releases import builtin_strategy_for, platform_for
    from kvaudit.strategies import STRATEGIES

    if inputs["platform"] == "ascend":
        name = builtin_strategy_for(inputs["release"])
        reported = dataclasses.replace(STRATEGIES[name], platform=platform_for(inputs["release"]))
        fixed = STRATEGIES["ascend-0.16"]
        label = f"vllm-ascend {inputs['release']}"
    else:
        reported = fixed = STRATEGIES["vllm"]
        label = f"vLLM {inputs['release']}"
    same = (reported.name, reported.platform) == (fixed.name, fixed.platform)
    try:
        results = audit_all(d, [reported] if same else [reported, fixed], MetaMeter())
    except ConfigError as e:
        return Triage(INSUFFICIENT, None, f"vLLM's planner refuses the reconstructed budget: {e.message}",
                      tuple(evidence), values, ask_for=("the startup log lines with 'Available KV cache memory' "
                                                        "or 'Available memory'",))
    r, f = results[0], results[-1]
    factor = round(r.ratio, 4)
    oom = ev.value("oom")
    phase = ev.value("oom_phase")
    T, u, non_kv, A = d.device_memory_bytes, d.gpu_memory_utilization, d.non_kv_bytes, d.kv_budget_bytes
    audited = [r] if r is f else [r, f]
    header = ("quantity", f"predicted: {label} ({reported.name})",
              *([f"predicted: fixed ({fixed.name})"] if r is not f else []), "reported")
    rows = [("KV cache allocated", *(fmt_bytes(a.allocated_bytes) for a in audited), "—"),
            ("device memory in use", *(f"{fmt_bytes(a.projected_bytes)} ({a.projected_utilization:.3f})"
                                       for a in audited), _reported_use(ev, T)),
            ("out of memory", *(_projected_oom(a) for a in audited), _reported_oom(oom, phase))]
    tokens = ev.first("kv_cache_tokens")
    if tokens is not None:  # "GPU KV cache size": num_blocks // groups × block size (vLLM's own formula)
        rows.insert(0, ("KV cache size (tokens)",
                        *(f"{a.plan.num_blocks // len(a.plan.groups) * a.plan.block_size:,}" for a in audited),
                        f"{tokens.value:,} (line {tokens.line})"))
    actions: list[str] = []
    rec_u = rec_kv = None
    if r.ratio > 1.005:
        verdict = OVER_ALLOCATION
        effect = (f"it would need {r.projected_utilization:.3f} of the device, so the device runs out of memory "
                  "while allocating the KV cache" if r.oom else
                  f"the {u} asked for becomes {r.projected_utilization:.3f} of the device")
        headline = (f"{label}'s KV-cache allocator gives this model {factor:.2f}× the memory vLLM planned "
                    f"({fmt_bytes(r.allocated_bytes)} for a plan of {fmt_bytes(r.expected_bytes)}), the class of "
                    f"vllm-ascend issue #3368: {effect}.")
        fixed_in = FIXED_RELEASE if inputs["platform"] == "ascend" else None
        rec_kv = int((u * T - non_kv) / r.ratio)
        if rec_kv > 0:
            rec_u = round((non_kv + rec_kv) / T - 0.0005, 3)
            actions.append(f"Upgrade to {fixed_in}; it allocates exactly the plan "
                           f"({f.ratio:.2f}×)." if fixed_in else "Use an allocator that shares tensors as planned.")
            if reported.name == "ascend-0.11":
                actions.append("vllm-ascend v0.12.0rc1 (PR #3760) already halves the waste (2×), but does not remove it.")
            actions.append(f"With the installed release, keep the real use at the {u} asked for: "
                           f"`--gpu-memory-utilization {rec_u}`, or `--kv-cache-memory={rec_kv}` "
                           f"({fmt_bytes(rec_kv)}) where the release supports that flag; the KV cache then holds "
                           f"{1 / r.ratio:.0%} of the blocks it would with the fix.")
        else:
            actions.append(f"Upgrade to {fixed_in}: with the installed release no utilization keeps the real use "
                           f"at {u} (the weights and other non-KV memory alone take {fmt_bytes(non_kv)}).")
    else:
        verdict = MATCHES_PLAN
        fixed_in = None
        shortfall = (oom.tried - oom.free) if oom is not None and oom.free is not None else None
        where = f"during {phase}" if phase else "(no traceback phase found)"
        if oom is None:
            headline = (f"{label}'s allocator allocates exactly the plan ({factor:.2f}×); the report shows no "
                        "out-of-memory error, so nothing points at the KV cache.")
        elif phase == "kv-cache allocation":
            others = ev.facts.get("device_process_mb", [])
            cause = (f"another process holds {max(o.value for o in others):,} MB of the device (line "
                     f"{others[0].line}), outside vLLM's profile" if len(others) >= 1 and not _is_vllm(others[0])
                     else "memory outside vLLM's profile (another process, non-torch allocations) or a "
                          "utilization too close to 1")
            headline = (f"{label}'s allocator allocates exactly the plan ({factor:.2f}×), yet the device ran out "
                        f"{where}: the budget itself did not fit; {cause}.")
        else:
            headline = (f"{label}'s allocator allocates exactly the plan ({factor:.2f}×); the device ran out {where},"
                        f" outside the KV-cache allocation: the {u} utilization left too little for it.")
        if shortfall is not None and shortfall > 0:
            margin = int(shortfall * 1.1) + (256 << 20)
            rec_kv = A - margin
            if rec_kv > 0:
                rec_u = round(u - margin / T - 0.0005, 3)
                actions.append(f"Free {fmt_bytes(margin)} for it (the failing request needed {fmt_bytes(shortfall)} "
                               f"more than was free, plus 10 % and 256 MiB): `--gpu-memory-utilization {rec_u}`, or "
                               f"`--kv-cache-memory={rec_kv}` ({fmt_bytes(rec_kv)}).")
        if not actions:
            actions.append("Nothing in the allocator to fix; if memory use still looks wrong, compare "
                           "`npu-smi info`/`nvidia-smi` with the 'device memory in use' prediction above.")
    return Triage(verdict, factor, headline, tuple(evidence), values, tuple(rows), header, tuple(actions), (),
                  rec_u, rec_kv, fixed_in, tuple(results))


def _is_vllm(f: Fact) -> bool:
    return "vllm" in f.text.lower()


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
    used = ev.facts.get("hbm_used_mb", [])
    if not used:
        return "—"
    top = max(used, key=lambda f: f.value)
    b = top.value << 20
    return f"{fmt_bytes(b)} ({b / total:.3f}) in the smi snapshot (line {top.line})"
