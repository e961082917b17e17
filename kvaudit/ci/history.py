"""``kvaudit history MODEL``: every published vllm-ascend release's own allocation code audited on one
deployment, in one process, one row per release, and where the allocation changed: a bisect of
allocation behaviour across releases.

Each release runs from its sdist (``kvaudit.strategies.releases``; fetched once into the cache) against vLLM's
plan with that release's block-size rule, on the ``meta`` meter. Where the ratio changes, the row names
the pull request: the one the release's own notes name next to KV-cache allocation, else the one
kvaudit knows for that era (``kvaudit.strategies.releases.ERA_PRS``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from kvaudit.errors import KvauditError
from kvaudit.model.deployment import Deployment
from kvaudit.strategies.releases import (ERA_PRS, ERAS, FIRST_HYBRID, PACKAGE, cache_dir, fetch_sdist, release_strategy,
                                         version_key)
from kvaudit.strategies.runner_code import SourceTree


@dataclass(frozen=True)
class Row:
    """One release's audit."""

    version: str
    ratio: float | None
    storages: int | None
    verdict: str
    """``PASS``, ``FAIL``, or ``not audited``."""
    reason: str | None = None
    changed: bool = False
    """The ratio differs from the previous audited release's."""
    pr: str | None = None
    kv_budget_scale: float | None = None
    """The share of the deployment's KV budget the release's worker gives vLLM's planner, where it
    shrinks it (``kvaudit.strategies.releases.kv_budget_rule``); the ratio is against that plan."""

    def to_dict(self) -> dict:
        """JSON form."""
        return {"version": self.version, "ratio": self.ratio, "storages": self.storages, "verdict": self.verdict,
                "reason": self.reason, "changed": self.changed, "pr": self.pr,
                "kv_budget_scale": self.kv_budget_scale}


def published(since: str | None = None) -> tuple[list[str], str]:
    """vllm-ascend's releases, oldest first, from ``since`` on: the package index's list (with
    pre-releases), else the releases in kvaudit's cache; and where the list came from."""
    from kvaudit import network

    network.started(f"listing {PACKAGE}'s releases on the package index (pip index versions), else the cache's")
    p = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "--pre", PACKAGE,
                        "--disable-pip-version-check", *network.pip_options()], capture_output=True, text=True)
    m = re.search(r"Available versions: (.*)", p.stdout)
    if p.returncode == 0 and m:
        versions, source = [v.strip() for v in m.group(1).split(",")], "the package index"
    else:
        root = cache_dir() / "sdists"
        versions = [d.name.removeprefix(f"{PACKAGE}-") for d in root.glob(f"{PACKAGE}-*") if d.is_dir()]
        source = f"kvaudit's cache ({root}; the package index did not answer)"
        network.gave_up("the package index", f"listing the releases in kvaudit's cache ({root})")
    chosen = [v for v in versions if since is None or version_key(v) >= version_key(since)]
    return sorted(set(chosen), key=version_key), source


def history(d: Deployment, versions: list[str], progress: Any = None) -> list[Row]:
    """Audit each release's own code on ``d`` (meta meter), oldest first."""
    from kvaudit.measure.audit import run_audit
    from kvaudit.measure.meters import MetaMeter
    from kvaudit.plan.planner import build_plan, plan_for, plan_key

    plans: dict[tuple[str, str], Any] = {}
    rows: list[Row] = []
    last: float | None = None
    newest = ERAS[-1][1]
    plans[(newest, "")] = build_plan(d, newest)
    hybrid = any(len(t.shared_by) > 1 for t in plans[(newest, "")].tensors)
    for v in versions:
        if progress:
            progress(v)
        if hybrid and version_key(v) < version_key(FIRST_HYBRID):  # known without fetching it
            rows.append(Row(v, None, None, "not audited", f"releases before {FIRST_HYBRID} cannot serve hybrid "
                                                          "models: they assert one layer per KV-cache tensor"))
            continue
        try:
            s = release_strategy(v)
            key = plan_key(s)  # from 0.28 the budget code is each release's own
            if key not in plans:
                plans[key] = plan_for(d, s)
            r = run_audit(d, plans[key], s, MetaMeter())
        except KvauditError as e:
            rows.append(Row(v, None, None, "not audited", e.message))
            continue
        ratio = round(r.ratio, 4)
        changed = last is not None and abs(ratio - last) > 1e-3
        scale = round(r.plan.kv_budget_bytes / d.kv_budget_bytes, 4) if r.plan.kv_budget_by else None
        rows.append(Row(v, ratio, r.allocations, r.verdict.value, None, changed,
                        _pr_for(v) if changed else None, scale))
        last = ratio
    return rows


