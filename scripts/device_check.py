"""The device part of ``scripts/device-check``: every check of kvaudit's device path, with results as JSON and Markdown.

Needs only Python with torch (and torch_npu on an Ascend host) and the files ``scripts/device-check
prepare`` saved: the plans vLLM made and the meta audits of them. Checks, in order:

1. torch here audits the saved plans on ``meta`` byte for byte as the planning host's live audit did;
2. the ``cuda`` / ``npu`` tests (``tests/test_device.py``: full scale against the meta accounting, a 4x
   strategy out of memory on purpose, the leak check);
3. a smoke audit through the real meter, no fake: every strategy on each saved Qwen3-Next TP 4 plan at
   full scale (``kvaudit audit --plan ... --meter cuda|npu``);
4. the 4x strategy run out of memory on purpose (the caching allocator capped at what is held plus three
   times the plan), the others still audited, memory back where it started;
5. ``bench/bench.py``'s device time per strategy against the fill-bandwidth floor;
6. on a CUDA host where vLLM is installed, vLLM's own memory profile of a start with dummy weights (its "Model
   loading took", "Free memory on device ... Actual usage is" and "Available KV cache memory" lines) against each of
   kvaudit's terms for the same deployment on this device (``compare_terms``); skipped, saying why, elsewhere;
7. on the same host, vLLM's OpenAI server started with that model (dummy weights) and ``kvaudit live`` run against it
   (its /metrics and nvidia-smi here): the server should hold its plan (``check_live``); skipped, saying why,
   elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def _env(plans: Path) -> dict:
    site = plans / "site"
    path = os.pathsep.join(filter(None, [str(ROOT), str(site) if site.is_dir() else "", os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, KVAUDIT_DEVICE_PLANS=str(plans), COLUMNS="160")


def _kvaudit(args: list[str], plans: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvaudit", *args], capture_output=True, text=True, cwd=ROOT,
                          env=_env(plans))


def _device() -> tuple[str | None, str]:
    from kvaudit.measure.meters import make_meter

    reasons = []
    for name in ("npu", "cuda"):
        why = make_meter(name).probe()
        if why is None:
            return name, make_meter(name).describe()
        reasons.append(f"{name}: {why}")
    return None, "; ".join(reasons)


def check_torch_compat(plans: Path) -> dict:
    rows = []
    for plan in sorted(plans.glob("*.plan.json")):
        expected = plan.with_name(plan.name.replace(".plan.json", ".meta.json"))
        p = _kvaudit(["audit", "--plan", str(plan), "--meter", "meta", "--format", "json"], plans)
        got = json.loads(p.stdout) if p.stdout.startswith("{") else None
        want = json.loads(expected.read_text()) if expected.is_file() else None
        ok = got is not None and want is not None
        if ok:  # the vllm strategy is skipped where vLLM is not installed: compare what both audited
            by_name = {a["strategy"]: a for a in want["audits"]}
            ok = all(a == by_name.get(a["strategy"]) for a in got["audits"]) and bool(got["audits"])
            ok = ok and all(want["capacity"].get(k) == v for k, v in got["capacity"].items())
            ok = ok and all(got[k] == want[k] for k in ("vllm_version", "meter", "meter_device", "model",
                                                         "deployment"))
        rows.append({"plan": plan.name, "exit_code": p.returncode, "identical": ok,
                     "audited": [a["strategy"] for a in got["audits"]] if got else [],
                     "skipped": [s["strategy"] for s in got["skipped"]] if got else [],
                     "stderr": p.stderr.strip().splitlines()[-1:] })
    passed = bool(rows) and all(r["identical"] for r in rows)
    return {"status": "pass" if passed else "fail", "plans": rows}


def check_device_tests(plans: Path) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "cuda or npu",
                        "tests/test_device.py"], capture_output=True, text=True, cwd=ROOT, env=_env(plans))
    lines = (p.stdout + p.stderr).strip().splitlines()
    summary = lines[-1] if lines else ""
    status = "pass" if p.returncode == 0 and " passed" in summary else (
        "skipped" if p.returncode == 0 else "fail")
    return {"status": status, "exit_code": p.returncode, "summary": summary, "seconds": time.perf_counter() - t0,
            "tail": lines[-15:]}


def check_smoke(plans: Path, device: str) -> dict:
    rows, ok = [], True
    for plan in sorted(plans.glob("*.plan.json")):
        t0 = time.perf_counter()
        p = _kvaudit(["audit", "--plan", str(plan), "--meter", device, "--format", "json"], plans)
        dt = time.perf_counter() - t0
        doc = json.loads(p.stdout) if p.stdout.startswith("{") else None
        if doc is None:
            rows.append({"plan": plan.name, "exit_code": p.returncode, "error": p.stderr.strip().splitlines()[-1:]})
            ok = False
            continue
        audits = [{"strategy": a["strategy"], "ratio": round(a["ratio"], 4), "verdict": a["verdict"],
                   "requested": a["reading"]["requested"], "allocated": a["reading"]["allocated"],
                   "reserved": a["reading"]["reserved"], "rounding": a["rounding_bytes"],
                   "leaked": a["leaked_bytes"], "device_oom": a["device_oom"] is not None,
                   "back_to_start": (a["after_release"] or {}).get("allocated") == (a["reading"]["before"] or {}).get(
                       "allocated")} for a in doc["audits"]]
        want = {"vllm": 1.0, "ascend-0.11": 4.0, "ascend-0.12": 2.0, "ascend-0.16": 1.0}
        good = (p.returncode == 1 and all(round(a["ratio"], 2) == want[a["strategy"]] and not a["leaked"]
                                          and not a["device_oom"] and a["back_to_start"] for a in audits))
        ok = ok and good
        rows.append({"plan": plan.name, "exit_code": p.returncode, "seconds": dt, "meter_device": doc["meter_device"],
                     "planned_by": doc["vllm_version"], "audits": audits,
                     "skipped": [[s["strategy"], s["reason"]] for s in doc["skipped"]], "as_expected": good})
    return {"status": "pass" if ok and rows else "fail", "plans": rows}


def check_oom_on_purpose(plans: Path, device: str) -> dict:
    from kvaudit.errors import NotAuditable
    from kvaudit.measure.audit import audit_all
    from kvaudit.measure.meters import make_meter
    from kvaudit.plan.planfile import load
    from kvaudit.strategies.builtin import STRATEGIES

    stage = load(plans / "qwen3-next.plan.json").stages[0]
    meter = make_meter(device)
    backend = meter.backend()
    backend.empty_cache()
    runnable = []
    for s in STRATEGIES.values():
        try:
            if s.prepare:
                s.prepare(stage.plans[s.platform])
            runnable.append(s)
        except NotAuditable:
            pass
    planned = stage.plans["ascend-align128"].planned_bytes
    total = backend.mem_get_info(0)[1]
    start = (backend.memory_allocated(0), backend.memory_reserved(0))
    cap = min(1.0, (start[1] + 3 * planned) / total)
    backend.set_per_process_memory_fraction(cap, 0)
    try:
        results = audit_all(stage.deployment, runnable, meter, plan_for=lambda s: stage.plans[s.platform])
    finally:
        backend.set_per_process_memory_fraction(1.0, 0)
    backend.empty_cache()
    end = (backend.memory_allocated(0), backend.memory_reserved(0))
    by = {r.strategy: r for r in results}
    oom = by["ascend-0.11"].device_oom
    ok = (oom is not None and all(r.device_oom is None for n, r in by.items() if n != "ascend-0.11")
          and end[0] == start[0] and all(r.leaked_bytes == 0 for r in results))
    return {"status": "pass" if ok else "fail", "cap_fraction": cap, "cap_bytes": int(cap * total),
            "planned_bytes": planned, "allocated_before": start[0], "allocated_after": end[0],
            "reserved_before": start[1], "reserved_after": end[1],
            "oom": oom.to_dict() if oom else None,
            "others": {n: {"ratio": round(r.ratio, 4), "verdict": r.verdict.value} for n, r in by.items()
                       if n != "ascend-0.11"}}


def check_bench(plans: Path) -> dict:
    sys.path.insert(0, str(ROOT / "bench"))
    import bench

    rows = bench.device_full_scale(str(plans / "qwen3-next.plan.json"))
    return {"status": "pass" if rows else "fail", "rows": rows}


TERMS_MODEL = ROOT / "fixtures" / "configs" / "qwen3-8b"
"""The model the terms check starts vLLM with (dummy weights: its config is all vLLM needs)."""
TERMS_OPTIONS = {"max_model_len": 4096, "gpu_memory_utilization": 0.5}
"""The start's flags, as vLLM's and kvaudit's option names both spell them."""
_LOGGED = {"weights": ("weights",), "peak_activation": ("peak_activation",), "non_torch": ("non_torch",),
           "cuda_graphs": ("cudagraph_estimate", "cudagraph_memory"), "kv_budget": ("available_kv",)}
