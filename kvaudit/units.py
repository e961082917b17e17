"""Byte sizes: parse what users type (``60.96GiB``, ``512MiB``, ``65452113920``) and format bytes."""

from __future__ import annotations

import re

from kvaudit.errors import UsageError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": KiB,
    "m": 1000**2, "mb": 1000**2, "mib": MiB,
    "g": 1000**3, "gb": 1000**3, "gib": GiB,
    "t": 1000**4, "tb": 1000**4, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float, what: str = "size", allow_zero: bool = False) -> int:
    """Parse a byte size such as ``65452113920``, ``60.96GiB`` or ``2 GB``; must be > 0 (or >= 0)."""
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        m = _SIZE.match(str(text))
        if not m:
            if str(text).strip().startswith("-"):
                raise UsageError(f"{what} must be positive, got {text!r}")
            raise UsageError(f"{what} {text!r} is not a size (examples: 65452113920, 60.96GiB, 512MiB)")
        value, unit = float(m.group(1)), m.group(2).lower()
        if unit not in _UNITS:
            raise UsageError(f"{what} {text!r} has an unknown unit {m.group(2)!r} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    nbytes = int(round(value * _UNITS[unit]))
    if nbytes < 0 or (nbytes == 0 and not allow_zero):
        raise UsageError(f"{what} must be positive, got {text!r}")
    return nbytes


def fmt_bytes(n: int | float, signed: bool = False) -> str:
    """Format bytes in binary units with two decimals (``3.42 GiB``); exact bytes below 1 KiB."""
    sign = "-" if n < 0 else ("+" if signed and n > 0 else "")
    a = abs(n)
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if a >= size:
            return f"{sign}{a / size:.2f} {unit}"
    return f"{sign}{int(a)} B"
