"""Stage 4, the measurement: a strategy run under a memory meter (``meters``) against vLLM's plan, its storages
attributed to layers (``accounting``), a device out-of-memory read as a finding (``oom``), the verdict
(``audit``), and the highest utilization that still fits, which runs dry-run audits (``utilization``).

Imports the model, plan and strategies stages below it."""

__all__ = ["audit", "meters", "oom", "utilization"]
