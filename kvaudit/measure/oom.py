"""Out-of-memory errors: recognise them and read the figures torch and torch_npu put in them.

The messages look like (torch_npu, ``torch_npu/csrc/core/npu/NPUCachingAllocator.cpp``: a ``RuntimeError``
ending ``) If reserved memory ...`` up to torch_npu 2.5.1, a ``torch.OutOfMemoryError`` ending ``).If
reserved memory ...`` from 2.6; CUDA before torch 2.1 used the same shape):
``NPU out of memory. Tried to allocate 2.57 GiB (NPU 0; 60.96 GiB total capacity; 57.49 GiB already
allocated; 57.49 GiB current active; 1.96 GiB free; 57.62 GiB reserved in total by PyTorch)``
and (CUDA, torch 2.1+):
``CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which
1.50 GiB is free. ... Of the allocated memory 76.00 GiB is allocated by PyTorch, and 1.10 GiB is
reserved by PyTorch but unallocated.``

In both allocators "Tried to allocate" is the segment the allocator asked the device for
(``get_allocation_size(round_size(request))``: a 2 MiB or 20 MiB pool segment, or the padded request
rounded up to 2 MiB), not the size the code requested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SIZE = r"(?<![0-9.])([0-9]{1,18}(?:\.[0-9]{1,18})?) ?([KMGT]i?B|bytes|B)"
"""A size as the allocators print it (a longer digit run is no size: it would overflow a float)."""
_UNITS = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}
_PATTERNS = {
    "tried": [rf"Tried to allocate {_SIZE}"],
    "total": [rf"{_SIZE} total capacity", rf"total capac(?:i)?ty of {_SIZE}"],  # torch 2.1 printed "capacty"
    "free": [rf"{_SIZE} free\b", rf"of which {_SIZE} is free"],
    "allocated": [rf"{_SIZE} already allocated", rf"{_SIZE} is allocated by PyTorch"],
    "reserved": [rf"{_SIZE} reserved in total by PyTorch"],
    "unallocated": [rf"{_SIZE} is reserved by PyTorch but unallocated"],
    "this_process": [rf"this process has {_SIZE} memory in use"],
}
"""torch 2.1+ (c10/cuda/CUDACachingAllocator.cpp) prints what PyTorch reserved as allocated plus "reserved by PyTorch
but unallocated", and, where the process can see itself, "Including non-PyTorch memory, this process has X memory in
use"."""


@dataclass(frozen=True)
class OomMessage:
    """The figures of one out-of-memory message (bytes; ``None`` where the message lacks one)."""

    device: str | None
    """``NPU 0``, ``GPU 0``, or ``None``."""
    tried: int | None
    total: int | None
    free: int | None
    allocated: int | None
    reserved: int | None
    unallocated: int | None = None
    """torch 2.1+: reserved by PyTorch but not allocated."""
    this_process: int | None = None
    """torch 2.1+: all this process holds on the device, non-PyTorch memory included."""
    processes: tuple[int, ...] = ()
    """torch 2.1+: what each process the driver lists holds ("Process 25252 has 18.65 GiB memory in use"), this one
    among them where torch cannot tell its own (a container's PID namespace)."""

    @property
    def torch_reserved(self) -> int | None:
        """What this process's PyTorch reserved."""
        if self.reserved is not None:
            return self.reserved
        if self.allocated is not None and self.unallocated is not None:
            return self.allocated + self.unallocated
        return None

    @property
    def held_here(self) -> int | None:
        """What this process holds: its own figure where printed; else, of the processes listed, the smallest that
        holds at least what its PyTorch reserved (one process listed alone is this one); else what PyTorch reserved."""
        if self.this_process is not None:
            return self.this_process
        reserved = self.torch_reserved
        mine = [p for p in self.processes if reserved is None or p >= reserved]
        if mine and (len(self.processes) == 1 or reserved is not None):
            return min(mine)
        return reserved

    @property
    def held_outside(self) -> int | None:
        """Device memory held by neither this process nor free when it ran out: total − ``held_here`` − free
        (``None`` where the message lacks one of them)."""
        if None in (self.total, self.held_here, self.free):
            return None
        return self.total - self.held_here - self.free  # type: ignore[operator]


def _size(number: str, unit: str) -> int:
    return int(round(float(number) * _UNITS[unit]))


def parse_oom(text: str) -> OomMessage | None:
    """The figures of an out-of-memory message, or ``None`` when ``text`` is not one."""
    if "out of memory" not in text.lower():
        return None
    found: dict[str, int | None] = {}
    for key, patterns in _PATTERNS.items():
        found[key] = None
        for p in patterns:
            m = re.search(p, text)
            if m:
                found[key] = _size(m.group(1), m.group(2))
                break
    dev = re.search(r"\b(NPU|GPU) ?(\d+)\b", text)
    processes = tuple(_size(m.group(1), m.group(2)) for m in re.finditer(rf"Process \d{{1,18}} has {_SIZE} memory in use",
                                                                          text))
    return OomMessage(device=f"{dev.group(1)} {dev.group(2)}" if dev else None, **found, processes=processes)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether an exception is an allocator running out of memory (device or host)."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError, torch.cuda's alias
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
