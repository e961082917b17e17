"""kvaudit's pytest plugin as an allocator's own test suite uses it: tests/plugin_project/ (a tiny allocator
package with its own tests) is run by pytest in a subprocess, the plugin found through its pytest11 entry
point, and every outcome and message is checked here."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT, VLLM_VERSION

PROJECT = ROOT / "tests" / "plugin_project"
ENTRY_POINT = ("pytest11", "kvaudit", "kvaudit.ci.pytest_plugin")
"""``[project.entry-points.pytest11] kvaudit = "kvaudit.ci.pytest_plugin"`` in pyproject.toml."""


def _installed_entry_point() -> importlib.metadata.EntryPoint | None:
    try:
        dist = importlib.metadata.distribution("kvaudit")
    except importlib.metadata.PackageNotFoundError:
        return None
    return next((ep for ep in dist.entry_points if (ep.group, ep.name) == ENTRY_POINT[:2]), None)


def _pytest(args: list[str], cwd: Path, tmp: Path) -> subprocess.CompletedProcess:
    """``python -m pytest ARGS`` in ``cwd`` as a user runs it: the plugin comes from its entry point (the
    installed kvaudit's, else the same declaration in a dist-info of its own), nothing from this session."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # ADDOPTS, PLUGINS, ...
    if _installed_entry_point() is None:
        dist = tmp / "entry-point" / "kvaudit_pytest_plugin-0.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kvaudit-pytest-plugin\nVersion: 0\n")
        (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT[0]}]\n{ENTRY_POINT[1]} = {ENTRY_POINT[2]}\n")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(dist.parent), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@dataclass(frozen=True)
class Outcome:
    outcome: str
    """passed, failed (the test's call), error (its setup) or skipped."""
    message: str
    """What pytest reported for it (its failure or error text)."""


@dataclass(frozen=True)
class Run:
    outcomes: dict[str, Outcome]
    """By test name, e.g. ``test_padding[1]``."""
    stdout: str


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Run:
    """The allocator project's suite, run once (vLLM plans in that process; about 15 s)."""
    tmp = tmp_path_factory.mktemp("pytest-plugin")
    copy = tmp / "plugin_project"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    p = _pytest(["--strict-markers", "--junitxml", str(tmp / "junit.xml")], copy, tmp)
    assert p.returncode == 1, p.stdout + p.stderr  # some of its tests fail on purpose
    outcomes = {}
    for case in ET.parse(tmp / "junit.xml").getroot().iter("testcase"):
        found = [(kind, el) for kind in ("failure", "error", "skipped") if (el := case.find(kind)) is not None]
        kind, el = found[0] if found else ("passed", None)
        outcome = {"failure": "failed"}.get(kind, kind)
        outcomes[case.get("name")] = Outcome(outcome, (el.text or el.get("message", "")) if el is not None else "")
    return Run(outcomes, p.stdout)


