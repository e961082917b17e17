"""A faithful fake of the ``torch.cuda`` / ``torch.npu`` memory API, driven by real allocations.

While ``recording()`` is active, every new storage an op creates on the fake's device (``cpu``:
real host memory stands in for device memory, so dry runs on ``meta`` are not counted) is a block of
the fake caching allocator: ``memory_allocated`` counts live blocks rounded up to 512 B (the CUDA
caching allocator's ``kMinBlockSize``; torch_npu's NPUCachingAllocator rounds the same way),
``memory_reserved`` counts segments (2 MiB for blocks up to 1 MiB, else the block rounded up to
2 MiB) kept until ``empty_cache``, ``max_memory_allocated`` the peak since
``reset_peak_memory_stats``, and ``memory_stats()["requested_bytes.all.current"]`` the bytes asked
for before rounding. Blocks are freed when their storage dies (checked at every API call). When a
new segment would exceed ``total``, the allocation raises ``torch.OutOfMemoryError`` with
torch_npu's message, as the real allocator does.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import types

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

MiB = 1 << 20


def _format_size(n: int) -> str:
    """As c10's ``format_size`` writes sizes into allocator messages: 2 decimals, the largest unit."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} bytes"


def _round(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class FakeAllocatorBackend:
    """The memory functions of ``torch.cuda``/``torch.npu`` over a simulated caching allocator."""

    def __init__(self, total: int = 64 << 30, name: str = "Ascend910B4 (fake)", count: int = 1,
                 device_type: str = "cpu"):
        self.total, self.name, self.count, self.device_type = total, name, count, device_type
        self.blocks: list[tuple[StorageWeakRef, int, int]] = []  # (ref, requested, rounded)
        self.reserved = 0
        self.peak = 0
        self.calls: list[str] = []

    # -- the simulated allocator ------------------------------------------------------------
    def _prune(self) -> None:
        self.blocks = [b for b in self.blocks if not b[0].expired()]

    def _allocated(self) -> int:
        self._prune()
        return sum(r for _, _, r in self.blocks)

    def note(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if t.device.type != self.device_type or st.nbytes() == 0 or any(
                ref.cdata == st._cdata and not ref.expired() for ref, _, _ in self.blocks):
            return
        n = st.nbytes()
        rounded = _round(n, 512)
        need = 2 * MiB if rounded <= MiB else _round(rounded, 2 * MiB)
        free_in_segments = self.reserved - self._allocated()
        if free_in_segments < rounded:
            if self.reserved + need > self.total:
                gib = _format_size
                raise torch.OutOfMemoryError(
                    f"NPU out of memory. Tried to allocate {gib(n)} (NPU 0; {gib(self.total)} total capacity; "
                    f"{gib(self._allocated())} already allocated; {gib(self._allocated())} current active; "
                    f"{gib(self.total - self.reserved)} free; {gib(self.reserved)} reserved in total by PyTorch) "
                    "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")
            self.reserved += need
        self.blocks.append((StorageWeakRef(st), n, rounded))
        self.peak = max(self.peak, self._allocated())

    @contextlib.contextmanager
    def recording(self):
        backend = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        backend.note(t)
                return out

        with _Mode():
            yield self

    # -- the API the meters call ---------------------------------------------------------------
    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def get_device_name(self, index: int = 0) -> str:
        return self.name

    def synchronize(self, index: int = 0) -> None:
        self.calls.append("synchronize")

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")
        self.reserved = _round(self._allocated(), 2 * MiB) if self._allocated() else 0

    def reset_peak_memory_stats(self, index: int = 0) -> None:
        self.calls.append("reset_peak_memory_stats")
        self.peak = self._allocated()

    def memory_allocated(self, index: int = 0) -> int:
        return self._allocated()

    def max_memory_allocated(self, index: int = 0) -> int:
        self.peak = max(self.peak, self._allocated())
        return self.peak

    def memory_reserved(self, index: int = 0) -> int:
        return self.reserved

    def memory_stats(self, index: int = 0) -> dict:
        self._prune()
        return {"allocated_bytes.all.current": self._allocated(),
                "requested_bytes.all.current": sum(q for _, q, _ in self.blocks),
                "reserved_bytes.all.current": self.reserved}

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        return self.total - self.reserved, self.total


def install_fake_torch_npu(monkeypatch, backend: FakeAllocatorBackend) -> None:
    """Make ``import torch_npu`` succeed and ``torch.npu`` be the fake, as torch_npu does."""
    mod = types.ModuleType("torch_npu")
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    monkeypatch.setitem(sys.modules, "torch_npu", mod)
    monkeypatch.setattr(torch, "npu", backend, raising=False)
