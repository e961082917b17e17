"""The CI gate runs as documented (docs/ci.md, linked from the README): its policy and its GitHub Actions job's
``kvaudit check`` command, in a vllm-ascend source tree, through ``scripts/kvaudit`` as the job calls it."""

from __future__ import annotations

import re
import shlex
import subprocess
import tarfile

import pytest

from conftest import ROOT

junitparser = pytest.importorskip("junitparser")
yaml = pytest.importorskip("yaml")

PAGE = (ROOT / "docs" / "ci.md").read_text()
SECTION = PAGE[PAGE.index("## The CI gate: `kvaudit check`"):]
_END = SECTION.find("\n## ", 5)
SECTION = SECTION if _END < 0 else SECTION[:_END]  # to the next section, or the page's end
RELEASE = "0.30.0rc2"
"""The vllm-ascend release whose source tree stands in for the checkout under test."""


def _block(lang: str) -> str:
    m = re.search(rf"```{lang}\n(.*?)```", SECTION, re.S)
    assert m, f"no ```{lang} block in docs/ci.md's CI gate section"
    return m.group(1)


def test_the_documented_job_is_a_complete_github_actions_workflow():
    job = yaml.safe_load(_block("yaml"))
    assert set(job["jobs"]) == {"kvaudit", "kvaudit-npu"} and job[True] == ["push", "pull_request"]  # YAML 1.1: on is true
    steps = job["jobs"]["kvaudit"]["steps"]
    uses = [s.get("uses", "").split("@")[0] for s in steps]
    assert uses[:2] == ["actions/checkout", "actions/checkout"] and "actions/upload-artifact" in uses
    assert steps[1]["with"]["path"] == ".kvaudit"
    runs = [s["run"] for s in steps if "run" in s]
    assert runs and all(r.startswith(".kvaudit/scripts/kvaudit check kvaudit.toml --meter meta") for r in runs)
    uploaded = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))["with"]["path"]
    assert set(uploaded.split()) == {"kvaudit-junit.xml", "kvaudit.html"} <= set(runs[0].split())
    npu = job["jobs"]["kvaudit-npu"]["steps"][-1]["run"]
    assert "kvaudit check kvaudit.toml --meter npu" in npu


def test_the_documented_policy_and_command_run_in_a_vllm_ascend_checkout(tmp_path):
    from kvaudit.strategies import releases

    with tarfile.open(releases.fetch_sdist(RELEASE)) as tf:
        tf.extractall(tmp_path, filter="data")
    checkout = next(tmp_path.iterdir())
    (checkout / "kvaudit.toml").write_text(_block("toml"))
    job = yaml.safe_load(_block("yaml"))
    command = shlex.split(next(s["run"] for s in job["jobs"]["kvaudit"]["steps"] if "run" in s))
    # the job checks kvaudit out at .kvaudit; here it is this repository (a link would give .venv/ the
    # link's path, which its scripts would keep)
    command[0] = command[0].replace(".kvaudit/", f"{ROOT}/", 1)
    p = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    xml = junitparser.JUnitXml.fromfile(str(checkout / "kvaudit-junit.xml"))
    suite = next(iter(xml))
    # qwen3-next at two utilizations and llama-3.1-8b with two KV-cache dtypes, each with two strategies
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (8, 0, 0, 0)
    assert {c.name for c in suite} == {"vllm-ascend=.", "vllm"}
    page = (checkout / "kvaudit.html").read_text()
    assert "<svg" in page and "qwen3-next" in page.lower().replace("qwen3-next-80b", "qwen3-next")
    assert p.stderr.strip().splitlines()[-1].startswith("kvaudit check: OK: 8 of 8 cells as expected")
