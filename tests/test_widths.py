"""Every table at every terminal width from 60 columns: the headline audit, ``plan``, ``check``, ``history`` and
``compare`` rendered at 60, 80, 100, 120 and 200 columns keep every figure whole (each figure of the matching JSON
report, and each figure the widest rendering shows), and no cell ends in an ellipsis; help screens show every option
name whole."""

from __future__ import annotations

import io
import json
import re

import pytest

from kvaudit.ci import check

from kvaudit.report import compare

from kvaudit.cli import main
from kvaudit.measure.audit import audit_all
from kvaudit.measure.meters import MetaMeter
from kvaudit.measure.utilization import plan_stage
from kvaudit.plan.planner import vllm_version
from kvaudit.report import render as report
from kvaudit.results import Report
from kvaudit.strategies.builtin import STRATEGIES
from kvaudit.units import fmt_bytes
from conftest import ROOT, deployment

WIDTHS = (60, 80, 100, 120, 200)
CUT = re.compile(r"…[ \t]*(?:[│┃|]|$)", re.M)
"""An ellipsis that ends a cell or a line: what rich writes where it cut a cell (a "…" inside a cell, as in a layer
list "0, 4, 8, …, 44", is kvaudit's own)."""
FIGURE = re.compile(r"(?<![\w.,])[-+]?\d[\d,]*(?:\.\d+)?(?![\d,]*\.?\d)")


def _render(renderables, width: int) -> str:
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, highlight=False, soft_wrap=False, color_system=None, force_terminal=False)
    for r in renderables:
        console.print(r)
    return buf.getvalue()


def _figures(text: str) -> set[str]:
    return set(FIGURE.findall(text))


def _assert_whole(renderables, wanted: set[str], widths: tuple[int, ...] = WIDTHS) -> None:
    """At every width: no cut cell, the figures of ``wanted`` (from the JSON) and those of the widest rendering."""
    widest = _render(renderables, 400)
    assert not CUT.search(widest)
    missing = {f for f in wanted if f not in _figures(widest)}
    assert not missing, f"JSON figures the tables do not show: {sorted(missing)}"
    for width in widths:
        text = _render(renderables, width)
        cut = CUT.search(text)
        assert cut is None, f"a cell cut at {width} columns: {text[max(0, cut.start() - 80):cut.end()]!r}"
        assert max(len(line) for line in text.splitlines()) <= width, f"wider than {width} columns"
        lost = _figures(widest) - _figures(text)
        assert not lost, f"figures not whole at {width} columns: {sorted(lost)[:10]}"


def _bytes(n: int) -> str:
    return fmt_bytes(n).split()[0]


@pytest.fixture(scope="module")
def audit_report():
    d = deployment(gpu_memory_utilization=0.9)  # the util at which the legacy releases run out of memory
    return Report(d, tuple(audit_all(d, list(STRATEGIES.values()), MetaMeter())), "meta", "meta: accounting",
                  vllm_version(), safe_utilization={"vllm": 1.0, "ascend-0.11": 0.736})


@pytest.mark.parametrize("detail", ["layers", "summary"])
def test_the_headline_audit_keeps_every_figure_whole(audit_report, detail):
    doc = report.to_dict(audit_report)
    wanted = {doc["plan"]["block_size"].__str__(), f"{doc['plan']['num_blocks']:,}"}
    for a in doc["audits"]:
        wanted |= {_bytes(a["expected_bytes"]), f"{a['projected_utilization']:.3f}"}
        if a["device_oom"] is None:
            wanted |= {_bytes(a["allocated_bytes"]), f"{a['ratio']:.2f}"}
        if detail == "layers":
            wanted |= {_bytes(g["expected_bytes"]) for g in a["groups"]} | {_bytes(r["allocated_bytes"])
                                                                            for r in a["layers"]}
    wanted |= {f"{u:.3f}" for u in doc["highest_safe_utilization"].values()}
    wanted |= {f"{c['tokens']:,}" for c in doc["capacity"].values()}
    renderables = report.render_tables(audit_report, detail)
    _assert_whole(renderables, wanted)
    for width in WIDTHS:
        text = _render(renderables, width)
        assert all(a["verdict"] in text for a in doc["audits"])


