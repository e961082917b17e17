"""kvaudit benchmarks: cold CLI wall time and peak RSS against the bare vLLM planner import, the
light commands, and the in-process plan + audits. Prints figures; asserts nothing.

Run: .venv/bin/python bench/bench.py [--reps N]
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


def run_child(argv: list[str]) -> tuple[float, int, int]:
    """Wall seconds, peak RSS in bytes and exit code of one child process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss * 1024, p.returncode


def cold(reps: int) -> None:
    cases = {
        "bare import vllm.v1.core.kv_cache_planning": [PY, "-c", "import vllm.v1.core.kv_cache_planning"],
        "kvaudit qwen3-next --util 0.7 --meter meta --format json": KVAUDIT + [
            "qwen3-next", "--util", "0.7", "--meter", "meta", "--format", "json"],
    }
    run_child(cases["kvaudit qwen3-next --util 0.7 --meter meta --format json"])  # warm vLLM's model-info cache
    walls: dict[str, list[float]] = {k: [] for k in cases}
    rss: dict[str, list[int]] = {k: [] for k in cases}
    for _ in range(reps):  # interleaved, so load drifts hit both alike
        for name, argv in cases.items():
            w, r, code = run_child(argv)
            assert code in (0, 1), f"{name} exited {code}"
            walls[name].append(w)
            rss[name].append(r)
    print(f"cold processes, median of {reps} (min-max):")
    for name in cases:
        print(f"  {name:58} {statistics.median(walls[name]):6.2f} s ({min(walls[name]):.2f}-{max(walls[name]):.2f})"
              f"   peak RSS {statistics.median(rss[name]) / 2**20:7.0f} MiB")
    floor, ours = (statistics.median(walls[n]) for n in cases)
    print(f"  kvaudit over the import floor: {100 * (ours / floor - 1):+.1f} % (target <= +15 %)")


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
    from kvaudit.audit import audit_all
    from kvaudit.deployment import PRESETS, load_preset_spec, make_deployment
    from kvaudit.meters import MetaMeter
    from kvaudit.plan import load_vllm
    from kvaudit.strategies import STRATEGIES

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    import platform

    print(f"kvaudit bench · {platform.machine()} · {os.cpu_count()} CPUs · Python {platform.python_version()}")
    cold(a.reps)
    print("light commands:")
    light(a.reps)
    in_process(max(a.reps, 5))


if __name__ == "__main__":
    main()
