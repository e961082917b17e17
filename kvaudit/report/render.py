"""Render audits: the JSON report (versioned), rich tables for people, and the one-line summary.

Pure formatting over ``results`` and ``deployment`` records; rich is imported only for tables.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from kvaudit import __version__
from kvaudit.model.deployment import DEVICES, Deployment
from kvaudit.model.memory import TITLES
from kvaudit.report.tables import fitted
from kvaudit.results import AuditResult, KVPlan, LayerRow, PlanStage, Report, Verdict
from kvaudit.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import RenderableType

SCHEMA_VERSION = 1


def meter_label(meter: str) -> str:
    """How the meter's figures must be read; a ``meta`` PASS is never a device PASS."""
    return {
        "meta": "meta (accounting of the storages requested; no memory allocated, no device measured)",
        "cpu": "cpu (real host allocations counted by torch.profiler; not a device measurement)",
        "cuda": "cuda (torch.cuda caching-allocator counters)",
        "npu": "npu (torch_npu caching-allocator counters)",
    }.get(meter, meter)


def to_dict(rep: Report) -> dict[str, Any]:
    """The JSON report (schema in ``kvaudit/report.schema.json``)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kvaudit_version": __version__,
        "vllm_version": rep.vllm_version,
        "meter": rep.meter,
        "meter_label": meter_label(rep.meter),
        "meter_device": rep.meter_device,
        "model": rep.deployment.model.name,
        "deployment": rep.deployment.to_dict(),
        "plan": rep.audits[0].plan.to_dict() if rep.audits else None,
        "audits": [r.to_dict() for r in rep.audits],
        "skipped": [{"strategy": name, "reason": reason} for name, reason in rep.skipped],
        "capacity": {platform: c.to_dict() for platform, c in rep.capacity.items()},
        "highest_safe_utilization": dict(rep.safe_utilization),
        "exit_code": rep.exit_code,
    }


def stages_to_json(reports: list[Report]) -> str:
    """The JSON of a multi-stage (pipeline-parallel) audit: one report per stage."""
    return json.dumps({"schema_version": SCHEMA_VERSION, "kvaudit_version": __version__,
                       "stages": [to_dict(r) for r in reports],
                       "exit_code": max(r.exit_code for r in reports)}, indent=2)


def plan_to_json(stages: list[PlanStage], vllm_version: str | None) -> str:
    """The JSON of ``kvaudit plan``."""
    from kvaudit.report import startup

    return json.dumps({"schema_version": SCHEMA_VERSION, "kvaudit_version": __version__, "vllm_version": vllm_version,
                       "stages": [{**s.to_dict(), "startup": [
                           startup.report_dict(s.deployment, s.plans[n], s.capacity[n])
                           for n in startup.own_plans(s.deployment, s.plans)]} for s in stages]}, indent=2)


def render_plan(stages: list[PlanStage], vllm_version: str | None) -> list[Any]:
    """``kvaudit plan`` as tables: per stage, the deployment line, the plans with their capacity, safe utilization."""
    from rich.markup import escape as e
    from rich.table import Table
    from rich.text import Text

    out: list[Any] = [Text.from_markup(f"[bold]kvaudit {__version__}[/] · plans by [bold]vLLM {e(str(vllm_version))}[/] "
                                       "· nothing allocated")]
    for st in stages:
        d = st.deployment
        stage = f" · PP stage {d.pp_rank} of {d.pp}" if d.pp > 1 else ""
        out.append(Text.from_markup(
            f"[bold]{e(d.model.name)}[/] ({e(str(d.architecture))}) · TP {d.tp}{stage} · {d.dtype} · kv-cache-dtype "
            f"{d.kv_cache_dtype} · max-model-len {d.max_model_len:,}\n{e(split_line(d))}"
            + (f"\n{e(defaults_line(d))}" if d.defaults else "")))
        pt = Table(title="Plans", title_justify="left")
        for col in ("platform rule", "strategies", "block size", "num_blocks", "planned bytes"):
            pt.add_column(col, justify="left" if col in ("platform rule", "strategies") else "right")
        names = {name: [s for s, pl in st.strategies.items() if pl == name] for name in st.plans}
        for name, plan in st.plans.items():
            pt.add_row(e(name), e(", ".join(names[name])), str(plan.block_size), f"{plan.num_blocks:,}",
                       f"{fmt_bytes(plan.planned_bytes)}")
        out.append(fitted(pt, wrap=("strategies",)))
        out.append(capacity_table(st.capacity, list(names.items())))
        out += _startup_lines(st)
        if st.safe_utilization:
            out.append(Text.from_markup("highest gpu_memory_utilization that does not run out of device memory: " + ", ".join(
                f"[bold]{e(s)}[/] {'none' if u is None else f'{u:.3f}'}" for s, u in st.safe_utilization.items())))
        for s, why in st.refused.items():
            out.append(Text.from_markup(f"[bold]{e(s)}[/]: not planned: {e(why)}"))
    return out


def _startup_lines(st: PlanStage) -> list[Any]:
    """What the emulated release would log at start-up for each of the platform's own plans, to diff against a log."""
    from rich.markup import escape as e
    from rich.text import Text

    from kvaudit.report import startup

    d = st.deployment
    out = []
    for name in startup.own_plans(d, st.plans):
        emulated = f"vLLM {d.vllm_version}" + (f" (emulated; vLLM {st.plans[name].vllm_version} planned)"
                                               if d.vllm_version != st.plans[name].vllm_version else "")
        body = "\n".join("  " + e(line) for line in startup.lines(d, st.plans[name], st.capacity[name]))
        out.append(Text.from_markup(f"Start-up lines {e(emulated)} would log under the [bold]{e(name)}[/] rule:\n{body}"))
    return out