def test_plan_keeps_every_figure_whole():
    d = deployment()
    stages = [plan_stage(d, list(STRATEGIES.values()))]
    doc = json.loads(report.plan_to_json(stages, vllm_version()))
    wanted = set()
    for st in doc["stages"]:
        for p in st["plans"]:
            wanted |= {f"{p['num_blocks']:,}", str(p["block_size"]), _bytes(p["planned_bytes"]),
                       f"{p['capacity']['tokens']:,}", f"{p['capacity']['pool_tokens']:,}"}
    _assert_whole(report.render_plan(stages, vllm_version()), wanted)


def test_check_is_a_grid_of_verdicts_at_every_width(tmp_path):
    """At 60, 80 and 120 columns (and the rest of WIDTHS) ``check`` is a deployment × strategy grid: one line per
    deployment holding each strategy's outcome, a failure's ratio from the JSON beside it; no cards."""
    from kvaudit.ci.policy import load_policy

    policy = tmp_path / "kvaudit.toml"
    policy.write_text('[check]\nmeter = "meta"\nstrategies = ["vllm", "ascend-0.11", "ascend-0.12", "ascend-0.16"]\n\n'
                      '[[model]]\nname = "qwen3-next"\nutil = 0.7\n'
                      'expect = { "ascend-0.11" = "fail", "ascend-0.12" = "fail" }\n'
                      'why = "the legacy releases give each layer of a shared tensor its own buffer (vllm-ascend #3368)"\n')
    result = check.run_policy(load_policy(policy, tuple(STRATEGIES)), meter=None)
    doc = check.to_dict(result)
    marks = [c["outcome"].upper() + (f" {c['ratio']:.2f}×" if c["outcome"] == "fail" else "") for c in doc["cells"]]
    assert marks == ["PASS", "FAIL 4.00×", "FAIL 2.00×", "PASS"]
    _assert_whole(check.render(result), {m.split()[1][:-1] for m in marks if " " in m})
    for width in (60, 80, 120):
        lines = _render(check.render(result), width).splitlines()
        header = next(i for i, line in enumerate(lines) if line.strip("│┃ ").startswith("deployment"))
        assert re.findall(r"vllm|ascend-0\.1\d", lines[header]) == [c["strategy"] for c in doc["cells"]]
        row = next(line for line in lines[header:] if "qwen3-next util=0.7" in line)
        assert re.findall(r"PASS|FAIL [\d.]+×", row) == marks, (width, row)
        assert len(lines) <= 16, "\n".join(lines)  # title, grid, caption, a line per expected failure


def test_a_failure_whose_total_is_as_planned_says_what_failed_not_1x():
    """FAIL beside 1.00× read as a contradiction: a FAIL within the tolerance in total names its finding."""
    from dataclasses import replace

    d = deployment("nemotron-h-8b")
    r, = audit_all(d, [STRATEGIES["ascend-0.11"]], MetaMeter())
    empty = sum(1 for row in r.layers if row.expected and not row.allocated)
    assert r.verdict.value == "FAIL" and f"{r.ratio:.2f}" == "1.00" and empty
    assert r.finding == f"{empty} layers got 0 B"
    assert replace(r, verdict=report.Verdict.PASS).finding == "1.00×"
    rep = Report(d, (r,), "meta", "meta: accounting", vllm_version())
    assert f"(ascend-0.11 {empty} layers got 0 B)" in report.summary_line(rep)


