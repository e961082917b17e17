"""Start-up logs benchmark: kvaudit's deployment (vLLM's serve defaults, the non-KV memory model, the planner)
against real vLLM and vllm-ascend start-ups from public threads (``fixtures/startup-logs``).

    .venv/bin/python bench/startup.py                # the development set
    .venv/bin/python bench/startup.py --held-out     # the third held back (held-out.txt)
    .venv/bin/python bench/startup.py --case cuda/ID --terms

For each start whose inputs (``fixtures/startup-logs/inputs.json``: config, flags, device, release) are known it
prints the error of

- **weights**: kvaudit's weights per rank against the logged "Model loading took" / "Loading model weights took";
- **budget**: the KV budget kvaudit derives from ``--util`` against the logged "Available KV cache memory"
  (vllm-ascend: "Available memory: A, total memory: T");
- **blocks**, **concurrency**, **tokens**: given the logged budget (``--kv-cache-memory``), vLLM's planner's
  num_blocks, "Maximum concurrency" and "KV cache size: N tokens" (by the release's definition) against the log;
- **other**: the non-KV memory beside the weights, kvaudit's terms against what the log implies
  (util × device memory − logged weights − logged budget), which is what the non-KV model is fitted to.

Each set's worst errors are also printed by the kind of device (``GROUPS``: datacenter, consumer and workstation,
Blackwell, Ascend), as issue 33 asks them reported.

The figures are read from the logs by ``kvaudit.triage.evidence`` (the triage reader), never typed in. Each metric's
median and worst absolute error follow. Every case runs through one model with one set of constants
(``kvaudit.model.memory``); nothing is set per case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "fixtures" / "startup-logs"
METRICS = ("weights", "budget", "other", "blocks", "concurrency", "tokens")
MODELLED_FROM = "0.11.0"
"""The non-KV model follows vLLM's V1 worker; older starts (the V0 engine) are listed apart, not scored."""


def cases() -> dict[str, dict]:
    """Every start with its inputs: ``{folder/id: {"case": cases.json entry, "inputs": inputs.json entry}}``."""
    inputs = json.loads((LOGS / "inputs.json").read_text())
    out = {}
    for folder in ("cuda", "ascend"):
        for name in ("cases.json",):
            path = LOGS / folder / name
            if path.exists():
                for cid, entry in json.loads(path.read_text()).items():
                    key = f"{folder}/{cid}"
                    if key in inputs:
                        out[key] = {"case": entry, "inputs": inputs[key]}
    return out


def held_out() -> set[str]:
    return {line.strip() for line in (LOGS / "held-out.txt").read_text().splitlines() if line.strip()}


def logged(key: str) -> dict:
    """The figures the start's log prints, as ``kvaudit.triage.evidence`` reads them."""
    from kvaudit.triage.evidence import clean_lines, extract

    ev = extract(clean_lines((LOGS / f"{key}.log").read_text(errors="replace")))
    got = {k: ev.value(k) for k in ("weights", "peak_activation", "non_torch", "cudagraph_memory",
                                    "cudagraph_estimate", "graph_capture", "profiled_weights", "device_memory")}
    # Each worker logs its own budget; the engine gives every worker the blocks of the smallest (vLLM's
    # get_kv_cache_configs: "Change the num_blocks of each rank to the smallest among all ranks"), and releases
    # that log a KV size per worker before that step print the smallest first only by chance of rank order.
    for k in SMALLEST_WORKER:
        values = [f.value for f in ev.all(k)]
        got[k] = min(values) if values else None
    return got


SMALLEST_WORKER = ("available_kv", "kv_cache_tokens", "max_concurrency", "gpu_blocks")
"""The figures a multi-worker start logs once per worker, of which the engine keeps the smallest."""


def device_kind(inp: dict, case: dict) -> str:
    """A device kind for the start's platform, its memory replaced by the logged one: the kind matters to vLLM only
    where its batch defaults look at the device (an A100's name, a GB10's capability: the small ones)."""
    if inp["platform"] == "ascend":
        return "atlas-a2-64g"
    device = str(case.get("device") or "").lower()
    if "gb10" in device or "dgx spark" in device:
        return "gb10-128g"
    if "a100" in device:  # by the memory the inputs give, else the card's name (prose may name the other size)
        given = inp.get("device_memory")
        if given:
            from kvaudit.units import parse_size

            return "a100-40g" if parse_size(str(given), "device_memory") < 60 * 2**30 else "a100-80g"
        return "a100-40g" if "40g" in device.replace(" ", "") else "a100-80g"
    return "h100-80g"


