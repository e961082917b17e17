"""Triage reading benchmark: how long ``kvaudit.triage.evidence`` takes to read a 1 MB paste (the shipped reports, real
threads and startup logs, repeated to size; not the held-out-5, -6 and -7 or develop-2 threads, collected after the paste was fixed), once the imports are done:
the launches in it are read by the installed vLLM's own argument parser, built once per process before the timing.

    .venv/bin/python bench/triage_parse.py [--mib 1] [--reps 5]

The target (issues 9 and 21): under 0.5 s for 1 MB. Prints the best and median of ``--reps`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kvaudit.triage.commands import parser_name
from kvaudit.triage.evidence import clean_lines, extract

ROOT = Path(__file__).resolve().parent.parent


def paste(size: int) -> str:
    """Real report text repeated to ``size`` bytes (UTF-8), cut at a line end."""
    reports = sorted(p for p in (ROOT / "fixtures" / "reports").rglob("*.txt")
                     if not {"held-out-5", "held-out-6", "held-out-7", "develop-2", "incoming"} & set(p.parts)) + sorted(
        (ROOT / "fixtures" / "reports").glob("*.log"))
    one = "\n".join(p.read_text() for p in reports)
    text = one * (size // len(one.encode()) + 1)
    cut = text.encode()[:size].decode(errors="ignore")
    return cut[: cut.rfind("\n") + 1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    text = paste(int(a.mib * (1 << 20)))
    t0 = time.perf_counter()
    parser = parser_name()  # the imports and vLLM's parser, once
    setup = time.perf_counter() - t0
    times, facts = [], 0
    for _ in range(a.reps):
        t0 = time.perf_counter()
        ev = extract(clean_lines(text))
        times.append(time.perf_counter() - t0)
        facts = len(ev)
    launches = sum(1 for f in ev.all("launch_parser"))
    print(f"paste: {len(text.encode()) / (1 << 20):.2f} MiB, {text.count(chr(10)):,} lines, {facts:,} facts, "
          f"{launches:,} launches")
    print(f"launches read by: {parser or 'kvaudit own flag reader (vLLM is not installed)'} "
          f"(imported and built once in {setup:.1f} s, before the timing)")
    print(f"read: best {min(times):.3f} s, median {statistics.median(times):.3f} s over {a.reps} runs "
          f"(target < 0.5 s per MiB)")


if __name__ == "__main__":
    main()
