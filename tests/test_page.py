"""The page (``--html`` / ``--svg``): a planned and an allocated bar per strategy and KV-cache group on one scale,
colored by verdict, the verdict beside its meter's label, the terminal's tables under the chart, every report
string escaped, one valid SVG document, nothing fetched; and what headless Chromium shows of it."""

from __future__ import annotations

import dataclasses
import html
import io
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvaudit.report import page
from kvaudit.report.render import meter_label, render_tables
from kvaudit.results import DEFAULT_TOLERANCE, DeviceOom, GroupRow, Report, Verdict
from kvaudit.units import fmt_bytes
from conftest import ROOT, deployment

SVG_NS = "{http://www.w3.org/2000/svg}"


def build_report(preset: str = "qwen3-next", util: float = 0.7, meter: str = "meta") -> Report:
    """The ``Report`` that ``kvaudit PRESET --util U --meter M`` renders (``cli.audit_command``'s recipe, with the
    four built-in strategies)."""
    from kvaudit.measure.audit import audit_all
    from kvaudit.measure.meters import select_meter
    from kvaudit.measure.utilization import for_report
    from kvaudit.plan.planner import vllm_version
    from kvaudit.strategies.builtin import STRATEGIES
    from kvaudit.strategies.resolve import resolve_strategy

    d = deployment(preset, gpu_memory_utilization=util)
    strategies = [resolve_strategy(s) for s in STRATEGIES]
    m = select_meter(meter)
    skipped: list[tuple[str, str]] = []
    audits = tuple(audit_all(d, strategies, m, DEFAULT_TOLERANCE, skipped))
    caps, safe = for_report(d, list(audits), strategies)
    return Report(deployment=d, audits=audits, meter=m.name, meter_device=m.describe(), vllm_version=vllm_version(),
                  skipped=tuple(skipped), capacity=caps, safe_utilization=safe)


@pytest.fixture(scope="module")
def rep() -> Report:
    return build_report()


@pytest.fixture(scope="module")
def page_html(rep) -> str:
    return page.to_html([rep])


def audit(rep: Report, name: str):
    return next(r for r in rep.audits if r.strategy == name)


def only(rep: Report, *names: str) -> Report:
    """The report with only these strategies (one verdict's bars on a screenshot)."""
    return dataclasses.replace(rep, audits=tuple(audit(rep, n) for n in names), skipped=())


class _Rects(HTMLParser):
    """The ``<rect>`` elements of a page, with their attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.rects: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "rect":
            self.rects.append({k: v or "" for k, v in attrs})

    handle_startendtag = handle_starttag


def bars(doc: str) -> list[dict[str, str]]:
    """The bars of an HTML page or an SVG document: ``kind`` (planned / allocated), ``strategy``, ``group``,
    ``bytes``, ``width``, ``fill``, ``verdict`` (pass / fail, for allocated bars)."""
    if doc.lstrip().startswith("<svg"):
        rects = [dict(e.attrib) for e in ET.fromstring(doc).iter(f"{SVG_NS}rect")]
    else:
        p = _Rects()
        p.feed(doc)
        rects = p.rects
    out = []
    for a in rects:
        cls = a.get("class", "").split()
        if "bar" not in cls:
            continue
        out.append({"kind": "planned" if "planned" in cls else "allocated", "strategy": a["data-strategy"],
                    "group": int(a["data-group"]), "bytes": int(a["data-bytes"]), "width": float(a["width"]),
                    "fill": a["fill"], "verdict": "fail" if "fail" in cls else "pass" if "pass" in cls else ""})
    return out


def tables_text(rep: Report, detail: str = "layers") -> str:
    """What the terminal prints for ``rep`` at the page's width, as plain text."""
    from rich.console import Console

    c = Console(record=True, file=io.StringIO(), width=page.TABLE_WIDTH, highlight=False, soft_wrap=False)
    for renderable in render_tables(rep, detail):
        c.print(renderable)
        c.print()
    return c.export_text()


# --- structure -----------------------------------------------------------------------------------------------------


def test_a_planned_and_an_allocated_bar_per_strategy_and_group(rep, page_html):
    found = bars(page_html)
    want = {(r.strategy, g.group, kind, nbytes) for r in rep.audits for g in r.groups
            for kind, nbytes in (("planned", g.expected), ("allocated", g.allocated))}
    assert len(rep.audits) == 4 and all(len(r.groups) == 4 for r in rep.audits)
    assert len(found) == len(want) == 32
    assert {(b["strategy"], b["group"], b["kind"], b["bytes"]) for b in found} == want


