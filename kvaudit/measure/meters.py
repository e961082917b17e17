"""Memory meters: ``npu`` and ``cuda`` (the device allocator's counters), ``cpu`` (allocations
counted at c10's CPU allocator through the profiler), ``meta`` (accounting only, no memory)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

from kvaudit.errors import MeterUnavailable, UsageError, did_you_mean, first_line
from kvaudit.results import MemoryReading, Snapshot

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # see accounting.py

AUTO_ORDER = ("npu", "cuda", "meta")
"""``--meter auto`` takes the first of these whose probe accepts."""


class Meter(Protocol):
    """What the audit needs from a meter."""

    name: str
    kind: str
    """``device`` (an allocator measured), ``host`` (real CPU allocations) or ``accounting``."""

    def probe(self) -> str | None:
        """``None`` when the meter can measure here, else the reason it cannot."""

    def device(self) -> Any:
        """The torch device strategies allocate on."""

    def describe(self) -> str:
        """One line: what is measured, on what."""

    def free_bytes(self) -> int | None:
        """Memory free for the audit on this meter's device, where it is known."""

    def start(self) -> None:
        """Take the baseline and reset the peak."""

    def stop(self) -> MemoryReading:
        """Read what was allocated since ``start`` (the strategy's tensors are still alive)."""

    def release(self) -> Snapshot | None:
        """Return cached memory after the strategy's tensors were dropped; the device's counters
        afterwards (device meters), for the leak check."""


class MetaMeter:
    """No memory at all: strategies allocate ``meta`` tensors and the meter sums the bytes of the
    distinct storages they created (views never counted twice). Accounting, not a measurement."""

    name = "meta"
    kind = "accounting"

    def __init__(self) -> None:
        self._recorder: Any = None

    def probe(self) -> str | None:  # noqa: D102
        return _torch_missing()

    def device(self) -> Any:  # noqa: D102
        import torch

        return torch.device("meta")

    def describe(self) -> str:  # noqa: D102
        return "meta: accounting of the storages requested (no memory allocated, no device measured)"

    def free_bytes(self) -> int | None:  # noqa: D102
        return None

    def start(self) -> None:  # noqa: D102
        from kvaudit.measure.accounting import StorageRecorder

        self._recorder = StorageRecorder()
        self._recorder.__enter__()

    def stop(self) -> MemoryReading:  # noqa: D102
        rec, self._recorder = self._recorder, None
        rec.__exit__(None, None, None)
        live = rec.live_bytes()
        return MemoryReading(allocated=live, peak=rec.peak, requested=live)

    def release(self) -> Snapshot | None:  # noqa: D102
        return None


class CpuMeter:
    """Real host allocations, counted at c10's CPU allocator: ``torch.profiler`` with
    ``profile_memory=True`` reports every allocation and free, so the net and the peak are exact."""

    name = "cpu"
    kind = "host"
    HOST_FRACTION = 0.8
    """At most this share of the host's available memory may be allocated by one strategy."""

    def __init__(self) -> None:
        self._prof: Any = None

    def probe(self) -> str | None:  # noqa: D102
        return _torch_missing()

    def device(self) -> Any:  # noqa: D102
        import torch

        return torch.device("cpu")

    def describe(self) -> str:  # noqa: D102
        return "cpu: real host allocations counted by torch.profiler's memory events"

    def free_bytes(self) -> int | None:  # noqa: D102
        return int(host_available_bytes() * self.HOST_FRACTION)

    def start(self) -> None:  # noqa: D102
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _native_stderr_silenced():  # kineto prints "profiler_start" lines from C++
            self._prof.__enter__()

    def stop(self) -> MemoryReading:  # noqa: D102
        prof, self._prof = self._prof, None
        with _native_stderr_silenced():
            prof.__exit__(None, None, None)
        events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()
                        if e.self_cpu_memory_usage)
        running = peak = 0
        for _, delta in events:
            running += delta
            peak = max(peak, running)
        return MemoryReading(allocated=running, peak=peak)

    def release(self) -> Snapshot | None:  # noqa: D102
        return None


