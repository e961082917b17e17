"""Mutation testing of kvaudit's core with mutmut (not part of CI): how many mutants of the planner, accounting,
audit, the verdict, capacity and triage's conclusion the tests kill. Prints a score per module and in all; asserts
nothing.

Run: .venv/bin/python bench/mutation.py [--jobs N] [--sample N --seed S | --names FILE | --resume
     | --again [--only MODULE]]   (installs mutmut 3.8.1 into the environment if missing).

Configuration: ``[tool.mutmut]`` in pyproject.toml. Every mutant of the core is some three hours on 2 CPUs.
``--sample N`` runs N of them drawn at random (seeded) and scores those, writing their names to
``mutants/sample.json``; ``--names`` runs the mutants such a file names (where the code is the same, the same
mutants), so that two trees are measured the same way. ``--resume`` goes on with a run of every mutant that was
stopped (mutmut keeps each mutant's result in ``mutants/``); ``--again`` runs the mutants the last run left
undetected again, against the tests as they are now, and the others keep their results (``--only plan.planner``:
those of one module). Survivors: ``.venv/bin/python -m mutmut results``; one of them:
``.venv/bin/python -m mutmut show NAME``.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT = "mutmut==3.8.1"
DETECTED = {"killed", "timeout", "caught by type check", "suspicious"}
"""mutmut's statuses (mutmut.stats.status_by_exit_code) that mean the mutant did not pass unnoticed;
"suspicious" is a mutant that crashed the test process (a signal)."""


UNDETECTED = {"survived", "no tests"}
"""mutmut's statuses of a mutant that passed unnoticed and of one that no test reaches."""

SAMPLE = ROOT / "mutants" / "sample.json"
"""The names drawn by ``--sample`` (scoring counts only those)."""


def _metas() -> list[Path]:
    return sorted((ROOT / "mutants" / "kvaudit").rglob("*.py.meta"))  # one per module, in its stage's folder


def scores() -> dict[str, collections.Counter]:
    from mutmut.stats import status_by_exit_code

    out: dict[str, collections.Counter] = {}
    package = ROOT / "mutants" / "kvaudit"
    drawn = set(json.loads(SAMPLE.read_text())) if SAMPLE.exists() else None
    for meta in _metas():
        c: collections.Counter = collections.Counter()
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if drawn is not None and name not in drawn:
                continue
            c["mutants"] += 1
            c[status_by_exit_code[code]] += 1
        out[meta.relative_to(package).as_posix().removesuffix(".meta")] = c
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--sample", type=int, help="run and score this many mutants, drawn at random")
    ap.add_argument("--seed", type=int, default=0, help="the draw's seed (default 0)")
    ap.add_argument("--names", type=Path, help="run and score the mutants a SAMPLE file names (another tree's "
                    "mutants/sample.json: the same mutants, where the code is the same)")
    ap.add_argument("--resume", action="store_true", help="go on with the last run of every mutant: the mutants "
                    "it did not reach (mutmut keeps each result in mutants/)")
    ap.add_argument("--again", action="store_true", help="run the mutants the last run did not detect (survived, "
                    "or reached by no test) again, against the tests as they are now")
    ap.add_argument("--only", action="append", default=[], metavar="MODULE",
                    help="with --again: only this module's mutants (e.g. plan.planner; repeatable)")
    ap.add_argument("--report-only", action="store_true", help="score the last run in mutants/")
    a = ap.parse_args()
    if not a.report_only:
        if importlib.util.find_spec("mutmut") is None:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", MUTMUT], check=True)
        if a.resume and SAMPLE.exists():
            sys.exit("mutation.py: --resume goes on with a run of every mutant; the last run drew a sample")
        if not (a.resume or a.again):
            shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        t0 = time.perf_counter()
        names: list[str] = []
        if a.again:
            drawn = set(json.loads(SAMPLE.read_text())) if SAMPLE.exists() else None
            from mutmut.stats import status_by_exit_code

            results = {k: code for meta in _metas()
                       for k, code in json.loads(meta.read_text())["exit_code_by_key"].items()}
            names = sorted(k for k, code in results.items() if status_by_exit_code[code] in UNDETECTED
                           and (drawn is None or k in drawn)
                           and (not a.only or any(k.startswith(f"kvaudit.{m}.") for m in a.only)))
            print(f"{len(names)} mutants the last run did not detect, run again")
        elif a.sample or a.names:
            # a name that matches no mutant: mutmut generates every mutant and collects which tests reach each,
            # then stops; the names are then in its files
            _mutmut(["run", "kvaudit.none-drawn"], a.jobs, check=False)
            every = sorted(k for meta in _metas() for k in json.loads(meta.read_text())["exit_code_by_key"])
            if a.names:
                given = json.loads(a.names.read_text())
                names = sorted(set(given) & set(every))
                print(f"{len(names)} of the {len(given)} mutants {a.names} names are mutants here")
            else:
                names = sorted(random.Random(a.seed).sample(every, min(a.sample, len(every))))
                print(f"drew {len(names)} of {len(every)} mutants (seed {a.seed})")
            SAMPLE.write_text(json.dumps(names))
        p = _mutmut(["run", "--max-children", str(a.jobs), *names], a.jobs)
        print(f"mutmut run: exit {p.returncode} in {time.perf_counter() - t0:.0f} s with {a.jobs} workers")
    total: collections.Counter = collections.Counter()
    print(f"{'module':22} {'mutants':>8} {'killed':>7} {'timeout/crash':>14} {'survived':>9} {'no tests':>9} "
          f"{'score':>7}")
    rows = [*scores().items()]
    for module, c in rows:
        total.update(c)
    for module, c in [*rows, ("all", total)]:
        detected = sum(c[s] for s in DETECTED)
        judged = c["mutants"] - c["not checked"] - c["skipped"]
        print(f"{module:22} {c['mutants']:8} {c['killed']:7} {detected - c['killed']:14} {c['survived']:9} "
              f"{c['no tests']:9} {100 * detected / max(1, judged):6.1f}%")
    print("score = detected (killed, timed out, crashed) / mutants checked; a mutant no test reaches is not detected")


def _mutmut(args: list[str], jobs: int, check: bool = True) -> subprocess.CompletedProcess:
    # one intra-op thread: mutmut forks its workers from a process that ran the tests, and torch's
    # OpenMP pool does not survive a fork (workers hang until the timeout)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, env=env)
    if check and p.returncode != 0:
        print(f"mutmut {args[0]}: exit {p.returncode}:\n{p.stderr[-3000:]}", file=sys.stderr)
    return p


if __name__ == "__main__":
    main()
