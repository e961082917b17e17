"""``kvaudit plan``: vLLM's plans only, nothing allocated: capacity as vLLM logs it and per strategy the highest
safe utilization; ``--save`` writes them as data for ``kvaudit audit --plan``."""

from __future__ import annotations

import sys
from typing import Any

from kvaudit.cli import deployments
from kvaudit.cli.options import AUDIT_OPTIONS, MODEL_OPTIONS, SAVE, Format
from kvaudit.cli.output import BUILDING, check_outputs, note, show, step

NAME = "plan"
OPTIONS = (*MODEL_OPTIONS, SAVE, *AUDIT_OPTIONS[:-2])
USAGE = "[MODEL] [OPTIONS]"
"""MODEL: as ``kvaudit audit MODEL`` takes it."""
HELP = "Plan only: capacity as vLLM logs it, Mamba slots, --kv-cache-memory, safe util."
DESCRIPTION = ("Plan with vLLM's own model and planner, allocate nothing: KV-cache tokens and concurrency "
               "as vLLM computes and logs them, Mamba slots against max_num_seqs, the --kv-cache-memory "
               "that reproduces the plan, and per strategy the highest gpu_memory_utilization that does "
               "not run out of device memory.")


def run(a: Any) -> int:
    """Plan only: capacity as vLLM computes it, and per strategy the highest safe utilization."""
    check_outputs(a.save)
    spec, p = deployments.model(a)  # (a config that is not one is told before the slow step)
    with step(BUILDING):
        from kvaudit.measure.utilization import plan_stage
        from kvaudit.plan.planner import vllm_version
        from kvaudit.report import render as report
        from kvaudit.strategies.builtin import STRATEGIES
        from kvaudit.strategies.resolve import resolve_strategies

        strategies, broken = resolve_strategies(a.strategy or list(STRATEGIES))
        stages = [plan_stage(deployments.deployment(a, spec, p, rank), strategies, broken)
                  for rank in deployments.pp_ranks(a)]
    if a.save:
        from kvaudit.plan.planfile import save

        path = save(stages, vllm_version(), a.save)
        note(f"kvaudit: saved {sum(len(st.plans) for st in stages)} plans of {spec.name} by vLLM {vllm_version()} "
             f"to {path} (audit them anywhere torch runs: kvaudit audit --plan {path})")
    if Format(a.fmt) is Format.json:
        sys.stdout.write(report.plan_to_json(stages, vllm_version()) + "\n")
    else:
        show(report.render_plan(stages, vllm_version()), gap=True)
    sys.stdout.flush()
    return 0
