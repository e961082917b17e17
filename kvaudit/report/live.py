"""A live server's audit (``kvaudit.server.live.LiveReport``) as the terminal's tables, Markdown to paste into an
issue, JSON, and JUnit XML for a CI gate; and one line per re-read for ``--watch``."""

from __future__ import annotations

import json
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from kvaudit.escape import md
from kvaudit.model.memory import TITLES
from kvaudit.units import fmt_bytes


def summary_line(r: Any) -> str:
    """The closing line: the verdict, what was measured and what planned."""
    extra = f" ({r.factor:.2f}×" + (f", as {', '.join(r.matching)}" if r.matching else "") + ")" if r.factor else ""
    measured = f"device memory from {r.smi.tool}" if r.smi else "no device memory read (--smi)"
    return (f"kvaudit live: {r.verdict.upper()}{extra}: vLLM {r.served.version or '?'} serving {_model(r)} at "
            f"{r.url} — {measured}; planned by vLLM {r.vllm_version} with the server's {r.served_blocks:,} blocks, "
            "allocations on meta")


def _model(r: Any) -> str:
    m = r.served.base_model
    return (m.root or m.id) if m else r.deployment.model


def _rows(r: Any) -> list[tuple[str, str, str]]:
    """(quantity, value, source) rows of the served plan."""
    cap, d = r.capacity, r.deployment
    def blocks(n: int) -> str:  # a num_blocks beside the served one
        return f"{n:,} ({(n - r.served_blocks) / max(1, r.served_blocks):+.1%})"

    planned = "—" if r.planned_blocks is None else blocks(r.planned_blocks)
    engine = r.served.metrics.engines[0]
    rows = [("num_gpu_blocks, served", f"{r.served_blocks:,}", "/metrics vllm:cache_config_info"),
            ("num_gpu_blocks, planned", planned,
             f"vLLM {r.vllm_version}'s planner, kvaudit's memory model of vLLM {d.vllm_version or r.vllm_version}"),
            ("KV cache size (tokens)", f"{cap.tokens:,}", "vLLM's get_kv_cache_capacity on the served plan"),
            (f"max concurrency ({cap.max_model_len:,} tokens)", f"{cap.max_concurrency:.2f}×", "the same"),
            ("KV cache planned", fmt_bytes(r.audits[0].expected_bytes), "the served plan's tensors"),
            ("budget (device × utilization)",
             f"{fmt_bytes(int(d.device_memory_bytes * d.gpu_memory_utilization))} ({d.gpu_memory_utilization:g} × "
             f"{fmt_bytes(d.device_memory_bytes)})", f"--device {d.device}"),
            ("weights", fmt_bytes(d.weights_bytes), d.weights_source),
            *((TITLES.get(t.key, t.key), fmt_bytes(t.bytes) + ("" if t.budgeted else ", beyond the budget"),
               t.source.split(" [")[0]) for t in d.overhead_terms)]
    if r.nearest_era:
        eras, n = r.nearest_era
        rows.insert(2, (f"num_gpu_blocks, the budget of vLLM {' and '.join(eras)}", blocks(n),
                        "the nearest of each era's budget formula to the served figure (the first release of each)"))
    if engine.kv_cache_usage is not None:
        rows.append(("KV-cache usage", f"{engine.kv_cache_usage:.1%}", "/metrics"))
    if engine.running is not None:
        rows.append(("requests running / waiting", f"{engine.running:g} / {engine.waiting or 0:g}", "/metrics"))
    return rows


def _strategy_rows(r: Any) -> list[tuple[str, ...]]:
    return [(s.strategy, f"{s.ratio:.2f}×", fmt_bytes(a.allocated_bytes), fmt_bytes(a.projected_bytes),
             f"{fmt_bytes(max(0, s.low_bytes))} – {fmt_bytes(s.high_bytes)}",
             "matches" if s.strategy in r.matching else "—") for a, s in zip(r.audits, r.signatures)]


STRATEGY_COLUMNS = ("strategy", "allocated / planned", "KV allocated", "weights + non-KV + KV allocated",
                    "device use predicted", "observed")
"""The strategies' table: kvaudit's projection from its memory model beside the range the server's own budget
predicts (what the verdict uses)."""


def _device_rows(r: Any) -> list[tuple[str, ...]]:
    total = r.deployment.device_memory_bytes
    return [(str(u.index) if u.index is not None else "?", u.name or "?", fmt_bytes(u.used_bytes),
             f"{u.used_bytes / total:.3f}", u.source) for u in r.devices]