def test_compare_keeps_every_figure_whole_and_narrow_terminals_get_its_verdicts():
    """Wide enough for the figures' tables: every figure whole; narrower: a grid of each strategy's verdict and ratio,
    old → new, and where the figures are."""
    folder = ROOT / "fixtures" / "reports" / "compare"
    c = compare.compare(compare.load_report(folder / "qwen3-next-util0.7-meta.json"),
                        compare.load_report(folder / "qwen3-next-util0.7-meta-kv-transfer.json"), 0.005)
    doc = compare.to_dict(c)
    wanted = set()
    for st in doc["stages"]:
        for s in st["strategies"]:
            for side in ("old", "new"):
                if s.get(side):
                    wanted |= {_bytes(s[side]["allocated_bytes"]), f"{s[side]['ratio']:.2f}"}
    assert wanted
    for detail in ("groups", "layers"):
        _assert_whole(compare.render(c, detail), wanted, widths=(200,))
        for width in (60, 80, 120):
            text = _render(compare.render(c, detail), width)
            assert max(len(line) for line in text.splitlines()) <= width and not CUT.search(text)
            if "Verdicts (old → new)" in text:
                assert "a wider terminal, --format json, --html or --svg" in " ".join(text.split())
                for s in doc["stages"][0]["strategies"]:
                    row = next(line for line in text.splitlines() if line.startswith(s["strategy"] + " "))
                    assert s["status"] in row and f"{s['new']['ratio']:.2f}" in row, row
            else:
                assert not {f for f in wanted if f not in _figures(text)}
        assert "Verdicts (old → new)" in _render(compare.render(c, detail), 60)


def test_history_keeps_every_figure_whole():
    from kvaudit.ci.history import history, render

    rows = history(deployment(), ["0.11.0", "0.13.0", "0.18.0"])
    wanted = {f"{r.ratio:.2f}" for r in rows} | {str(r.storages) for r in rows}
    _assert_whole(render(rows, "qwen3-next: TP 4, util 0.9, planned by vLLM, meter meta"), wanted)


@pytest.mark.parametrize("command", ["", "audit", "plan", "check", "compare", "triage", "history", "models"])
@pytest.mark.parametrize("width", [60, 80])
def test_help_shows_each_option_on_one_line_whole(capsys, monkeypatch, command, width):
    """Parsed at the width: every option's names (and the value it takes) on one line, whole; a flag shows no
    value; nothing cut; no line wider than the terminal; audit and plan name the MODEL they take."""
    from kvaudit.cli import app as cli

    monkeypatch.setenv("COLUMNS", str(width))
    assert main([*([command] if command else []), "--help"]) == 0
    out = capsys.readouterr().out
    lines = [line.strip("│ ") for line in out.splitlines()]
    assert "…" not in out and "<bool>" not in out and max(len(line) for line in out.splitlines()) <= width
    group = cli._click_command()
    params = [p for p in (group.commands[command] if command else group).params if not getattr(p, "hidden", False)]
    assert params or command == "models"
    for p in params:
        if p.param_type_name == "option":
            shown = ", ".join(p.opts) + (f" / {', '.join(p.secondary_opts)}" if p.secondary_opts else "")
            if p.metavar and not p.is_flag:
                shown += f" {p.metavar}"
        else:
            shown = p.metavar + ("..." if p.nargs != 1 else "")
        assert any(line == shown or line.startswith(shown + "  ") for line in lines), (shown, out)
    assert any(line.startswith(("-h, --help  ", "--help, -h  ")) for line in lines)  # (one row, as click orders them)
    if command in ("audit", "plan"):
        assert f"Usage: kvaudit {command} [MODEL] [OPTIONS]" in out


def test_the_screenshot_is_the_headline_at_80_columns_made_again_by_its_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("screenshot", ROOT / "scripts" / "screenshot.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = script.headline(80)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert plain.startswith(script.HEADLINE) and "4.00×" in plain and "2.00×" in plain and "FAIL" in plain
    assert max(len(line) for line in plain.splitlines()[:-1]) <= 80 and not CUT.search(plain)
    drawn = script.svg(text, 80)
    shipped = (ROOT / "docs" / "headline-80.svg").read_text()
    assert drawn.startswith("<svg") and shipped.startswith("<svg") and "headline-80.svg" in (ROOT / "README.md").read_text()
