"""Strategy names to strategies, in one place: the built-ins, ``installed``, ``vllm-ascend==X``,
``vllm-ascend=PATH``, ``module:function`` and the ``kvaudit.strategies`` entry points."""

from __future__ import annotations

from kvaudit.errors import KvauditError, MissingDependency, NotAuditable, StrategyFailed, UsageError, did_you_mean
from kvaudit.strategies import plugins
from kvaudit.strategies.builtin import STRATEGIES
from kvaudit.strategies.installed import installed_strategy
from kvaudit.strategies.releases import checkout_strategy, release_strategy
from kvaudit.strategies.strategy import Strategy


def resolve_strategies(names: list[str]) -> tuple[list[Strategy], list[tuple[str, str]]]:
    """Each named strategy on its own: those that resolve, and ``(name, reason)`` for each whose code cannot be had
    or loaded (a release that cannot be fetched, a plugin that raises on import: not audited, exit 3), so that
    one broken strategy does not stop the others. An unknown name is still a usage error (exit 2); when none
    resolves, the first one's error stands. A name given twice is a usage error, as in a policy."""
    seen: set[str] = set()
    for name in names:  # (before any is resolved: 20,000 repeats of one name took 202 s)
        if name in seen:
            raise UsageError(f"-s {name} is given twice: name each strategy once")
        seen.add(name)
    got: list[Strategy] = []
    broken: list[tuple[str, str]] = []
    first: KvauditError | None = None
    for name in names:
        try:
            got.append(resolve_strategy(name))
        except (StrategyFailed, NotAuditable, MissingDependency) as e:
            broken.append((name, e.message))
            first = first or e
    if not got and first is not None:
        raise first
    return got, broken


def resolve_strategy(name: str) -> Strategy:
    """A strategy by name: built-in, ``installed``, ``vllm-ascend==X``, ``module:function``, or an
    entry point of the ``kvaudit.strategies`` group. An unknown name is a usage error (exit 2)."""
    if name in STRATEGIES:
        return STRATEGIES[name]
    if name == "installed":
        return installed_strategy()
    if name.startswith("vllm-ascend=="):
        return release_strategy(name.partition("==")[2])
    if name.startswith("vllm-ascend="):
        return checkout_strategy(name.partition("=")[2])
    if ":" in name:
        return plugins.from_import_path(name)
    found = plugins.from_entry_point(name)
    if found is not None:
        return found
    extra = plugins.entry_point_names()
    raise UsageError(f"unknown strategy {name!r}{did_you_mean(name, (*STRATEGIES, 'installed'))} "
                     f"(known: {', '.join(STRATEGIES)}, installed, vllm-ascend==VERSION, "
                     "vllm-ascend=PATH, "
                     f"module:function{', ' + ', '.join(extra) if extra else ''})")