def split_line(d: Deployment) -> str:
    """Device memory × utilization split into weights, each non-KV term and the KV budget, as the emulated
    release budgets it; terms it does not subtract follow as memory beyond the budget."""
    total = int(d.device_memory_bytes * d.gpu_memory_utilization)
    parts = [f"weights {fmt_bytes(d.weights_bytes)}"] + [
        f"{TITLES[t.key]} {fmt_bytes(t.bytes)}" for t in d.overhead_terms if t.budgeted]
    head = (f"{fmt_bytes(d.device_memory_bytes)} × {d.gpu_memory_utilization} = {fmt_bytes(total)} = "
            if d.kv_cache_memory_bytes is None else "--kv-cache-memory: ")
    line = head + " + ".join(parts + [f"KV {fmt_bytes(d.kv_budget_bytes)}"]) + f" (vLLM {d.vllm_version}'s budget)"
    beyond = [f"{TITLES[t.key]} {fmt_bytes(t.bytes)}" for t in d.overhead_terms if not t.budgeted]
    unknown = [note.split(" (")[0] for note in d.unmodelled] if d.kv_cache_memory_bytes is None else []
    return line + (f"; beyond it: {', '.join(beyond)}" if beyond else "") + (
        f"; the KV an upper bound: {', '.join(unknown)} not modelled" if unknown else "")


def defaults_line(d: Deployment) -> str:
    """The settings vLLM chose because no option set them, grouped by where each came from:
    ``max_num_seqs 1024, max_num_batched_tokens 8192 (vLLM 0.33.0's default for vllm serve on ...)``."""
    by_source: dict[str, list[str]] = {}
    for key, source in (d.defaults or {}).items():
        value = getattr(d, key, None)
        shown = ("on" if value else "off") if isinstance(value, bool) else f"{value:,}" if isinstance(value, int) else value
        by_source.setdefault(source, []).append(f"{key} {shown}")
    return "; ".join(f"{', '.join(keys)} ({source})" for source, keys in by_source.items())


def to_json(rep: Report) -> str:
    """The JSON report as text."""
    return json.dumps(to_dict(rep), indent=2)


