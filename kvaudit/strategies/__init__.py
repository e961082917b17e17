"""Stage 3, the strategies: the strategy type (``strategy``; ``Strategy``, ``KVBudget`` and ``RawTensors`` are
re-exported here for plugin authors), the built-ins (``builtin``), each published vllm-ascend release's own code
(``releases``, run by ``runner_code``), the installed code (``installed``), third-party plugins (``plugins``),
and strategy names resolved in one place (``resolve``).

Imports the model and plan stages below it."""

from kvaudit.plan.planner import KVBudget
from kvaudit.strategies.strategy import RawTensors, Strategy

__all__ = ["builtin", "plugins", "releases", "resolve", "runner_code", "strategy",
           "KVBudget", "RawTensors", "Strategy"]