def test_bars_are_proportional_to_bytes_on_one_scale(rep, page_html):
    found = bars(page_html)
    per_byte = {round(b["width"] / b["bytes"] * (1 << 30), 2) for b in found}
    assert max(per_byte) - min(per_byte) < 0.02 * max(per_byte), "one scale for every bar of the section"
    assert max(b["width"] for b in found) <= page.BAR_MAX and max(b["width"] for b in found) > page.BAR_MAX / 2
    r = audit(rep, "ascend-0.11")
    assert r.ratio == pytest.approx(4.0, rel=0.005)
    for g in r.groups:
        planned, allocated = (next(b["width"] for b in found if (b["strategy"], b["group"], b["kind"]) ==
                                   ("ascend-0.11", g.group, kind)) for kind in ("planned", "allocated"))
        assert planned > 50 and allocated == pytest.approx(4 * planned, rel=0.005)
    for g in audit(rep, "vllm").groups:
        planned, allocated = (next(b["width"] for b in found if (b["strategy"], b["group"], b["kind"]) ==
                                   ("vllm", g.group, kind)) for kind in ("planned", "allocated"))
        assert allocated == pytest.approx(planned, rel=0.001)


def test_allocated_bars_are_colored_by_verdict(rep, page_html):
    found = bars(page_html)
    assert {b["fill"] for b in found if b["kind"] == "planned"} == {page.PLANNED_BAR}
    for name in ("vllm", "ascend-0.16"):
        assert {(b["fill"], b["verdict"]) for b in found if b["strategy"] == name and b["kind"] == "allocated"} == {
            (page.PASS_BAR, "pass")}
    assert {(b["fill"], b["verdict"]) for b in found
            if b["strategy"] == "ascend-0.11" and b["kind"] == "allocated"} == {(page.FAIL_BAR, "fail")}
    # ascend-0.12 splits what the plan shares: every group gets more than its share (4.00× for attention)
    assert {b["fill"] for b in found if b["strategy"] == "ascend-0.12" and b["kind"] == "allocated"} == {page.FAIL_BAR}
    assert len({page.PLANNED_BAR, page.PASS_BAR, page.FAIL_BAR, page.PASS_INK, page.FAIL_INK, page.SKIP_INK}) == 6


@pytest.mark.parametrize("top", [0, 1, 3, 1000, 1 << 20, 3_709_703_296, int(2.5 * (1 << 30)), (1 << 30) + 1,
                                 int(13.82 * (1 << 30)), 5 << 40])
def test_the_scale_is_round_and_holds_every_bar(top):
    scale, ticks = page._nice_scale(top)
    if top == 0:  # nothing to draw: one tick, and a scale that divides nothing by zero
        assert (scale, ticks) == (1, [0])
        return
    assert ticks[0] == 0 and ticks[-1] == scale and ticks == sorted(set(ticks)) and len(ticks) <= 11
    assert top <= scale and (scale < 2 * top or top < 4)
    steps = {b - a for a, b in zip(ticks, ticks[1:])}
    assert len(steps) <= 1 or max(steps) - min(steps) <= 1  # evenly spaced


def test_labels_in_binary_units_with_the_ratio(rep, page_html):
    r = audit(rep, "ascend-0.11")
    g = r.groups[0]
    assert "3.45 GiB allocated · 4.00×" in page_html and "884.25 MiB planned" in page_html
    assert f"{fmt_bytes(g.allocated)} allocated · {g.allocated / g.expected:.2f}×" in page_html
    for tick in ("0 B", "1.00 GiB", "2.00 GiB", "3.00 GiB", "4.00 GiB"):  # the scale: 3.45 GiB rounds up to 4 GiB
        assert f">{tick}</text>" in page_html


def test_each_strategy_has_its_verdict_next_to_its_meter(rep, page_html):
    for r in rep.audits:
        block = re.search(rf'<g class="strategy" data-strategy="{re.escape(r.strategy)}" data-verdict="(\w+)">'
                          r'<g class="badge">.*?>([^<]*)</text></g>', page_html)
        assert block, r.strategy
        assert block.group(1) == r.verdict.value and block.group(2) == f"{r.verdict.value} · meta"
    assert [r.verdict for r in rep.audits] == [Verdict.PASS, Verdict.FAIL, Verdict.FAIL, Verdict.PASS]
    assert page_html.count("meter meta: accounting only, no device measured") == 4


