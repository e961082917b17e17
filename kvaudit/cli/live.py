"""``kvaudit live URL``: a running vLLM / vllm-ascend server read from outside (its own endpoints, the device's smi
output), its deployment planned by vLLM with the server's own num_gpu_blocks, and the device memory it holds judged
against each strategy's allocation of that plan."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from kvaudit.cli.options import (API_KEY, CONFIG, COUNT, LIVE_FORMAT, REVISION, SMI, STRATEGY, TOLERANCE,
                                 TRUST_REMOTE_CODE, URL, WATCH, LiveFormat)
from kvaudit.cli.output import BUILDING, note, show, step
from kvaudit.errors import UsageError
from kvaudit.model.options import DEPLOYMENT_OPTIONS
from kvaudit.results import check_tolerance

NAME = "live"
OPTIONS = (URL, CONFIG, REVISION, TRUST_REMOTE_CODE, API_KEY, SMI,
           *(o for o in DEPLOYMENT_OPTIONS if o.name not in ("vllm_python", "pp_rank", "num_blocks")),
           STRATEGY, TOLERANCE, LIVE_FORMAT, WATCH, COUNT)
HELP = "Audit a running vLLM / vllm-ascend server against vLLM's plan (its /metrics, the device's smi)."
DESCRIPTION = ("Read a running server's own endpoints (/metrics: its CacheConfig and num_gpu_blocks; /v1/models; "
               "/version; /server_info in dev mode), plan the same model and settings with vLLM's planner and the "
               "server's num_gpu_blocks, allocate that plan with each strategy on meta, and judge the device memory "
               "the server's processes hold (nvidia-smi / npu-smi, run here or given with --smi) against it. "
               "Exit 0 as planned, 1 a finding (over or below the plan, settings other than asked), 3 nothing "
               "measured.")
def run(a: Any) -> int:
    """Read the server, plan and judge; then, with ``--watch``, read it again every N seconds."""
    from types import SimpleNamespace

    from kvaudit.report import live as out
    from kvaudit.server.endpoints import check_url
    from kvaudit.server.live import audit_served, read_live

    check_tolerance(a.tolerance)
    if a.watch is not None and not 0 < a.watch <= 86400:
        raise UsageError(f"--watch {a.watch:g}: give the seconds between reads, above 0 and at most a day")
    if a.count is not None and a.count < 1:
        raise UsageError(f"--count {a.count}: give how many reads, at least 1")
    check_url(a.url)
    api_key = a.api_key or os.environ.get("VLLM_API_KEY") or None
    smi_text, smi_source = _smi_text(a)
    asked = SimpleNamespace(**{o.name: (getattr(a, o.name, None) if getattr(a, o.name, o.default) != o.default
                                        else None) for o in DEPLOYMENT_OPTIONS})
    served, smi = read_live(a.url, api_key, smi_text, smi_source)
    with step(BUILDING):
        report = audit_served(served, smi, model=a.config, revision=a.revision,
                              trust_remote_code=a.trust_remote_code, asked=asked, strategies=a.strategy,
                              tolerance=a.tolerance, note=note)
    fmt = LiveFormat(a.fmt)
    if fmt is LiveFormat.json:
        sys.stdout.write(out.to_json(report) + "\n")
    elif fmt is LiveFormat.markdown:
        sys.stdout.write(out.to_markdown(report))
    elif fmt is LiveFormat.junit:
        sys.stdout.write(out.to_junit(report))
    else:
        show(out.render(report), gap=True)
    sys.stdout.flush()
    note(out.summary_line(report))
    if a.watch is not None:
        _watch(a, api_key, rerun_smi=a.smi is None and smi_text is not None)
    return report.exit_code


def _smi_text(a: Any) -> tuple[str | None, str]:
    """The smi output: ``--smi -`` (stdin), else ``kvaudit.server.live.smi_output``'s (``--smi FILE``, or the tool run
    here); where there is none, a note says why."""
    from kvaudit.server.live import smi_output
    from kvaudit.server.smi import SMI_LIMIT

    if a.smi == "-":
        text = sys.stdin.read(SMI_LIMIT + 1)
        if len(text) > SMI_LIMIT or not text.strip():
            raise UsageError(f"--smi -: stdin is {'empty' if not text.strip() else 'larger than 1 MiB'}, not smi output")
        return text, "stdin"
    text, source = smi_output(a.url, a.smi)
    if text is None:
        note(f"kvaudit: {source}")
    return text, source


def _watch(a: Any, api_key: str | None, rerun_smi: bool) -> None:
    """``--watch N``: /metrics (and the smi, where it was run here) read again every N seconds, a line each."""
    from kvaudit.report.live import watch_line
    from kvaudit.server.endpoints import read_server_metrics, server_base
    from kvaudit.server.live import device_use
    from kvaudit.server.smi import read_smi, run_smi

    base = server_base(a.url)
    reads = 1
    while a.count is None or reads < a.count:
        time.sleep(a.watch)
        metrics = read_server_metrics(base, api_key)
        devices: Any = ()
        if rerun_smi:
            text, source = run_smi()
            devices = device_use(read_smi(text, source)) if text else ()
        print(watch_line(time.strftime("%H:%M:%S"), metrics, devices), flush=True)
        reads += 1
