"""kvaudit benchmarks: cold CLI wall time and peak RSS against the bare vLLM planner import, the
light commands, the in-process plan + audits, cpu-meter time per GiB, and (on a GPU/NPU) full-scale
device audit time per strategy against the fill-bandwidth floor. Prints figures; asserts nothing.

Run: .venv/bin/python bench/bench.py [--reps N]; on a device host without vLLM:
python3 bench/bench.py --device-only --plan PLAN.json (what scripts/device-check runs)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
KVAUDIT = [PY, "-m", "kvaudit"]


def run_child(argv: list[str]) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds (user + system), peak RSS in bytes and exit code of one child."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, p.returncode


def cold(reps: int) -> None:
    cases = {
        # the bare planner import, where torchvision imports (kvaudit's lean env carries its CUDA wheel, which
        # transformers imports), ended as kvaudit ends: without the seconds of interpreter teardown
        "bare import vllm.v1.core.kv_cache_planning": [PY, "-c", (
            "import os, kvaudit.model.vllm_modules as m; m.declare_torchvision_ops(); "
            "import vllm.v1.core.kv_cache_planning; os._exit(0)")],
        "kvaudit qwen3-next --util 0.7 --meter meta --format json": KVAUDIT + [
            "qwen3-next", "--util", "0.7", "--meter", "meta", "--format", "json"],
    }
    run_child(cases["kvaudit qwen3-next --util 0.7 --meter meta --format json"])  # warm vLLM's model-info cache
    walls: dict[str, list[float]] = {k: [] for k in cases}
    cpus: dict[str, list[float]] = {k: [] for k in cases}
    rss: dict[str, list[int]] = {k: [] for k in cases}
    for _ in range(reps):  # interleaved, so load drifts hit both alike
        for name, argv in cases.items():
            w, c, r, code = run_child(argv)
            assert code in (0, 1), f"{name} exited {code}"  # the floor must really import
            walls[name].append(w)
            cpus[name].append(c)
            rss[name].append(r)
    print(f"cold processes, median of {reps}: wall (min-max), CPU time, peak RSS")
    for name in cases:
        print(f"  {name:58} {statistics.median(walls[name]):6.2f} s ({min(walls[name]):.2f}-{max(walls[name]):.2f})"
              f"  CPU {statistics.median(cpus[name]):6.2f} s   peak RSS {statistics.median(rss[name]) / 2**20:5.0f} MiB")
    floor, ours = (statistics.median(walls[n]) for n in cases)
    cfloor, cours = (statistics.median(cpus[n]) for n in cases)
    print(f"  kvaudit over the import floor: wall {100 * (ours / floor - 1):+.1f} %, CPU time "
          f"{100 * (cours / cfloor - 1):+.1f} % (target <= +15 %; CPU time is the steadier figure on a busy host)")


def light(reps: int) -> None:
    for argv, label in (([*KVAUDIT, "--help"], "kvaudit --help"), ([*KVAUDIT, "meters"], "kvaudit meters")):
        walls = [run_child(argv)[0] for _ in range(reps)]
        print(f"  {label:58} {statistics.median(walls):6.2f} s")
    code = ("import sys; from kvaudit.cli import main; import io, contextlib; f = io.StringIO();\n"
            "with contextlib.redirect_stdout(f): main(['{cmd}'])\n"
            "print(*(m for m in ('torch', 'vllm') if m in sys.modules))")
    for cmd in ("--help", "meters"):
        out = subprocess.run([PY, "-c", code.format(cmd=cmd)], capture_output=True, text=True, cwd=ROOT).stdout
        print(f"  modules imported by kvaudit {cmd}: {out.strip() or 'neither torch nor vllm'}")


def in_process(reps: int) -> None:
    sys.path.insert(0, str(ROOT))
    from kvaudit.measure.audit import audit_all
    from kvaudit.measure.meters import MetaMeter
    from kvaudit.model.deployment import PRESETS, load_preset_spec
    from kvaudit.plan.planner import load_vllm
    from kvaudit.plan.planner import make_deployment
    from kvaudit.strategies.builtin import STRATEGIES

    p = PRESETS["qwen3-next"]
    d = make_deployment(load_preset_spec(p), tp=p.tp, max_model_len=p.max_model_len, gpu_memory_utilization=0.7)
    load_vllm()
    audit_all(d, list(STRATEGIES.values()), MetaMeter())  # first call imports the model's layer modules
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        audit_all(d, list(STRATEGIES.values()), MetaMeter())
        times.append(time.perf_counter() - t0)
    print(f"  in-process: 3 plans + 4 audits on meta (Qwen3-Next, TP 4), median of {reps}: "
          f"{statistics.median(times) * 1000:.0f} ms (target < 300 ms)")


def _qwen(**kw):
    from kvaudit.model.deployment import PRESETS, load_preset_spec
    from kvaudit.plan.planner import make_deployment

    p = PRESETS["qwen3-next"]
    return make_deployment(load_preset_spec(p), tp=p.tp, max_model_len=p.max_model_len, gpu_memory_utilization=0.7,
                           **kw)


def cpu_per_gib() -> None:
    """Real host allocations on the cpu meter: seconds per GiB allocated (zero-filled by torch.zeros)."""
    from kvaudit.measure.audit import run_audit
    from kvaudit.measure.meters import CpuMeter
    from kvaudit.plan.planner import build_plan
    from kvaudit.strategies.builtin import STRATEGIES

    d = _qwen(num_blocks_override=321)  # about 1 GiB per plan
    print("cpu meter, Qwen3-Next plans scaled to 321 blocks:")
    for s in STRATEGIES.values():
        plan = build_plan(d, s.platform)
        t0 = time.perf_counter()
        r = run_audit(d, plan, s, CpuMeter())
        dt = time.perf_counter() - t0
        gib = r.allocated_bytes / 2**30
        print(f"  {s.name:12} {gib:6.2f} GiB allocated in {dt:5.2f} s = {dt / gib:5.2f} s/GiB")


def device_full_scale(plan_file: str | None = None) -> list[dict]:
    """On a GPU/NPU: full-scale audit time per strategy next to the floor, the bytes it zeroes over
    the device's measured fill bandwidth. Plans come from vLLM, or from ``plan_file`` (``kvaudit plan
    --save``) where vLLM is not installed. Returns the rows it printed."""
    from kvaudit.errors import NotAuditable
    from kvaudit.measure.audit import run_audit
    from kvaudit.measure.meters import select_meter
    from kvaudit.strategies.builtin import STRATEGIES

    meter = select_meter("auto")
    if meter.name not in ("cuda", "npu"):
        print("device: skipped (no cuda or npu device here)")
        return []
    if plan_file:
        from kvaudit.plan.planfile import load

        stage = load(plan_file).stages[0]
        d, plans = stage.deployment, stage.plans
    else:
        from kvaudit.plan.planner import build_plan

        d = _qwen()
        plans = {s.platform: build_plan(d, s.platform) for s in STRATEGIES.values()}
    import torch

    backend = meter.backend()  # type: ignore[attr-defined]
    buf = torch.empty(4 << 30, dtype=torch.int8, device=meter.device())
    backend.synchronize()
    t0 = time.perf_counter()
    buf.zero_()
    backend.synchronize()
    bandwidth = (4 << 30) / (time.perf_counter() - t0)
    del buf
    backend.empty_cache()
    print(f"device {meter.describe()}: fill bandwidth {bandwidth / 1e9:.0f} GB/s")
    rows = []
    for s in STRATEGIES.values():
        try:
            if s.prepare:
                s.prepare(plans[s.platform])
        except NotAuditable as e:
            print(f"  {s.name:12} not audited: {e.message}")
            continue
        t0 = time.perf_counter()
        r = run_audit(d, plans[s.platform], s, meter)
        dt = time.perf_counter() - t0
        floor = r.reading.allocated / bandwidth
        rows.append({"strategy": s.name, "allocated_bytes": r.reading.allocated, "seconds": dt,
                     "floor_seconds": floor, "bandwidth_bytes_per_s": bandwidth})
        print(f"  {s.name:12} {r.reading.allocated / 2**30:6.2f} GiB zeroed in {dt * 1000:7.1f} ms "
              f"(floor {floor * 1000:6.1f} ms)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--device-only", action="store_true",
                    help="only the full-scale device audit (a GPU/NPU host; needs no vLLM with --plan)")
    ap.add_argument("--plan", help="a plan file from 'kvaudit plan --save' for the device audit")
    a = ap.parse_args()
    import platform

    print(f"kvaudit bench · {platform.machine()} · {os.cpu_count()} CPUs · Python {platform.python_version()}")
    if a.device_only:
        sys.path.insert(0, str(ROOT))
        device_full_scale(a.plan)
        return
    cold(a.reps)
    print("light commands:")
    light(a.reps)
    in_process(max(a.reps, 5))
    cpu_per_gib()
    device_full_scale()


if __name__ == "__main__":
    main()