def summary_line(rep: Report) -> str:
    """One line for stderr: the overall verdict, the failing strategies, the meter and vLLM."""
    results = rep.audits
    failed = [r for r in results if r.verdict is Verdict.FAIL]
    where = f"meter {rep.meter}" + (" (accounting only, not a device measurement)" if rep.meter == "meta" else "")
    tail = f"{where}; planned by vLLM {rep.vllm_version}"
    if rep.skipped:
        tail += f"; {len(rep.skipped)} not audited ({', '.join(name for name, _ in rep.skipped)}: the report says why)"
    if not failed:
        verdict = "PASS" if not rep.skipped else "NOT MEASURED"
        return f"kvaudit: {verdict}: {len(results)} of {len(results)} audited strategies allocate what vLLM planned; {tail}"
    worst = ", ".join(f"{r.strategy} {r.finding}" for r in failed)
    return f"kvaudit: FAIL: {len(failed)} of {len(results)} strategies do not allocate what vLLM planned ({worst}); {tail}"


def split_layer(name: str) -> tuple[str, str]:
    """``model.layers.28.linear_attn`` -> (``28``, ``linear_attn``)."""
    m = re.match(r"model\.layers\.(\d+)\.(.+)$", name)
    return (m.group(1), m.group(2)) if m else (name, "")


def short_layer(name: str) -> str:
    """``model.layers.28.linear_attn`` -> ``28.linear_attn``."""
    i, kind = split_layer(name)
    return f"{i}.{kind}" if kind else i


def layers_text(names: tuple[str, ...] | list[str], limit: int = 4) -> str:
    """Layer names grouped by kind: ``0, 1, 2 linear_attn · 3 self_attn.attn``."""
    by_kind: dict[str, list[str]] = {}
    for n in names:
        i, kind = split_layer(n)
        by_kind.setdefault(kind, []).append(i)
    parts = []
    for kind, ids in by_kind.items():
        text = ", ".join(ids) if len(ids) <= limit else f"{', '.join(ids[:3])}, …, {ids[-1]} ({len(ids)})"
        parts.append(f"{text} {kind}".strip())
    return " · ".join(parts)


def _ids(names: tuple[str, ...]) -> str:
    return ", ".join(split_layer(n)[0] for n in names) or "—"


def _structure(plan: KVPlan) -> str:
    sizes = sorted({len(g.layer_names) for g in plan.groups})
    sharers = sorted({len(t.shared_by) for t in plan.tensors})
    return (f"{_n(len(plan.groups), 'group')} of {'/'.join(map(str, sizes))} layers; "
            f"{_n(len(plan.tensors), 'planned tensor')}, each shared by {'/'.join(map(str, sharers))} "
            f"layer{'s' if sharers != [1] else ''}; vLLM's plan format: {plan.plan_format}")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _ratio(allocated: int, expected: int) -> str:
    return f"{allocated / expected:.2f}×" if expected else "—"


def _verdict(v: Verdict) -> str:
    return f"[bold green]{v.value}[/]" if v is Verdict.PASS else f"[bold red]{v.value}[/]"


def _oom_text(o: Any, allocations: int) -> str:
    """``alloc 21/60, tensor 4`` for a projected or measured out-of-memory point; ``—`` for none."""
    if o is None:
        return "—"
    where = f"tensor {o.tensor}" if o.tensor is not None else "an unplanned storage"
    return f"alloc {o.allocation}/{allocations}, {where}"


def _plans(results: list[AuditResult]) -> list[tuple[KVPlan, list[str]]]:
    seen: dict[int, tuple[KVPlan, list[str]]] = {}
    for r in results:
        seen.setdefault(id(r.plan), (r.plan, []))[1].append(r.strategy)
    return list(seen.values())


