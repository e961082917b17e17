"""The command line: every exit code, one-line errors without tracebacks, stdout/stderr split."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvaudit.cli import main
from kvaudit.measure import meters
from conftest import ROOT

QWEN = ROOT / "fixtures/configs/qwen3-next-80b-a3b-instruct"


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_exit_0_when_every_strategy_passes(capsys):
    code, out, err = _run(["qwen3-next", "--util", "0.7", "-s", "vllm", "-s", "ascend-0.16", "--detail",
                           "summary"], capsys)
    assert code == 0 and "PASS" in out and err.strip().splitlines()[-1].startswith("kvaudit: PASS")


def test_exit_1_when_any_strategy_fails(capsys):
    code, out, err = _run(["qwen3-next", "--util", "0.7", "--detail", "summary"], capsys)
    assert code == 1 and "4.00×" in out and "2.00×" in out
    assert "kvaudit: FAIL" in err


def test_audit_with_config_path_is_the_same_as_the_preset(capsys):
    args = ["--util", "0.7", "-s", "ascend-0.12", "--format", "json"]
    a = json.loads(_run(["audit", "--config", str(QWEN), "--tp", "4", "--max-model-len", "4096"] + args, capsys)[1])
    b = json.loads(_run(["qwen3-next"] + args, capsys)[1])
    assert a["audits"][0]["allocated_bytes"] == b["audits"][0]["allocated_bytes"]


BAD_INPUT = [
    (["audit", "--config", "/nonexistent/config.json"], "config not found"),
    (["audit", "--config", "{tmp}/notjson.json"], "not JSON ("),
    (["audit", "--config", "{tmp}/missing.json"], "missing 'architectures'"),
    (["audit", "--config", "{tmp}/gpt2.json"], "'n_layer' must be a positive integer"),
    (["audit"], "exactly one of --model"),
    (["qwen3-next", "--util", "0"], "--util must be in (0, 1]"),
    (["qwen3-next", "--util", "1.5"], "--util must be in (0, 1]"),
    (["qwen3-next", "--util", "abc"], "qwen3-next: Invalid value for '--util'"),
    (["qwen3-next", "--tp", "3"], "must be divisible by tensor parallel size (3)"),
    (["qwen3-next", "--device-memory=-5GiB"], "must be positive"),
    (["qwen3-next", "--device-memory", "0"], "must be positive"),
    (["qwen3-next", "--device-memory", "80GiB"], "--device-memory 80GiB gives a size but not the kind of device, whose "
     "rules plan it: add --device (Ascend: atlas-a2-64g, atlas-a2-32g; CUDA: h100-80g, a100-80g"),
    (["qwen3-next", "--kv-cache-memory", "1MiB"], "planner refused"),
    (["qwen3-next", "--util", "0.5"], "no memory left for the KV cache"),
    (["qwen3-next", "--num-blocks", "0"], "--num-blocks must be at least 1"),
    (["qwen9"], "unknown preset or command 'qwen9'"),
    (["qwen3-next", "--strategy", "ascend-9"], "unknown strategy 'ascend-9'"),
    (["qwen3-next", "--meter", "tpu"], "unknown meter 'tpu'"),
    (["qwen3-next", "--format", "xml"], "'xml' is not one of 'table', 'json'"),
    # click's own usage errors (several lines with the usage in click) are one line here too
    (["qwen3-next", "--util"], "Option '--util' requires an argument"),
    (["qwen3-next", "--utl", "0.7"], "qwen3-next: No such option: --utl (did you mean '--util'?)"),
    (["audit", "--tensor-paralel", "2"], "audit: No such option: --tensor-paralel (did you mean "
     "'--tensor-parallel-size'?)"),
    (["qwen3-next", "extra"], "qwen3-next: Got unexpected extra argument(s) (extra)"),
    (["qwen3-next", "--tp", "four"], "qwen3-next: Invalid value for '--tp'"),
    (["triage"], "triage: Missing argument 'REPORT'"),
    (["compare", "old.json"], "compare: Missing argument 'NEW'"),
    (["check", "--format", "xml"], "check: Invalid value for '--format'"),
    (["--bogus"], "No such option: --bogus"),
]


@pytest.mark.parametrize("argv,message", BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    (tmp_path / "notjson.json").write_text("{model_type: qwen3_next")
    (tmp_path / "missing.json").write_text('{"model_type": "llama"}')
    (tmp_path / "gpt2.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 0}')
    code, out, err = _run([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert lines[-1].startswith("kvaudit: error: ") and message in lines[-1]
    assert "Traceback" not in err and len([l for l in lines if l.startswith("kvaudit: error")]) == 1


def test_unavailable_meter_by_name_is_exit_3(capsys):
    code, out, err = _run(["qwen3-next", "--meter", "npu"], capsys)
    assert code == 3 and out == "" and "meter 'npu' is unavailable: torch_npu is not installed" in err


def test_cpu_meter_on_a_host_too_small_offers_num_blocks(capsys, monkeypatch):
    monkeypatch.setattr(meters, "host_available_bytes", lambda: 2 << 30)
    code, out, err = _run(["qwen3-next", "--util", "0.7", "--meter", "cpu", "-s", "ascend-0.11"], capsys)
    assert code == 3 and "--num-blocks" in err and "Traceback" not in err


def test_cpu_meter_scaled_audit(capsys):
    code, out, err = _run(["qwen3-next", "--util", "0.7", "--meter", "cpu", "--num-blocks", "16",
                           "--max-model-len", "1024", "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["meter"] == "cpu" and doc["deployment"]["num_blocks_override"] == 16
    assert [round(a["ratio"], 2) for a in doc["audits"]] == [1.0, 4.0, 2.0, 1.0]


def test_a_real_process_writes_only_json_to_stdout_and_leaves_no_temp_files(tmp_path):
    """One process, two of its behaviours: stdout holds the JSON document alone (the notes and the verdict line go
    to stderr), and the model folders the planner made under $TMPDIR are gone when it ends (it ends without the
    interpreter's teardown, so kvaudit removes them itself)."""
    env = dict(__import__("os").environ, TMPDIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "kvaudit", "llama-3.1-8b", "--meter", "meta", "--format", "json"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["exit_code"] == 0 and doc["meter"] == "meta"
    assert p.stderr.strip().splitlines()[-1].startswith("kvaudit: PASS")
    # (torch's import makes its compile cache there, torchinductor_USER, unless vLLM's import in this process set
    # TORCHINDUCTOR_CACHE_DIR first: that folder is torch's cache, meant to stay)
    assert sorted(x.name for x in tmp_path.iterdir() if not x.name.startswith("torchinductor_")) == []


def test_help_imports_neither_torch_nor_vllm():
    code = ("import sys; from kvaudit.cli import main; rc = main(['--help']); "
            "print(rc, [m for m in ('torch', 'vllm') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 []"


def test_no_arguments_prints_help_and_exit_2(capsys):
    code, out, err = _run([], capsys)
    assert code == 2 and "Usage: kvaudit" in err


def test_every_command_has_help_with_rich_panels(capsys):
    for argv in (["qwen3-next", "--help"], ["audit", "--help"], ["check", "--help"], ["compare", "-h"]):
        code, out, err = _run(argv, capsys)
        assert code == 0 and f"Usage: kvaudit {argv[0]}" in out, argv
    code, out, err = _run(["qwen3-next", "--help"], capsys)
    assert "Deployment (vLLM's flags)" in out and "--kv-cache-dtype" in out and "Output" in out


def test_shell_completion_completes_presets_and_options():
    import os

    def complete(words: str, cword: int) -> list[str]:
        env = dict(os.environ, _KVAUDIT_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(cword))
        code = "from kvaudit.cli import run; run()"
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return p.stdout.split()

    assert complete("kvaudit qwen3", 1) == ["qwen3-next", "qwen3-8b", "qwen3-30b-a3b", "qwen3.5-27b",
                                            "qwen3.5-397b-a17b"]
    assert complete("kvaudit qwen3-next --kv-c", 2) == ["--kv-cache-dtype", "--kv-cache-memory"]


def test_version(capsys):
    code, out, err = _run(["--version"], capsys)
    assert code == 0 and out.startswith("kvaudit ")


def test_html_and_svg_pages_are_written_beside_the_report(tmp_path, capsys):
    html, svg = tmp_path / "r.html", tmp_path / "r.svg"
    code, out, err = _run(["qwen3-next", "--util", "0.7", "-s", "ascend-0.12", "--detail", "summary", "--html",
                           str(html), "--svg", str(svg)], capsys)
    assert code == 1 and "2.00×" in out
    assert f"kvaudit: wrote {html}" in err and f"kvaudit: wrote {svg}" in err
    page = html.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "ascend-0.12" in page and "<svg" in page
    import xml.etree.ElementTree as ET

    assert ET.parse(svg).getroot().tag.endswith("svg")


def test_an_output_file_that_cannot_be_written_is_refused_before_the_audit(tmp_path, capsys):
    code, out, err = _run(["qwen3-next", "--html", str(tmp_path / "no/such/folder/r.html")], capsys)
    assert code == 2 and out == "" and err.strip().startswith("kvaudit: error: cannot write") and "planning" not in err
    code, out, err = _run(["check", "kvaudit.toml", "--junit", str(tmp_path)], capsys)
    assert code == 2 and f"{tmp_path} is a directory" in err


def _raising(monkeypatch, exc):
    """Make the audit command's first step raise ``exc``."""
    import kvaudit.cli.deployments

    def boom(a):
        raise exc

    monkeypatch.setattr(kvaudit.cli.deployments, "model", boom)


def test_an_unexpected_exception_is_exit_4_in_one_line_never_a_finding(capsys, monkeypatch):
    _raising(monkeypatch, ZeroDivisionError("division by zero"))
    code, out, err = _run(["qwen3-next", "--meter", "meta"], capsys)
    assert code == 4 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("kvaudit: internal error (a bug in kvaudit, not a finding): ZeroDivisionError: division by "
                          "zero at test_cli.py:") and "--debug" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--debug", "qwen3-next", "--meter", "meta"], ["qwen3-next", "--meter", "meta", "--debug"]])
def test_debug_adds_the_traceback(capsys, monkeypatch, argv):
    _raising(monkeypatch, ZeroDivisionError("division by zero"))
    code, out, err = _run(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 4 and lines[0] == "Traceback (most recent call last):" and "in boom" in err
    assert lines[-1].startswith("kvaudit: internal error")


def _caused_by(e, cause):
    e.__cause__ = cause
    return e


@pytest.mark.parametrize("exc, code, line", [
    (KeyboardInterrupt(), 130, "kvaudit: interrupted"),
    # Ctrl-C inside a class body's __set_name__ (torch's dataclasses, while vLLM is imported) reaches
    # kvaudit as the RuntimeError Python wraps it in
    (_caused_by(RuntimeError("Error calling __set_name__ on 'Field' instance 'dtype' in 'TensorProperties'"),
                KeyboardInterrupt()), 130, "kvaudit: interrupted"),
    # click reads EOFError as Ctrl-D at a prompt; a truncated archive raises it too
    (EOFError("Compressed file ended before the end-of-stream marker was reached"), 4,
     "kvaudit: internal error (a bug in kvaudit, not a finding): EOFError: Compressed file ended"),
    (BrokenPipeError(32, "Broken pipe"), 4, "kvaudit: internal error (a bug in kvaudit, not a finding): BrokenPipeError"),
    (MemoryError(), 3, "kvaudit: error: this host ran out of memory"),
    (ModuleNotFoundError("No module named 'torch'", name="torch"), 3, "kvaudit: error: this command needs the Python "
                                                                      "package 'torch'"),
])
def test_every_ending_has_its_exit_code_and_line(capsys, monkeypatch, exc, code, line):
    """typer turns KeyboardInterrupt into a silent 130, EOFError into an abort and a broken pipe into exit 1;
    kvaudit's own mapping decides instead."""
    _raising(monkeypatch, exc)
    got, out, err = _run(["qwen3-next", "--meter", "meta"], capsys)
    assert got == code and len(err.strip().splitlines()) == 1 and err.startswith(line), err


def test_the_exit_codes_in_help_are_the_documented_ones(capsys):
    from kvaudit.errors import EXIT_CODES

    code, out, err = _run(["--help"], capsys)
    assert code == 0 and "--debug" in out
    assert sorted(EXIT_CODES) == [0, 1, 2, 3, 4, 130]
    readme = (ROOT / "README.md").read_text()
    for c, what in EXIT_CODES.items():
        assert f"| {c} | {what} |" in readme, f"README's exit-code table lacks {c}"


class _ClosedAfterOneLine:
    """A stdout whose reader goes away after the first line (``| head -1``)."""

    def __init__(self):
        self.text = ""

    def write(self, s):
        if "\n" in self.text:
            raise BrokenPipeError(32, "Broken pipe")
        self.text += s
        return len(s)

    def flush(self):
        if "\n" in self.text:
            raise BrokenPipeError(32, "Broken pipe")

    def isatty(self):
        return False


@pytest.mark.parametrize("preset, verdict", [("llama-3.1-8b", 0), ("qwen3-next", 1)])
def test_a_reader_that_closes_stdout_early_does_not_change_the_exit_code(monkeypatch, capsys, preset, verdict):
    stdout = _ClosedAfterOneLine()
    monkeypatch.setattr(sys, "stdout", stdout)
    code = main([preset, "--meter", "meta", "--detail", "summary"])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == verdict and stdout.text.startswith("kvaudit") and "Traceback" not in err and "error" not in err


def _default_sigint():
    """In the child: SIGINT as a terminal delivers it (this test's runner may ignore or block it)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_in_a_real_process_says_interrupted_and_exits_130():
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-m", "kvaudit", "qwen3-next", "--meter", "meta"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_default_sigint)
    time.sleep(2)  # while vLLM is imported (about 8 s on the CI machine kind)
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()
    assert p.wait(timeout=60) == 130, rest
    assert rest.strip().splitlines()[-1] == "kvaudit: interrupted", rest
    assert "Exception ignored" not in rest, rest


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_an_interrupt_ends_the_process_without_the_teardown_of_what_it_left_half_built(fmt):
    """Ctrl-C inside a library's import can leave a logging handler with no stream; logging's atexit
    flush of it would print a traceback after "kvaudit: interrupted" (seen in CI at 2 s into an audit). With
    ``--format json`` stdout holds the error object (kvaudit/error.schema.json)."""
    script = ("import logging, kvaudit.cli.app as cli\n"
              "h = logging.StreamHandler(); del h.stream\n"
              "def boom(argv, debug): raise KeyboardInterrupt\n"
              "cli._main = boom\n"
              f"cli.sys.argv = ['kvaudit', 'qwen3-next', '--format', '{fmt}']\n"
              "cli.run()\n")
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stderr) == (130, "kvaudit: interrupted\n")
    if fmt == "json":
        import jsonschema

        doc = json.loads(p.stdout)
        jsonschema.validate(doc, json.loads((ROOT / "kvaudit" / "error.schema.json").read_text()))
        assert doc["exit_code"] == 130
    else:
        assert p.stdout == ""


@pytest.mark.parametrize("argv", [
    ["compare", "/dev/zero", "/dev/zero"], ["audit", "--plan", "/dev/zero"], ["audit", "--config", "/dev/zero"],
    ["check", "/dev/zero"], ["triage", "/dev/zero"],
])
def test_a_device_or_pipe_is_refused_before_a_byte_is_read(capsys, argv):
    """``/dev/zero`` never ends: reading it once took all the memory there was."""
    code, out, err = _run(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "/dev/zero" in err, err


@pytest.mark.parametrize("flag", ["--html", "--svg"])
def test_an_output_the_file_system_refuses_is_found_before_the_audit(capsys, monkeypatch, flag):
    """A folder that exists but takes no file (a read-only file system; /proc, even for root): the audit's
    verdict must not be lost to a write error found after it."""
    import kvaudit.cli.deployments

    monkeypatch.setattr(kvaudit.cli.deployments, "model", lambda a: pytest.fail("audited before checking the output"))
    code, out, err = _run(["llama-3.1-8b", "--meter", "meta", flag, "/proc/kvaudit-report.html"], capsys)
    assert code == 2 and err.startswith("kvaudit: error: cannot write /proc/kvaudit-report.html:"), err


def test_head_on_a_real_process_keeps_the_verdict():
    """``kvaudit llama-3.1-8b | head -1``: the reader goes away after one line; exit 0 is still the verdict."""
    p = subprocess.Popen([sys.executable, "-m", "kvaudit", "llama-3.1-8b", "--meter", "meta"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0 and first.startswith("kvaudit"), err
    assert "Traceback" not in err and "error" not in err, err


def test_models_lists_a_preset_that_has_no_kv_budget_at_the_default_util(capsys, monkeypatch):
    """The listing needs each preset's layer mix, not a KV budget: kimi-k2 has none at 0.9 (its 120.85 GiB of FP8
    weights per H200 at TP 8), and `kvaudit models` with no names had stopped there with exit 2."""
    import kvaudit.cli.models
    from kvaudit.model.deployment import PRESETS

    monkeypatch.setattr(kvaudit.cli.models, "PRESETS", {n: PRESETS[n] for n in ("kimi-k2", "llama-3.1-8b")})
    monkeypatch.setenv("COLUMNS", "400")  # (a row per line)
    code, out, err = _run(["models"], capsys)
    assert code == 0, err
    kimi, llama = [line for line in out.splitlines() if line.startswith("│ ")]
    assert kimi.split()[1] == "kimi-k2" and llama.split()[1:5] == ["llama-3.1-8b", "│", "Llama-3.1-8B", "│"]
    assert "32 full attention" in llama
    # vLLM 0.23's CPU install has no MLA prefill backend: the row says so, the listing goes on
    assert "61 MLA" in kimi or "(not built here: vLLM could not build DeepseekV3ForCausalLM" in kimi, kimi


@pytest.mark.parametrize("tolerance", ["1", "1.5", "-0.01", "nan"])
@pytest.mark.parametrize("command", [["qwen3-next"], ["audit", "--preset", "llama-3.1-8b"],
                                     ["compare", "old.json", "new.json"], ["triage", "report.log"]])
def test_a_tolerance_outside_0_to_1_is_bad_input_in_every_command_before_any_work(capsys, command, tolerance):
    """One rule (``kvaudit.results.valid_tolerance``) for every command that takes ``--tolerance``: it is
    checked before a model is planned or a file read (none of these files exists)."""
    code, out, err = _run([*command, "--tolerance", tolerance], capsys)
    assert (code, out) == (2, "") and err == f"kvaudit: error: --tolerance must be in [0, 1), got {float(tolerance)}\n"


def test_the_tolerance_rule_takes_0_and_refuses_1():
    from kvaudit.results import DEFAULT_TOLERANCE, valid_tolerance

    assert valid_tolerance(0.0) and valid_tolerance(DEFAULT_TOLERANCE) and valid_tolerance(0.999)
    assert not any(valid_tolerance(t) for t in (1.0, -1e-9, float("nan"), float("inf")))
