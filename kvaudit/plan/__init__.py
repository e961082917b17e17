"""Stage 2, the plan: vLLM's own KV-cache planner driven for a deployment (``planner``: ``KVPlan``, the platform
rules, ``KVBudget``), what a plan holds as vLLM logs it (``capacity``), and plans saved as data (``planfile``).

Imports the model stage below it, never a strategy, a meter or a report."""

__all__ = ["capacity", "planfile", "planner"]
