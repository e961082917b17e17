"""Device memory as the device's own tools print it: ``nvidia-smi``'s table, its CSV queries
(``--query-compute-apps=pid,process_name,used_memory --format=csv``, ``--query-gpu=index,name,memory.used,memory.total
--format=csv``) and ``npu-smi info``; read a line at a time (``read_line``: what a paste holds around the table is left
out; triage reads reports so) and whole (``read_smi``: each device with its processes, for ``kvaudit live``).

The layouts are those the tools print across driver releases (nvidia-smi's process row with its ``GI CI`` columns,
its PID column 9 or 16 wide; npu-smi's chip row ``used/ total`` HBM, its process table's ``NPU Chip`` columns),
as real tables pasted in public threads and repositories show them (``fixtures/live/smi/SOURCES.md``).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

from kvaudit.errors import UsageError

NPU_SMI_CHIP = re.compile(
    r"^\|\s*\d+(?:\s+\d+)?\s*\|\s*[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*\|\s*\d+\s+\d+\s*/\s*\d+\s+"
    r"(?P<used>\d{1,18})\s*/\s*(?P<total>\d{1,18})\s*\|")
"""npu-smi's chip row: chip (and phy id), bus id, AICore %, memory used / total, then HBM used / total (MB)."""
NPU_SMI_NAME = re.compile(r"^\|\s*(?P<npu>\d{1,18})\s+(?P<name>(?:Ascend)?\w+)\s*\|\s*(?:OK|Warning|Alarm|Critical|\w+)\s*\|")
"""npu-smi's device row: NPU index, name (``910B4``, ``Ascend910``), health."""
NPU_SMI_PROCESS = re.compile(r"^\|\s*(?P<npu>\d{1,18})\s+\d+\s*\|\s*(?P<pid>\d{1,18})\s*\|\s*(?P<name>\S+)\s*\|\s*"
                             r"(?P<mb>\d{1,18})\s*\|")
"""npu-smi's process row: NPU and chip, pid, name (cut to 15 characters), memory (MB)."""
NVIDIA_PROCESS = re.compile(r"^\|\s*(?P<gpu>\d{1,18})\s+\S+\s+\S+\s+(?P<pid>\d{1,18})\s+(?:C\+G|[CG])\s+"
                            r"(?P<name>\S+)\s+(?P<mb>\d{1,18})MiB\s*\|")
"""nvidia-smi's process row: GPU, GI and CI (``N/A`` without MIG), pid, type, name, memory (MiB)."""
NVIDIA_TEMP_POWER = re.compile(r"(?<!\d)\d{1,3}C\s+P\d{1,2}(?!\d)")
NVIDIA_USAGE = re.compile(r"^\s*(?P<used>\d{1,9})MiB\s*/\s*(?P<total>\d{1,9})MiB\s*$")
"""nvidia-smi's device row, cell by cell (``|  30%  35C  P0  70W / 300W |  1234MiB / 81920MiB |``): the usage
cell after one holding the temperature and performance state."""
NVIDIA_NAME = re.compile(r"^\|\s+(?P<gpu>\d{1,18})\s+(?P<name>NVIDIA .+?|Tesla .+?)\s+(?:On|Off)\s+\|")
_CSV_FIELDS = {"pid": "pid", "process_name": "name", "used_gpu_memory": "mb", "used_memory": "mb", "index": "gpu",
               "name": "device_name", "memory.used": "used", "memory.total": "total", "gpu_bus_id": "bus",
               "pci.bus_id": "bus"}
"""nvidia-smi's CSV header names (``--format=csv`` writes each query field, ``used_gpu_memory [MiB]`` for the
``used_memory`` asked) and what each column is here."""


@dataclass(frozen=True)
class SmiProcess:
    """A process holding device memory, as the tool's process table lists it."""

    device: int | None
    """The device index (nvidia-smi's GPU, npu-smi's NPU); ``None`` where the table does not say (a CSV of
    compute apps without ``gpu_bus_id``)."""
    pid: int
    name: str
    used_mb: int
    line: int


@dataclass(frozen=True)
class SmiDevice:
    """One device: its index, name and memory used of total (MiB for nvidia-smi, MB for npu-smi: both 2^20 bytes)."""

    index: int
    name: str | None = None
    used_mb: int | None = None
    total_mb: int | None = None
    line: int = 0