"""Each compared figure, by kvaudit's term key, and the facts of ``kvaudit.triage.evidence`` that read vLLM's lines
(the graphs: vLLM's estimate where it logs one, else the breakdown's CUDAGraph figure)."""


def compare_terms(log: str, d) -> list[dict]:
    """vLLM's logged figures (read by kvaudit's own log reader) against the deployment's: weights, each non-KV term
    and the KV budget, with the ratio modelled / logged where both exist."""
    from kvaudit.triage.evidence import clean_lines, extract

    ev = extract(clean_lines(log))
    terms = {t.key: t.bytes for t in d.overhead_terms}
    modelled = {"weights": d.weights_bytes, **terms, "kv_budget": d.kv_budget_bytes}
    rows = []
    for key, facts in _LOGGED.items():
        logged = next((v for v in map(ev.value, facts) if v is not None), None)
        got = modelled.get(key)
        rows.append({"term": key, "logged": logged, "modelled": got,
                     "ratio": round(got / logged, 3) if logged and got is not None else None})
    return rows


def check_terms(device: str | None) -> dict:
    import importlib.util

    if device != "cuda":
        return {"status": "skipped", "reason": "the terms follow vLLM's CUDA worker: a CUDA host is needed"}
    if importlib.util.find_spec("vllm") is None:
        return {"status": "skipped", "reason": "vLLM is not installed on this host: its own profile run is what the "
                                               "terms are measured against"}
    import torch

    from kvaudit.model.deployment import DEVICES
    from kvaudit.model.spec import load_model_spec
    from kvaudit.plan.planner import make_deployment

    name, total = torch.cuda.get_device_name(0), torch.cuda.mem_get_info(0)[1]
    capability = torch.cuda.get_device_capability(0)
    kind = min((k for k, dv in DEVICES.items() if dv.platform == "cuda" and dv.capability == capability),
               key=lambda k: abs(DEVICES[k].memory_bytes - total), default="h100-80g")
    start = ("from vllm import LLM; LLM(model=%r, load_format='dummy', skip_tokenizer_init=True, max_model_len=%d, "
             "gpu_memory_utilization=%s)" % (str(TERMS_MODEL), TERMS_OPTIONS["max_model_len"],
                                              TERMS_OPTIONS["gpu_memory_utilization"]))
    p = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, cwd=ROOT, timeout=900,
                       env=dict(os.environ, VLLM_LOGGING_LEVEL="INFO"))
    log = p.stdout + p.stderr
    d = make_deployment(load_model_spec(TERMS_MODEL), tp=1, device=kind, device_memory_bytes=total,
                        gpu_memory_utilization=TERMS_OPTIONS["gpu_memory_utilization"],
                        max_model_len=TERMS_OPTIONS["max_model_len"])
    rows = compare_terms(log, d)
    measured = [r for r in rows if r["ratio"] is not None]
    return {"status": "pass" if p.returncode == 0 and measured else "fail", "device": name, "kind": kind,
            "vllm_exit_code": p.returncode, "terms": rows, "tail": log.strip().splitlines()[-12:]}


