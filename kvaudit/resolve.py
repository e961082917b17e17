"""Strategy names to strategies, in one place: the built-ins, ``installed``, ``vllm-ascend==X``,
``vllm-ascend=PATH``, ``module:function`` and the ``kvaudit.strategies`` entry points."""

from __future__ import annotations

from kvaudit import plugins
from kvaudit.errors import UsageError
from kvaudit.installed import installed_strategy
from kvaudit.releases import checkout_strategy, release_strategy
from kvaudit.strategies import STRATEGIES
from kvaudit.strategy import Strategy


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
    raise UsageError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)}, installed, vllm-ascend==VERSION, "
                     "vllm-ascend=PATH, "
                     f"module:function{', ' + ', '.join(extra) if extra else ''})")