def test_the_section_verdict_carries_the_meter_label(rep, page_html):
    label = html.escape(meter_label("meta"))
    assert re.search(r'<div class="verdict fail"><span class="word">FAIL</span>\s*'
                     rf'<span class="meter accounting">meter: {re.escape(label)}</span>', page_html)
    assert "2 of 4 strategies do not allocate what vLLM planned (ascend-0.11 4.00×, ascend-0.12 2.00×)" in page_html
    head = page_html[page_html.index('<section class="report"'):page_html.index('<svg class="chart"')]
    d = rep.deployment
    for text in (d.model.name, f"TP {d.tp}", "PP 1", f"gpu_memory_utilization {d.gpu_memory_utilization}",
                 "Atlas 800 A2 (Ascend 910B, 64 GB HBM) (60.96 GiB)", f"vLLM {rep.vllm_version}",
                 "vllm, ascend-0.11, ascend-0.12, ascend-0.16"):
        assert html.escape(text) in head, text


def test_a_device_meter_reads_as_a_device_measurement(rep):
    dev = "cuda: NVIDIA H200 #0, 150,112,731,136 B total"
    cuda = dataclasses.replace(rep, meter="cuda", meter_device=dev,
                               audits=tuple(dataclasses.replace(r, meter="cuda") for r in rep.audits))
    out = page.to_html([cuda])
    assert re.search(rf'<span class="word">FAIL</span>\s*<span class="meter">meter: {re.escape(meter_label("cuda"))}',
                     out)
    assert f"measured on {dev}" in out and ">PASS · cuda</text>" in out and ">PASS · meta<" not in out
    assert "no device measured" not in out.split('<pre class="tables"')[0]


def test_the_tables_under_the_chart_are_the_terminals(rep, page_html):
    assert page_html.index('<svg class="chart"') < page_html.index('<pre class="tables"')
    pre = re.search(r'<pre class="tables"[^>]*>(.*?)</pre>', page_html, re.S).group(1)
    assert "<span style=" in pre  # rich's inline styles (bold, colors)
    assert html.unescape(re.sub(r"<[^>]+>", "", pre)).strip() == tables_text(rep).strip()


def test_detail_is_passed_to_the_tables(rep):
    out = page.to_html([rep], detail="summary")
    pre = re.search(r'<pre class="tables"[^>]*>(.*?)</pre>', out, re.S).group(1)
    assert html.unescape(re.sub(r"<[^>]+>", "", pre)).strip() == tables_text(rep, "summary").strip()
    assert len(bars(out)) == 32  # the bars do not depend on the tables' detail


def test_every_report_string_is_escaped(rep):
    evil = "<script>alert('kv')</script> & \"co\""
    d = rep.deployment
    r = dataclasses.replace(audit(rep, "ascend-0.11"), strategy="<script>bad()</script>",
                            strategy_title="<b>title</b>", strategy_releases="<i>rel</i>",
                            reasons=("<img src=x onerror=alert(1)> reason",))
    bad = dataclasses.replace(rep, deployment=dataclasses.replace(d, model=dataclasses.replace(d.model, name=evil)),
                              audits=(r,), skipped=(("<script>skip</script>", "<iframe src=x> why"),),
                              vllm_version="<script>v</script>")
    out = page.to_html([bad], title="<script>title</script>")
    lower = out.lower()
    for tag in ("<script", "<img", "<iframe", "<b>", "<i>"):
        assert tag not in lower, tag
    assert html.escape(evil) in out and "&lt;script&gt;bad()&lt;/script&gt;" in out
    assert "&lt;img src=x onerror=alert(1)&gt; reason" in out and "&lt;iframe src=x&gt; why" in out
    assert {b["strategy"] for b in bars(out)} == {"<script>bad()</script>"}  # the attribute, unescaped by the parser
    svg = page.to_svg([bad])
    root = ET.fromstring(svg)  # still one valid XML document
    texts = "".join(root.itertext())
    assert evil in texts and "<img src=x onerror=alert(1)> reason" in texts
    assert not any(e.tag in (f"{SVG_NS}script", "script") for e in root.iter())


