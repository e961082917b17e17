"""``kvaudit meters``: every meter, with its availability here or the reason it is not."""

from __future__ import annotations

from typing import Any

from kvaudit.cli.options import PROBE_INDEX
from kvaudit.cli.output import PROBING, show, step

NAME = "meters"
OPTIONS = (PROBE_INDEX,)
HELP = "List every meter with its availability here or the reason it is not."
DESCRIPTION = None


def run(a: Any) -> int:
    """Print every meter with its availability or refusal reason."""
    with step(PROBING):
        from kvaudit.measure.meters import meter_table

        table = meter_table(a.device_index)
    from rich.table import Table

    out = Table(title="kvaudit's meters on this host (--meter NAME; auto takes npu, then cuda, then meta)",
                title_justify="left")
    for column in ("meter", "here", "what it measures, or why it cannot"):
        out.add_column(column, overflow="fold")
    for name, ok, text in table:
        out.add_row(name, "available" if ok else "unavailable", text)
    show([out])
    return 0