def render_tables(rep: Report, detail: str = "layers") -> list["RenderableType"]:
    """Everything a person reads, top to bottom: deployment, plans, per-strategy detail, summary."""
    from rich.markup import escape as e
    from rich.table import Table
    from rich.text import Text

    d, results, meter, vllm_version = rep.deployment, list(rep.audits), rep.meter, rep.vllm_version
    out: list[Any] = [Text.from_markup(
        f"[bold]kvaudit {__version__}[/] · plans by [bold]vLLM {e(str(vllm_version))}[/] · meter: "
        f"[bold]{e(meter_label(meter))}[/]" + (f"\nmeasured on {e(str(rep.meter_device))}" if rep.meter in ("cuda", "npu") else ""))]

    dep = Table(title="Deployment (one rank)", title_justify="left", show_header=False, box=None, padding=(0, 2))
    dep.add_column(style="bold", no_wrap=True)
    dep.add_column(overflow="fold")
    m = d.model
    dev = DEVICES.get(d.device)
    kv_layers = len(results[0].plan.layer_specs) if results else 0
    dep.add_row("model", f"{e(m.name)} ({e(str(d.architecture or m.architecture))}, {kv_layers} KV-cache layers on this rank) · "
                         f"TP {d.tp}" + (f" · PP {d.pp} stage {d.pp_rank}" if d.pp > 1 else "")
                         + (f" · DP {d.dp}" if d.dp > 1 else "") + (" · expert parallel" if d.enable_expert_parallel else "")
                         + f" · {d.dtype} · kv-cache-dtype {d.kv_cache_dtype} · max-model-len {d.max_model_len}")
    dep.add_row("device memory", f"{fmt_bytes(d.device_memory_bytes)} ({d.device_memory_bytes:,} B"
                                 + (f", {e(dev.title)}" if dev else "")
                                 + ("'s rules, the size from --device-memory" if d.device_memory_given else "") + ")")
    dep.add_row("gpu_memory_utilization", f"{d.gpu_memory_utilization} → "
                                          f"{fmt_bytes(int(d.device_memory_bytes * d.gpu_memory_utilization))}")
    dep.add_row("weights per rank", f"{fmt_bytes(d.weights_bytes)} ({e(d.weights_source)})")
    for t in d.overhead_terms:
        dep.add_row(TITLES[t.key], f"{fmt_bytes(t.bytes)} ({e(t.source)})")
    budget = ("--kv-cache-memory" if d.kv_cache_memory_bytes is not None
              else "device memory × utilization − weights − the terms above")
    dep.add_row("KV budget", f"[bold]{fmt_bytes(d.kv_budget_bytes)}[/] ({d.kv_budget_bytes:,} B = {budget})"
                + (", an upper bound" if d.unmodelled and d.kv_cache_memory_bytes is None else ""))
    for note in d.unmodelled:
        dep.add_row("not modelled", e(note))
    extras = []
    if d.kv_transfer:
        extras.append("--kv-transfer: vllm-ascend's 2 MiB-aligned buffers")
    if d.num_blocks_override is not None:
        extras.append(f"--num-blocks {d.num_blocks_override}: a scaled plan")
    taken = d.defaults or {}
    for flag, value in (("--quantization", d.quantization), ("--block-size", d.block_size),
                        ("--enable-prefix-caching", d.enable_prefix_caching), ("--mamba-cache-mode", d.mamba_cache_mode),
                        ("--max-num-seqs", d.max_num_seqs), ("--max-num-batched-tokens", d.max_num_batched_tokens),
                        ("--max-cudagraph-capture-size", d.max_cudagraph_capture_size),
                        ("--enforce-eager", True if d.enforce_eager else None),
                        ("--compilation-config", f'{{"cudagraph_mode": "{d.cudagraph_mode}"}}' if d.cudagraph_mode else None),
                        ("--usage-context", d.usage_context if d.usage_context != "serve" else None),
                        ("--num-speculative-tokens", d.num_speculative_tokens or None), ("--hf-overrides", d.hf_overrides),
                        ("--limit-mm-per-prompt", json.dumps(d.limit_mm_per_prompt) if d.limit_mm_per_prompt else None),
                        ("--skip-mm-profiling", True if d.skip_mm_profiling else None),
                        ("--language-model-only", True if d.language_model_only else None)):
        if value is not None and flag[2:].replace("-", "_") not in taken:
            extras.append(f"{flag} {value}" if value is not True else flag)
    if extras:
        dep.add_row("options", e("; ".join(extras)))
    if taken:
        dep.add_row("vLLM's defaults", e(defaults_line(d)))
    out.append(dep)
    skipped = [f"[bold]{e(name)}[/]: not audited: {e(reason)}" for name, reason in rep.skipped]
    if not results:
        out.append(Text.from_markup("\n".join("• " + n for n in skipped)))
        return out

    plans = _plans(results)
    base = plans[0][0]
    pt = Table(title=f"Plans by vLLM {vllm_version}'s get_kv_cache_configs, one per platform block-size rule"
                     + (" and KV budget" if any(p.kv_budget_by for p, _ in plans) else ""),
               title_justify="left", caption=_structure(base), caption_justify="left")
    for col in ("platform rule", "strategies", "block size", "page size", "num_blocks", "planned bytes"):
        pt.add_column(col, justify="left" if col in ("platform rule", "strategies") else "right")
    for plan, names in plans:
        pages = sorted({g.page_size_bytes for g in plan.groups})
        pt.add_row(e(plan.name), e(", ".join(names)), str(plan.block_size), " / ".join(f"{p:,}" for p in pages),
                   f"{plan.num_blocks:,}", fmt_bytes(plan.planned_bytes))
    out.append(fitted(pt, wrap=("strategies",)))
    if rep.capacity:
        out.append(capacity_table(rep.capacity, [(plan.name, names) for plan, names in plans]))

    if detail == "summary":
        out.append(_summary_table(results, meter, rep.safe_utilization))
        out.extend(_notes(results, d, rep.skipped))
        return out
    gt = Table(title="KV-cache groups (the same in every plan)", title_justify="left")
    gt.add_column("group", justify="right")
    gt.add_column("spec")
    gt.add_column("layers")
    for g in base.groups:
        gt.add_row(str(g.index), e(g.spec_type), e(layers_text(g.layer_names, limit=8)))
    out.append(fitted(gt, wrap=("layers",)))
    tt = Table(title="Planned tensors and the layers that share each one (size in each plan)", title_justify="left")
    tt.add_column("tensor", justify="right")
    tt.add_column("shared by")
    for plan, _ in plans:
        tt.add_column(e(plan.name), justify="right")
    for i, t in enumerate(base.tensors):
        tt.add_row(str(i), e(layers_text(t.shared_by)),
                   *(fmt_bytes(p.tensors[i].size) if i < len(p.tensors) else "—" for p, _ in plans))
    out.append(fitted(tt, wrap=("shared by",)))

    for r in results:
        out.extend(_strategy_detail(r, detail))
    out.append(_summary_table(results, meter, rep.safe_utilization))
    out.extend(_notes(results, d, rep.skipped))
    return out