def deployment(inp: dict, case: dict, kv_cache_memory: int | None = None):
    """The start's deployment as kvaudit builds it from the inputs (its flags under vLLM's names)."""
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import make_deployment
    from kvaudit.units import parse_size

    config = ROOT / "fixtures" / inp["config"] if "/" in inp["config"] else ROOT / "fixtures" / "configs" / inp["config"]
    spec = load_model_spec(config)
    o = dict(inp.get("options") or {})
    device = device_kind(inp, case)  # (an A100 keeps the preset's memory: vLLM reads its name)
    return make_deployment(
        spec, tp=inp["tp"], pp=inp.get("pp", 1), gpu_memory_utilization=inp["util"],
        max_model_len=inp.get("max_model_len"),
        device=device,
        device_memory_bytes=None if device.startswith("a100") or not inp.get("device_memory")
        else parse_size(str(inp["device_memory"]), "device_memory"),
        hf_overrides=inp.get("hf_overrides"), vllm_release=inp.get("vllm_version"),
        kv_cache_memory_bytes=kv_cache_memory, allow_no_kv_budget=bool(inp.get("allow_no_kv_budget")), **o)


def rule_for(inp: dict, case: dict) -> str:
    """The platform rule of the start: CUDA's, or the block-size rule of its vllm-ascend release."""
    if inp["platform"] == "cuda":
        return "cuda"
    from kvaudit.strategies.releases import platform_for

    return platform_for(case.get("vllm_ascend_version") or inp.get("vllm_ascend_version") or inp["vllm_version"])


GROUPS = ("datacenter", "consumer and workstation", "Blackwell", "Ascend")
"""How issue 33 asks the figures reported: by the kind of device a start ran on."""


def platform_group(entry: dict) -> str:
    """The start's group in ``GROUPS``, from its platform and the device its case names (a Blackwell card, consumer or
    workstation, before the datacenter default)."""
    if entry["inputs"].get("platform") == "ascend":
        return "Ascend"
    device = str(entry["case"].get("device") or "").lower()
    if any(w in device for w in ("b200", "gb200", "gb10", "dgx spark", "blackwell", "5090", "5080", "5070", "pro 6000")):
        return "Blackwell"
    if any(w in device for w in ("rtx", "geforce", "jetson", "a6000", "a5000")):
        return "consumer and workstation"
    return "datacenter"


