"""Reports as a page to read without a terminal: expected vs allocated bars, verdicts and tables (HTML or SVG)."""

from __future__ import annotations

import html
import io
import math
import re
import textwrap
from dataclasses import dataclass
from typing import Any

from kvaudit import __version__
from kvaudit.escape import xml_safe
from kvaudit.model.deployment import DEVICES
from kvaudit.report.render import meter_label, render_tables, summary_line
from kvaudit.results import AuditResult, GroupRow, Report, Verdict
from kvaudit.units import GiB, KiB, MiB, fmt_bytes

PLANNED_BAR = "#7b8fa8"
"""Fill of a group's expected (planned) bar."""
PASS_BAR = "#37b24d"
"""Fill of a group's allocated bar when it is within tolerance of its planned share."""
FAIL_BAR = "#f03e3e"
"""Fill of a group's allocated bar when it is off its planned share by more than the tolerance."""
PASS_INK = "#2b8a3e"
FAIL_INK = "#c92a2a"
SKIP_INK = "#868e96"
"""Verdict badges (darker than the bars, so the bars' colors are the bars' alone)."""

TABLE_WIDTH = 120
"""Columns of the console the tables are rendered into (the CLI's width when not on a terminal)."""

CHART_WIDTH = 1080
BAR_X = 250
"""Where every bar starts: the groups' labels sit to the left of it."""
BAR_MAX = 600
"""Length of a bar at the top of the section's scale."""
BAR_H = 14
BAR_GAP = 3
ROW_GAP = 14
WRAP = 150
"""Characters per line of a reason in the chart."""

FONT = "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif"
MONO = "DejaVu Sans Mono, Liberation Mono, Menlo, Consolas, monospace"

def _esc(text: Any) -> str:
    """Text for HTML and XML alike: escaped, quotes included, without the characters XML forbids."""
    return html.escape(xml_safe(text), quote=True)


def _table_theme() -> Any:
    """A light terminal theme for the exported tables (rich's own light theme has dark-red and dark-green)."""
    from rich.terminal_theme import TerminalTheme

    return TerminalTheme(
        (255, 255, 255), (33, 37, 41),
        [(33, 37, 41), (201, 42, 42), (43, 138, 62), (230, 119, 0), (25, 113, 194), (156, 54, 181),
         (12, 133, 153), (134, 142, 150)],
        [(73, 80, 87), (201, 42, 42), (43, 138, 62), (230, 119, 0), (25, 113, 194), (156, 54, 181),
         (12, 133, 153), (248, 249, 250)])


def _console(rep: Report, detail: str, width: int) -> Any:
    """A recording console holding the tables the terminal shows for ``rep``."""
    return _recorded(render_tables(rep, detail), width)


def _recorded(renderables: list[Any], width: int) -> Any:
    """A recording console holding ``renderables`` as a terminal ``width`` columns wide shows them."""
    from rich.console import Console

    console = Console(record=True, file=io.StringIO(), width=width, highlight=False, soft_wrap=False,
                      color_system="truecolor", force_terminal=True, force_jupyter=False, legacy_windows=False)
    for renderable in renderables:
        console.print(renderable)
        console.print()
    return console


def _html_tables(console: Any) -> str:
    """What a recording console holds, as inline-styled HTML."""
    theme = _table_theme()
    return console.export_html(
        theme=theme, inline_styles=True,
        code_format='<pre class="tables" style="color: {foreground}; background: {background}">'
                    '<code style="font-family: inherit">{code}</code></pre>')


# --- what the page says ---------------------------------------------------------------------------------------


def report_verdict(rep: Report) -> str:
    """The section's verdict, in ``summary_line``'s words: FAIL, NOT MEASURED (something not audited) or PASS."""
    if any(r.verdict is not Verdict.PASS for r in rep.audits):
        return "FAIL"
    return "NOT MEASURED" if rep.skipped or not rep.audits else "PASS"


def group_off_plan(r: AuditResult, g: GroupRow) -> bool:
    """Whether a group's allocation is off its planned share by more than its share of the strategy's tolerance
    (the allocated bar is then drawn in ``FAIL_BAR``, else ``PASS_BAR``)."""
    share = r.tolerance_bytes * g.expected / r.expected_bytes if r.expected_bytes else r.tolerance_bytes
    return abs(g.allocated - g.expected) > share