def capacity_table(capacity: dict[str, Any], plans: list[tuple[str, Any]]) -> Any:
    """Per platform rule: what vLLM would log for the plan, the pool, Mamba slots, --kv-cache-memory."""
    from rich.markup import escape as e
    from rich.table import Table

    t = Table(title="Capacity of each plan, as vLLM computes and logs it (get_kv_cache_capacity)", title_justify="left",
              caption="KV cache tokens = max concurrency × max-model-len (vLLM's 'GPU KV cache size'); the pool is "
                      "num_blocks × block size: for hybrid models a request takes blocks from every group, so the "
                      "two differ. Mamba slots: one block per decoding sequence (vLLM refuses max_num_seqs above "
                      "it with full decode CUDA graphs).", caption_justify="left")
    for col in ("platform rule", "KV cache tokens", "concurrency", "pool tokens", "Mamba slots", "--kv-cache-memory"):
        t.add_column(col, justify="left" if col == "platform rule" else "right", no_wrap=True)
    for platform, names in plans:
        c = capacity.get(platform)
        if c is None:
            continue
        slots = "—" if c.mamba_slots is None else (f"{c.mamba_slots:,} for {c.max_num_seqs} seqs"
                                                    + (" [bold]SHORT[/]" if c.mamba_slots_short else ""))
        t.add_row(e(platform), f"{c.tokens:,}", f"{c.max_concurrency:.2f}× @ {c.max_model_len:,}",
                  f"{c.pool_tokens:,}", slots, str(c.kv_cache_memory_bytes))
    return fitted(t, wrap=("Mamba slots", "concurrency"))


