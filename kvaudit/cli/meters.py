"""``kvaudit meters``: every meter, with its availability here or the reason it is not."""

from __future__ import annotations

from typing import Any

from kvaudit.cli.options import PROBE_INDEX

NAME = "meters"
OPTIONS = (PROBE_INDEX,)
HELP = "List every meter with its availability here or the reason it is not."
DESCRIPTION = None


def run(a: Any) -> int:
    """Print every meter with its availability or refusal reason."""
    from kvaudit.measure.meters import meter_table

    for name, ok, text in meter_table(a.device_index):
        print(f"{name:5} {'available  ' if ok else 'unavailable'}  {text}")
    return 0
