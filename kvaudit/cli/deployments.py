"""The model and the deployments a command line names, resolved as vLLM resolves them (one per pipeline stage)."""

from __future__ import annotations

from typing import Any


def model(a: Any) -> tuple[Any, Any]:
    """The model spec and preset the options name."""
    from kvaudit.model.deployment import load_model

    return load_model(a.preset, a.config, getattr(a, "revision", None), getattr(a, "trust_remote_code", False))


def pp_ranks(a: Any) -> list[int]:
    """The pipeline stages to plan: the one ``--pp-rank`` names, else every stage."""
    if a.pp_rank is not None:
        return [a.pp_rank]
    return list(range(max(1, a.pp or 1)))


def deployment(a: Any, spec: Any, p: Any, pp_rank: int = 0) -> Any:
    """The deployment the options describe, resolved by vLLM (``kvaudit.plan.planner.deploy``)."""
    from kvaudit.model.options import DeploymentOptions
    from kvaudit.plan.planner import deploy

    return deploy(spec, p, DeploymentOptions.of(a), pp_rank)
