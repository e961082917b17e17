"""``kvaudit check``: every policy error names its key and line (exit 2), expected-to-fail cells, JUnit read
back by junitparser, the JSON matrix, progress lines, and the shipped example policy."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
import xml.etree.ElementTree as ET

import pytest

from kvaudit.cli import main
from conftest import ROOT

junitparser = pytest.importorskip("junitparser")

EXAMPLE = ROOT / "examples/kvaudit.toml"

POLICY_ERRORS = [
    # (policy text, line, message)
    ("[check]\nmeter = 'meta'\n[[model]\nname = 'qwen3-next'\n", 3, "not valid TOML"),
    ("[checks]\nmeter = 'meta'\n", 1, "unknown table [checks]"),
    ("[check]\nmeter = 'meta'\nstrategy = ['vllm']\n[[model]]\nname = 'qwen3-next'\n", 3,
     "unknown key 'strategy' in [check]"),
    ("[check]\ntolerance = '0.01'\n[[model]]\nname = 'qwen3-next'\n", 2,
     "'tolerance' in [check] must be a number, got a string"),
    ("[check]\ntolerance = 1.5\n[[model]]\nname = 'qwen3-next'\n", 2, "'tolerance' in [check] must be in [0, 1)"),
    ("[check]\nstrategies = []\n[[model]]\nname = 'qwen3-next'\n", 2, "'strategies' in [check] is an empty list"),
    ("[check]\nstrategies = ['vllm', 'vllm']\n[[model]]\nname = 'qwen3-next'\n", 2, "names a strategy twice"),
    ("[check]\nstrategies = ['vllm', 3]\n[[model]]\nname = 'qwen3-next'\n", 2,
     "'strategies' in [check] must be a list of strings, got a list"),
    ("[check]\nmeter = 'meta'\n", 1, "at least one [[model]] entry"),
    ("[check]\nmeter = 'tpu'\n[[model]]\nname = 'qwen3-next'\n", 2, "unknown meter 'tpu' in [check]"),
    ("[[model]]\nname = 'qwen3-next'\nmeter = 'gpu'\n", 3, "unknown meter 'gpu' in [[model]]"),
    ("[[model]]\nname = 'llama-3.1-8b'\n\n[[model]]\nname = 'qwen3-next'\nutl = 0.7\n", 6,
     "unknown key 'utl' in [[model]]"),
    ("[[model]]\nname = 'qwen3-next'\ntp = '4'\n", 3, "'tp' in [[model]] must be an integer or a list of them, "
                                                        "got a string"),
    ("[[model]]\nname = 'qwen3-next'\nutil = [0.7, 'high']\n", 3, "'util' in [[model]] must be a number"),
    ("[[model]]\nname = 'qwen3-next'\ntp = true\n", 3, "'tp' in [[model]] must be an integer or a list of them, "
                                                         "got a boolean"),
    ("[[model]]\nname = 'qwen3-next'\nutil = []\n", 3, "'util' is an empty list"),
    ("[[model]]\nname = 'qwen3-next'\nkv_transfer = 'yes'\n", 3,
     "'kv_transfer' in [[model]] must be true or false or a list of them, got a string"),
    ("[[model]]\nname = 'qwen3-next'\ndevice_memory = 1.5\n", 3,
     "'device_memory' in [[model]] must be a string or an integer, got a number"),
    ("[[model]]\nname = 'qwen3-next'\nnum_blocks = [16, 32]\n", 3,
     "'num_blocks' in [[model]] must be an integer, got a list"),
    ("[[model]]\ntp = 4\n", 1, "exactly one of name = PRESET or config = PATH"),
    ("[[model]]\nname = 'qwen3-next'\nconfig = 'x'\n", 1, "exactly one of name = PRESET or config = PATH"),
    ("[[model]]\nname = 'qwen9'\n", 2, "unknown preset 'qwen9'"),
    ("[[model]]\nconfig = 'nowhere/config.json'\n", 2, "config not found: nowhere/config.json"),
    ("[[model]]\nname = 'qwen3-next'\nexpect = 'xfail'\n", 3, "'expect' must be one of pass, fail, not-audited"),
    ("[[model]]\nname = 'qwen3-next'\nexpect = { 'ascend-0.9' = 'fail' }\n", 3,
     "'expect' names strategy 'ascend-0.9', which this entry does not run"),
    ("[[model]]\nname = 'qwen3-next'\n[model.expect]\n'ascend-0.11' = 'broken'\n", 3,
     "'expect.ascend-0.11' must be one of pass, fail, not-audited, got 'broken'"),
    ("[[model]]\nname = 'qwen3-next'\nwhy = 3\n", 3, "'why' in [[model]] must be a string or a table, got an integer"),
    ("[[model]]\nname = 'qwen3-next'\nmeter = 'meta'\nstrategies = ['vllm', 'ascend-9']\n", 1,
     "unknown strategy 'ascend-9'"),
    ("[[model]]\nname = 'llama-3.1-8b'\nstrategies = ['vllm']\n[[model]]\nname = 'qwen3-next'\n"
     "strategies = ['ascend-9']\n", 4, "unknown strategy 'ascend-9'"),
    ("[[model]]\nname = 'llama-3.1-8b'\n\n[[model]]\ntp = 2\n", 4, "exactly one of name = PRESET or config = PATH"),
    ("check = 3\n[[model]]\nname = 'qwen3-next'\n", 1, "'check' must be a table: [check]"),
    ("[check]\nmeter = 'meta'\n[model]\nname = 'qwen3-next'\n", 3, "at least one [[model]] entry"),
    ("[[model]]\nname = 'qwen3-next'\nwhy = { 'ascend-0.11' = 4 }\n", 3, "'why.ascend-0.11' must be a string, got 4"),
    ("[[model]]\nname = 'qwen3-next'\nwhy = { 'vllm-ascend' = 'x' }\n", 3,
     "'why' names strategy 'vllm-ascend', which this entry does not run"),
]


def _check(argv, capsys):
    code = main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _check_json(argv, capsys):
    """``kvaudit check ARGV --format json``: the exit code, the JSON document on stdout, and stderr."""
    code, out, err = _check([*argv, "--format", "json"], capsys)
    return code, json.loads(out), err


@pytest.mark.parametrize("text,line,message", POLICY_ERRORS, ids=[m for _, _, m in POLICY_ERRORS])
def test_every_policy_error_is_one_line_with_its_line_and_exit_2(text, line, message, tmp_path, capsys):
    policy = tmp_path / "kvaudit.toml"
    policy.write_text(text)
    code, out, err = _check([str(policy)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"kvaudit: error: {policy}:{line}: ") and message in lines[0], lines[0]


def test_a_policy_expands_into_its_cells(tmp_path):
    from kvaudit.ci.policy import load_policy

    (tmp_path / "models/llama").mkdir(parents=True)
    (tmp_path / "models/llama/config.json").write_text("{}")
    policy = _policy(tmp_path, """
        [check]
        meter = "cpu"
        tolerance = 0.01
        strategies = ["vllm", "ascend-0.11"]
        expect = "fail"

        [[model]]
        name = "qwen3-next"
        util = [0.7, 0.9]
        kv_transfer = [false, true]
        num_blocks = 16
        expect = { "vllm" = "pass" }
        why = { "ascend-0.11" = "#3368" }

        [[model]]
        config = "models/llama"
        strategies = ["ascend-0.16"]
        tolerance = 0.02
        meter = "meta"
        why = "dense"
        """)
    cells = load_policy(policy, ("vllm",)).cells
    assert [(c.model, c.label, c.strategy, c.expect, c.why, c.meter, c.tolerance, c.line) for c in cells] == [
        ("qwen3-next", f"qwen3-next util={u} kv_transfer={k} num_blocks=16", s, e, w, "cpu", 0.01, 8)
        for u in (0.7, 0.9) for k in ("false", "true")
        for s, e, w in (("vllm", "pass", ""), ("ascend-0.11", "fail", "#3368"))] + [
        ("models/llama", "models/llama", "ascend-0.16", "fail", "dense", "meta", 0.02, 16)]
    assert cells[0].preset == "qwen3-next" and cells[0].config is None
    assert cells[-1].preset is None and cells[-1].config == str((tmp_path / "models/llama").resolve())
    assert cells[0].options == (("util", 0.7), ("kv_transfer", False), ("num_blocks", 16))
    # the two strategies of one deployment share it; each combination of the axes is a deployment of its own
    assert len({c.deployment_key for c in cells}) == 5 and cells[0].deployment_key == cells[1].deployment_key


def test_a_missing_policy_file_is_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _check([], capsys)
    assert code == 2 and err.strip() == ("kvaudit: error: kvaudit.toml: policy file not found (start from "
                                         "examples/kvaudit.toml; docs/ci.md describes every key)")


QWEN = """
[check]
meter = "meta"
strategies = ["vllm", "ascend-0.11"]

