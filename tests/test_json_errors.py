"""``--format json`` answers every outcome in JSON: on bad input (exit 2) and on what cannot be measured (exit 3)
stdout holds the error object of ``kvaudit/error.schema.json``, stderr the same message as one line."""

from __future__ import annotations

import json

import jsonschema
import pytest

from kvaudit.cli import main
from kvaudit.cli.output import STEPS as ALL_STEPS
from conftest import ROOT

pytestmark = pytest.mark.fast

SCHEMA = json.loads((ROOT / "kvaudit" / "error.schema.json").read_text())
PAPER = str(ROOT / "fixtures" / "reports" / "too-little.log")

BAD_INPUT = {
    "audit": ["qwen3-next", "--util", "1.5", "--format", "json"],
    "audit (an unknown option)": ["audit", "--preset", "qwen3-next", "--bogus", "--format", "json"],
    "plan": ["plan", "--preset", "no-such-model", "--format=json"],
    "check": ["check", str(ROOT / "no-such-policy.toml"), "--format", "json"],
    "compare": ["compare", str(ROOT / "no-such-old.json"), str(ROOT / "no-such-new.json"), "--format", "json"],
    "triage": ["triage", str(ROOT / "no-such-report.log"), "--format", "json"],
    "history": ["history", "qwen3-next", "--util", "2", "--format", "json"],
}

NOT_MEASURED = {  # (the command line, where it is made to find what stops a measurement, what that is)
    "audit": (["qwen3-next", "--meter", "npu", "--format", "json"], None, None),  # no torch_npu here
    "plan": (["plan", "--preset", "qwen3-next", "--format", "json"], "kvaudit.cli.deployments.model", "vllm"),
    "check": (["check", str(ROOT / "examples" / "kvaudit.toml"), "--format", "json"], "kvaudit.ci.policy.load_policy",
              "torch"),
    "compare": (["compare", PAPER, PAPER, "--format", "json"], "kvaudit.report.compare.load_report", MemoryError),
    "triage": (["triage", PAPER, "--format", "json"], "kvaudit.triage.evidence.read_report", MemoryError),
    "history": (["history", "qwen3-next", "--format", "json"], "kvaudit.cli.deployments.model", "vllm"),
}


def _error_object(capsys, argv, code):
    got = main(argv)
    out, err = capsys.readouterr()
    assert got == code, err
    doc = json.loads(out)  # stdout is nothing but the object
    jsonschema.validate(doc, SCHEMA)
    lines = err.strip().splitlines()
    assert doc["exit_code"] == code and lines[-1].endswith(doc["error"]), (lines, doc)
    assert all(line in STEPS for line in lines[:-1]), lines  # one error line, after the note of a slow step begun
    return doc


STEPS = {f"kvaudit: {s}" for s in ALL_STEPS}
"""What may come before the error line: the note of the slow step the error ended (issue 35: a note before each)."""


@pytest.mark.parametrize("argv", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_an_error_object_on_stdout(capsys, argv):
    _error_object(capsys, argv, 2)


@pytest.mark.parametrize("argv, where, missing", NOT_MEASURED.values(), ids=NOT_MEASURED.keys())
def test_what_cannot_be_measured_is_an_error_object_on_stdout(capsys, monkeypatch, argv, where, missing):
    if where is not None:
        module, _, name = where.rpartition(".")

        def stop(*args, **kwargs):
            if missing is MemoryError:
                raise MemoryError()
            raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)

        monkeypatch.setattr(f"{module}.{name}", stop)
    doc = _error_object(capsys, argv, 3)
    assert doc["exit_reason"].startswith("could not measure")


def test_the_table_format_keeps_stdout_empty_on_an_error(capsys):
    assert main(["qwen3-next", "--util", "1.5"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and lines[-1].startswith("kvaudit: error:") and all(line in STEPS for line in lines[:-1])