def _notes(results: list[AuditResult], d: Deployment, skipped: tuple[tuple[str, str], ...] = ()) -> list[Any]:
    from rich.markup import escape as e
    from rich.text import Text

    notes = [f"[bold]{e(r.strategy)}[/]: {e(reason)}" for r in results for reason in r.reasons]
    notes += [f"[bold]{e(name)}[/]: not audited: {e(reason)}" for name, reason in skipped]
    notes += [_oom_note(r, d) for r in results if r.oom is not None]
    notes += [f"[bold]{e(r.strategy)}[/]: allocator rounding {fmt_bytes(r.rounding_bytes, signed=True)} (handed out "
              f"{fmt_bytes(r.reading.allocated)} for {fmt_bytes(r.reading.requested or 0)} requested; not counted "
              "as the strategy's)" for r in results if r.rounding_bytes and r.meter in ("cuda", "npu")]
    return [Text.from_markup("\n".join("• " + n for n in notes))] if notes else []


def _strategy_detail(r: AuditResult, detail: str) -> list[Any]:
    from rich.markup import escape as e
    from rich.table import Table

    outcome = "out of memory" if r.device_oom else f"{r.ratio:.2f}×"
    title = (f"{r.strategy} ({r.strategy_releases}: {r.strategy_title}) · plan {r.plan.name}, block "
             f"{r.plan.block_size}, {r.plan.num_blocks:,} blocks · {r.verdict.value} {outcome}")
    if r.device_oom:
        from rich.text import Text

        return [Text(f"{title}\n  no per-layer rows: the strategy ran out of memory before it returned its tensors")]
    gt = Table(title=e(title), title_justify="left")
    for col in ("group", "spec", "layers", "expected", "allocated", "ratio"):
        gt.add_column(col, justify="left" if col == "spec" else "right")
    for g in r.groups:
        gt.add_row(str(g.group), e(g.spec), str(g.layers), fmt_bytes(g.expected), fmt_bytes(g.allocated),
                   _ratio(g.allocated, g.expected))
    tt = Table(show_edge=True)
    for col in ("tensor", "storages", "expected", "allocated", "ratio", "padding", "planned to be shared by"):
        tt.add_column(col, justify="left" if col.startswith("planned") else "right")
    for t in r.tensors:
        tt.add_row(str(t.tensor), str(t.storages), fmt_bytes(t.expected), fmt_bytes(t.allocated),
                   _ratio(t.allocated, t.expected), fmt_bytes(t.padding) if t.padding else "—",
                   e(layers_text(t.shared_by)))
    out: list[Any] = [fitted(gt), fitted(tt, wrap=("planned to be shared by",))]
    if detail == "layers":
        lt = Table(title="Per layer: layers with the same figures on one row, bytes per layer", title_justify="left")
        for col in ("layers", "group", "spec", "expected", "allocated", "ratio", "shares memory with",
                    "planned to share with"):
            lt.add_column(col, justify="right" if col in ("group", "expected", "allocated", "ratio") else "left",
                          no_wrap=col not in ("layers",) and not col.endswith("with"))
        for run in layer_runs(r.layers):
            row = run[0]
            shares, planned = _sharing(run)
            lt.add_row(e(short_layer(row.layer) if len(run) == 1 else layers_text([x.layer for x in run])),
                       str(row.group), e(row.spec), fmt_bytes(row.expected), fmt_bytes(row.allocated),
                       _ratio(row.allocated, row.expected), shares, planned)
        out.append(fitted(lt, wrap=("layers", "shares memory with", "planned to share with"), drop=("spec",)))
    return out


