"""Live benchmark: ``kvaudit live`` against a real HTTP server in this process that serves a real ``/metrics`` (the
whole dump of an idle vLLM 0.11-era server, fixtures/live/metrics) with a real nvidia-smi table (another server's: the
verdict is not the point, the time is); prints vLLM's import time, then the time of one read of the server, one whole
audit, and one ``--watch`` re-read.

    .venv/bin/python bench/live.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # (tests/served.py: the tests' in-process server)
METRICS = ROOT / "fixtures/live/metrics/hardware-aware-router-vllm_metrics-v0.11-era.metrics.txt"
SMI = ROOT / "fixtures/live/smi/nvidia-smi_tokenkaki_a100-40gb_vllm0.19.1_qwen3-8b.txt"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    t0 = time.perf_counter()
    from kvaudit.model.vllm_modules import module

    module("vllm.config")
    print(f"vLLM's import: {time.perf_counter() - t0:.2f} s")
    from served import serving

    with serving({"/metrics": (200, METRICS.read_bytes())}) as url:
        run(url, a.reps)


def run(url: str, reps: int) -> None:
    from kvaudit.model.options import DEPLOYMENT_OPTIONS
    from kvaudit.server.endpoints import read_server_metrics, server_base
    from kvaudit.server.live import audit_served, read_live

    asked = SimpleNamespace(**{**{o.name: None for o in DEPLOYMENT_OPTIONS}, "max_model_len": 8192, "device": "h100-80g"})
    reads, audits = [], []
    for _ in range(reps):
        t = time.perf_counter()
        served, smi = read_live(url, None, SMI.read_text(), str(SMI))
        reads.append(time.perf_counter() - t)
        t = time.perf_counter()
        report = audit_served(served, smi, model="meta-llama/Meta-Llama-3.1-8B-Instruct", asked=asked)
        audits.append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(reps):
        read_server_metrics(server_base(url))
    watch = (time.perf_counter() - t) / reps
    print(f"read /metrics (45 KB) and the smi table: median {statistics.median(reads) * 1000:.1f} ms")
    n = len(report.audits)
    print(f"plan and audit ({n} strateg{'y' if n == 1 else 'ies'} on meta, num_gpu_blocks {report.served_blocks:,}): "
          f"first {audits[0]:.2f} s, median of the rest {statistics.median(audits[1:] or audits):.2f} s")
    print(f"--watch re-read of /metrics: {watch * 1000:.1f} ms")


if __name__ == "__main__":
    main()