def test_device_oom_and_not_audited_strategies_are_text_without_bars(rep):
    r = audit(rep, "ascend-0.11")
    oom = DeviceOom(allocation=21, allocations=60, request_bytes=300 << 20, allocated_before_bytes=6 << 30,
                    free_bytes=100 << 20, tensor=4, layers=("model.layers.16.linear_attn",),
                    message="CUDA out of memory. Tried to allocate 300.00 MiB", segment_bytes=300 << 20)
    ran_out = dataclasses.replace(r, device_oom=oom, verdict=Verdict.FAIL, groups=(), tensors=(), layers=(),
                                  reasons=("ran out of memory on the cuda meter at allocation 21 of 60",))
    rep2 = dataclasses.replace(rep, audits=(audit(rep, "vllm"), ran_out),
                               skipped=(("vllm-ascend==0.9.0", "no sdist of vllm-ascend 0.9.0"),))
    for out in (page.to_html([rep2]), page.to_svg([rep2])):
        assert {b["strategy"] for b in bars(out)} == {"vllm"} and len(bars(out)) == 8
        assert "out of memory at allocation 21 of 60, with 6.00 GiB allocated by then" in out
        assert "ran out of memory on the cuda meter at allocation 21 of 60" in out
        assert ">NOT AUDITED</text>" in out and "not audited: no sdist of vllm-ascend 0.9.0" in out
    nothing = dataclasses.replace(rep, audits=(), skipped=(("ascend-0.11", "interleaved plan"),))
    out = page.to_html([nothing])
    assert bars(out) == [] and '<span class="word">NOT MEASURED</span>' in out
    assert "not audited: interleaved plan" in out
    ET.fromstring(page.to_svg([nothing]))


def test_zero_bytes_draw_zero_length_bars(rep):
    r = audit(rep, "vllm")
    zero = dataclasses.replace(r, groups=(GroupRow(0, "MambaSpec", 12, 0, 0), GroupRow(1, "FullAttentionSpec", 12,
                                                                                      1 << 30, 0)))
    out = page.to_html([dataclasses.replace(rep, audits=(zero,))])
    found = {(b["group"], b["kind"]): b for b in bars(out)}
    assert found[(0, "planned")]["width"] == found[(0, "allocated")]["width"] == found[(1, "allocated")]["width"] == 0
    assert found[(1, "planned")]["width"] > 0
    assert found[(0, "allocated")]["verdict"] == "pass" and found[(1, "allocated")]["verdict"] == "fail"
    assert "0 B planned" in out and "0 B allocated · —" in out and "0 B allocated · 0.00×" in out
    all_zero = dataclasses.replace(r, expected_bytes=0, allocated_bytes=0, groups=(GroupRow(0, "MambaSpec", 1, 0, 0),))
    for out in (page.to_html([dataclasses.replace(rep, audits=(all_zero,))]),
                page.to_svg([dataclasses.replace(rep, audits=(all_zero,))])):
        assert [b["width"] for b in bars(out)] == [0, 0]


def test_hundreds_of_layers_are_bars_per_group(rep):
    r = audit(rep, "ascend-0.11")
    row = r.layers[0]
    layers = tuple(dataclasses.replace(row, layer=f"model.layers.{i}.linear_attn", group=i % 3) for i in range(480))
    groups = tuple(GroupRow(k, "MambaSpec", 160, 160 * row.expected, 160 * row.allocated) for k in range(3))
    many = dataclasses.replace(rep, audits=(dataclasses.replace(r, layers=layers, groups=groups),))
    out = page.to_html([many])
    assert len(bars(out)) == 6
    assert "MambaSpec · 160 layers" in out and "model.layers.479" not in out.split('<pre class="tables"')[0]
    assert ET.fromstring(page.to_svg([many], detail="groups")) is not None


def test_several_reports_are_one_section_each(rep):
    d = rep.deployment
    stage1 = dataclasses.replace(rep, deployment=dataclasses.replace(d, pp=2, pp_rank=1))
    stage0 = dataclasses.replace(rep, deployment=dataclasses.replace(d, pp=2, pp_rank=0))
    out = page.to_html([stage0, stage1], title="pipeline")
    assert out.count('<section class="report"') == 2 and "<title>pipeline</title>" in out
    assert "PP stage 0 of 2" in out and "PP stage 1 of 2" in out and len(bars(out)) == 64
    svg = page.to_svg([stage0, stage1])
    root = ET.fromstring(svg)
    ids = [e.get("id") for e in root.iter() if e.get("id")]
    assert len(ids) == len(set(ids)), "the nested tables' ids do not collide"
    assert len([e for e in root.iter(f"{SVG_NS}svg") if e.get("class") == "rich-terminal"]) == 2
    assert page.to_html([]) and ET.fromstring(page.to_svg([])) is not None


