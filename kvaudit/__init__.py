"""kvaudit: did the KV-cache allocator give each layer and group exactly what vLLM planned?"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "load_model_spec", "make_deployment", "build_plan", "run_audit", "AuditResult"]


def __getattr__(name: str):
    # Lazy re-exports: importing kvaudit must not import torch or vLLM.
    if name == "load_model_spec":
        from kvaudit.model.spec import load_model_spec
        return load_model_spec
    if name == "make_deployment":
        from kvaudit.plan.planner import make_deployment
        return make_deployment
    if name == "build_plan":
        from kvaudit.plan.planner import build_plan
        return build_plan
    if name == "run_audit":
        from kvaudit.measure.audit import run_audit
        return run_audit
    if name == "AuditResult":
        from kvaudit.results import AuditResult
        return AuditResult
    raise AttributeError(name)