def _pr_for(version: str) -> str | None:
    """The pull request behind an allocation change in ``version``: its release notes' KV-cache
    allocation line, else the one kvaudit knows for the era that starts there."""
    try:
        tree = SourceTree(f"{PACKAGE} {version}", tarball=fetch_sdist(version))
        notes = tree.read("docs/source/user_guide/release_notes.md") or ""
    except KvauditError:
        notes = ""
    section = re.search(rf"^## v{re.escape(version)}\b.*?(?=^## |\Z)", notes, re.M | re.S)
    for line in (section.group(0).splitlines() if section else []):
        if re.search(r"(?i)kv.?cache.{0,80}(alloc|shar|duplicat|memory)|(alloc|shar|duplicat).{0,80}kv.?cache", line):
            prs = re.findall(r"/pull/(\d+)", line)
            if prs:
                return ", ".join(f"#{n}" for n in prs) + " (release notes)"
    return ERA_PRS.get(version)


CHART_BAR = 24
"""Characters of the longest bar of the step chart (the highest ratio)."""


def chart(rows: list[Row]) -> Any:
    """The ratio release by release as a step chart: one bar per run of consecutive releases with the same ratio and
    verdict (``0.9.0 – 0.11.0 (12)  ████████████  4.00× FAIL``), a run not audited without a bar; ``None`` for no
    audited release."""
    from rich.console import Group
    from rich.markup import escape as e
    from rich.table import Table
    from rich.text import Text

    top = max((r.ratio for r in rows if r.ratio is not None), default=None)
    if not top:
        return None
    runs: list[list[Row]] = []
    for r in rows:
        if runs and (runs[-1][0].ratio is None) == (r.ratio is None) and runs[-1][0].verdict == r.verdict and (
                r.ratio is None or round(runs[-1][0].ratio, 2) == round(r.ratio, 2)):
            runs[-1].append(r)
        else:
            runs.append([r])
    t = Table.grid(padding=(0, 1))
    for justify in ("left", "left", "right", "left"):
        t.add_column(justify=justify, no_wrap=True)
    for run in runs:
        first, last = run[0], run[-1]
        releases = e(first.version if len(run) == 1 else f"{first.version} – {last.version} ({len(run)})")
        if first.ratio is None:
            t.add_row(releases, Text("not audited", style="dim"), "", "")
            continue
        style = "green" if first.verdict == "PASS" else "red"
        t.add_row(releases, Text("█" * max(1, round(first.ratio / top * CHART_BAR)), style=style),
                  f"{first.ratio:.2f}×", Text(first.verdict, style=style))
    return Group(Text("Allocated / planned, release by release (each bar a run of equal ratios)", style="italic"), t)


def render(rows: list[Row], head: str) -> list[Any]:
    """The step chart (``chart``), then the rows as a table under ``head``: each release's ratio, storages and
    verdict, and where it changed."""
    from rich.markup import escape as e
    from rich.table import Table
    from rich.text import Text

    from kvaudit.report.tables import fitted

    t = Table(title=e(head), title_justify="left")
    for col in ("release", "ratio", "storages", "verdict", "change"):
        t.add_column(col, justify="right" if col in ("ratio", "storages") else "left")
    for r in rows:
        change = ("← changed" + (f": {r.pr}" if r.pr else "")) if r.changed else (r.reason or "")
        if r.kv_budget_scale is not None:
            change += ("; " if change else "") + f"planned with ×{r.kv_budget_scale:.2f} of the budget (its worker)"
        t.add_row(e(r.version), f"{r.ratio:.2f}×" if r.ratio is not None else "—",
                  f"{r.storages}" if r.storages is not None else "—", e(r.verdict), e(change))
    if not rows:
        return [Text(head)]
    steps = chart(rows)
    return [fitted(t, wrap=("change",)), *([Text(""), steps] if steps is not None else [])]
