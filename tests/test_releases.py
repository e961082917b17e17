"""Published vllm-ascend releases, run from their sdists: parity with kvaudit's built-in
strategies layer by layer, the fetch cache, and the fetch errors. Needs the package index once;
the sdists are then cached under ~/.cache/kvaudit (or $KVAUDIT_CACHE_DIR)."""

from __future__ import annotations

import subprocess

import pytest
import torch

from kvaudit import releases
from kvaudit.accounting import byte_span, storage_key
from kvaudit.errors import StrategyFailed, UsageError
from kvaudit.strategies import STRATEGIES, resolve_strategy
from conftest import deployment, plan_for

PARITY = {"0.11.0": "ascend-0.11", "0.13.0": "ascend-0.12", "0.18.0": "ascend-0.16"}


def _layout(raw: dict) -> tuple[dict, set]:
    """Per layer, the (storage bytes, byte span) of each of its tensors; and which layer tensors share
    a storage. Equal layouts mean the same storages, layer by layer."""
    per_layer, owners = {}, {}
    for layer, value in raw.items():
        tensors = value if isinstance(value, tuple) else (value,)
        per_layer[layer] = tuple((t.untyped_storage().nbytes(), byte_span(t)) for t in tensors)
        for i, t in enumerate(tensors):
            owners.setdefault(storage_key(t), set()).add((layer, i))
    return per_layer, {frozenset(v) for v in owners.values()}


@pytest.mark.parametrize("kv_transfer", [False, True])
@pytest.mark.parametrize("version", list(PARITY))
def test_release_code_allocates_exactly_the_builtin_strategys_storages(version, kv_transfer):
    real = resolve_strategy(f"vllm-ascend=={version}")
    builtin = STRATEGIES[PARITY[version]]
    assert real.platform == builtin.platform
    d = deployment(kv_transfer=kv_transfer)
    plan = plan_for(d, real.platform)
    meta = torch.device("meta")
    ours = builtin.allocate(plan, meta, kv_transfer)
    theirs = real.allocate(plan, meta, kv_transfer)
    assert set(ours) == set(theirs) == set(plan.layer_specs)
    assert _layout(theirs) == _layout(ours)


@pytest.mark.parametrize("version", list(PARITY))
def test_release_code_on_the_dense_control(version):
    from kvaudit.audit import run_audit
    from kvaudit.meters import MetaMeter

    s = resolve_strategy(f"vllm-ascend=={version}")
    d = deployment("llama-3.1-8b")
    r = run_audit(d, plan_for(d, s.platform), s, MetaMeter())
    assert r.ratio == 1.0


def test_the_sdist_is_cached(monkeypatch):
    releases.fetch_sdist("0.13.0")  # fetched (or already cached)

    def no_pip(*a, **k):
        raise AssertionError("pip must not run for a cached release")

    monkeypatch.setattr(subprocess, "run", no_pip)
    path = releases.fetch_sdist("0.13.0")
    assert path.name == "vllm_ascend-0.13.0.tar.gz" and path.is_relative_to(releases.cache_dir())


@pytest.mark.parametrize("version,platform", [("0.10.2rc1", "ascend-align64"), ("0.11.0rc1", "ascend-align64"),
                                              ("0.11.0rc2", "ascend-align128"), ("0.11.0", "ascend-align128"),
                                              ("0.15.0rc1", "ascend-align128"), ("0.16.0rc1", "ascend-contiguous"),
                                              ("0.23.0.post1", "ascend-contiguous")])
def test_platform_rule_by_release(version, platform):
    assert releases.platform_for(version) == platform


@pytest.mark.parametrize("version,strategy", [("0.11.0rc0", "ascend-0.11"), ("0.11.0", "ascend-0.11"),
                                              ("0.12.0rc1", "ascend-0.12"), ("0.15.0rc1", "ascend-0.12"),
                                              ("0.16.0rc1", "ascend-0.16"), ("0.30.0rc2", "ascend-0.16")])
def test_builtin_strategy_by_release(version, strategy):
    assert releases.builtin_strategy_for(version) == strategy


def test_a_release_that_is_not_on_the_index_is_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("KVAUDIT_CACHE_DIR", str(tmp_path))
    with pytest.raises(UsageError, match="vllm-ascend 0.0.99 is not on the package index") as e:
        resolve_strategy("vllm-ascend==0.0.99")
    assert e.value.exit_code == 2


