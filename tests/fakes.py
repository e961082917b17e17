"""A fake of the ``torch.npu`` / ``torch.cuda`` memory API whose allocator is torch_npu's (or c10's CUDA) caching allocator.

While ``recording()`` is active, every new storage an op creates on the fake's device (``cpu``: real
host memory stands in for device memory, so dry runs on ``meta`` are not counted) is an allocation
of a simulated caching allocator that follows ``NPUCachingAllocator.cpp`` of torch_npu
(github.com/Ascend/pytorch, ``torch_npu/csrc/core/npu/NPUCachingAllocator.cpp``) and, with
``flavor="cuda"``, c10's ``c10/cuda/CUDACachingAllocator.cpp``:

- ``round_size``: torch_npu adds 32 bytes to every request first (``AddPadSize``; 0 only on Ascend950
  with CANN 9.1+), then rounds up to ``kMinBlockSize`` = 512 B; CUDA rounds without the pad. So 1000 B
  takes 1536 B on an NPU and 1024 B on a GPU, and exactly 1 MiB goes to the NPU's large pool.
- pools: a rounded size up to ``kSmallSize`` (1 MiB) is served from the small pool, whose segments are
  ``kSmallBuffer`` (2 MiB); larger sizes from the large pool: a segment of ``kLargeBuffer`` (20 MiB) below
  ``kMinLargeAlloc`` (10 MiB), else the size rounded up to ``kRoundLarge`` (2 MiB) (``get_allocation_size``).
- a free block is found best-fit in its pool and split when the rest is worth keeping (small pool:
  at least 512 B; large pool: more than 1 MiB, else the whole block is handed out); freed blocks merge
  with free neighbours; ``empty_cache`` releases only segments that are entirely free.
- out of memory: when a new segment does not fit (the device, or the cap
  ``set_per_process_memory_fraction`` sets), the allocator frees its cached segments and tries once
  more (``num_alloc_retries``), then raises ``torch.OutOfMemoryError`` (``num_ooms``). "Tried to allocate"
  is the *segment* size (``alloc_size``), not the request. torch_npu's message (2.6+; up to 2.5.1 it was a
  ``RuntimeError`` with ``) If``): ``NPU out of memory. Tried to allocate 20.00 MiB (NPU 0; 1.00 GiB total
  capacity; ... already allocated; ... current active; ... free; ... reserved in total by PyTorch).If
  reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.``; CUDA's:
  ``CUDA out of memory. Tried to allocate X. GPU 0 has a total capacity of T of which F is free. ...``
- counters, as ``memory_stats()`` flattens them: ``allocated_bytes`` (block sizes: rounding and unsplit
  remainders included; ``memory_allocated``), ``requested_bytes`` (the sizes asked for, before the pad
  and the rounding), ``reserved_bytes`` (segments; ``memory_reserved``), ``active_bytes``,
  ``inactive_split_bytes``, ``allocation``, ``segment``, ``active``, ``inactive_split``, each
  ``.all/.small_pool/.large_pool`` with ``.current/.peak/.allocated/.freed``; ``num_alloc_retries``,
  ``num_ooms``. ``max_memory_allocated`` is ``allocated_bytes.all.peak``.

Blocks are freed when their storage dies (checked at every API call and allocation).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import types
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

MiB = 1 << 20
K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 * MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
NPU_PAD = 32
"""torch_npu's ``AddPadSize()``: 32 bytes added to every request before rounding."""


def format_size(n: int) -> str:
    """c10's / torch_npu's ``format_size``: bytes up to 1 KiB, then KiB, MiB, GiB with 2 decimals."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1 << 20:
        return f"{n / 1024:.2f} KiB"
    if n <= 1 << 30:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


def round_size(n: int, pad: int) -> int:
    """``round_size``: the pad, then up to a multiple of 512 B (power-of-two divisions are off by default)."""
    n += pad
    return K_MIN_BLOCK_SIZE if n < K_MIN_BLOCK_SIZE else -(-n // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(rounded: int) -> int:
    """``get_allocation_size``: the segment reserved from the device for a rounded request."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-rounded // K_ROUND_LARGE) * K_ROUND_LARGE


@dataclass(eq=False)
class _Block:
    offset: int
    size: int
    requested: int = 0
    ref: StorageWeakRef | None = None

    @property
    def used(self) -> bool:
        return self.ref is not None


@dataclass(eq=False)
class _Segment:
    size: int
    small: bool
    blocks: list[_Block] = field(default_factory=list)


