"""Third-party allocators as strategies: the ``kvaudit.strategies`` entry-point group, or
``module:function`` on the command line.

A plugin is a ``kvaudit.strategies.Strategy``, or a function with one of the two signatures kvaudit
knows (parameter names matter, extra parameters must have defaults):

- ``fn(kv_cache_config, device)`` or ``fn(kv_cache_config, device, kv_transfer)``: vLLM's own terms;
  ``kv_cache_config`` is the installed vLLM's ``KVCacheConfig``, as a model runner receives it;
- ``fn(plan, device, kv_transfer)``: kvaudit's ``KVPlan`` (``plan.tensors`` is the ``shared_by`` view).

Either returns layer name -> tensor (or a tuple of tensors), as ``_allocate_kv_cache_tensors`` does.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from typing import Any, Callable

from kvaudit.errors import StrategyFailed, UsageError, first_line
from kvaudit.results import KVPlan
from kvaudit.strategies.strategy import RawTensors, Strategy

ENTRY_POINT_GROUP = "kvaudit.strategies"
_SIGNATURES = (("kv_cache_config", "device"), ("kv_cache_config", "device", "kv_transfer"),
               ("plan", "device", "kv_transfer"))


def entry_point_names() -> list[str]:
    """Names registered under the ``kvaudit.strategies`` entry-point group."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})


def from_entry_point(name: str) -> Strategy | None:
    """The plugin registered as ``name``, or ``None`` when no entry point has that name."""
    eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not eps:
        return None
    ep = eps[0]
    try:
        obj = ep.load()
    except Exception as e:  # a broken plugin is reported, never a traceback
        raise StrategyFailed(f"plugin {name!r} (entry point {ep.value}) raised {type(e).__name__} while "
                             f"loading: {first_line(e)}") from None
    return adapt(obj, name, f"entry point {ep.value}")


def from_import_path(path: str) -> Strategy:
    """The plugin named ``module:function`` (``function`` may be dotted)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise UsageError(f"strategy {path!r} is not module:function")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UsageError(f"strategy {path!r}: no module named {e.name!r}") from None
        raise StrategyFailed(f"strategy {path!r}: importing {module_name} failed: {first_line(e)}") from None
    except Exception as e:
        raise StrategyFailed(f"strategy {path!r}: importing {module_name} raised {type(e).__name__}: "
                             f"{first_line(e)}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"strategy {path!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return adapt(obj, path, path)


def adapt(obj: Any, name: str, origin: str) -> Strategy:
    """Turn a plugin object into a ``Strategy``; an unknown signature is exit 3, never a guess."""
    if isinstance(obj, Strategy):
        return obj
    if not callable(obj):
        raise StrategyFailed(f"plugin {name!r} ({origin}) is a {type(obj).__name__}, not a function or Strategy")
    params = _required_params(obj, name, origin)
    if params not in _SIGNATURES:
        known = " or ".join(f"fn({', '.join(s)})" for s in _SIGNATURES)
        raise StrategyFailed(f"plugin {name!r} ({origin}) has an unknown signature fn({', '.join(params)}); "
                             f"kvaudit calls {known}")
    def prepare(plan: KVPlan) -> None:  # vLLM's KVCacheConfig, rebuilt before the meter's window for a saved plan
        _config(obj, plan)

    return Strategy(name=name, title=f"plugin {origin}", platform="cuda", releases=f"plugin {origin}",
                    allocate=_caller(obj, params), prepare=None if params[0] == "plan" else prepare)


def _required_params(fn: Callable, name: str, origin: str) -> tuple[str, ...]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise StrategyFailed(f"plugin {name!r} ({origin}) has no inspectable signature") from None
    names = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is p.empty or p.name == "kv_transfer":
            names.append(p.name)
    return tuple(names)


def _caller(fn: Callable, params: tuple[str, ...]) -> Callable[[KVPlan, Any, bool], RawTensors]:
    def allocate(plan: KVPlan, device: Any, kv_transfer: bool = False) -> RawTensors:
        if params[0] == "plan":
            return fn(plan, device, kv_transfer)
        config = _config(fn, plan)
        if "kv_transfer" in params:
            return fn(config, device, kv_transfer)
        return fn(config, device)

    return allocate


def _config(fn: Callable, plan: KVPlan) -> Any:
    """vLLM's ``KVCacheConfig`` of the plan, for a plugin written against it (rebuilt for a saved plan)."""
    from kvaudit.plan.planfile import vllm_objects

    return vllm_objects(plan, f"a plugin written against vLLM's KVCacheConfig "
                              f"({getattr(fn, '__qualname__', fn)})")[0]