LIVE_TIMEOUT_S = 300
"""How long the server may take to start (load dummy weights, profile, capture graphs) before the check gives up."""


def check_live(device: str | None) -> dict:
    """vLLM's OpenAI server started here with ``TERMS_MODEL`` (dummy weights), then ``kvaudit live`` against it."""
    import importlib.util
    import socket
    import urllib.request

    if device != "cuda":
        return {"status": "skipped", "reason": "starting vLLM's server needs a CUDA host (vllm-ascend's, an NPU one "
                                               "with vllm-ascend installed: not tried here)"}
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("fastapi") is None:
        return {"status": "skipped", "reason": "vLLM's server is not installed on this host (vllm with fastapi and "
                                               "uvicorn): it is what kvaudit live reads"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(TERMS_MODEL),
                               "--load-format", "dummy", "--port", str(port), "--host", "127.0.0.1",
                               "--max-model-len", str(TERMS_OPTIONS["max_model_len"]),
                               "--gpu-memory-utilization", str(TERMS_OPTIONS["gpu_memory_utilization"])],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + LIVE_TIMEOUT_S
        while time.monotonic() < deadline and server.poll() is None:
            try:
                body = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
                if 'num_gpu_blocks="' in body and 'num_gpu_blocks="None"' not in body:
                    break
            except OSError:
                pass
            time.sleep(2)
        else:
            return {"status": "fail", "reason": f"vLLM's server did not come up in {LIVE_TIMEOUT_S} s "
                                                f"(exit {server.poll()})"}
        p = subprocess.run([sys.executable, "-m", "kvaudit", "live", url, "--model", str(TERMS_MODEL), "--format",
                            "json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
        doc = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {}
        return {"status": "pass" if p.returncode == 0 else "fail", "exit_code": p.returncode,
                "verdict": doc.get("verdict"), "findings": doc.get("findings"), "devices": doc.get("devices"),
                "num_gpu_blocks": doc.get("num_gpu_blocks"), "tail": p.stderr.strip().splitlines()[-3:]}
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def markdown(res: dict) -> str:
    gib = 1 << 30
    out = [f"# kvaudit device check, {res['date']}", "",
           f"- host: {res['host']}", f"- torch {res['torch']}, Python {res['python']}",
           f"- device: {res['device_description']}", f"- total: {res['seconds']:.0f} s", ""]
    out += ["| check | status | figures |", "|---|---|---|"]
    for name, c in res["checks"].items():
        fig = ""
        if name == "torch_compat":
            fig = "; ".join(f"{r['plan']}: {'identical' if r['identical'] else 'DIFFERS'} ({', '.join(r['audited'])})"
                            for r in c.get("plans", []))
        elif name == "device_tests":
            fig = c.get("summary", "")
        elif name == "smoke" and c.get("plans"):
            fig = "; ".join(f"{r['plan']}: " + ", ".join(
                f"{a['strategy']} {a['ratio']:.2f}× ({a['requested'] / gib:.2f} GiB, rounding {a['rounding']} B)"
                for a in r.get("audits", [])) for r in c["plans"])
        elif name == "oom_on_purpose" and c.get("oom"):
            o = c["oom"]
            fig = (f"cap {c['cap_bytes'] / gib:.2f} GiB; ascend-0.11 out at allocation {o['allocation']} of "
                   f"{o['allocations']}; allocated after = before ({c['allocated_after']:,} B): "
                   f"{c['allocated_after'] == c['allocated_before']}")
        elif name == "bench" and c.get("rows"):
            fig = "; ".join(f"{r['strategy']} {r['seconds'] * 1000:.1f} ms (floor {r['floor_seconds'] * 1000:.1f} ms)"
                            for r in c["rows"])
        elif name == "live" and c.get("verdict"):
            fig = f"{c['verdict']} (exit {c['exit_code']}); num_gpu_blocks {c.get('num_gpu_blocks')}"
        elif name == "terms" and c.get("terms"):
            fig = "; ".join(f"{r['term']} {r['ratio']}× of vLLM's" for r in c["terms"] if r["ratio"] is not None)
        elif c.get("reason"):
            fig = c["reason"]
        out.append(f"| {name} | {c['status']} | {fig} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--plans", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    t0 = time.perf_counter()
    import torch

    device, description = _device()
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
           "python": platform.python_version(), "torch": torch.__version__, "device": device,
           "device_description": description, "checks": {}}
    checks = [("torch_compat", lambda: check_torch_compat(a.plans)),
              ("device_tests", lambda: check_device_tests(a.plans))]
    if device:
        checks += [("smoke", lambda: check_smoke(a.plans, device)),
                   ("oom_on_purpose", lambda: check_oom_on_purpose(a.plans, device)),
                   ("bench", lambda: check_bench(a.plans))]
    checks.append(("terms", lambda: check_terms(device)))
    checks.append(("live", lambda: check_live(device)))
    for name, run in checks:
        t = time.perf_counter()
        try:
            res["checks"][name] = run()
        except Exception as e:  # a check that breaks is a failed check, with its reason
            res["checks"][name] = {"status": "fail", "reason": f"{type(e).__name__}: {e}"}
        res["checks"][name]["seconds"] = time.perf_counter() - t
        print(f"device-check: {name}: {res['checks'][name]['status']}", file=sys.stderr, flush=True)
    if not device:
        for name in ("smoke", "oom_on_purpose", "bench"):
            res["checks"][name] = {"status": "skipped", "reason": f"no cuda or npu device ({description})"}
    res["seconds"] = time.perf_counter() - t0
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    (a.out / "results.md").write_text(markdown(res))
    sys.stdout.write(markdown(res))
    return 1 if any(c["status"] == "fail" for c in res["checks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