def test_svg_is_one_valid_document_with_bars_and_tables(rep):
    svg = page.to_svg([rep])
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG_NS}svg" and float(root.get("width")) > 1000 and float(root.get("height")) > 1000
    nested = [e for e in root.iter(f"{SVG_NS}svg") if e.get("class") == "rich-terminal"]
    assert len(nested) == 1
    assert len(bars(svg)) == 32 and bars(svg) == bars(page.to_html([rep]))
    texts = "".join(root.itertext()).replace("\xa0", " ")
    assert "Audit per strategy" in texts and meter_label("meta") in texts
    assert "ascend-0.11 (vllm-ascend ≤ 0.11.0: before PR #3760)" in texts  # rich's tables, as text


@pytest.mark.parametrize("kind", ["html", "svg"])
def test_the_page_fetches_nothing(rep, page_html, kind):
    out = page_html if kind == "html" else page.to_svg([rep])
    rest = out.replace('xmlns="http://www.w3.org/2000/svg"', "")
    for needle in ("http://", "https://", "<script", "<link", "@import", "url(http", "@font-face", "src="):
        assert needle not in rest.lower(), needle


def test_importing_the_page_imports_neither_torch_nor_vllm():
    code = ("import sys; import kvaudit.report.page; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'vllm'}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


# --- what a browser shows ----------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="chromium is not on PATH (Debian: apt-get install chromium)")


def screenshot(doc: Path, png: Path, size: tuple[int, int] = (1400, 2000)) -> dict[tuple[int, int, int], int]:
    """``doc`` as headless Chromium shows it at ``size``: the count of pixels of each RGB color."""
    pil = pytest.importorskip("PIL.Image", reason="Pillow decodes the screenshot")
    args = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--force-device-scale-factor=1", "--no-first-run", f"--user-data-dir={png.parent / 'chromium-profile'}",
            f"--window-size={size[0]},{size[1]}", f"--screenshot={png}", doc.resolve().as_uri()]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and png.is_file(), f"chromium: {p.returncode}: {p.stderr[-2000:]}"
    with pil.open(png) as im:
        assert im.size == size
        return {c: n for n, c in im.convert("RGB").getcolors(size[0] * size[1])}


def rgb(hex_color: str) -> tuple[int, int, int]:
    return tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))


def areas(counts: dict) -> tuple[int, int, int]:
    """Pixels of the planned, the within-plan and the off-plan bar colors (the legend's three swatches included)."""
    return tuple(counts.get(rgb(c), 0) for c in (page.PLANNED_BAR, page.PASS_BAR, page.FAIL_BAR))


SWATCH = 12 * 12


def bar_areas(doc: Path, text: str) -> tuple[int, int, int]:
    """Write ``text`` (a page or an SVG) to ``doc`` and count its bars' pixels in a Chromium screenshot."""
    doc.write_text(text)
    return areas(screenshot(doc, doc.with_suffix(".png")))


@needs_chromium
def test_screenshot_shows_a_4x_strategy_as_a_red_bar_four_times_its_plan(rep, tmp_path):
    planned, within, off = bar_areas(tmp_path / "ascend-0.11.html", page.to_html([only(rep, "ascend-0.11")]))
    # four groups, each a planned bar of about 130 × 14 px
    assert planned > 4 * 100 * 12, planned
    assert off == pytest.approx(4 * planned, rel=0.1), (planned, off)
    assert within <= SWATCH + 20, "no bar within plan"


@needs_chromium
def test_screenshot_shows_a_passing_strategy_as_green_bars_the_length_of_its_plan(rep, tmp_path):
    planned, within, off = bar_areas(tmp_path / "vllm.html", page.to_html([only(rep, "vllm")]))
    assert planned > 4 * 100 * 12, planned
    assert within == pytest.approx(planned, rel=0.05), (planned, within)
    assert off <= SWATCH + 20, "no bar off plan"


@needs_chromium
def test_screenshot_of_the_svg_shows_every_strategys_bars(rep, tmp_path):
    planned, within, off = bar_areas(tmp_path / "report.svg", page.to_svg([rep]))
    # in units of one group's plan: 16 planned, 8 within (vllm, ascend-0.16), 24 off (4 × 4 + 3 × 1.33 + 4)
    unit = planned / 16
    assert unit > 100 * 12, planned
    assert within == pytest.approx(8 * unit, rel=0.1), (planned, within, off)
    assert off == pytest.approx(24 * unit, rel=0.1), (planned, within, off)


@needs_chromium
def test_screenshot_of_the_full_page_shows_every_strategys_bars(page_html, tmp_path):
    planned, within, off = bar_areas(tmp_path / "report.html", page_html)
    unit = planned / 16
    assert unit > 100 * 12, planned
    assert within == pytest.approx(8 * unit, rel=0.1), (planned, within, off)
    assert off == pytest.approx(24 * unit, rel=0.1), (planned, within, off)