@dataclass
class DeviceMeter:
    """An accelerator's caching-allocator counters (``torch.cuda`` or ``torch.npu``): allocated,
    reserved and peak bytes, and requested bytes (before rounding) where ``memory_stats`` has them."""

    name: str
    device_type: str
    load_backend: Callable[[], Any]
    """Returns ``torch.cuda`` / ``torch.npu``, or raises with the reason it is unavailable."""
    index: int = 0
    kind: str = "device"

    def __post_init__(self) -> None:
        self._base: tuple[int, int, int | None] | None = None

    def backend(self) -> Any:
        """The ``torch.<device>`` module."""
        return self.load_backend()

    def probe(self) -> str | None:  # noqa: D102
        if (missing := _torch_missing()) is not None:
            return missing
        try:
            b = self.backend()
        except Exception as e:  # the reason the backend cannot load is the answer
            return " ".join(str(e).split()) or type(e).__name__
        if not b.is_available():
            return f"torch.{self.device_type}.is_available() is False"
        if self.index >= b.device_count():
            return f"no {self.device_type} device {self.index} (device_count() = {b.device_count()})"
        return None

    def device(self) -> Any:  # noqa: D102
        import torch

        return torch.device(self.device_type, self.index)

    def describe(self) -> str:  # noqa: D102
        b = self.backend()
        total = b.mem_get_info(self.index)[1]
        return f"{self.name}: {b.get_device_name(self.index)} #{self.index}, {total:,} B total, allocator counters"

    def free_bytes(self) -> int | None:  # noqa: D102
        return int(self.backend().mem_get_info(self.index)[0])

    def _requested(self, b: Any) -> int | None:
        stats = b.memory_stats(self.index)
        v = stats.get("requested_bytes.all.current")
        return int(v) if v is not None else None

    def start(self) -> None:  # noqa: D102
        b = self.backend()
        b.synchronize(self.index)
        b.reset_peak_memory_stats(self.index)
        self._base = (b.memory_allocated(self.index), b.memory_reserved(self.index), self._requested(b))

    def stop(self) -> MemoryReading:  # noqa: D102
        b = self.backend()
        b.synchronize(self.index)
        assert self._base is not None
        alloc0, reserved0, req0 = self._base
        req = self._requested(b)
        return MemoryReading(
            allocated=b.memory_allocated(self.index) - alloc0,
            peak=b.max_memory_allocated(self.index) - alloc0,
            reserved=b.memory_reserved(self.index) - reserved0,
            requested=None if req is None or req0 is None else req - req0,
            before=Snapshot(alloc0, reserved0))

    def release(self) -> Snapshot | None:
        """Collect reference cycles only while the device still holds more than before the audit (a full
        ``gc.collect()`` with vLLM imported takes a few tenths of a second), then return cached memory."""
        b = self.backend()
        b.synchronize(self.index)
        if self._base is None or b.memory_allocated(self.index) > self._base[0]:
            import gc

            gc.collect()  # tensors a strategy's own objects still hold in a cycle
            b.synchronize(self.index)
        b.empty_cache()
        return Snapshot(b.memory_allocated(self.index), b.memory_reserved(self.index))


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for a moment (native libraries' chatter)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _torch_missing() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    return None


def _load_cuda() -> Any:
    import torch

    return torch.cuda


def _load_npu() -> Any:
    if importlib.util.find_spec("torch_npu") is None:
        raise RuntimeError("torch_npu is not installed (Ascend NPUs are measured through torch_npu)")
    import torch

    try:
        importlib.import_module("torch_npu")
    except Exception as e:  # torch_npu without CANN raises ImportError (libhccl.so) or RuntimeError
        raise RuntimeError(f"torch_npu is installed but failed to import: {first_line(e)}") from None
    if not hasattr(torch, "npu"):
        raise RuntimeError("torch_npu imported but registered no torch.npu module")
    return torch.npu


def make_meter(name: str, index: int = 0) -> Meter:
    """A fresh meter by name (``npu``, ``cuda``, ``cpu``, ``meta``)."""
    if name == "npu":
        return DeviceMeter("npu", "npu", _load_npu, index)
    if name == "cuda":
        return DeviceMeter("cuda", "cuda", _load_cuda, index)
    if name == "cpu":
        return CpuMeter()
    if name == "meta":
        return MetaMeter()
    raise UsageError(f"unknown meter {name!r}{did_you_mean(name, ('auto', *METER_NAMES), METER_ALIASES)} "
                     f"(known: auto, {', '.join(METER_NAMES)})")


METER_NAMES = ("npu", "cuda", "cpu", "meta")
METER_ALIASES = {"gpu": "cuda", "nvidia": "cuda", "ascend": "npu", "torch_npu": "npu", "host": "cpu",
                 "dry-run": "meta", "dry": "meta"}
"""What people call the meters (``--meter gpu``)."""


def select_meter(name: str, index: int = 0) -> Meter:
    """The meter to use: by name (refused with exit 3 when unavailable), or ``auto``."""
    if name == "auto":
        for candidate in AUTO_ORDER:
            meter = make_meter(candidate, index)
            if meter.probe() is None:
                return meter
        raise MeterUnavailable("no meter is available: " + "; ".join(
            f"{n}: {make_meter(n, index).probe()}" for n in AUTO_ORDER))
    meter = make_meter(name, index)
    reason = meter.probe()
    if reason is not None:
        raise MeterUnavailable(f"meter {name!r} is unavailable: {reason} (kvaudit meters lists what this host has; "
                               "--meter meta audits without a device)")
    return meter


def host_available_bytes() -> int:
    """Host memory available to new allocations (``MemAvailable``), without psutil if need be."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil  # vLLM depends on it; only reached off Linux

    return int(psutil.virtual_memory().available)


def meter_table(index: int = 0) -> list[tuple[str, bool, str]]:
    """Every meter with whether it is available here and its description or refusal reason."""
    rows = []
    for name in METER_NAMES:
        meter = make_meter(name, index)
        reason = meter.probe()
        rows.append((name, reason is None, meter.describe() if reason is None else reason))
    return rows
