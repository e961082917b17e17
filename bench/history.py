"""History benchmark: ``kvaudit history`` over the cached vllm-ascend releases, in one process, on the
meta meter; prints the time per release after vLLM's import and each release's first fetch.

    .venv/bin/python bench/history.py [--model qwen3-next] [--since 0.10.2rc1] [--util 0.7]

The first run fetches every sdist (pip, a few seconds each); this benchmark fetches them first, then
times the audits alone: each release's code extracted from its sdist, planned by vLLM, run on meta.
"""

from __future__ import annotations

import argparse
import time

t0 = time.perf_counter()
from kvaudit.ci.history import history, published  # noqa: E402
from kvaudit.model.deployment import PRESETS, load_preset_spec  # noqa: E402
from kvaudit.plan.planner import load_vllm, make_deployment  # noqa: E402
from kvaudit.strategies.releases import fetch_sdist  # noqa: E402

load_vllm()
IMPORT_S = time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-next")
    ap.add_argument("--since", default="0.10.2rc1")
    ap.add_argument("--util", type=float, default=0.7)
    a = ap.parse_args()
    p = PRESETS[a.model]
    d = make_deployment(load_preset_spec(p), tp=p.tp, max_model_len=p.max_model_len, device=p.device,
                        gpu_memory_utilization=a.util)
    versions, source = published(a.since)
    start = time.perf_counter()
    for v in versions:
        fetch_sdist(v)
    fetched = time.perf_counter() - start
    start = time.perf_counter()
    rows = history(d, versions)
    took = time.perf_counter() - start
    audited = sum(r.ratio is not None for r in rows)
    print(f"releases: {len(versions)} from {source} ({audited} audited, {len(rows) - audited} not)")
    print(f"import (vLLM): {IMPORT_S:.1f} s; fetch/cache check: {fetched:.1f} s")
    print(f"history: {took:.1f} s in one process, {took / len(rows):.2f} s per release")


if __name__ == "__main__":
    main()