@dataclass(frozen=True)
class SmiReading:
    """A smi output read whole: the tool, each device, and each process with the device it holds memory on."""

    tool: str
    """``nvidia-smi`` or ``npu-smi``."""
    devices: tuple[SmiDevice, ...] = ()
    processes: tuple[SmiProcess, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def platform(self) -> str:
        """``cuda`` or ``ascend``."""
        return "ascend" if self.tool == "npu-smi" else "cuda"

    def device(self, index: int | None) -> SmiDevice | None:
        return next((d for d in self.devices if d.index == index), None)


def read_line(line: str) -> list[tuple[str, object]]:
    """What one line of a smi table states, on its own: ``("process", (device, pid, name, MiB))``, ``("device_name",
    (index, name, platform))`` or ``("usage", (used, total))`` (a usage row does not name its device: the device row
    above it does); nothing for any other line. A paste's indent (a Markdown list's) is left out."""
    line = line.lstrip()
    if m := NPU_SMI_PROCESS.search(line):
        return [("process", (int(m["npu"]), int(m["pid"]), m["name"], int(m["mb"])))]
    if m := NVIDIA_PROCESS.search(line):
        return [("process", (int(m["gpu"]), int(m["pid"]), m["name"], int(m["mb"])))]
    if m := NPU_SMI_NAME.search(line):
        return [("device_name", (int(m["npu"]), m["name"], "ascend"))]
    if m := NPU_SMI_CHIP.search(line):
        return [("usage", (int(m["used"]), int(m["total"])))]
    if m := NVIDIA_NAME.search(line):
        return [("device_name", (int(m["gpu"]), m["name"].strip(), "cuda"))]
    cells = line.split("|")
    for before, cell in zip(cells, cells[1:]):
        if "MiB" in cell and (m := NVIDIA_USAGE.match(cell)) and NVIDIA_TEMP_POWER.search(before):
            return [("usage", (int(m["used"]), int(m["total"])))]
    return []


def read_smi(text: str, source: str = "the smi output") -> SmiReading:
    """Every device and process of an ``nvidia-smi`` / ``npu-smi info`` table, or of nvidia-smi's CSV queries, in
    ``text`` (other lines around them are left out); text with neither is a one-line ``UsageError``."""
    if _csv_header(text) is not None:
        return _read_csv(text, source)
    devices: dict[int, dict] = {}
    processes: list[SmiProcess] = []
    tool, last = None, None
    for n, line in enumerate(text.splitlines(), 1):
        for kind, value in read_line(line):
            if kind == "device_name":
                index, name, platform = value
                tool = tool or ("npu-smi" if platform == "ascend" else "nvidia-smi")
                devices[index] = {"index": index, "name": name, "line": n}
                last = index
            elif kind == "usage" and last is not None:
                devices[last].update(used_mb=value[0], total_mb=value[1], line=n)
            elif kind == "process":
                device, pid, name, mb = value
                processes.append(SmiProcess(device, pid, name, mb, n))
                tool = tool or ("npu-smi" if NPU_SMI_PROCESS.search(line) else "nvidia-smi")
    if not devices and not processes:
        raise UsageError(f"{source} holds no nvidia-smi or npu-smi table (no device row or process row)")
    return SmiReading(tool or "nvidia-smi", tuple(SmiDevice(**d) for d in devices.values()), tuple(processes))


def _csv_header(text: str) -> list[str] | None:
    """The columns of nvidia-smi's CSV (its header line, fields as queried, units in brackets), else ``None``."""
    for line in text.splitlines():
        if line.strip():
            names = [c.strip().split(" [")[0] for c in line.split(",")]
            return names if len(names) > 1 and all(n in _CSV_FIELDS for n in names) else None
    return None


def _read_csv(text: str, source: str) -> SmiReading:
    """nvidia-smi's ``--query-compute-apps`` or ``--query-gpu`` CSV (with its header: ``--format=csv``)."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    header = [_CSV_FIELDS[c.strip().split(" [")[0]] for c in rows[0]]
    devices, processes, notes = [], [], []
    for n, row in enumerate(rows[1:], 2):
        if len(row) != len(header):
            continue
        cell = dict(zip(header, (c.strip() for c in row)))

        def mib(key: str) -> int | None:
            value = cell.get(key, "").removesuffix("MiB").strip()
            return int(value) if value.isdigit() else None  # ("[N/A]": a GB10's memory.total)

        if "pid" in cell and cell["pid"].isdigit():
            used = mib("mb")
            if used is None:
                notes.append(f"line {n}: process {cell['pid']}'s memory is {cell.get('mb')!r}")
                continue
            processes.append(SmiProcess(int(cell["gpu"]) if cell.get("gpu", "").isdigit() else None,
                                        int(cell["pid"]), cell.get("name", "?"), used, n))
        elif cell.get("gpu", "").isdigit():
            devices.append(SmiDevice(int(cell["gpu"]), cell.get("device_name"), mib("used"), mib("total"), n))
    if not devices and not processes:
        raise UsageError(f"{source}: nvidia-smi's CSV holds no row of a process or a device")
    return SmiReading("nvidia-smi", tuple(devices), tuple(processes), tuple(notes))


SMI_LIMIT = 1 << 20
"""The most smi output read (a table of 16 devices is under 10 KB)."""
SMI_COMMANDS = (("nvidia-smi", ("nvidia-smi",)), ("npu-smi", ("npu-smi", "info")))
"""The tools run on this machine when no output is given, in this order."""


def run_smi() -> tuple[str | None, str]:
    """nvidia-smi's or npu-smi's output on this machine (under kvaudit's network timeout, which bounds every outside
    call), and which ran; ``(None, why)`` where neither is installed."""
    import shutil
    import subprocess

    from kvaudit.network import timeout_s

    for tool, command in SMI_COMMANDS:
        if shutil.which(command[0]):
            try:
                p = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s())
            except (OSError, subprocess.TimeoutExpired) as e:
                raise UsageError(f"{tool} did not run: {e}") from None
            if p.returncode == 0:
                return p.stdout, f"{tool} run here"
            return None, f"{tool} failed here (exit {p.returncode}): {(p.stderr or p.stdout).strip()[:160]}"
    return None, "neither nvidia-smi nor npu-smi is installed here"
