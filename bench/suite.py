"""Where the test suite's time goes: by file, by fixture and by kind (vLLM's import, torch's import, a model
built on ``meta``, a plan, waiting on a subprocess, the rest: the test itself and pytest), for each tested vLLM.

    .venv/bin/python bench/suite.py [--vllm 0.33.0] [--workers N] [--top 15] [--json FILE] [-- PYTEST-ARGS]
    .venv/bin/python bench/suite.py --from FILE      # print a saved run again

Each suite runs in its own environment (as ``scripts/test`` makes them), one after the other so that their
times are not mixed; ``--workers 0`` (the default) runs a suite in one process, the clearest attribution,
``--workers 2`` as ``scripts/test`` does. The plugin that measures is ``bench/suite_plugin.py``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite_plugin import KINDS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def tested_vllms() -> list[str]:
    """The vLLMs ``scripts/test`` tests, primary first (read from scripts/venv.sh, where they are set)."""
    out = subprocess.run(["bash", "-c", 'source scripts/venv.sh && echo "$KVAUDIT_VLLM $KVAUDIT_VLLM_ALSO"'],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


def venv_python(version: str, primary: str) -> Path:
    return ROOT / (".venv" if version == primary else f".venv-vllm-{version}") / "bin" / "python"


def run_suite(python: Path, workers: int, pytest_args: list[str]) -> dict:
    """One suite under the plugin; its workers' files merged into one record."""
    with tempfile.TemporaryDirectory(prefix="kvaudit-suite-") as tmp:
        path = os.path.join(tmp, "profile.json")
        env = dict(os.environ, KVAUDIT_SUITE_PROFILE=path,  # (bytecode written, as scripts/test lets it be)
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")])))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        args = [str(python), "-m", "pytest", "-q", "-p", "suite_plugin", "-p", "no:cacheprovider"]
        if workers:
            args += ["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"]  # as scripts/test
        t0 = time.perf_counter()
        p = subprocess.run(args + pytest_args, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        parts = [json.loads(Path(f).read_text()) for f in sorted(glob.glob(path + "*"))]
    summary = (p.stdout.strip().splitlines() or [""])[-1]
    if not parts:
        raise SystemExit(f"suite.py: {python}: pytest wrote no profile (exit {p.returncode}): {summary}\n{p.stderr[-2000:]}")
    return {"python": str(python), "wall": wall, "exit": p.returncode, "summary": summary, "workers": workers,
            "processes": parts}


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def report(suite: dict, top: int) -> None:
    # under xdist the controller runs no test: it waits for its workers, whose CPU would count as its children's
    procs = [p for p in suite["processes"] if p.get("worker")] or suite["processes"]
    tests = {k: v for p in procs for k, v in p["tests"].items()}
    kinds_total: collections.Counter = collections.Counter()
    kinds_by_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for p in procs:
        for where, c in p["kinds"].items():
            kinds_total.update(c)
            if where not in ("session", "collection"):
                kinds_by_file[_file(where)].update(c)
    cpu = sum(p["cpu"] for p in procs)
    children = sum(p["children_cpu"] for p in procs)
    collection = sum(p["collection"]["wall"] for p in procs)
    outcomes = collections.Counter(t["outcome"] for t in tests.values())
    print(f"\n== {suite['python']}: {suite['summary']}")
    workers = f" ({len(procs)} workers; the controller left out)" if len(procs) < len(suite["processes"]) else ""
    print(f"wall {suite['wall']:.1f} s with {len(procs)} process(es){workers}; CPU {cpu:.1f} s in pytest, {children:.1f} s in "
          f"subprocesses; collection {collection:.1f} s (in all processes); tests: "
          + ", ".join(f"{n} {o}" for o, n in outcomes.most_common()))
    spent = sum(kinds_total.values())
    print("\nby kind (wall seconds, exclusive; summed over processes)")
    for kind in KINDS:
        print(f"  {kind:14} {kinds_total[kind]:8.1f} s  {100 * kinds_total[kind] / max(spent, 1e-9):5.1f} %")
    print(f"  {'of which collection':14} {sum(p['kinds'].get('collection', {}).get(k, 0) for p in procs for k in KINDS):5.1f} s;"
          f" pytest between tests {sum(sum(p['kinds'].get('session', {}).values()) for p in procs):.1f} s")

    by_file: dict[str, list] = collections.defaultdict(lambda: [0.0, 0, 0.0])
    for nodeid, t in tests.items():
        f = by_file[_file(nodeid)]
        f[0] += sum(t["phases"].values())
        f[1] += 1
        f[2] += t.get("children_cpu", 0.0)
    print(f"\nby file (top {top} of {len(by_file)}; seconds of setup + call + teardown)")
    print(f"  {'file':38} {'tests':>6} {'total':>7} " + " ".join(f"{k:>12}" for k in KINDS) + f" {'child CPU':>10}")
    for name, (total, n, child) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        k = kinds_by_file[name]
        print(f"  {name:38} {n:6} {total:7.1f} " + " ".join(f"{k[x]:12.1f}" for x in KINDS) + f" {child:10.1f}")

    fixtures: dict[tuple, list] = collections.defaultdict(list)
    for p in procs:
        for fx in p["fixtures"]:
            fixtures[(fx["name"], fx["scope"])] += fx["times"]
    print(f"\nby fixture (top {top}; its setup, wall seconds)")
    print(f"  {'fixture':38} {'scope':>9} {'setups':>7} {'total':>8} {'each':>8}")
    for (name, scope), times in sorted(fixtures.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"  {name:38} {scope:>9} {len(times):7} {sum(times):8.2f} {sum(times) / len(times):8.3f}")

    print(f"\nslowest tests (top {top})")
    for nodeid, t in sorted(tests.items(), key=lambda kv: -sum(kv[1]["phases"].values()))[:top]:
        print(f"  {sum(t['phases'].values()):7.2f} s  {nodeid}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", action="append", help="a tested vLLM (default: every one scripts/test tests)")
    ap.add_argument("--workers", type=int, default=0, help="pytest-xdist workers per suite (0: one process)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", help="save the run here")
    ap.add_argument("--from", dest="saved", help="print a saved run instead of running")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    a = ap.parse_args()
    if a.saved:
        suites = json.loads(Path(a.saved).read_text())
    else:
        versions = tested_vllms()
        suites = []
        for version in a.vllm or versions:
            python = venv_python(version, versions[0])
            if not python.exists():
                raise SystemExit(f"suite.py: {python} does not exist; scripts/test creates it")
            suites.append(run_suite(python, a.workers, a.pytest_args))
        if a.json:
            Path(a.json).write_text(json.dumps(suites))
    for suite in suites:
        report(suite, a.top)
    total = sum(s["wall"] for s in suites)
    print(f"\nall suites, one after the other: {total:.1f} s wall")


if __name__ == "__main__":
    main()
