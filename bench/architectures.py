"""Architectures benchmark: does kvaudit plan every architecture of vLLM's registry that a public config exists for?

    .venv/bin/python bench/architectures.py                  # every folder under fixtures/architectures
    .venv/bin/python bench/architectures.py --only Qwen3     # folders whose name contains Qwen3
    .venv/bin/python bench/architectures.py --json /tmp/arch.json

For each folder of ``fixtures/architectures`` (a public Hugging Face ``config.json``, its ``SOURCE`` beside it) it runs
``kvaudit plan --model FOLDER --format json`` in this process (``kvaudit.cli.main``: vLLM is imported once) with the
defaults (TP 1 on the default device). Where the weights leave no memory for the KV cache, or too little for one request of the default
max_model_len, it raises the TP (2, 4, 8, 16), then takes the largest device preset (``h200-141g``) at TP 8 and 16, then
TP 8 × PP 2 there; the row names the TP, PP and device used (the figures are the first stage's).
It prints one row per folder:

- the architecture (``architectures[0]``) and where vLLM's registry lists it (``reg``: T text generation,
  M multimodal, B through vLLM's Transformers backend, R removed, ``-`` none);
- **served** (kvaudit planned it) or **refused** (kvaudit's one-line reason: vLLM no longer serves the
  architecture, the config needs code that is not here, the model does not fit, ...);
- the KV-cache spec kinds of vLLM's upstream plan with the layers each covers (``FullAttentionSpec×36``), the
  KV-cache layers in all, and the weights per rank in GiB.

A **traceback** row is a kvaudit bug (exit code 4) or an exception that escaped ``kvaudit.cli.main``; its last
traceback line is shown. The summary counts configs, distinct architectures, served and refused ones (with reasons)
and tracebacks, which must be zero. The exit code is 1 when any traceback occurred.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "fixtures" / "architectures"
TP_STEPS = (1, 2, 4, 8, 16)
BIG_DEVICE = "h200-141g"
BIG_DEVICE_TPS = (8, 16)
NO_ROOM = ("no memory left for the KV cache", "planner refused the budget")
"""Refusals a larger TP (more memory per rank) can lift: the weights leave no KV budget, or too little for one
request of max_model_len."""
NO_FIT = "must be divisible by tensor parallel size"
"""A TP the model's heads do not divide: skipped while looking for room."""


def folders(only: str | None) -> list[Path]:
    return [p for p in sorted(FOLDER.iterdir()) if (p / "config.json").is_file() and (not only or only in p.name)]


def architecture(folder: Path) -> str:
    try:
        return (json.loads((folder / "config.json").read_text()).get("architectures") or ["?"])[0]
    except (OSError, ValueError) as e:
        return f"? ({e})"


def registry_kind(arch: str) -> str:
    """T (text generation), M (multimodal), B (served by vLLM's Transformers backend: ``_TRANSFORMERS_SUPPORTED_MODELS``),
    R (removed) or - for vLLM's registry of this environment."""
    from kvaudit.model.vllm_modules import declare_torchvision_ops

    declare_torchvision_ops()
    from vllm.model_executor.models import registry

    if arch in registry._TEXT_GENERATION_MODELS:
        return "T"
    if arch in registry._MULTIMODAL_MODELS:
        return "M"
    if arch in getattr(registry, "_TRANSFORMERS_SUPPORTED_MODELS", {}):
        return "B"
    if arch in getattr(registry, "_PREVIOUSLY_SUPPORTED_MODELS", {}):
        return "R"
    return "-"


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``kvaudit.cli.main(argv)`` in this process: exit code, stdout, stderr."""
    from kvaudit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def reason(stderr: str) -> str:
    """kvaudit's one error line, without its ``kvaudit: error:`` prefix."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    picked = next((ln for ln in reversed(lines) if ln.startswith("kvaudit:")), lines[-1] if lines else "")
    for prefix in ("kvaudit: error: ", "kvaudit: "):
        if picked.startswith(prefix):
            return picked[len(prefix):]
    return picked


def last_traceback_line(stderr: str) -> str:
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    tb = [ln for ln in lines if not ln.startswith(("kvaudit:", " "))]
    return tb[-1] if tb else (lines[-1] if lines else "")