def measure(key: str, entry: dict) -> dict:
    """One start's errors (``None`` where the log or the inputs do not allow a figure)."""
    from kvaudit.errors import KvauditError
    from kvaudit.plan.capacity import capacity
    from kvaudit.plan.planner import build_plan
    from kvaudit.report import startup

    inp, case = entry["inputs"], entry["case"]
    judge = set(inp.get("judge", METRICS))
    got = logged(key)
    err: dict = {m: None for m in METRICS}
    row = {"key": key, "terms": {}, "logged": got, "err": err, "release": inp.get("vllm_version"), "note": "",
           "group": platform_group(entry)}
    avail = got["available_kv"]
    if inp.get("device_memory") and judge & {"weights", "budget"}:
        try:
            d = deployment(inp, case)
        except KvauditError as e:  # e.g. quantized weights kvaudit does not model, over util × memory
            row["note"] = e.message
        else:
            row.update(terms={t.key: t.bytes for t in d.overhead_terms}, release=d.vllm_version,
                       max_num_seqs=d.max_num_seqs, max_num_batched_tokens=d.max_num_batched_tokens,
                       upper_bound=bool(d.unmodelled))
            if got["weights"] and "weights" in judge:
                err["weights"] = d.weights_bytes / got["weights"] - 1
            if avail and "budget" in judge:
                err["budget"] = d.kv_budget_bytes / avail - 1
                if got["weights"]:
                    implied = int(d.device_memory_bytes * d.gpu_memory_utilization) - got["weights"] - avail
                    err["other"] = (d.overhead_bytes - implied) / max(implied, 1)
    if avail and avail > 0 and judge & {"blocks", "concurrency", "tokens"}:
        given = deployment(inp, case, kv_cache_memory=avail)
        plan = build_plan(given, rule_for(inp, case))
        cap = capacity(plan)
        if got["gpu_blocks"] and "blocks" in judge:
            err["blocks"] = plan.num_blocks / got["gpu_blocks"] - 1
        if got["max_concurrency"] and "concurrency" in judge:
            err["concurrency"] = startup.max_concurrency(plan, cap, given.vllm_version) / got["max_concurrency"] - 1
        if got["kv_cache_tokens"] and "tokens" in judge:
            err["tokens"] = startup.kv_cache_tokens(plan, cap, given.vllm_version) / got["kv_cache_tokens"] - 1
    return row


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def report(rows: list[dict], title: str, terms: bool) -> None:
    print(f"\n{title}: {len(rows)} starts")
    print(f"{'start':58} {'vLLM':>8} " + " ".join(f"{m:>11}" for m in METRICS))
    for r in rows:
        print(f"{r['key'][:58]:58} {str(r['release'])[:8]:>8} " + " ".join(
            f"{_pct(r['err'][m]) + ('*' if m == 'budget' and r.get('upper_bound') and r['err'][m] is not None else ''):>11}"
            for m in METRICS))
        if terms:
            g = {k: (round(v / (1 << 30), 2) if isinstance(v, int) and k not in ("kv_cache_tokens", "gpu_blocks") else v)
                 for k, v in r["logged"].items() if v is not None}
            print(f"    modelled (GiB): {', '.join(f'{k} {v / (1 << 30):.2f}' for k, v in r['terms'].items())}; "
                  f"seqs {r.get('max_num_seqs')}, batched {r.get('max_num_batched_tokens')}; logged: {g}"
                  + (f"; {r['note']}" if r["note"] else ""))
    print(f"{'':58} {'':>8} " + " ".join(f"{'median':>11}" for _ in METRICS))
    for what, f in (("median |error|", statistics.median), ("worst |error|", max)):
        cells = []
        for m in METRICS:
            vals = [abs(r["err"][m]) for r in rows if r["err"][m] is not None]
            cells.append(f"{100 * f(vals):.1f}% ({len(vals)})" if vals else "—")
        print(f"{what:58} {'':>8} " + " ".join(f"{c:>11}" for c in cells))
    for group in GROUPS:  # worst |error| per group (issue 33's report by platform)
        mine = [r for r in rows if r["group"] == group]
        if not mine:
            continue
        cells = []
        for m in METRICS:
            vals = [abs(r["err"][m]) for r in mine if r["err"][m] is not None]
            cells.append(f"{100 * max(vals):.1f}% ({len(vals)})" if vals else "—")
        print(f"{'  worst, ' + group + f' ({len(mine)} starts)':58} {'':>8} " + " ".join(f"{c:>11}" for c in cells))


def footnote(rows: list[dict]) -> None:
    if any(r.get("upper_bound") for r in rows):
        print("* a budget kvaudit calls an upper bound: memory the profile holds that no term models (the report's "
              "\"not modelled\" row: a multimodal encoder's profile)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held-out", action="store_true", help="measure the held-back third instead")
    ap.add_argument("--all", action="store_true", help="both sets, reported apart")
    ap.add_argument("--case", action="append", default=[], help="only this start (folder/id); repeatable")
    ap.add_argument("--terms", action="store_true", help="print each start's modelled terms and logged figures")
    a = ap.parse_args()
    from kvaudit.errors import KvauditError

    everything, held = cases(), held_out()
    sets = [("development set", False), ("held-out set", True)] if a.all else [
        ("held-out set" if a.held_out else "development set", a.held_out)]
    for title, want_held in sets:
        rows = []
        for key, entry in sorted(everything.items()):
            if a.case and key not in a.case:
                continue
            if not a.case and ((key in held) != want_held or "skip" in entry["inputs"]):
                continue
            try:
                rows.append(measure(key, entry))
            except KvauditError as e:
                print(f"{key}: not measured: {e.message}", file=sys.stderr)
        from kvaudit.versions import version_key

        old = [r for r in rows if version_key(r["release"] or "0") < version_key(MODELLED_FROM)]
        report([r for r in rows if r not in old], title, a.terms)
        if old:
            report(old, f"{title}, vLLM before {MODELLED_FROM} (the V0 engine: not modelled, not scored)", a.terms)
        footnote(rows)


if __name__ == "__main__":
    main()
