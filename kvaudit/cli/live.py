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
from kvaudit.cli.output import BUILDING, note, show, step, write
from kvaudit.errors import UsageError
from kvaudit.model.options import DEPLOYMENT_OPTIONS
from kvaudit.results import check_tolerance

NAME = "live"
OPTIONS = (URL, CONFIG, REVISION, TRUST_REMOTE_CODE, API_KEY, SMI,
           *(o for o in DEPLOYMENT_OPTIONS if o.name not in ("vllm_python", "pp_rank", "num_blocks")),
           STRATEGY, TOLERANCE, LIVE_FORMAT, WATCH, COUNT)
USAGE = "URL [OPTIONS]"
HELP = "Audit a running vLLM / vllm-ascend server against vLLM's plan (its /metrics, the device's smi)."
DESCRIPTION = ("Read a running server's own endpoints (/metrics: its CacheConfig and num_gpu_blocks; /v1/models; "
               "/version; /server_info in dev mode), plan the same model and settings with vLLM's planner and the "
               "server's num_gpu_blocks, allocate that plan with each strategy on meta, and judge the device memory "
               "the server's processes hold (nvidia-smi / npu-smi, run here or given with --smi) against it. "
               "Exit 0 as planned, 1 a finding (over or below the plan, settings other than asked), 3 nothing "
               "measured.")
SMI_LIMIT = 1 << 20
"""The most smi output read (a table of 16 devices is under 10 KB)."""
SMI_COMMANDS = (("nvidia-smi", ["nvidia-smi"]), ("npu-smi", ["npu-smi", "info"]))


def run(a: Any) -> int:
    """Read the server, plan and judge; then, with ``--watch``, read it again every N seconds."""
    from kvaudit.report import live as out
    from kvaudit.server.endpoints import read_server

    check_tolerance(a.tolerance)
    if a.watch is not None and not 0 < a.watch <= 86400:
        raise UsageError(f"--watch {a.watch:g}: give the seconds between reads, above 0 and at most a day")
    if a.count is not None and a.count < 1:
        raise UsageError(f"--count {a.count}: give how many reads, at least 1")
    api_key = a.api_key or os.environ.get("VLLM_API_KEY") or None
    served = read_server(a.url, api_key)
    smi_text, smi_source = _smi_text(a)
    from kvaudit.server.smi import read_smi

    smi = read_smi(smi_text, smi_source) if smi_text is not None else None
    with step(BUILDING):
        report = _audit(a, served, smi)
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
        _watch(a, api_key, smi_source)
    return report.exit_code


def _audit(a: Any, served: Any, smi: Any) -> Any:
    """The live audit of ``served``: the model the options or the server name, the strategies, the settings asked."""
    from types import SimpleNamespace

    from kvaudit.server.live import live_audit, served_settings
    from kvaudit.strategies.builtin import STRATEGIES
    from kvaudit.strategies.resolve import resolve_strategies

    served_settings(served, None)  # (a server whose /metrics will not do is told before its model is loaded)
    spec, preset = _model(a, served)
    asked = SimpleNamespace(**{o.name: (getattr(a, o.name, None) if getattr(a, o.name, o.default) != o.default
                                        else None) for o in DEPLOYMENT_OPTIONS})
    strategies, broken = resolve_strategies(a.strategy or list(STRATEGIES))
    for s in strategies:
        if s.note:
            note(f"kvaudit: {s.note}")
    return live_audit(served, smi, asked, spec, preset, strategies, a.tolerance, broken)


def _model(a: Any, served: Any) -> tuple[Any, Any]:
    """The served model's spec: ``--model`` where given, else what the server loaded (``/v1/models``' root: a
    shipped config where one is that model, else by Hub id)."""
    from kvaudit.model.deployment import get_preset, load_model, load_preset_spec, preset_for_model
    from kvaudit.model.hub import names_hub_model

    if a.config:
        return load_model(None, a.config, a.revision, a.trust_remote_code)[0], None
    model = served.base_model
    root = (model.root or model.id) if model else served.engine_config.get("model")
    if not root:
        raise UsageError(f"{served.url} names no model (no /v1/models, no /server_info): give --model")
    shipped = preset_for_model(root)
    if shipped and shipped[1] and a.revision is None:
        return load_preset_spec(get_preset(shipped[0])), None
    if not names_hub_model(root):
        raise UsageError(f"the server loaded {root!r}, a path on its host: give --model (a Hub id, the model's folder "
                         "or its config.json)")
    return load_model(None, root, a.revision, a.trust_remote_code)[0], None


def _smi_text(a: Any) -> tuple[str | None, str]:
    """The smi output: ``--smi FILE`` (``-``: stdin), else nvidia-smi's or npu-smi's run here where the server is
    this machine and one is installed; ``None`` where there is none."""
    from kvaudit.jsonfile import read_bytes

    if a.smi == "-":
        text = sys.stdin.read(SMI_LIMIT + 1)
        if len(text) > SMI_LIMIT or not text.strip():
            raise UsageError(f"--smi -: stdin is {'empty' if not text.strip() else 'larger than 1 MiB'}, not smi output")
        return text, "stdin"
    if a.smi:
        raw = read_bytes(a.smi, "smi output", "run nvidia-smi or npu-smi info on the server's host into a file",
                         limit=SMI_LIMIT)
        return raw.decode("utf-8", errors="replace"), a.smi
    if not _local(a.url):
        note(f"kvaudit: {a.url} is not this machine: give its nvidia-smi / npu-smi output with --smi to judge its "
             "device memory")
        return None, ""
    return _run_smi()


def _run_smi() -> tuple[str | None, str]:
    import shutil
    import subprocess

    from kvaudit.network import timeout_s

    for tool, command in SMI_COMMANDS:
        if shutil.which(command[0]):
            try:
                p = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s())
            except (OSError, subprocess.TimeoutExpired) as e:
                raise UsageError(f"{tool} did not run: {e}") from None
            if p.returncode == 0:
                return p.stdout, f"{tool} run here"
    note("kvaudit: neither nvidia-smi nor npu-smi is installed here: give their output from the server's host with "
         "--smi to judge its device memory")
    return None, ""


def _local(url: str) -> bool:
    """Whether ``url``'s host is this machine (a loopback address, localhost, or this host's name)."""
    import ipaddress
    import socket
    import urllib.parse

    host = urllib.parse.urlsplit(url if "//" in url else "http://" + url).hostname or ""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _watch(a: Any, api_key: str | None, smi_source: str) -> None:
    """``--watch N``: /metrics (and the smi, where run here) read again every N seconds, a line each."""
    from kvaudit.report.live import watch_line
    from kvaudit.server.endpoints import read_server
    from kvaudit.server.live import device_use
    from kvaudit.server.smi import read_smi

    reads = 1
    while a.count is None or reads < a.count:
        time.sleep(a.watch)
        served = read_server(a.url, api_key)
        devices: Any = ()
        if smi_source.endswith("run here"):
            text, _ = _run_smi()
            devices = device_use(read_smi(text or "", smi_source)) if text else ()
        print(watch_line(time.strftime("%H:%M:%S"), served, devices), flush=True)
        reads += 1