def summarise(doc: dict) -> dict:
    """Spec kinds with layer counts, KV layers and weights per rank from ``kvaudit plan --format json``."""
    stage = doc["stages"][0]
    dep = stage["deployment"]
    plans = stage["plans"]
    plan = next((p for p in plans if "vllm" in p.get("strategies", [])), plans[0]) if plans else None
    kinds: Counter = Counter()
    layers: set[str] = set()
    if plan:
        for g in plan["groups"]:
            kinds[g["spec"]] += len(g["layers"])
            layers.update(g["layers"])
    return {"specs": " ".join(f"{k}×{n}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))),
            "kv_layers": len(layers), "weights_gib": dep["weights_bytes"] / 2**30, "stages": len(doc["stages"]),
            "num_blocks": plan["num_blocks"] if plan else None, "max_model_len": dep["max_model_len"],
            "device": dep["device"]}


def attempts():
    for tp in TP_STEPS:
        yield tp, None, 1
    for tp in BIG_DEVICE_TPS:
        yield tp, BIG_DEVICE, 1
    yield BIG_DEVICE_TPS[0], BIG_DEVICE, 2  # two pipeline stages: each holds half the layers


def bench(folder: Path) -> dict:
    arch = architecture(folder)
    row = {"folder": folder.name, "architecture": arch, "registry": registry_kind(arch), "status": "refused",
           "tp": 1, "device": None, "reason": "", "specs": "", "kv_layers": None, "weights_gib": None}
    start = time.monotonic()
    try:
        for tp, device, pp in attempts():
            argv = ["plan", "--model", str(folder.relative_to(ROOT)), "--format", "json"]
            if tp != 1:
                argv += ["--tp", str(tp)]
            if pp != 1:
                argv += ["--pp", str(pp)]
            if device:
                argv += ["--device", device]
            rc, out, err = run_cli(argv)
            row.update(tp=tp, device=device, pp=pp)
            if rc == 0:
                row.update(status="served", reason="", **summarise(json.loads(out)))
                break
            if rc == 4:  # a bug in kvaudit: rerun with --debug for its traceback
                _, _, err_dbg = run_cli(argv + ["--debug"])
                row.update(status="traceback", reason=f"{reason(err)} [{last_traceback_line(err_dbg)}]")
                break
            why = reason(err) or f"exit code {rc}"
            if NO_FIT in why and any(m in row["reason"] for m in NO_ROOM):
                continue  # this TP does not divide the model; keep the reason of the last TP that did
            row["reason"] = why
            if not any(m in why for m in NO_ROOM):
                break
    except BaseException as e:  # noqa: BLE001 - one model's failure is a row, not the end of the bench
        if isinstance(e, KeyboardInterrupt):
            raise
        row.update(status="traceback", reason=f"{type(e).__name__}: {e} [{traceback.format_exc().splitlines()[-1]}]")
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def print_row(r: dict) -> None:
    weights = f"{r['weights_gib']:.2f}" if r.get("weights_gib") is not None else "—"
    where = f"tp{r['tp']}" + (f"pp{r['pp']}" if r.get("pp", 1) != 1 else "") + (f"@{r['device']}" if r.get("device") else "")
    what = r["specs"] if r["status"] == "served" else r["reason"]
    kv = r["kv_layers"] if r.get("kv_layers") is not None else "—"
    print(f"{r['folder']:<48} {r['architecture']:<40} {r['registry']:<3} {r['status']:<9} {where:<14} "
          f"{kv!s:>4} {weights:>8}  {what}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", metavar="SUBSTR", help="only folders whose name contains SUBSTR")
    ap.add_argument("--json", metavar="PATH", help="also write the rows and the summary as JSON to PATH")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))

    todo = folders(args.only)
    print(f"{'folder':<48} {'architecture':<40} {'reg':<3} {'status':<9} {'tp@device':<14} "
          f"{'kvL':>4} {'GiB/rank':>8}  KV-cache specs (served) / reason (refused)")
    rows = []
    t0 = time.monotonic()
    for folder in todo:
        r = bench(folder)
        rows.append(r)
        print_row(r)

    archs = Counter(r["architecture"] for r in rows)
    served = [r for r in rows if r["status"] == "served"]
    refused = [r for r in rows if r["status"] == "refused"]
    tracebacks = [r for r in rows if r["status"] == "traceback"]
    in_registry = {r["architecture"] for r in rows if r["registry"] in ("T", "M", "B")}
    served_archs = {r["architecture"] for r in served}
    print()
    print(f"configs: {len(rows)}   distinct architectures: {len(archs)} "
          f"({len(in_registry)} in vLLM's registry for generation)   "
          f"served: {len(served)} configs, {len(served_archs)} architectures   refused: {len(refused)}   "
          f"tracebacks: {len(tracebacks)}   ({time.monotonic() - t0:.0f} s)")
    if refused:
        print("refused:")
        for r in refused:
            print(f"  {r['folder']} ({r['architecture']}, registry {r['registry']}): {r['reason']}")
    if tracebacks:
        print("tracebacks:")
        for r in tracebacks:
            print(f"  {r['folder']} ({r['architecture']}): {r['reason']}")
    if args.json:
        summary = {"configs": len(rows), "architectures": len(archs), "in_registry": len(in_registry),
                   "served": len(served), "served_architectures": len(served_archs), "refused": len(refused),
                   "tracebacks": len(tracebacks)}
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    return 1 if tracebacks else 0


if __name__ == "__main__":
    sys.exit(main())
