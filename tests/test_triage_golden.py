"""Triage's whole answer for every shipped real report, pinned: verdict, cause, headline, evidence, the deployment
and each value's source, actions, recommendations, notes and the Markdown, without planning and planned by vLLM.
``pytest --update-golden`` rewrites ``fixtures/golden/vllm-VERSION/triage-*.json`` after an intended change."""

from __future__ import annotations

import json

import pytest

from conftest import GOLDEN, ROOT
from kvaudit.errors import ConfigError
from kvaudit.triage.conclude import triage

REPORTS = ROOT / "fixtures" / "reports"
SHIPPED = sorted(REPORTS.glob("*.log")) + sorted(
    p for folder in ("threads", "develop", "held-out-1") for p in (REPORTS / folder).glob("*.txt"))
"""The shipped real reports (each cited beside it), not the later held-out sets (kept as they were scored)."""
PLANNED = sorted(REPORTS.glob("*.log")) + sorted((REPORTS / "threads").glob("*.txt"))
"""The reports triaged with vLLM's planner too (planning each costs a model build)."""


@pytest.fixture
def no_hub(monkeypatch):
    """The same answer with or without the Hub and whatever the Hugging Face cache holds."""
    import kvaudit.model.hub

    def fetch(repo_id, revision, trust_remote_code):
        raise ConfigError(f"{repo_id} is not fetched in this test")

    monkeypatch.setattr(kvaudit.model.hub, "fetch", fetch)


def _check(paths, golden, update: bool) -> None:
    got = {}
    for path in paths:
        t = triage(path.read_text(errors="replace"))
        got[path.relative_to(REPORTS).as_posix()] = {**t.to_dict(), "markdown": t.to_markdown().splitlines()}
    if update:
        golden.write_text(json.dumps(got, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    assert golden.exists(), f"missing {golden}: run pytest --update-golden"
    want = json.loads(golden.read_text())
    assert sorted(got) == sorted(want), "the shipped reports changed: run pytest --update-golden"
    for name in want:  # report by report, field by field: the first difference is named
        for key in want[name]:
            assert got[name].get(key) == want[name][key], f"{name}: {key} differs from {golden.name}"
        assert sorted(got[name]) == sorted(want[name]), f"{name}: fields differ from {golden.name}"


def test_every_shipped_report_concludes_as_its_golden_answer_without_planning(monkeypatch, no_hub, update_golden):
    """Read (launches by this vLLM's argument parser) and concluded without planning, as where vLLM's planner is
    not installed."""
    import kvaudit.plan.planner
    from kvaudit.triage.commands import parser_name

    parser_name()  # (vLLM's parser is built once, named by the installed vLLM: before vllm_version is patched)
    monkeypatch.setattr(kvaudit.plan.planner, "vllm_version", lambda: None)
    _check(SHIPPED, GOLDEN / "triage-without-planning.json", update_golden)


def test_each_report_planned_by_vllm_concludes_as_its_golden_answer(no_hub, update_golden):
    _check(PLANNED, GOLDEN / "triage-planned.json", update_golden)
