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
MAX_BYTES = 1 << 50
"""The largest byte figure kvaudit takes (1 PiB): device memory, weights, budgets and planned tensors alike.
The largest accelerator memory today is a few hundred GiB; beyond this a figure describes no device."""

_SIZE = re.compile(r"^\s*([0-9]{0,30}\.?[0-9]{1,30}(?:[eE][+-]?[0-9]{1,4})?)\s*([a-zA-Z]{0,3})\s*$")


def parse_size(text: str | int | float, what: str = "size", allow_zero: bool = False) -> int:
    """Parse a byte size such as ``65452113920``, ``60.96GiB`` or ``2 GB``; must be > 0 (or >= 0) and at most
    ``MAX_BYTES``."""
    if isinstance(text, bool):
        raise UsageError(f"{what} {text!r} is not a size (examples: 65452113920, 60.96GiB, 512MiB)")
    if isinstance(text, int) and not -MAX_BYTES <= text <= MAX_BYTES:  # (beyond what a float holds, too)
        value, unit = float("-inf" if text < 0 else "inf"), ""
    elif isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        m = _SIZE.match(str(text)[:100])
        if not m:
            if str(text).strip().startswith("-"):
                raise UsageError(f"{what} must be positive, got {text!r}")
            raise UsageError(f"{what} {text!r} is not a size (examples: 65452113920, 60.96GiB, 512MiB)")
        value, unit = float(m.group(1)), m.group(2).lower()
        if unit not in _UNITS:
            raise UsageError(f"{what} {text!r} has an unknown unit {m.group(2)!r} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    scaled = value * _UNITS[unit]
    if scaled != scaled:  # NaN
        raise UsageError(f"{what} {text!r} is not a size (examples: 65452113920, 60.96GiB, 512MiB)")
    if scaled < 0:
        raise UsageError(f"{what} must be positive, got {text!r}")
    if scaled > MAX_BYTES:  # inf, 1e309, or simply more than any device has
        raise UsageError(f"{what} {text!r} is more than kvaudit takes (1 PiB, {MAX_BYTES:,} B)")
    nbytes = int(round(scaled))
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
