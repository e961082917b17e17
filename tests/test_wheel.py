"""kvaudit as ``pip install kvaudit`` gives it to a user without a serving stack: the wheel, installed into
a fresh environment with neither torch nor vLLM. Every command works or ends with one line, exit 3,
naming what to install (a traceback with exit 1 would read as "over-allocation" in a CI gate)."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import ROOT, ending

THREAD = ROOT / "fixtures/reports/threads/vllm-10569.txt"


UV = Path(sys.executable).with_name("uv")
"""The installer scripts/venv.sh puts beside this environment's python (requirements/installer.txt). Where it is,
it builds the wheel (the same PEP 517 build by setuptools) and installs it (the same files and metadata as pip's
install), in about a sixth of the time; elsewhere pip does both."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """kvaudit's wheel, built once for both environments below."""
    dist = tmp_path_factory.mktemp("dist")
    build = [str(UV), "build", "-q", "--wheel", "-o", str(dist), str(ROOT)] if UV.is_file() else \
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)]
    subprocess.run(build, check=True, capture_output=True)
    (built,) = dist.glob("kvaudit-*.whl")
    return built


def _install(py, *install) -> None:
    """``install`` put into the environment of ``py`` from outside it (``uv pip install --python``, else
    ``pip --python``: the same install as the environment's own pip would make, without seeding one into it)."""
    args = [str(UV), "pip", "install", "-q", "--python", str(py)] if UV.is_file() else \
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q"]
    subprocess.run([*args, *install], check=True, capture_output=True)


def _environment(folder, *install):
    """A fresh environment (no system site-packages) with ``install`` in it (``_install``); its python."""
    venv.create(folder, with_pip=False)
    py = folder / "bin/python"
    _install(py, *install)
    return py


@pytest.fixture(scope="module")
def kvaudit_exe(tmp_path_factory, wheel):
    py = _environment(tmp_path_factory.mktemp("wheel") / "env", str(wheel))
    missing = subprocess.run([str(py), "-c", "import importlib.util as u; print(u.find_spec('torch'), "
                              "u.find_spec('vllm'))"], capture_output=True, text=True, check=True).stdout
    assert missing.split() == ["None", "None"]
    return py.parent / "kvaudit"


def _kvaudit(exe, *args):
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, cwd=exe.parent)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["meters"]])
def test_what_needs_no_torch_works(kvaudit_exe, args):
    p = _kvaudit(kvaudit_exe, *args)
    assert p.returncode == 0 and p.stdout and "Traceback" not in p.stderr


def test_meters_says_torch_is_not_installed(kvaudit_exe):
    out = _kvaudit(kvaudit_exe, "meters").stdout
    assert "meta" in out and "torch is not installed" in out


@pytest.mark.parametrize("args, package", [
    (["qwen3-next"], "torch"), (["audit", "--preset", "llama-3.1-8b", "--meter", "meta"], "torch"),
    (["audit", "--plan", ROOT / "README.md"], None), (["plan", "--preset", "qwen3-next"], "vLLM"),
    (["models"], "vLLM"), (["history", "qwen3-next"], "vLLM"),
    (["check", ROOT / "examples/kvaudit.toml"], "torch"),
])
def test_what_needs_torch_or_vllm_is_one_line_and_exit_3(kvaudit_exe, args, package):
    p = _kvaudit(kvaudit_exe, *args)
    lines = ending(p.stderr)
    if package is None:  # not a plan file: bad input comes first
        assert p.returncode == 2 and lines[-1].startswith("kvaudit: error:") and len(lines) == 1
        return
    assert p.returncode == 3 and len(lines) == 1 and p.stdout == "", p.stderr
    assert lines[0].startswith("kvaudit: error:") and package in lines[0] and "install" in lines[0]


def test_compare_needs_neither_torch_nor_vllm(kvaudit_exe):
    saved = ROOT / "fixtures/reports/compare"
    p = _kvaudit(kvaudit_exe, "compare", saved / "qwen3-next-util0.7-meta.json",
                 saved / "qwen3-next-util0.7-meta-kv-transfer.json")
    assert p.returncode == 1 and "regression" in p.stdout and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("kvaudit compare: REGRESSION in 2 of 4 strategies")


def test_a_saved_plan_needs_torch_to_be_audited(kvaudit_exe, tmp_path):
    from kvaudit.cli import main

    plan = tmp_path / "p.json"
    assert main(["plan", "--preset", "llama-3.1-8b", "-s", "vllm", "--save", str(plan), "--format", "json"]) == 0
    p = _kvaudit(kvaudit_exe, "audit", "--plan", plan)
    assert p.returncode == 3 and ending(p.stderr) == [
        "kvaudit: error: this command needs the Python package 'torch', which is not installed in this environment: "
        "kvaudit allocates with torch (install the serving environment's torch, or a CPU wheel from "
        "https://download.pytorch.org/whl/cpu)"]


def test_triage_reads_the_report_and_says_the_audit_did_not_run(kvaudit_exe):
    p = _kvaudit(kvaudit_exe, "triage", THREAD)
    assert p.returncode == 3 and "Traceback" not in p.stderr
    assert "### kvaudit triage: allocation-matches-plan" in p.stdout
    assert "memory profiling" in p.stdout and "kvaudit did not audit the allocator: vLLM is not installed" in p.stdout
    assert p.stderr.strip().splitlines()[-1].startswith("kvaudit: the audit step did not run: vLLM is not installed")


OLD_TYPER = ("typer==0.15.4", "click==8.1.8")
"""A typer from before it vendored click (0.15, with click 8.1): the CLI then maps click's own exceptions."""


@pytest.fixture(scope="module")
def old_typer_exe(tmp_path_factory, wheel):
    py = _environment(tmp_path_factory.mktemp("old-typer") / "env", *OLD_TYPER, "rich")
    _install(py, "--no-deps", str(wheel))
    return py.parent / "kvaudit"


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "No such option: --bogus"), (["qwen3-next", "--util"], "Option '--util' requires an argument"),
    (["qwen3-next", "--util", "abc"], "qwen3-next: Invalid value for '--util'"),
    (["triage"], "triage: Missing argument"), (["nosuch"], "unknown preset or command 'nosuch'"),
])
def test_usage_errors_are_one_line_with_a_typer_that_depends_on_click(old_typer_exe, args, message):
    p = _kvaudit(old_typer_exe, *args)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("kvaudit: error: ") and message in lines[0]


def test_help_and_compare_with_a_typer_that_depends_on_click(old_typer_exe):
    assert _kvaudit(old_typer_exe, "--help").returncode == 0
    saved = ROOT / "fixtures/reports/compare"
    p = _kvaudit(old_typer_exe, "compare", saved / "qwen3-next-util0.7-meta.json", saved / "qwen3-next-util0.7-meta.json")
    assert p.returncode == 0 and "no regression" in p.stderr
