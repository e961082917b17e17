"""``kvaudit models``: the shipped presets with the layer mix vLLM's own model code registers for each."""

from __future__ import annotations

from typing import Any

from kvaudit.cli.options import NAMES
from kvaudit.cli.output import PRESETS_BUILT, show, step
from kvaudit.errors import ConfigError
from kvaudit.model.deployment import PRESETS
from kvaudit.model.memory import default_gpu_memory_utilization

NAME = "models"
OPTIONS = (NAMES,)
HELP = "List the shipped presets with their layer mix (as vLLM's model code builds it)."
DESCRIPTION = "List the presets: title, architecture, layer mix per kind, deployment, config."


def run(a: Any) -> int:
    """List the presets with the layer mix vLLM's own model code registers for each."""
    from rich.table import Table

    rows: list[tuple[str, ...]] = []
    with step(PRESETS_BUILT):
        _rows(a, rows)
    table = Table(title="kvaudit's presets: each one's layers as vLLM's model code builds them", title_justify="left")
    for column in ("preset", "model", "architecture", "layers (KV-cache kinds)", "deployment"):
        table.add_column(column, overflow="fold")
    for name, title, architecture, mix, deployment, _config, why in rows:
        table.add_row(name, title, architecture, mix + why, deployment)
    show([table])
    return 0


def _rows(a: Any, rows: list) -> None:
    """Each preset the options name: its title, architecture, layer mix, deployment, config, and why not built."""
    from kvaudit.model.deployment import load_preset_spec
    from kvaudit.plan.planner import layer_mix, make_deployment

    for name, p in PRESETS.items():
        if a.names and name not in a.names:
            continue
        spec = load_preset_spec(p)
        try:  # the layer mix needs vLLM's model for the rank, not a KV budget (kimi-k2 has none at 0.9): one given
            d = make_deployment(spec, tp=p.tp, max_model_len=p.max_model_len,
                                gpu_memory_utilization=default_gpu_memory_utilization(None), device=p.device,
                                kv_cache_memory_bytes=1 << 30)
            architecture, mix, why = d.architecture, layer_mix(d), ""
        except ConfigError as e:  # a model this vLLM cannot build here: its row says why, the others still list
            architecture, mix, why = spec.architecture or "?", "—", f"  (not built here: {e.message})"
        rows.append((name, p.title, architecture, mix, f"TP {p.tp}, {p.device}", p.config, why))
