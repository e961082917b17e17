"""Check benchmark: ``kvaudit check`` over the shipped example policy, in one process; prints vLLM's import
time, then the time per cell and per deployment after it, and ``kvaudit --help`` in cold processes.

    .venv/bin/python bench/check.py [--policy examples/kvaudit.toml] [--reps 2] [--help-reps 9]

The first repetition also builds each model on ``meta`` (vLLM's model code imported per architecture);
later ones reuse what the process has imported, as a long matrix does.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def help_times(reps: int) -> None:
    """``kvaudit --help`` as a user runs it: a cold process each time; and what it imported."""
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kvaudit", "--help"], capture_output=True, check=True, cwd=ROOT)
        walls.append(time.perf_counter() - t0)
    code = ("import sys, io, contextlib; from kvaudit.cli import main; f = io.StringIO()\n"
            "with contextlib.redirect_stdout(f): main(['--help'])\n"
            "print(*(m for m in ('torch', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    print(f"kvaudit --help, cold process, median of {reps}: {statistics.median(walls):.3f} s "
          f"({min(walls):.3f}-{max(walls):.3f}; target < 0.5 s); imports {out or 'neither torch nor vLLM'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default=str(ROOT / "examples/kvaudit.toml"))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--help-reps", type=int, default=9)
    a = ap.parse_args()
    help_times(a.help_reps)

    t0 = time.perf_counter()
    from kvaudit.ci.check import run_policy
    from kvaudit.ci.policy import load_policy
    from kvaudit.plan.planner import load_vllm, vllm_version
    from kvaudit.strategies.builtin import STRATEGIES

    load_vllm()
    imported = time.perf_counter() - t0
    policy = load_policy(a.policy, tuple(STRATEGIES))
    print(f"kvaudit check {Path(a.policy).name}: {len(policy.cells)} cells, planned by vLLM {vllm_version()}, "
          f"import {imported:.1f} s")
    for rep in range(a.reps):
        result = run_policy(policy)
        n, deployments = len(result.results), len(result.reports)
        print(f"  run {rep + 1}: {result.seconds:.1f} s, {1000 * result.seconds / n:.0f} ms per cell, "
              f"{1000 * result.seconds / deployments:.0f} ms per deployment ({deployments}); exit {result.exit_code}")
    slowest = sorted(result.results, key=lambda r: -r.seconds)[:3]
    print("  slowest cells (last run): " + ", ".join(f"{r.cell.label} {1000 * r.seconds:.0f} ms" for r in slowest))


if __name__ == "__main__":
    main()
