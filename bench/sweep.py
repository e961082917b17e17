"""Sweep benchmark: every preset x TP {1, 2, 4, 8} x util {0.5 .. 0.95} x the four built-in strategies
on ``meta``, in one process; prints configurations per second after the import.

    .venv/bin/python bench/sweep.py [--presets a,b] [--utils 0.5,0.9]

A configuration is one (preset, TP, util, strategy) audit. Deployments vLLM or kvaudit refuses
(TP that does not divide the heads, weights that do not fit) are counted apart, not as audits.
"""

from __future__ import annotations

import argparse
import time

t0 = time.perf_counter()
from kvaudit.errors import KvauditError  # noqa: E402
from kvaudit.measure.audit import audit_all  # noqa: E402
from kvaudit.measure.meters import make_meter  # noqa: E402
from kvaudit.model.deployment import PRESETS, load_preset_spec  # noqa: E402
from kvaudit.plan.planner import load_vllm, make_deployment  # noqa: E402
from kvaudit.strategies.builtin import STRATEGIES  # noqa: E402

load_vllm()
IMPORT_S = time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--utils", default="0.5,0.55,0.6,0.65,0.7,0.75,0.8,0.85,0.9,0.95")
    a = ap.parse_args()
    utils = [float(u) for u in a.utils.split(",")]
    meter, strategies = make_meter("meta"), list(STRATEGIES.values())
    audited = refused = skipped_n = 0
    first_build = 0.0
    start = time.perf_counter()
    for name in a.presets.split(","):
        p = PRESETS[name]
        spec = load_preset_spec(p)
        for tp in (1, 2, 4, 8):
            for util in utils:
                t = time.perf_counter()
                try:
                    d = make_deployment(spec, tp=tp, max_model_len=p.max_model_len, gpu_memory_utilization=util,
                                        device=p.device)
                except KvauditError:
                    refused += len(strategies)
                    continue
                finally:
                    first_build += time.perf_counter() - t if util == utils[0] else 0.0
                skipped: list = []
                try:
                    audited += len(audit_all(d, strategies, meter, skipped=skipped))
                except KvauditError:
                    refused += len(strategies)
                    continue
                skipped_n += len(skipped)
    wall = time.perf_counter() - start
    print(f"import of kvaudit + vLLM: {IMPORT_S:.1f} s")
    print(f"sweep: {audited} audits, {skipped_n} not auditable, {refused} refused configurations in {wall:.1f} s "
          f"({(audited + skipped_n) / wall:.1f} configurations/s after the import; model builds "
          f"{first_build:.1f} s of it)")


if __name__ == "__main__":
    main()
