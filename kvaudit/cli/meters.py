"""``kvaudit meters``: every meter, with its availability here or the reason it is not."""

from __future__ import annotations

from typing import Any

from kvaudit.cli.options import PROBE_INDEX
from kvaudit.cli.output import PROBING, step

NAME = "meters"
OPTIONS = (PROBE_INDEX,)
HELP = "List every meter with its availability here or the reason it is not."
DESCRIPTION = None


def run(a: Any) -> int:
    """Print every meter with its availability or refusal reason."""
    with step(PROBING):
        from kvaudit.measure.meters import meter_table

        table = meter_table(a.device_index)
    for name, ok, text in table:
        print(f"{name:5} {'available  ' if ok else 'unavailable'}  {text}")
    return 0