_STATS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
          "inactive_split_bytes", "requested_bytes")


class FakeAllocatorBackend:
    """The memory functions of ``torch.npu`` (``flavor="npu"``) or ``torch.cuda`` (``"cuda"``) over a
    simulated caching allocator of that flavour (see the module docstring)."""

    def __init__(self, total: int = 64 << 30, name: str = "Ascend910B4 (fake)", count: int = 1,
                 device_type: str = "cpu", flavor: str = "npu"):
        self.total, self.name, self.count, self.device_type, self.flavor = total, name, count, device_type, flavor
        self.pad = NPU_PAD if flavor == "npu" else 0
        self.segments: list[_Segment] = []
        self.peaks: dict[str, int] = {}
        self.cumulative: dict[str, list[int]] = {}  # stat -> [allocated, freed] over the process
        self.fraction: float | None = None
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.calls: list[str] = []

    # -- the simulated allocator ------------------------------------------------------------
    def _used(self, small: bool | None = None) -> list[_Block]:
        return [b for s in self.segments if small is None or s.small == small for b in s.blocks if b.used]

    def _current(self, small: bool | None = None) -> dict[str, int]:
        segs = [s for s in self.segments if small is None or s.small == small]
        used = [b for s in segs for b in s.blocks if b.used]
        split_free = [b for s in segs if len(s.blocks) > 1 for b in s.blocks if not b.used]
        return {"allocation": len(used), "segment": len(segs), "active": len(used),
                "inactive_split": len(split_free), "allocated_bytes": sum(b.size for b in used),
                "reserved_bytes": sum(s.size for s in segs), "active_bytes": sum(b.size for b in used),
                "inactive_split_bytes": sum(b.size for b in split_free),
                "requested_bytes": sum(b.requested for b in used)}

    def _count(self, stat: str, pool: str, delta: int) -> None:
        for key in (f"{stat}.all", f"{stat}.{pool}"):
            c = self.cumulative.setdefault(key, [0, 0])
            c[0 if delta > 0 else 1] += abs(delta)

    def _update_peaks(self) -> None:
        for pool, small in (("all", None), ("small_pool", True), ("large_pool", False)):
            for stat, v in self._current(small).items():
                key = f"{stat}.{pool}"
                self.peaks[key] = max(self.peaks.get(key, 0), v)

    def _free(self, seg: _Segment, block: _Block) -> None:
        pool = "small_pool" if seg.small else "large_pool"
        self._count("allocation", pool, -1)
        self._count("allocated_bytes", pool, -block.size)
        self._count("requested_bytes", pool, -block.requested)
        block.ref, block.requested = None, 0
        i = seg.blocks.index(block)
        if i + 1 < len(seg.blocks) and not seg.blocks[i + 1].used:  # merge with the free neighbours
            block.size += seg.blocks.pop(i + 1).size
        if i > 0 and not seg.blocks[i - 1].used:
            prev = seg.blocks[i - 1]
            prev.size += block.size
            seg.blocks.pop(i)

    def _prune(self) -> None:
        for seg in self.segments:
            for b in list(seg.blocks):
                if b.used and b.ref.expired():
                    self._free(seg, b)

    def _release_free_segments(self) -> None:
        """``release_cached_blocks``: give back every segment that is one free block."""
        for seg in [s for s in self.segments if len(s.blocks) == 1 and not s.blocks[0].used]:
            self.segments.remove(seg)
            self._count("segment", "small_pool" if seg.small else "large_pool", -1)
            self._count("reserved_bytes", "small_pool" if seg.small else "large_pool", -seg.size)

    def _reserved(self) -> int:
        return sum(s.size for s in self.segments)

    def _limit(self) -> int:
        """The device's memory, or the cap ``set_per_process_memory_fraction`` put on this process."""
        return self.total if self.fraction is None else int(self.fraction * self.total)

    def _out_of_memory(self, alloc_size: int) -> torch.OutOfMemoryError:
        cur = self._current()
        free = self.total - self._reserved()
        fs = format_size
        if self.flavor == "npu":
            allowed = f"{fs(self._limit())} allowed; " if self.fraction is not None else ""
            return torch.OutOfMemoryError(
                f"NPU out of memory. Tried to allocate {fs(alloc_size)} (NPU 0; {fs(self.total)} total capacity; "
                f"{fs(cur['allocated_bytes'])} already allocated; {fs(cur['active_bytes'])} current active; "
                f"{fs(free)} free; {allowed}{fs(cur['reserved_bytes'])} reserved in total by PyTorch).If reserved memory is "
                ">> allocated memory try setting max_split_size_mb to avoid fragmentation.")
        return torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {fs(alloc_size)}. GPU 0 has a total capacity of {fs(self.total)} "
            f"of which {fs(free)} is free. Including non-PyTorch memory, this process has {fs(cur['reserved_bytes'])} "
            f"memory in use. Of the allocated memory {fs(cur['allocated_bytes'])} is allocated by PyTorch, and "
            f"{fs(cur['reserved_bytes'] - cur['allocated_bytes'])} is reserved by PyTorch but unallocated. If reserved "
            "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.  See documentation for Memory Management  "
            "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")

    def malloc(self, n: int, ref: StorageWeakRef) -> None:
        """Serve a request of ``n`` bytes as the caching allocator does, or raise its out-of-memory error."""
        self._prune()
        rounded = round_size(n, self.pad)
        small = rounded <= K_SMALL_SIZE
        pool = "small_pool" if small else "large_pool"
        fits = [(b.size, i, b) for i, s in enumerate(self.segments) if s.small == small
                for b in s.blocks if not b.used and b.size >= rounded]
        if fits:
            _, i, block = min(fits, key=lambda f: (f[0], f[1], f[2].offset))
            seg = self.segments[i]
        else:
            alloc_size = allocation_size(rounded)
            if self._reserved() + alloc_size > self._limit():
                self.num_alloc_retries += 1
                self._release_free_segments()
                if self._reserved() + alloc_size > self._limit():
                    self.num_ooms += 1
                    raise self._out_of_memory(alloc_size)
            block = _Block(0, alloc_size)
            seg = _Segment(alloc_size, small, [block])
            self.segments.append(seg)
            self._count("segment", pool, 1)
            self._count("reserved_bytes", pool, alloc_size)
        rest = block.size - rounded
        if (small and rest >= K_MIN_BLOCK_SIZE) or (not small and rest > K_SMALL_SIZE):
            seg.blocks.insert(seg.blocks.index(block) + 1, _Block(block.offset + rounded, rest))
            block.size = rounded
        block.requested, block.ref = n, ref
        self._count("allocation", pool, 1)
        self._count("allocated_bytes", pool, block.size)
        self._count("requested_bytes", pool, n)
        self._update_peaks()

    def note(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if t.device.type != self.device_type or st.nbytes() == 0:
            return
        if any(b.ref.cdata == st._cdata and not b.ref.expired() for b in self._used()):
            return
        self.malloc(st.nbytes(), StorageWeakRef(st))

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
        self._prune()
        self._release_free_segments()

    def reset_peak_memory_stats(self, index: int = 0) -> None:
        self.calls.append("reset_peak_memory_stats")
        self._prune()
        self.peaks = {}
        self._update_peaks()

    def memory_stats(self, index: int = 0) -> dict:
        self._prune()
        self._update_peaks()
        out: dict[str, int] = {}
        for pool, small in (("all", None), ("small_pool", True), ("large_pool", False)):
            for stat, v in self._current(small).items():
                key = f"{stat}.{pool}"
                done = self.cumulative.get(key, [0, 0])
                out.update({f"{key}.current": v, f"{key}.peak": self.peaks.get(key, v),
                            f"{key}.allocated": done[0], f"{key}.freed": done[1]})
        out.update(num_alloc_retries=self.num_alloc_retries, num_ooms=self.num_ooms)
        return out

    def memory_allocated(self, index: int = 0) -> int:
        return self.memory_stats(index)["allocated_bytes.all.current"]

    def max_memory_allocated(self, index: int = 0) -> int:
        return self.memory_stats(index)["allocated_bytes.all.peak"]

    def memory_reserved(self, index: int = 0) -> int:
        return self.memory_stats(index)["reserved_bytes.all.current"]

    def set_per_process_memory_fraction(self, fraction: float, index: int = 0) -> None:
        """Cap what this process may reserve at ``fraction`` of the device (``None`` after 1.0 lifts it)."""
        self.fraction = None if fraction >= 1.0 else fraction

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        self._prune()
        return self.total - self._reserved(), self.total


def install_fake_torch_npu(monkeypatch, backend: FakeAllocatorBackend) -> None:
    """Make ``import torch_npu`` succeed and ``torch.npu`` be the fake, as torch_npu does."""
    mod = types.ModuleType("torch_npu")
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    monkeypatch.setitem(sys.modules, "torch_npu", mod)
    monkeypatch.setattr(torch, "npu", backend, raising=False)