def _bytes(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in:\n{text}"
    return int(m.group(1).replace(",", ""))


def _figures(message: str) -> tuple[int, int, int]:
    """Expected, allocated and tolerance bytes of a failure message."""
    line = re.search(r"^  expected .*$", message, re.M)
    assert line, message
    return (_bytes(r"expected [^(]+\(([\d,]+) B\)", line[0]), _bytes(r"allocated [^(]+\(([\d,]+) B\)", line[0]),
            _bytes(r"tolerance [^(]+\(([\d,]+) B", line[0]))


def test_an_allocator_that_follows_the_plan_passes(project):
    assert project.outcomes["test_allocate_matches_the_plan"] == Outcome("passed", "")
    # one buffer per layer is what vLLM plans for a dense model: no layer shares a tensor there
    assert project.outcomes["test_per_layer_allocator_on_a_dense_model"] == Outcome("passed", "")
    # kvaudit_audit hands back kvaudit's AuditResult (the project's test asserts 4.00× and FAIL itself)
    assert project.outcomes["test_audit_fixture"] == Outcome("passed", "")


def test_a_buffer_per_layer_fails_with_the_figures(project):
    o = project.outcomes["test_per_layer_allocator"]
    assert o.outcome == "failed"
    lines = o.message.strip().splitlines()
    expected, allocated, tolerance = _figures(o.message)
    assert allocated == 4 * expected and tolerance == round(expected / 100)
    assert re.fullmatch(r"kvaudit: kvalloc_demo\.allocate_per_layer does not allocate vLLM's plan within 1 %: "
                        r"allocates [\d.]+ GiB for a plan of [\d.]+ GiB: 4\.00×, [\d.]+ GiB over a tolerance of "
                        r"[\d.]+ MiB", lines[0]), lines[0]
    assert "also: 12 of 12 shared tensors split into private buffers" in o.message
    assert "deployment: Qwen3-Next-80B-A3B-Instruct, TP 4, util 0.9 of atlas-a2-64g" in o.message
    assert (f"meter: meta (accounting of the storages requested; no memory allocated, no device measured); "
            f"planned by vLLM {VLLM_VERSION}") in o.message
    groups = re.findall(r"group \d \((\w+), 12 layers\): [\d.]+ GiB -> [\d.]+ GiB \(4\.00×\)  <- off plan", o.message)
    assert sorted(groups) == ["FullAttentionSpec", "MambaSpec", "MambaSpec", "MambaSpec"]
    assert "tensors off their plan or split: 12 of 12" in o.message and "tensor 0 (4 layers, 4 storages)" in o.message
    assert "layers off their plan: 48 of 48" in o.message and "... 43 more" in o.message


def test_every_audit_of_a_marked_test_is_judged(project):
    o = project.outcomes["test_every_audit_counts"]
    assert o.outcome == "failed" and o.message.count("does not allocate vLLM's plan") == 1
    assert o.message.startswith("kvaudit: kvalloc_demo.allocate_per_layer does not allocate vLLM's plan within 1 %")


def test_the_meter_measures_what_the_allocator_allocated(project):
    """On the cpu meter the bytes are real host allocations, counted by torch.profiler around the call."""
    assert project.outcomes["test_real_host_allocations[allocate]"] == Outcome("passed", "")
    o = project.outcomes["test_real_host_allocations[allocate_per_layer]"]
    expected, allocated, _ = _figures(o.message)
    assert o.outcome == "failed" and allocated == 4 * expected and ": 4.00×," in o.message
    assert "meter: cpu (real host allocations counted by torch.profiler" in o.message
    assert "16 blocks of" in o.message


@pytest.mark.parametrize("test,extra", [("test_padding", 1), ("test_trimming", -1)])
def test_within_percent_is_a_byte_exact_boundary(project, test, extra):
    """``kv_cache_within(1)`` allows 1 % of the planned bytes, over or under, and not one byte more."""
    assert project.outcomes[f"{test}[0]"] == Outcome("passed", "")
    o = project.outcomes[f"{test}[1]"]
    assert o.outcome == "failed"
    expected, allocated, tolerance = _figures(o.message)
    assert tolerance == round(expected / 100) and allocated - expected == extra * (tolerance + 1)
    assert ("over a tolerance of" if extra > 0 else "less than the planned") in o.message.splitlines()[0]


def test_zero_percent_allows_no_byte(project):
    assert project.outcomes["test_zero_percent[0]"] == Outcome("passed", "")
    o = project.outcomes["test_zero_percent[1]"]
    assert o.outcome == "failed" and ": 1.00×, 1 B over a tolerance of 0 B" in o.message.splitlines()[0]


@pytest.mark.parametrize("test,message", [
    ("test_unknown_model", "kvaudit: kv_cache_within(1, model='no-such-model'): unknown model 'no-such-model': "
                           "not a kvaudit preset (qwen3-next, "),
    ("test_negative_percent", "kvaudit: kv_cache_within(-1): percent must be in [0, 100)"),
    ("test_percent_of_100", "kvaudit: kv_cache_within(100): percent must be in [0, 100)"),
    ("test_percent_as_text", "kvaudit: kv_cache_within('1%'): percent must be a number, got a string '1%'"),
    ("test_misspelt_keyword", "kvaudit: kv_cache_within(1, utl=0.9): unknown keyword 'utl' (did you mean 'util'?)"),
    ("test_tp_that_does_not_divide_the_heads", "kvaudit: kv_cache_within(1, model='qwen3-next', util=0.9, tp=3): "
                                               "vLLM rejected "),
    ("test_marker_without_the_fixture", "kvaudit: @pytest.mark.kv_cache_within needs the test to take the "
                                        "kvaudit_plan fixture"),
    ("test_fixture_without_the_marker", "kvaudit: the kvaudit_plan fixture needs a @pytest.mark.kv_cache_within"),
])
def test_bad_options_are_a_one_line_error(project, test, message):
    o = project.outcomes[test]
    assert o.outcome == "error" and o.message.strip().startswith(message), o
    assert "\n" not in o.message.strip(), o.message


def test_misuse_in_the_test_body_fails_clearly(project):
    o = project.outcomes["test_nothing_audited"]
    assert o.outcome == "failed" and o.message.strip() == (
        "kvaudit: the test is marked kv_cache_within but audited nothing: hand the allocator to "
        "kvaudit_plan.audit(allocate)")
    o = project.outcomes["test_audit_fixture_with_a_bad_percent"]
    assert o.outcome == "failed" and ("UsageError: kvaudit_audit(250, model='qwen3-next'): percent must be in "
                                      "[0, 100)") in o.message


def test_an_allocator_error_keeps_its_own_traceback(project):
    o = project.outcomes["test_allocator_that_raises"]
    assert o.outcome == "failed" and "E       ValueError: no room for layer 0" in o.message
    assert "def broken_allocator(kv_cache_config, device):" in o.message
    assert "kvaudit/measure/audit.py" not in o.message and "kvaudit/strategies/plugins.py" not in o.message


def test_each_deployment_is_planned_once_per_session(project):
    """15 audits, 3 deployments (Qwen3-Next at util 0.9, Llama-3.1-8B, Qwen3-Next at 16 blocks); the
    deployment vLLM rejects (TP 3) is no plan."""
    # kvaudit's section, up to the next one (pytest's short summary follows it; with CI set in the
    # environment pytest does not cut its lines to the terminal's width, and they name kvaudit too)
    section = re.search(r"^=+ kvaudit =+\n(.*?)(?=^=+ |\Z)", project.stdout, re.M | re.S)
    assert section, project.stdout
    summary = section[1]
    assert re.search(r"^FAIL +4\.00× .* meta +kvalloc_demo\.allocate_per_layer +"
                     r"tests/check_allocators\.py::test_per_layer_allocator$", summary, re.M), summary
    assert f"kvaudit: 15 audits against 3 deployments planned by vLLM {VLLM_VERSION} (each planned once per " \
           "session)" in summary


def test_loaded_but_unused_it_imports_neither_torch_nor_vllm(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        "import json, sys\n"
        "def pytest_unconfigure(config):\n"
        "    heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm'))\n"
        "    markers = [m for m in config.getini('markers') if m.startswith('kv_cache_within(')]\n"
        "    loaded = config.pluginmanager.has_plugin('kvaudit')\n"
        "    open('seen.json', 'w').write(json.dumps({'heavy': heavy, 'markers': markers, 'loaded': loaded}))\n")
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    p = _pytest(["-q"], tmp_path, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["loaded"] and len(seen["markers"]) == 1 and seen["heavy"] == []
    assert " kvaudit " not in p.stdout  # no summary when nothing was audited


def test_the_entry_point_is_declared():
    ep = _installed_entry_point()
    if ep is None:
        pytest.skip("the installed kvaudit does not declare the pytest11 entry point yet: add "
                    '[project.entry-points.pytest11] kvaudit = "kvaudit.ci.pytest_plugin" to pyproject.toml and '
                    "reinstall (pip install --no-deps -e .)")
    assert ep.value == ENTRY_POINT[2]
    import kvaudit.ci.pytest_plugin

    assert ep.load() is kvaudit.ci.pytest_plugin