[[model]]
name = "qwen3-next"
util = 0.7
{expect}
"""


def _policy(tmp_path, text, name="kvaudit.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _junit(path):
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = list(xml) if isinstance(xml, junitparser.JUnitXml) else [xml]
    cases = [c for s in suites for c in s]
    return suites[0], cases


def _kind(case):
    kinds = {type(r).__name__ for r in case.result}
    return kinds.pop() if kinds else "passed"


def test_a_cell_expected_to_fail_keeps_the_job_green_and_is_reported_skipped(tmp_path, capsys):
    policy = _policy(tmp_path, QWEN.format(expect='expect = { "ascend-0.11" = "fail" }\nwhy = "vllm-ascend #3368"'))
    code, out, err = _check([str(policy), "--junit", str(tmp_path / "j.xml"), "--html", str(tmp_path / "c.html"),
                             "--svg", str(tmp_path / "c.svg")], capsys)
    assert code == 0, err
    assert "ok (expected fail)" in out and "4.00×" in out and "vllm-ascend #3368" in out
    # the page leads with the check's verdict and its matrix (a pinned FAIL reads as expected), then the report
    page = (tmp_path / "c.html").read_text(encoding="utf-8")
    assert "<h1>kvaudit check " in page and "OK: 2 of 2 cells as expected" in page
    assert page.index("ok (expected fail)") < page.index("FAIL · meta")
    # and so does the SVG: its title, the verdict line, the matrix (rich writes its spaces as &#160;), the report
    svg = (tmp_path / "c.svg").read_text(encoding="utf-8")
    ET.fromstring(svg)
    assert "<title>kvaudit check " in svg and ">OK: 2 of 2 cells as expected" in svg
    assert svg.index("ok&#160;(expected&#160;fail)") < svg.index('<g class="report"')
    suite, cases = _junit(tmp_path / "j.xml")
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (2, 0, 0, 1)
    by_name = {c.name: c for c in cases}
    assert _kind(by_name["vllm"]) == "passed" and _kind(by_name["ascend-0.11"]) == "Skipped"
    skipped = by_name["ascend-0.11"].result[0]
    assert skipped.type == "expected-fail" and "expected fail" in skipped.message
    assert "4.00×" in skipped.text and "vllm-ascend #3368" in skipped.text and "meter meta (accounting" in skipped.text
    assert err.strip().splitlines()[-1].startswith("kvaudit check: OK: 2 of 2 cells as expected")


def test_text_from_the_policy_and_the_paths_is_printed_as_written_not_read_as_markup(tmp_path, capsys, monkeypatch):
    """rich reads ``[...]`` as a style: a why or a folder name with brackets once vanished from the tables,
    and a ``[/...]`` stopped the command with a MarkupError."""
    (tmp_path / "[bold]llama").mkdir()
    shutil.copy(ROOT / "fixtures/configs/llama-3.1-8b/config.json", tmp_path / "[bold]llama")
    policy = _policy(tmp_path, """
        [check]
        meter = "meta"
        strategies = ["ascend-0.11"]

        [[model]]
        name = "qwen3-next"
        util = 0.7
        expect = "fail"
        why = "a buffer per layer [vllm-ascend#3368] [/fixed by #6887]"

        [[model]]
        config = "[bold]llama"
        """)
    monkeypatch.setenv("COLUMNS", "250")  # the reason column folds text on a narrower table
    code, out, err = _check([str(policy), "--html", str(tmp_path / "c.html")], capsys)
    assert code == 0, err
    assert "a buffer per layer [vllm-ascend#3368] [/fixed by #6887]" in out and "[bold]llama" in out
    page = (tmp_path / "c.html").read_text(encoding="utf-8")
    assert "[vllm-ascend#3368]" in page and "[bold]llama (LlamaForCausalLM, 32 KV-cache layers" in page


def test_an_unexpected_failure_fails_the_job_with_its_reasons(tmp_path, capsys):
    policy = _policy(tmp_path, QWEN.format(expect=""))
    code, out, err = _check([str(policy), "--junit", str(tmp_path / "j.xml")], capsys)
    assert code == 1 and "UNEXPECTED (expected pass)" in out
    suite, cases = _junit(tmp_path / "j.xml")
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (2, 1, 0, 0)
    failure = next(c for c in cases if c.name == "ascend-0.11").result[0]
    assert type(failure).__name__ == "Failure" and failure.type == "unexpected-fail"
    assert "over-allocation" in failure.message and "4.00×" in failure.message
    m = re.search(r"allocated [0-9.]+ GiB \(([0-9,]+) B\) of [0-9.]+ GiB \(([0-9,]+) B\)", failure.text)
    assert m and round(int(m[1].replace(",", "")) / int(m[2].replace(",", "")), 2) == 4.0, failure.text
    assert "planned by vLLM" in failure.text
    assert "kvaudit check: FAIL: 1 of 2 cells as expected" in err


def test_a_pinned_failure_that_now_passes_fails_the_job(tmp_path, capsys):
    policy = _policy(tmp_path, QWEN.format(expect='expect = "fail"'))
    code, out, err = _check([str(policy), "--junit", str(tmp_path / "j.xml")], capsys)
    assert code == 1
    suite, cases = _junit(tmp_path / "j.xml")
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (2, 1, 0, 1)
    failure = next(c for c in cases if c.name == "vllm").result[0]
    assert failure.type == "unexpected-pass" and "update the policy" in failure.message


def test_a_deployment_vllm_refuses_is_an_error_cell_with_its_line_and_the_rest_still_runs(tmp_path, capsys):
    policy = _policy(tmp_path, """
        [check]
        strategies = ["vllm"]

        [[model]]
        name = "qwen3-next"
        tp = [3, 4]
        """)
    code, doc, err = _check_json([str(policy), "--junit", str(tmp_path / "j.xml")], capsys)
    assert code == 2 and doc["exit_code"] == 2
    assert [(c["options"]["tp"], c["outcome"]) for c in doc["cells"]] == [(3, "error"), (4, "pass")]
    assert doc["cells"][0]["reason"].startswith(f"{policy}:5: ") and "divisible by tensor parallel size (3)" in \
        doc["cells"][0]["reason"]
    suite, cases = _junit(tmp_path / "j.xml")
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (2, 0, 1, 0)


def test_an_unavailable_meter_leaves_cells_not_audited_exit_3(tmp_path, capsys):
    policy = _policy(tmp_path, QWEN.format(expect=""))
    code, out, err = _check([str(policy), "--meter", "npu", "--junit", str(tmp_path / "j.xml")], capsys)
    assert code == 3 and "not audited" in out and "torch_npu" in out and "kvaudit check: NOT MEASURED" in err
    suite, _ = _junit(tmp_path / "j.xml")
    assert (suite.tests, suite.errors) == (2, 2)


def test_json_holds_the_whole_matrix_and_each_deployments_report(tmp_path, capsys):
    policy = _policy(tmp_path, """
        [check]
        strategies = ["vllm", "ascend-0.12"]

        [[model]]
        name = "qwen3-next"
        util = [0.7, 0.9]
        expect = { "ascend-0.12" = "fail" }
        """)
    code, doc, err = _check_json([str(policy)], capsys)
    assert code == 0 and doc["schema_version"] == 1 and doc["vllm_version"]
    import jsonschema

    jsonschema.validate(doc, json.loads((ROOT / "kvaudit/check.schema.json").read_text()))
    report_schema = json.loads((ROOT / "kvaudit/report.schema.json").read_text())
    for report in doc["reports"]:
        jsonschema.validate(report, report_schema)
    assert [(c["options"]["util"], c["strategy"], c["outcome"], c["as_expected"]) for c in doc["cells"]] == [
        (0.7, "vllm", "pass", True), (0.7, "ascend-0.12", "fail", True),
        (0.9, "vllm", "pass", True), (0.9, "ascend-0.12", "fail", True)]
    assert [round(c["ratio"], 2) for c in doc["cells"]] == [1.0, 2.0, 1.0, 2.0]
    assert len(doc["reports"]) == 2 and [c["report"] for c in doc["cells"]] == [0, 0, 1, 1]
    assert doc["reports"][1]["deployment"]["gpu_memory_utilization"] == 0.9
    assert doc["counts"] == {"pass": 2, "fail": 2, "not-audited": 0, "error": 0, "unexpected": 0, "expected-fail": 2}
    # progress: one plain line per deployment on stderr when it is not a terminal
    assert [l for l in err.splitlines() if l.startswith("kvaudit check: [")] == [
        "kvaudit check: [1/2] qwen3-next util=0.7 (2 strategies)",
        "kvaudit check: [2/2] qwen3-next util=0.9 (2 strategies)"]


def test_a_config_path_is_resolved_against_the_policys_folder(tmp_path, capsys):
    import shutil

    shutil.copytree(ROOT / "fixtures/configs/llama-3.1-8b", tmp_path / "models/llama")
    policy = _policy(tmp_path, """
        [check]
        strategies = ["ascend-0.16"]

        [[model]]
        config = "models/llama"
        max_model_len = 8192
        """)
    code, doc, err = _check_json([str(policy)], capsys)
    assert code == 0 and doc["cells"][0]["model"] == "models/llama" and doc["cells"][0]["outcome"] == "pass"


def test_the_example_policy_covers_every_preset_against_the_built_ins_and_passes(tmp_path, capsys):
    from kvaudit.model.deployment import PRESETS
    from kvaudit.strategies.builtin import STRATEGIES

    code, doc, err = _check_json([str(EXAMPLE), "--junit", str(tmp_path / "j.xml")], capsys)
    assert code == 0, err
    assert {(c["model"], c["strategy"]) for c in doc["cells"]} == {(p, s) for p in PRESETS for s in STRATEGIES}
    suite, cases = _junit(tmp_path / "j.xml")
    assert suite.tests == len(doc["cells"]) == len(cases) == 84  # qwen3-next runs at two utilizations
    assert (suite.failures, suite.errors) == (0, 0)
    assert suite.skipped == doc["counts"]["expected-fail"] == 23  # 20 pinned failures, 3 not audited


def test_progress_is_a_rich_bar_on_a_terminal_and_plain_lines_elsewhere(monkeypatch, capsys):
    import io
    import sys

    from kvaudit.ci import check

    plain = check.progress_to_stderr()
    plain(0, 2, "a (4 strategies)")
    plain(2, 2, "done")
    assert capsys.readouterr().err == "kvaudit check: [1/2] a (4 strategies)\n"

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    bar = check.progress_to_stderr()
    assert bar is not plain and bar.__name__ == "rich_bar"
    bar(0, 2, "qwen3-next util=0.7 (4 strategies)")
    bar(1, 2, "qwen3-next util=0.9 (4 strategies)")
    bar(2, 2, "done")
    drawn = term.getvalue()
    assert "kvaudit check" in drawn and "━" in drawn and "0/2" in drawn and "2/2" in drawn


def test_pipeline_stages_are_cells_of_their_own(tmp_path, capsys):
    policy = _policy(tmp_path, """
        [check]
        strategies = ["ascend-0.12"]

        [[model]]
        name = "qwen3-next"
        util = 0.7
        pp = 2
        expect = "fail"
        """)
    code, doc, err = _check_json([str(policy), "--junit", str(tmp_path / "j.xml")], capsys)
    assert code == 0
    assert [(c["options"], c["outcome"], round(c["ratio"], 2)) for c in doc["cells"]] == [
        ({"util": 0.7, "pp": 2, "pp_rank": 0}, "fail", 2.0), ({"util": 0.7, "pp": 2, "pp_rank": 1}, "fail", 2.0)]
    assert [r["deployment"]["pipeline_parallel_rank"] for r in doc["reports"]] == [0, 1]
    suite, cases = _junit(tmp_path / "j.xml")
    assert (suite.tests, suite.skipped) == (2, 2)
    assert [c.classname for c in cases] == ["kvaudit.qwen3-next util=0.7 pp=2 pp_rank=0",
                                            "kvaudit.qwen3-next util=0.7 pp=2 pp_rank=1"]


def test_hf_overrides_as_a_toml_table(tmp_path, capsys):
    policy = _policy(tmp_path, """
        [check]
        strategies = ["vllm"]

        [[model]]
        name = "llama-3.1-8b"
        hf_overrides = { max_position_embeddings = 4096 }
        max_model_len = 4096
        """)
    code, doc, err = _check_json([str(policy)], capsys)
    assert code == 0, err
    assert doc["cells"][0]["options"]["hf_overrides"] == {"max_position_embeddings": 4096}


def test_a_cell_that_cannot_be_measured_is_not_audited_not_an_error(tmp_path, capsys, monkeypatch):
    from kvaudit.measure import meters

    monkeypatch.setattr(meters, "host_available_bytes", lambda: 2 << 30)  # the host cannot hold the plan
    policy = _policy(tmp_path, """
        [check]
        meter = "cpu"
        strategies = ["ascend-0.11"]

        [[model]]
        name = "qwen3-next"
        util = 0.7
        """)
    code, doc, err = _check_json([str(policy)], capsys)
    assert code == 3 and [c["outcome"] for c in doc["cells"]] == ["not-audited"]
    assert "--num-blocks" in doc["cells"][0]["reason"]


def test_control_characters_in_a_policy_leave_junit_svg_and_html_well_formed(tmp_path, capsys):
    """A why with control characters (TOML allows them escaped) once made the JUnit file and the SVG invalid
    XML: every parser refused them."""
    import xml.etree.ElementTree as ET

    policy = _policy(tmp_path, """
        [check]
        meter = "meta"
        strategies = ["ascend-0.11"]

        [[model]]
        name = "qwen3-next"
        util = 0.7
        expect = "fail"
        why = "a buffer per layer\\u0001\\u0007 \\u001b[31m (#3368) \\u000b"
        """)
    outputs = {kind: tmp_path / f"c.{kind}" for kind in ("xml", "svg", "html")}
    code, out, err = _check([str(policy), "--junit", str(outputs["xml"]), "--svg", str(outputs["svg"]),
                             "--html", str(outputs["html"])], capsys)
    assert code == 0, err
    for kind in ("xml", "svg"):
        ET.parse(outputs[kind])  # raises on a character XML forbids
    for path in outputs.values():
        text = path.read_text(encoding="utf-8")
        assert "buffer" in text and not any(c in text for c in "\x01\x07\x0b\x1b"), path.name
    _, cases = _junit(outputs["xml"])
    assert "(#3368)" in cases[0].result[0].text