def test_no_network_is_exit_3(tmp_path, monkeypatch):
    monkeypatch.setenv("KVAUDIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no configured mirrors either
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    with pytest.raises(StrategyFailed, match="could not fetch vllm-ascend==0.13.0.*no network") as e:
        resolve_strategy("vllm-ascend==0.13.0")
    assert e.value.exit_code == 3


def test_a_malformed_version_is_exit_2():
    with pytest.raises(UsageError, match="not a release version"):
        resolve_strategy("vllm-ascend==latest; rm -rf /")


def test_release_through_the_cli(capsys):
    from kvaudit.cli import main

    code = main(["qwen3-next", "--util", "0.7", "-s", "vllm-ascend==0.13.0", "-s", "vllm-ascend==0.18.0",
                 "--format", "json"])
    import json

    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert {a["strategy"]: round(a["ratio"], 2) for a in doc["audits"]} == {
        "vllm-ascend==0.13.0": 2.0, "vllm-ascend==0.18.0": 1.0}


def _checkout(tmp_path, version: str):
    """A source tree of ``version`` as a checkout would hold it (the sdist unpacked)."""
    import tarfile

    with tarfile.open(releases.fetch_sdist(version)) as tf:
        tf.extractall(tmp_path, filter="data")
    return next(tmp_path.iterdir())


def test_a_source_checkout_is_audited_like_its_release(tmp_path):
    root = _checkout(tmp_path, "0.13.0")
    s = resolve_strategy(f"vllm-ascend={root}")
    release = resolve_strategy("vllm-ascend==0.13.0")
    assert s.name == f"vllm-ascend={root.name}" and s.releases == "vllm-ascend checkout (0.13.0)"
    assert s.platform == release.platform == "ascend-align128"
    d = deployment()
    plan = plan_for(d, s.platform)
    meta = torch.device("meta")
    assert _layout(s.allocate(plan, meta, False)) == _layout(release.allocate(plan, meta, False))


def test_a_checkout_without_a_version_is_planned_with_the_newest_rule(tmp_path):
    root = _checkout(tmp_path, "0.18.0")
    (root / "vllm_ascend" / "_version.py").unlink()
    s = resolve_strategy(f"vllm-ascend={root}")
    assert s.releases == "vllm-ascend checkout (no version found)" and s.platform == releases.ERAS[-1][1]


def test_a_path_that_is_not_a_checkout_is_exit_2(tmp_path):
    with pytest.raises(UsageError, match="not a vllm-ascend source checkout"):
        resolve_strategy(f"vllm-ascend={tmp_path}")


def test_installed_says_when_vllm_ascend_is_absent():
    import importlib.util

    if importlib.util.find_spec("vllm_ascend") is not None:
        pytest.skip("vllm-ascend is installed here")
    s = resolve_strategy("installed")
    assert "vllm-ascend is not installed" in s.note and "no vllm-ascend" in s.releases


def test_history_finds_where_the_allocation_changed():
    from kvaudit.history import history

    rows = history(deployment(), ["0.10.1rc1", "0.11.0", "0.13.0", "0.18.0"])
    assert [(r.version, r.ratio, r.storages, r.verdict, r.changed) for r in rows] == [
        ("0.10.1rc1", None, None, "not audited", False), ("0.11.0", 4.0, 60, "FAIL", False),
        ("0.13.0", 2.0, 36, "FAIL", True), ("0.18.0", 1.0, 12, "PASS", True)]
    assert "cannot serve hybrid models" in rows[0].reason
    assert rows[2].pr is None  # 0.13.0 is not where PR #3760 landed; 0.12.0rc1 is
    assert releases.ERA_PRS["0.12.0rc1"].startswith("#3760") and releases.ERA_PRS["0.16.0rc1"].startswith("#6887")


def test_history_through_the_cli(capsys, monkeypatch):
    import json

    from kvaudit import history
    from kvaudit.cli import main

    monkeypatch.setattr(history, "published", lambda since=None: (["0.13.0", "0.18.0"], "a test list"))
    code = main(["history", "qwen3-next", "--util", "0.7", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and [(r["version"], r["ratio"], r["changed"]) for r in doc["releases"]] == [
        ("0.13.0", 2.0, False), ("0.18.0", 1.0, True)]
    assert doc["meter"] == "meta" and doc["planned_with_vllm"]


def test_version_order_counts_post_releases():
    assert sorted(["0.23.0.post1", "0.24.0rc1", "0.23.0", "0.23.0rc1"], key=releases.version_key) == [
        "0.23.0rc1", "0.23.0", "0.23.0.post1", "0.24.0rc1"]