def _deployment_line(rep: Report) -> str:
    d = rep.deployment
    dev = DEVICES.get(d.device)
    given = ", --device-memory" if d.device_memory_given else ""
    device = f"{dev.title if dev else d.device} ({fmt_bytes(d.device_memory_bytes)}{given})"
    stage = f"PP stage {d.pp_rank} of {d.pp}" if d.pp > 1 else "PP 1"
    return (f"{d.architecture or d.model.architecture} · TP {d.tp} · {stage} · gpu_memory_utilization "
            f"{d.gpu_memory_utilization} · {device} · KV budget {fmt_bytes(d.kv_budget_bytes)} · {d.dtype} · "
            f"kv-cache-dtype {d.kv_cache_dtype} · max-model-len {d.max_model_len:,}")


def _heading(rep: Report) -> str:
    d = rep.deployment
    stage = f" · PP stage {d.pp_rank} of {d.pp}" if d.pp > 1 else ""
    return f"{d.model.name} · TP {d.tp}{stage} · util {d.gpu_memory_utilization}"


def _summary(rep: Report) -> str:
    """``summary_line`` without its ``kvaudit: VERDICT:`` prefix (the badge says it)."""
    return re.sub(r"^kvaudit: [A-Z ]+: ", "", summary_line(rep))


def _measured(rep: Report) -> str | None:
    """What a device meter measured on; accounting meters measure no device."""
    return f"measured on {rep.meter_device}" if rep.meter in ("cuda", "npu") else None


def _is_device(meter: str) -> bool:
    return meter in ("cuda", "npu")


def _nice_scale(top: int) -> tuple[int, list[int]]:
    """A scale end at or above ``top`` bytes and its ticks, round in binary units (0, 1, 2, 3, 4 GiB)."""
    if top <= 0:
        return 1, [0]
    unit = next(u for u in (1 << 40, GiB, MiB, KiB, 1) if top >= u)
    v = top / unit
    raw = v / 4
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw - 1e-12)
    if unit == 1:
        step = max(1, math.ceil(step))
    n = max(1, math.ceil(v / step - 1e-9))
    return int(round(n * step * unit)), [int(round(i * step * unit)) for i in range(n + 1)]


# --- the chart (SVG elements in local coordinates, shared by the HTML and the SVG page) -------------------------


@dataclass
class _Svg:
    """SVG elements in local coordinates and the height they take."""

    body: str
    height: float


