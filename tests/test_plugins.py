"""Third-party allocators (entry points and module:function) and ``--strategy installed``."""

from __future__ import annotations

import pytest

from kvaudit.cli import main
from kvaudit.errors import StrategyFailed, UsageError
from kvaudit.measure.audit import run_audit
from kvaudit.measure.meters import MetaMeter
from kvaudit.plan import planner as plan_module
from kvaudit.results import Verdict
from kvaudit.strategies.resolve import resolve_strategy
from conftest import ROOT, deployment, each_vllm, plan_for

PLUGINS = ROOT / "tests" / "plugins"


@pytest.fixture
def plugin_path(monkeypatch, tmp_path):
    """The test plugins importable, and registered as entry points through a dist-info."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    dist = tmp_path / "kvaudit_testplugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kvaudit-testplugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[kvaudit.strategies]\n"
        "test-one-buffer = kvaudit_testplugin:one_buffer_per_tensor\n"
        "test-broken = kvaudit_testplugin_broken:allocate\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _audit(strategy, preset="qwen3-next"):
    d = deployment(preset)
    return run_audit(d, plan_for(d, strategy.platform), strategy, MetaMeter())


@pytest.mark.parametrize("preset", ["qwen3-next", "llama-3.1-8b"])
def test_entry_point_plugin_is_audited(plugin_path, preset):
    s = resolve_strategy("test-one-buffer")
    assert s.name == "test-one-buffer" and "entry point" in s.releases
    r = _audit(s, preset)
    assert r.verdict is Verdict.PASS and r.ratio == 1.0


def test_module_function_plugin_is_audited(plugin_path):
    r = _audit(resolve_strategy("kvaudit_testplugin:doubled"))
    assert r.verdict is Verdict.FAIL and r.ratio == pytest.approx(2.0, rel=1e-3)


def test_a_plugin_that_is_a_strategy_object_is_audited_as_it_is(plugin_path):
    """The plugin API the docs name: ``from kvaudit.strategies import Strategy`` (and ``KVBudget``, ``RawTensors``)
    are the types kvaudit's own strategies are made of."""
    import kvaudit.plan.planner
    import kvaudit.strategies
    import kvaudit.strategies.strategy

    assert kvaudit.strategies.Strategy is kvaudit.strategies.strategy.Strategy
    assert kvaudit.strategies.KVBudget is kvaudit.plan.planner.KVBudget
    assert kvaudit.strategies.RawTensors is kvaudit.strategies.strategy.RawTensors
    s = resolve_strategy("kvaudit_testplugin:DOUBLED_STRATEGY")
    r = _audit(s)
    assert s.name == "test-strategy-object" and r.verdict is Verdict.FAIL and r.ratio == pytest.approx(2.0, rel=1e-3)


def test_plugins_through_the_cli(plugin_path, capsys):
    code = main(["qwen3-next", "--util", "0.7", "-s", "test-one-buffer", "-s", "kvaudit_testplugin:doubled",
                 "--detail", "summary"])
    out = capsys.readouterr().out
    assert code == 1 and "test-one-buffer" in out and "kvaudit_testplugin:doubled" in out


def test_unknown_signature_is_exit_3_naming_the_plugin(plugin_path, capsys):
    with pytest.raises(StrategyFailed, match="kvaudit_testplugin:unknown_signature.*unknown signature"):
        resolve_strategy("kvaudit_testplugin:unknown_signature")
    code = main(["qwen3-next", "-s", "kvaudit_testplugin:unknown_signature"])
    err = capsys.readouterr().err
    assert code == 3 and "unknown signature fn(config, where, how_much)" in err and "Traceback" not in err


@pytest.mark.parametrize("name,exc,message", [
    ("kvaudit_no_such_module:allocate", UsageError, "no module named 'kvaudit_no_such_module'"),
    ("kvaudit_testplugin:no_such_function", UsageError, "has no attribute 'no_such_function'"),
    ("kvaudit_testplugin:NOT_CALLABLE", StrategyFailed, "is a int, not a function"),
    ("kvaudit_testplugin_needs:allocate", StrategyFailed, "kvaudit_no_such_dependency"),
    ("kvaudit_testplugin_broken:allocate", StrategyFailed, "raised RuntimeError"),
    ("test-broken", StrategyFailed, "plugin 'test-broken' .* raised RuntimeError while loading"),
    (":allocate", UsageError, "is not module:function"),
])
def test_plugins_that_cannot_load(plugin_path, name, exc, message):
    with pytest.raises(exc, match=message):
        resolve_strategy(name)


def test_bad_plugins_are_one_line_errors_through_the_cli(plugin_path, capsys):
    assert main(["qwen3-next", "-s", "kvaudit_no_such_module:allocate"]) == 2
    assert main(["qwen3-next", "-s", "test-broken"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("kvaudit: error:") == 2


@each_vllm
@pytest.mark.parametrize("preset", ["qwen3-next", "llama-3.1-8b"])
def test_installed_allocator_matches_the_plan(preset):
    s = resolve_strategy("installed")
    assert "(installed" in s.releases and s.platform == "cuda"
    r = _audit(s, preset)
    assert r.verdict is Verdict.PASS and r.ratio == 1.0


def test_installed_with_no_allocator_is_exit_3(monkeypatch):
    import importlib.util

    monkeypatch.setattr(plan_module, "vllm_version", lambda: None)
    monkeypatch.setattr("kvaudit.strategies.installed.vllm_version", lambda: None)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm_ascend" else real(n, *a))
    with pytest.raises(StrategyFailed, match="no KV-cache allocator is installed") as e:
        resolve_strategy("installed")
    assert e.value.exit_code == 3


def test_one_broken_strategy_does_not_stop_the_others(plugin_path, capsys):
    """A plugin that raises on import (and one whose signature kvaudit cannot call) is listed as not audited with
    its reason; the built-in beside it is audited; the exit code is 3 (not everything could be measured)."""
    import json

    code = main(["llama-3.1-8b", "--format", "json", "-s", "test-broken", "-s", "vllm",
                 "-s", "kvaudit_testplugin:unknown_signature"])
    out = json.loads(capsys.readouterr().out)
    assert code == 3 and out["exit_code"] == 3
    assert [r["strategy"] for r in out["audits"]] == ["vllm"] and out["audits"][0]["verdict"] == "PASS"
    reasons = {s["strategy"]: s["reason"] for s in out["skipped"]}
    assert set(reasons) == {"test-broken", "kvaudit_testplugin:unknown_signature"}
    assert "raised RuntimeError" in reasons["test-broken"]


def test_a_strategy_that_fails_while_allocating_is_not_audited_alone(plugin_path, capsys):
    from kvaudit.measure.audit import audit_all
    from kvaudit.strategies.builtin import STRATEGIES
    from kvaudit.strategies.strategy import Strategy

    def explodes(plan, device, kv_transfer):
        raise RuntimeError("boom")

    bad = Strategy(name="explodes", title="explodes", platform="cuda", releases="a test", allocate=explodes)
    skipped: list = []
    results = audit_all(deployment("llama-3.1-8b"), [bad, STRATEGIES["vllm"]], MetaMeter(), skipped=skipped)
    assert [r.strategy for r in results] == ["vllm"]
    assert skipped == [("explodes", "strategy 'explodes' raised RuntimeError: boom")]