def render(r: Any) -> list[Any]:
    """The terminal's renderables: settings, the served plan, each strategy's signature, the devices, the findings."""
    from rich.table import Table
    from rich.text import Text

    from kvaudit.report.tables import Fitted

    out: list[Any] = [Text(summary_line(r).removeprefix("kvaudit live: "), style="bold")]
    settings = Table(title="Settings the server runs with", title_justify="left")
    for c in ("setting", "served", "source", "asked"):
        settings.add_column(c)
    for s in r.settings:
        settings.add_row(s.flag, str(s.served), s.source, "—" if s.asked is None else
                         Text(str(s.asked), style="red bold" if s.differs else ""))
    plan = Table(title="The served plan", title_justify="left")
    for c in ("quantity", "value", "source"):
        plan.add_column(c)
    for row in _rows(r):
        plan.add_row(*row)
    strategies = Table(title="Each strategy's allocation of the served plan (meta), and the device use it predicts "
                             "per rank", title_justify="left")
    for c in STRATEGY_COLUMNS:
        strategies.add_column(c)
    for row in _strategy_rows(r):
        strategies.add_row(*row)
    out += [Fitted(settings, wrap=("source",)), Fitted(plan, wrap=("value", "source")),
            Fitted(strategies, wrap=("device use predicted",))]
    if r.devices:
        devices = Table(title=f"Device memory ({r.smi.tool}; tolerance ±{fmt_bytes(r.tolerance_bytes)})",
                        title_justify="left")
        for c in ("device", "name", "held", "of the device", "source"):
            devices.add_column(c)
        for row in _device_rows(r):
            devices.add_row(*row)
        out.append(Fitted(devices, wrap=("name", "source")))
    out += [Text(f"• {f}") for f in r.findings] + [Text(f"note: {n}", style="dim") for n in r.notes]
    return out


def to_markdown(r: Any) -> str:
    """The report as Markdown (a table per part), to paste into an issue."""
    def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
        return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                + ["| " + " | ".join(md(str(c)) for c in row) + " |" for row in rows] + [""])

    lines = [f"### {md(summary_line(r))}", ""]
    lines += [f"- {md(f)}" for f in r.findings] + ([""] if r.findings else [])
    lines += table(("setting", "served", "source", "asked"),
                   [(s.flag, str(s.served), s.source, "—" if s.asked is None else str(s.asked)) for s in r.settings])
    lines += table(("quantity", "value", "source"), _rows(r))
    lines += table(STRATEGY_COLUMNS, _strategy_rows(r))
    if r.devices:
        lines += table(("device", "name", "held", "of the device", "source"), _device_rows(r))
    lines += [f"- note: {md(n)}" for n in r.notes]
    return "\n".join(lines).rstrip() + "\n"


def to_json(r: Any) -> str:
    return json.dumps(r.to_dict(), indent=2, default=str)


def to_junit(r: Any) -> str:
    """One test case: the server against its plan; a failure for a finding, skipped where nothing was measured."""
    from kvaudit.errors import EXIT_FAIL, EXIT_NOT_MEASURED

    code = r.exit_code
    failed, skipped = int(code == EXIT_FAIL), int(code == EXIT_NOT_MEASURED)
    body = ""
    if failed:
        body = f"<failure message={quoteattr(r.verdict)}>{escape(chr(10).join(r.findings))}</failure>"
    elif skipped:
        body = f"<skipped message={quoteattr('no device memory read: give --smi')}/>"
    name = quoteattr(f"{_model(r)} at {r.url}")
    return ('<?xml version="1.0" encoding="utf-8"?>\n'
            f'<testsuites><testsuite name="kvaudit live" tests="1" failures="{failed}" errors="0" '
            f'skipped="{skipped}"><testcase classname="kvaudit.live" name={name}>{body}<system-out>'
            f"{escape(summary_line(r))}</system-out></testcase></testsuite></testsuites>\n")


def watch_line(when: str, metrics: Any, devices: Any) -> str:
    """One re-read for ``--watch``: the time, each engine's KV-cache usage and requests (``metrics``: the server's
    ``/metrics`` read), each device's memory."""
    parts = [when]
    for e in metrics.engines:
        usage = "?" if e.kv_cache_usage is None else f"{e.kv_cache_usage:.1%}"
        parts.append(f"engine {e.engine}: KV {usage}, running {e.running or 0:g}, waiting {e.waiting or 0:g}")
    parts += [f"device {u.index}: {fmt_bytes(u.used_bytes)}" for u in devices]
    return "  ".join(parts)
