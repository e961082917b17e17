"""Triage scored on real issue threads: for each report of a folder of ``fixtures/reports`` (``threads``, ``develop``,
``held-out-1``, ``held-out-2``), ``kvaudit triage --format json`` as a user runs it, set against the diagnosis its thread reached
(``expected.json``, written from the thread before any run). Also prints the seconds each report took once vLLM is
imported, for the reports vLLM's planner planned and for the rest (median and max).

    .venv/bin/python bench/triage_threads.py develop [held-out-1 held-out-2 threads] [--show]

A report scores when the verdict is the thread's and, where the thread names a cause, the cause is too (causes of one
kind count as one: memory outside vLLM's budget is the same finding whether the report shows another process or a
component in this one, ``SAME``). Where the thread's diagnosis rests on a fact the report lacks (``deciding_term``, the
ledger terms it is about, written from the thread before any run), it also scores when triage does not conclude a
cause and names one of those terms in ``deciding`` (the decision recorded in issue 32). Threads that reached no
diagnosis (``verdict: null``) are not scored. Confident-wrong: a cause concluded that is not the thread's. Also counted, on every report: a traceback, an exit 2 (a real
report refused), blaming the allocator where the thread does not, and asking for a fact the report states.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "fixtures" / "reports"
ALLOCATOR = ("allocator-over-allocation", "allocator-mismatch")
SAME = {"outside-budget": "another-process"}
"""Causes of one kind (the issue's "memory outside vLLM's budget, naming the component"), scored as one."""
ASKED = {  # a question in ask_for, and the fact of expected.json that answers it (vLLM's words not vllm-ascend's)
    "model": re.compile(r"which model"),
    "vLLM": re.compile(r"(?:which vllm|vllm version|the vllm release)(?!-ascend)"),
    "vllm-ascend": re.compile(r"which vllm-ascend|vllm-ascend version|the vllm-ascend release"),
    "tensor parallel size": re.compile(r"tensor parallel|--tensor-parallel-size"),
}


def deciding_terms(want: dict) -> set[str]:
    """The thread's ``deciding_term``: a list of ledger terms, or one term written as a string."""
    terms = want.get("deciding_term") or ()
    return {terms} if isinstance(terms, str) else set(terms)


def scored(want: dict, verdict: str | None, cause: str | None, deciding=()) -> tuple[bool, str]:
    """Whether an answer (verdict, cause, the deciding terms named) is the thread's diagnosis ``want``, and how it
    is not: "" where it is the diagnosis itself, "named the deciding term", "confident-wrong", or "not concluded"."""
    undecided = verdict == "insufficient-information" or cause in (None, "unknown")
    if verdict == want["verdict"] and (want.get("cause") is None
                                       or SAME.get(cause, cause) == SAME.get(want["cause"], want["cause"])):
        return True, ""
    if undecided and deciding_terms(want) & set(deciding):
        return True, "named the deciding term"
    return False, "not concluded" if undecided else "confident-wrong"


def run(path: Path) -> tuple[int | None, dict | None, str]:
    """``kvaudit triage PATH --format json``: its exit code, its JSON, and stderr (or the traceback)."""
    from kvaudit.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["triage", str(path), "--format", "json"])
    except BaseException:  # noqa: BLE001 - a traceback is what this counts
        return None, None, traceback.format_exc()
    try:
        return code, json.loads(out.getvalue()), err.getvalue()
    except ValueError:
        return code, None, err.getvalue()


def score(folder: str, show: bool = False) -> dict:
    """Run every report of the folder; print a row per report and the totals; return the totals."""
    base = REPORTS / folder
    expected = {k: v for k, v in json.loads((base / "expected.json").read_text()).items() if not k.startswith("_")}
    totals = dict(reports=0, scored=0, right=0, verdict_right=0, tracebacks=0, exit2=0, allocator_contradicted=0,
                  asked_stated=0, confident_wrong=0, deciding=0, deciding_named=0)
    times: dict[bool, list[float]] = {True: [], False: []}
    for name in sorted(expected):
        want = expected[name]
        t0 = time.perf_counter()
        code, doc, err = run(base / name)
        took = time.perf_counter() - t0
        totals["reports"] += 1
        times[bool((doc or {}).get("planned_with_vllm"))].append(took)
        got_v, got_c = (doc or {}).get("verdict"), (doc or {}).get("cause")
        notes = []
        if code is None:
            totals["tracebacks"] += 1
            notes.append("TRACEBACK " + err.strip().splitlines()[-1][:100])
        elif code not in (0, 2, 3):  # kvaudit's own internal error (exit 4): a traceback, caught
            totals["tracebacks"] += 1
            notes.append(f"INTERNAL ERROR (exit {code}) " + err.strip()[:100])
        elif code == 2:
            totals["exit2"] += 1
            notes.append("EXIT 2 " + err.strip()[:100])
        if got_v in ALLOCATOR and want["verdict"] is not None and want["verdict"] not in ALLOCATOR:
            totals["allocator_contradicted"] += 1
            notes.append("allocator blamed")
        asks = " ".join((doc or {}).get("ask_for", [])).lower()
        for fact, words in ASKED.items():
            if want["facts"].get(fact) is not None and words.search(asks):
                totals["asked_stated"] += 1
                notes.append(f"asked for the {fact}")
        ok = None
        named = bool(deciding_terms(want) & set((doc or {}).get("deciding", ())))
        if want.get("deciding_term"):
            totals["deciding"] += 1
            totals["deciding_named"] += named
        if want["verdict"] is not None:
            totals["scored"] += 1
            ok, how = scored(want, got_v, got_c, (doc or {}).get("deciding", ()))
            if how:
                notes.append(how)
            totals["right"] += ok
            totals["verdict_right"] += got_v == want["verdict"]
            totals["confident_wrong"] += how == "confident-wrong"
        mark = "-" if ok is None else "ok" if ok else "XX"
        print(f"{mark:2} {name:34} want {want['verdict']}/{want.get('cause', '')}  got {got_v}/{got_c}  "
              f"{took:5.1f}s {'; '.join(notes)}")
        if show and ok is False and doc:
            print("     " + doc.get("headline", "")[:400])
    pct = 100 * totals["right"] / totals["scored"] if totals["scored"] else 0.0
    vpct = 100 * totals["verdict_right"] / totals["scored"] if totals["scored"] else 0.0
    print(f"{folder}: {totals['right']}/{totals['scored']} verdict and cause right ({pct:.0f} %), "
          f"{totals['verdict_right']} verdicts right ({vpct:.0f} %); "
          f"{totals['reports']} reports, {totals['tracebacks']} tracebacks, {totals['exit2']} exit 2, "
          f"{totals['allocator_contradicted']} allocator blamed against the thread, "
          f"{totals['asked_stated']} questions about a stated fact; {totals['confident_wrong']} confident-wrong; "
          f"deciding fact absent on {totals['deciding']}, named on {totals['deciding_named']}")
    print(f"{folder}: seconds per report, vLLM imported: " + "; ".join(
        f"{len(ts)} {what}: median {statistics.median(ts):.2f}, max {max(ts):.2f}"
        for what, ts in (("planned", times[True]), ("not planned", times[False])) if ts))
    return totals


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="*", default=["develop"])
    ap.add_argument("--show", action="store_true", help="print the headline of each miss")
    a = ap.parse_args()
    from kvaudit.plan.planner import load_vllm, vllm_version
    from kvaudit.triage.commands import parser_name

    if vllm_version() is not None:  # imported before the first report: each report's time is its own
        load_vllm()
        parser_name()
    for folder in a.folders:
        score(folder, a.show)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