def _text(x: float, y: float, text: str, size: float = 12, fill: str = "#212529", weight: str = "normal",
          anchor: str = "start", cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return (f'<text x="{x:g}" y="{y:g}" font-size="{size:g}" fill="{fill}" font-weight="{weight}" '
            f'text-anchor="{anchor}"{c}>{_esc(text)}</text>')


def _badge(x: float, y: float, label: str, ink: str) -> tuple[str, float]:
    """A filled verdict badge with its top-left at (x, y); returns the elements and its width."""
    w = 8.2 * len(label) + 18
    return (f'<g class="badge"><rect x="{x:g}" y="{y:g}" width="{w:g}" height="22" rx="4" fill="{ink}"/>'
            + _text(x + w / 2, y + 15.5, label, 12.5, "#ffffff", "bold", "middle") + "</g>", w)


def _meter_tag(meter: str) -> str:
    """How the meter qualifies a verdict, next to it: an accounting PASS must not read as a device PASS."""
    if meter == "meta":
        return "meter meta: accounting only, no device measured"
    if meter == "cpu":
        return "meter cpu: host allocations, not a device measurement"
    if _is_device(meter):
        return f"meter {meter}: measured on the device"
    return f"meter {meter}"


def _wrapped(x: float, y: float, text: str, size: float, fill: str, width: int = WRAP) -> tuple[str, float]:
    lines = textwrap.wrap(text, width) or [""]
    step = size * 1.45
    return "".join(_text(x, y + i * step, line, size, fill) for i, line in enumerate(lines)), len(lines) * step


def _strategy_block(r: AuditResult, rep: Report, scale: int, ticks: list[int], y: float) -> tuple[str, float]:
    """One audited strategy: its verdict and figures, then per group a planned and an allocated bar."""
    parts: list[str] = [f'<g class="strategy" data-strategy="{_esc(r.strategy)}" data-verdict="{r.verdict.value}">']
    ink = PASS_INK if r.verdict is Verdict.PASS else FAIL_INK
    badge, bw = _badge(0, y, f"{r.verdict.value} · {r.meter}", ink)
    parts.append(badge)
    parts.append(f'<text x="{bw + 12:g}" y="{y + 16:g}" font-size="15" fill="#212529">'
                 f'<tspan font-weight="bold">{_esc(r.strategy)}</tspan>'
                 f'<tspan fill="#495057"> — {_esc(r.strategy_releases)}: {_esc(r.strategy_title)}</tspan></text>')
    if r.device_oom is not None:
        o = r.device_oom
        figures = (f"out of memory at allocation {o.allocation} of {o.allocations}, with "
                   f"{fmt_bytes(o.allocated_before_bytes)} allocated by then, against a plan of "
                   f"{fmt_bytes(r.expected_bytes)}: no bars, the strategy returned no tensors")
    else:
        ratio = f"{r.ratio:.2f}×" if r.expected_bytes else "—"
        figures = (f"{ratio} the plan: {fmt_bytes(r.allocated_bytes)} allocated for {fmt_bytes(r.expected_bytes)} "
                   f"planned · projected util {r.projected_utilization:.3f} of the {r.requested_utilization} asked")
        safe = rep.safe_utilization.get(r.strategy)
        if r.strategy in rep.safe_utilization:
            figures += f" · max util {'none' if safe is None else f'{safe:.3f}'}"
        if r.oom is not None:
            figures += f" · the device would run out at allocation {r.oom.allocation} of {r.allocations}"
    figures += (f" · plan {r.plan.name}, block {r.plan.block_size}, {r.plan.num_blocks:,} blocks · "
                f"{_meter_tag(r.meter)}")
    text, h = _wrapped(0, y + 42, figures, 12, "#343a40")
    parts.append(text)
    y += 42 + h  # the baseline of the next line
    if r.device_oom is None and not r.groups:
        parts.append(_text(0, y, "no KV-cache groups in this plan: nothing to draw", 12, "#495057"))
        y += 18
    if r.groups:
        top = y - 4
        y = top
        rows: list[str] = []
        for g in r.groups:
            rows.append(_group_row(r, g, group_off_plan(r, g), scale, y))
            y += 2 * BAR_H + BAR_GAP + ROW_GAP
        y -= ROW_GAP  # the bottom of the last bar
        grid = "".join(f'<line x1="{BAR_X + BAR_MAX * t / scale:g}" y1="{top - 6:g}" '
                       f'x2="{BAR_X + BAR_MAX * t / scale:g}" y2="{y + 6:g}" stroke="#e9ecef" stroke-width="1"/>'
                       for t in ticks)
        parts.append(grid)
        parts.extend(rows)
        y += 22  # the baseline of a reason under the bars
    for reason in r.reasons:
        text, h = _wrapped(0, y, "• " + reason, 12, FAIL_INK)
        parts.append(text)
        y += h
    parts.append("</g>")
    return "".join(parts), y + 20


def _group_row(r: AuditResult, g: GroupRow, off: bool, scale: int, y: float) -> str:
    label = f"{g.spec} · {g.layers} layer{'s' if g.layers != 1 else ''}"
    if len(label) > 38:
        label = label[:37] + "…"
    ratio = f"{g.allocated / g.expected:.2f}×" if g.expected else "—"
    fill = FAIL_BAR if off else PASS_BAR
    parts = [f'<g class="group" data-group="{g.group}">',
             _text(16, y + 12, f"group {g.group}", 13, "#212529", "bold"),
             _text(16, y + 2 * BAR_H + BAR_GAP - 1, label, 11, "#495057")]
    for kind, nbytes, colour, y0, caption in (
            ("planned", g.expected, PLANNED_BAR, y, f"{fmt_bytes(g.expected)} planned"),
            ("allocated " + ("fail" if off else "pass"), g.allocated, fill, y + BAR_H + BAR_GAP,
             f"{fmt_bytes(g.allocated)} allocated · {ratio}")):
        w = max(0.0, BAR_MAX * nbytes / scale)
        tip = (f"{r.strategy}, group {g.group} ({g.spec}, {g.layers} layers): {fmt_bytes(g.allocated)} allocated for "
               f"{fmt_bytes(g.expected)} planned ({ratio})")
        parts.append(f'<rect class="bar {kind}" data-strategy="{_esc(r.strategy)}" data-group="{g.group}" '
                     f'data-bytes="{nbytes}" x="{BAR_X}" y="{y0:g}" width="{w:.2f}" height="{BAR_H}" '
                     f'fill="{colour}"><title>{_esc(tip)}</title></rect>')
        if nbytes == 0:  # a zero bar has no length: mark where it would start
            parts.append(f'<line x1="{BAR_X}" y1="{y0 - 1:g}" x2="{BAR_X}" y2="{y0 + BAR_H + 1:g}" stroke="#495057" '
                         'stroke-width="2"/>')
        bold = "bold" if kind != "planned" and off else "normal"
        parts.append(_text(BAR_X + w + 8, y0 + 11.5, caption, 12, FAIL_INK if bold == "bold" else "#343a40", bold))
    parts.append("</g>")
    return "".join(parts)


def _skipped_block(name: str, reason: str, y: float) -> tuple[str, float]:
    badge, bw = _badge(0, y, "NOT AUDITED", SKIP_INK)
    parts = [f'<g class="strategy skipped" data-strategy="{_esc(name)}" data-verdict="NOT AUDITED">', badge,
             f'<text x="{bw + 12:g}" y="{y + 16:g}" font-size="15" font-weight="bold" fill="#212529">'
             f'{_esc(name)}</text>']
    text, h = _wrapped(0, y + 42, f"not audited: {reason}", 12, "#495057")
    parts.append(text)
    parts.append("</g>")
    return "".join(parts), y + 42 + h + 20


def _chart(rep: Report) -> _Svg:
    """Legend and scale, then per strategy its verdict and per KV-cache group its two bars."""
    audited = [r for r in rep.audits if r.device_oom is None]
    top = max([max(g.expected, g.allocated) for r in audited for g in r.groups] or [0])
    scale, ticks = _nice_scale(top)
    parts: list[str] = []
    x = 0.0
    for colour, label in ((PLANNED_BAR, "expected: the group's planned bytes"),
                          (PASS_BAR, "allocated, within tolerance of the plan"),
                          (FAIL_BAR, "allocated, off the plan")):
        parts.append(f'<rect class="swatch" x="{x:g}" y="2" width="12" height="12" fill="{colour}"/>')
        parts.append(_text(x + 18, 12.5, label, 12, "#343a40"))
        x += 18 + 6.6 * len(label) + 28
    y = 30.0
    has_bars = any(r.groups for r in audited)
    if has_bars:
        parts.append(_text(0, y + 12, "per KV-cache group, one scale:", 12, "#495057"))
        parts.append(f'<line x1="{BAR_X}" y1="{y + 16:g}" x2="{BAR_X + BAR_MAX}" y2="{y + 16:g}" stroke="#adb5bd"/>')
        for t in ticks:
            tx = BAR_X + BAR_MAX * t / scale
            parts.append(f'<line x1="{tx:g}" y1="{y + 12:g}" x2="{tx:g}" y2="{y + 16:g}" stroke="#adb5bd"/>')
            parts.append(_text(tx, y + 8, fmt_bytes(t), 11, "#495057", anchor="middle"))
        y += 34
    for r in rep.audits:
        body, y = _strategy_block(r, rep, scale, ticks, y)
        parts.append(body)
    for name, reason in rep.skipped:
        body, y = _skipped_block(name, reason, y)
        parts.append(body)
    if not rep.audits and not rep.skipped:
        parts.append(_text(0, y + 12, "no strategy was run", 13, "#495057"))
        y += 24
    return _Svg("".join(parts), y)


# --- HTML ----------------------------------------------------------------------------------------------------------

_CSS = f"""
* {{ box-sizing: border-box; }}
body {{ margin: 0; background: #f1f3f5; color: #212529; font-family: {FONT}; font-size: 14px; line-height: 1.45; }}
main {{ max-width: 1200px; margin: 0 auto; padding: 24px 28px 40px; }}
header.page h1 {{ font-size: 24px; margin: 0 0 4px; }}
header.page p {{ margin: 0; color: #495057; }}
section.report {{ background: #ffffff; border: 1px solid #dee2e6; border-radius: 10px; padding: 20px 26px 24px;
  margin: 22px 0; }}
section.report h2 {{ font-size: 20px; margin: 0 0 4px; }}
.deployment {{ color: #495057; margin: 0 0 2px; }}
.verdict {{ display: flex; flex-wrap: wrap; align-items: center; gap: 10px 14px; margin: 14px 0 6px;
  padding: 12px 16px; border-radius: 8px; border-left: 6px solid {SKIP_INK}; background: #f8f9fa; }}
.verdict.fail {{ border-left-color: {FAIL_INK}; background: #fff5f5; }}
.verdict.pass {{ border-left-color: {PASS_INK}; background: #ebfbee; }}
.verdict .word {{ font-size: 20px; font-weight: 700; color: #ffffff; background: {SKIP_INK}; border-radius: 6px;
  padding: 2px 12px; }}
.verdict.fail .word {{ background: {FAIL_INK}; }}
.verdict.pass .word {{ background: {PASS_INK}; }}
.meter {{ font-weight: 700; padding: 3px 10px; border-radius: 6px; border: 2px solid #1971c2; color: #1864ab;
  background: #e7f5ff; }}
.meter.accounting {{ border-color: #e67700; color: #a04f00; background: #fff4e6; }}
.summary {{ flex-basis: 100%; color: #343a40; }}
.measured {{ color: #495057; margin: 2px 0 0; }}
svg.chart {{ display: block; margin: 18px 0 8px; max-width: 100%; height: auto; }}
h3 {{ font-size: 15px; margin: 22px 0 8px; color: #343a40; }}
pre.tables {{ font-family: {MONO}; font-size: 12px; line-height: 1.165; margin: 0; padding: 14px 16px;
  border: 1px solid #dee2e6; border-radius: 8px; overflow-x: auto; }}
footer {{ color: #868e96; font-size: 12px; text-align: center; }}
"""


def _default_title(reports: list[Report]) -> str:
    models = list(dict.fromkeys(r.deployment.model.name for r in reports))
    return "kvaudit: " + (", ".join(models) if models else "no report")


def _html_section(rep: Report, index: int, detail: str, width: int) -> str:
    verdict = report_verdict(rep)
    cls = {"FAIL": "fail", "PASS": "pass"}.get(verdict, "other")
    chart = _chart(rep)
    tables = _html_tables(_console(rep, detail, width))
    measured = _measured(rep)
    return f"""<section class="report" id="report-{index}">
<h2>{_esc(_heading(rep))}</h2>
<p class="deployment">{_esc(_deployment_line(rep))}</p>
<p class="deployment">planned by <strong>vLLM {_esc(rep.vllm_version)}</strong> · strategies: {_esc(', '.join(
        [r.strategy for r in rep.audits] + [n for n, _ in rep.skipped]) or 'none')}</p>
<div class="verdict {cls}"><span class="word">{_esc(verdict)}</span>
<span class="meter{'' if _is_device(rep.meter) else ' accounting'}">meter: {_esc(meter_label(rep.meter))}</span>
<span class="summary">{_esc(_summary(rep))}</span></div>
{f'<p class="measured">{_esc(measured)}</p>' if measured else ''}
<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" height="{math.ceil(chart.height)}" \
viewBox="0 0 {CHART_WIDTH} {math.ceil(chart.height)}" font-family="{FONT}" role="img" \
aria-label="expected and allocated bytes per strategy and KV-cache group">{chart.body}</svg>
<h3>The tables, as the terminal shows them</h3>
{tables}
</section>"""


def to_html(reports: list[Report], title: str | None = None, *, detail: str = "layers",
            width: int = TABLE_WIDTH, lead: str | None = None, preface: list[Any] = ()) -> str:
    """One standalone HTML page (no script, no external asset): per report (a pipeline stage, a deployment of a
    check matrix) its deployment, verdict with the meter's label, the bars of each strategy and KV-cache group,
    and the tables ``render_tables(rep, detail)`` prints, exported by rich with inline styles at ``width``
    columns. ``lead`` replaces the line under the title (the overall verdict), ``preface`` (rich renderables,
    such as the check's matrix with each cell's expected outcome) comes before the reports."""
    title = title if title is not None else _default_title(reports)
    overall = max((r.exit_code for r in reports), default=0)
    words = {0: "PASS", 1: "FAIL", 3: "NOT MEASURED"}
    sections = "\n".join(_html_section(rep, i, detail, width) for i, rep in enumerate(reports))
    if preface:
        sections = f'<section class="report">{_html_tables(_recorded(list(preface), width))}</section>\n' + sections
    lead = lead if lead is not None else (
        f"{len(reports)} report{'s' if len(reports) != 1 else ''} · overall {words.get(overall, overall)} "
        f"(exit code {overall}) · kvaudit {__version__}")
    return xml_safe(f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="kvaudit {_esc(__version__)}">
<title>{_esc(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<main>
<header class="page"><h1>{_esc(title)}</h1><p>{_esc(lead)}</p></header>
{sections}
<footer>kvaudit {_esc(__version__)}: did the allocator give each layer and group what vLLM planned?</footer>
</main>
</body>
</html>
""")  # the tables rich exports carry the report's text too


# --- SVG -----------------------------------------------------------------------------------------------------------

_RICH_SVG = """<svg class="rich-terminal" width="{width}" height="{height}" viewBox="0 0 {width} {height}" \
xmlns="http://www.w3.org/2000/svg">
<style>
.{unique_id}-matrix {{ font-family: %s; font-size: {char_height}px; line-height: {line_height}px; }}
.{unique_id}-title {{ font-size: 18px; font-weight: bold; font-family: %s; }}
{styles}
</style>
<defs>
<clipPath id="{unique_id}-clip-terminal"><rect x="0" y="0" width="{terminal_width}" height="{terminal_height}" />\
</clipPath>
{lines}
</defs>
{chrome}
<g transform="translate({terminal_x}, {terminal_y})" clip-path="url(#{unique_id}-clip-terminal)">
{backgrounds}
<g class="{unique_id}-matrix">
{matrix}
</g>
</g>
</svg>""" % (MONO, FONT)
"""rich's ``CONSOLE_SVG_FORMAT`` without its web fonts (the page must render offline), with a size."""


def _tables_svg(console: Any, unique_id: str, title: str) -> tuple[str, float, float]:
    """rich's SVG of what a recording console holds, and its width and height."""
    svg = console.export_svg(title=title, theme=_table_theme(), code_format=_RICH_SVG, font_aspect_ratio=0.602,
                             unique_id=unique_id)
    m = re.search(r'viewBox="0 0 ([0-9.]+) ([0-9.]+)"', svg)
    assert m, "rich's SVG has no viewBox"
    return svg, float(m.group(1)), float(m.group(2))


def _svg_header(rep: Report, y: float) -> tuple[str, float]:
    """The section's heading, deployment, vLLM and verdict banner with the meter's label."""
    verdict = report_verdict(rep)
    ink = {"FAIL": FAIL_INK, "PASS": PASS_INK}.get(verdict, SKIP_INK)
    parts = [_text(0, y + 22, _heading(rep), 22, "#212529", "bold")]
    text, h = _wrapped(0, y + 44, _deployment_line(rep), 13, "#495057", 140)
    parts.append(text)
    y += 44 + h - 4
    strategies = ", ".join([r.strategy for r in rep.audits] + [n for n, _ in rep.skipped]) or "none"
    parts.append(_text(0, y + 4, f"planned by vLLM {rep.vllm_version} · strategies: {strategies}", 13, "#495057"))
    y += 16
    badge_w = 13 * len(verdict) + 24
    meter = f"meter: {meter_label(rep.meter)}"
    summary_lines = textwrap.wrap(_summary(rep), 140)
    measured = _measured(rep)
    extra = [measured] if measured else []
    banner_h = 44 + 18 * (len(summary_lines) + len(extra))
    parts.append(f'<rect x="0" y="{y:g}" width="{CHART_WIDTH}" height="{banner_h:g}" rx="8" fill="#f8f9fa" '
                 f'stroke="{ink}" stroke-width="1.5"/>')
    parts.append(f'<rect x="0" y="{y:g}" width="7" height="{banner_h:g}" rx="3.5" fill="{ink}"/>')
    parts.append(f'<rect x="18" y="{y + 9:g}" width="{badge_w:g}" height="28" rx="6" fill="{ink}"/>')
    parts.append(_text(18 + badge_w / 2, y + 29, verdict, 19, "#ffffff", "bold", "middle"))
    accounting = not _is_device(rep.meter)
    parts.append(_text(18 + badge_w + 14, y + 28.5, meter, 14.5, "#a04f00" if accounting else "#1864ab", "bold",
                       cls="meter"))
    for i, line in enumerate(summary_lines + extra):
        parts.append(_text(18, y + 58 + 18 * i, line, 12.5, "#343a40"))
    return "".join(parts), y + banner_h + 18


def to_svg(reports: list[Report], title: str | None = None, *, detail: str = "layers", width: int = TABLE_WIDTH,
           lead: str | None = None, preface: list[Any] = ()) -> str:
    """One standalone SVG document: per report its heading, verdict with the meter's label, the bars, and the
    tables as rich exports them (nested, scaled to the chart's width). ``title``, ``lead`` (a line under the
    title) and ``preface`` (rich renderables before the reports, as the check's matrix) as for ``to_html``."""
    margin = 28
    parts: list[str] = []
    title = title if title is not None else _default_title(reports)
    y = float(margin)
    parts.append(f'<g transform="translate({margin}, 0)">' + _text(0, y + 20, title, 24, "#212529", "bold") + "</g>")
    y += 40
    if lead:
        text, h = _wrapped(0, y, lead, 14, "#343a40", 130)
        parts.append(f'<g class="lead" transform="translate({margin}, 0)">{text}</g>')
        y += h + 12

    def tables(console: Any, unique_id: str, heading: str) -> None:
        nonlocal y
        svg, tw, th = _tables_svg(console, unique_id, heading)
        s = CHART_WIDTH / tw
        parts.append(f'<rect x="{margin}" y="{y:g}" width="{CHART_WIDTH}" height="{th * s:.2f}" rx="8" fill="#ffffff" '
                     'stroke="#dee2e6"/>')
        parts.append(f'<g class="tables" transform="translate({margin}, {y:g}) scale({s:.6f})">{svg}</g>')
        y += th * s + 36

    if preface:
        tables(_recorded(list(preface), width), "kvaudit-preface", "as the terminal shows it")
    for i, rep in enumerate(reports):
        header, h = _svg_header(rep, 0)
        parts.append(f'<g class="report" transform="translate({margin}, {y:g})">{header}')
        chart = _chart(rep)
        parts.append(f'<g class="chart" transform="translate(0, {h + 8:g})">{chart.body}</g></g>')
        y += h + 8 + chart.height + 10
        tables(_console(rep, detail, width), f"kvaudit-tables-{i}", "the tables, as the terminal shows them")
    total_w = CHART_WIDTH + 2 * margin
    total_h = math.ceil(y)
    return xml_safe(f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" '
                    f'viewBox="0 0 {total_w} {total_h}" font-family="{FONT}">\n<title>{_esc(title)}</title>\n'
                    f'<rect x="0" y="0" width="{total_w}" height="{total_h}" fill="#ffffff"/>\n'
                    + "\n".join(parts) + "\n</svg>\n")  # rich's SVG export writes control characters as they are