def layer_runs(rows: tuple[LayerRow, ...] | list[LayerRow]) -> list[list[LayerRow]]:
    """The layer rows with the same figures, each set as one run (in the order of its first layer): the same kind
    of layer (``linear_attn``), group, spec, planned and allocated bytes and storages, and a sharing of the same
    shape (as many layers shared with, as many planned, as planned or not). A table shows one row per run."""
    runs: dict[tuple, list[LayerRow]] = {}
    for row in rows:
        key = (split_layer(row.layer)[1], row.group, row.spec, row.expected, row.allocated, row.storages,
               len(row.shares_with), len(row.planned_shares_with),
               set(row.shares_with) == set(row.planned_shares_with))
        runs.setdefault(key, []).append(row)
    return list(runs.values())


def _sharing(run: list[LayerRow]) -> tuple[str, str]:
    """The two sharing cells of a run: the layers' ids for one layer; for several, how many layers each shares with
    ("as planned", "none", "2 each, not as planned"; planned: "3 each"), a sharing other than the plan's in red."""
    from rich.markup import escape as e

    row = run[0]
    as_planned = set(row.shares_with) == set(row.planned_shares_with)
    if len(run) == 1:
        shares, planned = e(_ids(row.shares_with)), e(_ids(row.planned_shares_with))
    else:
        shares = ("as planned" if as_planned else "none" if not row.shares_with
                  else f"{len(row.shares_with)} each, not as planned")
        planned = f"{len(row.planned_shares_with)} each" if row.planned_shares_with else "—"
    return (shares if as_planned else f"[bold red]{shares}[/]"), planned


def _summary_table(results: list[AuditResult], meter: str, safe: dict[str, Any] | None = None) -> Any:
    from rich.markup import escape as e
    from rich.table import Table

    asked = results[0].requested_utilization if results else 0
    t = Table(title=f"Audit per strategy (projected device utilization vs the {asked} asked) · meter "
                    f"{e(meter_label(meter))}", title_justify="left")
    cols = ["strategy", "release", "expected", "allocated", "ratio", "util", "OOM (deployment)"]
    cols += ["max util"] if safe else []
    for col in cols + ["verdict"]:
        t.add_column(col, justify="right" if col in ("expected", "allocated", "ratio", "util", "max util") else "left",
                     no_wrap=True)
    for r in results:
        o = r.device_oom
        allocated = f"OOM at {o.allocation}/{o.allocations}" if o else fmt_bytes(r.allocated_bytes)
        ratio = "—" if o else _ratio(r.allocated_bytes, r.expected_bytes)
        cells = [e(r.strategy), e(r.strategy_releases), fmt_bytes(r.expected_bytes), allocated, ratio,
                 f"{r.projected_utilization:.3f}", _oom_text(r.oom, r.allocations)]
        if safe:
            u = safe.get(r.strategy)
            cells.append("none" if u is None and r.strategy in safe else "—" if u is None else f"{u:.3f}")
        t.add_row(*cells, _verdict(r.verdict))
    return fitted(t, wrap=("release", "OOM (deployment)"), below=("release",))


def _oom_note(r: AuditResult, d: Deployment) -> str:
    """The note on a projected out-of-memory point, as rich markup."""
    from rich.markup import escape as e

    o = r.oom
    assert o is not None
    layers = ", ".join(o.layers) if o.layers else "no layer"
    where = f"tensor {o.tensor} ({layers})" if o.tensor is not None else layers
    return (f"[bold]{e(r.strategy)}[/] would run out of memory on a {fmt_bytes(d.device_memory_bytes)} device at "
            f"allocation {o.allocation} of {r.allocations}: {fmt_bytes(o.request_bytes)} for {e(where)}, with "
            f"{fmt_bytes(o.allocated_before_bytes)} of KV cache already allocated and "
            f"{fmt_bytes(o.free_bytes)} left after {fmt_bytes(d.non_kv_bytes)} of non-KV memory")
