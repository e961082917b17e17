"""``kvaudit audit`` (and ``kvaudit PRESET``, ``kvaudit MODEL``): plan with vLLM, or read a saved plan, and
audit each strategy under the meter; the report as tables or JSON, with pages."""

from __future__ import annotations

from typing import Any

from kvaudit.cli import deployments
from kvaudit.cli.options import AUDIT_OPTIONS, DEPLOYMENT_OPTIONS, MODEL_OPTIONS, PLAN_FILE, Detail, Format
from kvaudit.cli.output import BUILDING, TORCH, check_outputs, note, render_reports, step, summarize, write_pages
from kvaudit.errors import UsageError
from kvaudit.results import check_tolerance

NAME = "audit"
OPTIONS = (*MODEL_OPTIONS, PLAN_FILE, *AUDIT_OPTIONS)
USAGE = "[MODEL] [OPTIONS]"
"""MODEL: a preset's name, a Hub id, a model folder or a config.json (``--preset`` or ``--model`` made explicit by
``kvaudit.cli.app``)."""
HELP = "Audit a model (--model: a Hub id, a folder, a config.json) or a preset (--preset)."
DESCRIPTION = ("Audit the KV-cache allocation of MODEL under each strategy: a shipped model's name, a Hub id, a "
               "model folder or a config.json (as --preset or --model).")


def run(a: Any) -> int:
    """Run the audit the options describe, render it, and return the exit code."""
    check_tolerance(a.tolerance)
    check_outputs(a.html, a.svg)
    if getattr(a, "plan", None):
        return _saved_plan_audit(a)
    spec, p = deployments.model(a)  # (a config that is not one is told before the slow step)
    with step(BUILDING):
        from kvaudit.measure.utilization import audit_stage
        from kvaudit.plan.planner import vllm_version

        strategies, broken, meter = _strategies_and_meter(a)
        stages = [deployments.deployment(a, spec, p, rank) for rank in deployments.pp_ranks(a)]
    note(f"kvaudit: planning with vLLM {vllm_version()} and auditing {len(strategies)} "
         f"strategies on the {meter.name} meter" + (f", {len(stages)} pipeline stages" if len(stages) > 1 else ""))
    reports = [audit_stage(dep, strategies, meter, a.tolerance, vllm_version(), broken) for dep in stages]
    render_reports(reports, Format(a.fmt), Detail(a.detail))
    write_pages(a, reports)
    summarize(reports)
    return max(rep.exit_code for rep in reports)


def _saved_plan_audit(a: Any) -> int:
    """``audit --plan PLAN.json``: the saved plans, audited with torch alone (vLLM is not imported unless
    a strategy needs vLLM's own code and the vLLM that planned is installed)."""
    from kvaudit.plan import planfile

    fixed = _deployment_options_given(a)
    if fixed:
        raise UsageError(f"{fixed} cannot change a saved plan ({a.plan} fixes the model and deployment); plan "
                         "again with: kvaudit plan ... --save PLAN.json")
    saved = planfile.load(a.plan)  # bad input is reported before anything needs torch

    with step(TORCH):
        import kvaudit.measure.audit  # noqa: F401 - torch, imported in the step this note names (or said missing)
        from kvaudit.measure.utilization import audit_stage

        strategies, broken, meter = _strategies_and_meter(a)
    stages = [st for st in saved.stages if a.pp_rank is None or st.deployment.pp_rank == a.pp_rank]
    if not stages:
        raise UsageError(f"--pp-rank {a.pp_rank}: {a.plan} holds stages "
                         f"{', '.join(str(st.deployment.pp_rank) for st in saved.stages)}")
    note(f"kvaudit: auditing {len(strategies)} strategies on the {meter.name} meter against {saved.path.name} "
         f"(planned by vLLM {saved.vllm_version})")
    reports = [audit_stage(st.deployment, strategies, meter, a.tolerance, saved.vllm_version, broken, saved=st,
                           plan_for=lambda s, st=st: planfile.plan_for(st, s, saved.path)) for st in stages]
    render_reports(reports, Format(a.fmt), Detail(a.detail))
    write_pages(a, reports)
    summarize(reports)
    return max(rep.exit_code for rep in reports)


def _strategies_and_meter(a: Any) -> tuple[list[Any], list[tuple[str, str]], Any]:
    """The strategies the options name (each one's note said), those that could not be had, and the meter."""
    from kvaudit.measure.meters import select_meter
    from kvaudit.strategies.builtin import STRATEGIES
    from kvaudit.strategies.resolve import resolve_strategies

    strategies, broken = resolve_strategies(a.strategy or list(STRATEGIES))
    for s in strategies:
        if s.note:
            note(f"kvaudit: {s.note}")
    return strategies, broken, select_meter(a.meter, a.device_index)


def _deployment_options_given(a: Any) -> str | None:
    """The first model or deployment option given with ``--plan`` (a saved plan fixes them all)."""
    for o in (*MODEL_OPTIONS, *DEPLOYMENT_OPTIONS):
        if o.name not in ("vllm_python", "pp_rank") and getattr(a, o.name, o.default) != o.default:
            return o.decls[0].split("/")[0]
    return None
