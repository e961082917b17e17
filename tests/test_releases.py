"""Published vllm-ascend releases, run from their sdists: parity with kvaudit's built-in
strategies layer by layer, the fetch cache, and the fetch errors. Needs the package index once;
the sdists are then cached under ~/.cache/kvaudit (or $KVAUDIT_CACHE_DIR)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from kvaudit.errors import StrategyFailed, UsageError
from kvaudit.measure.accounting import byte_span, storage_key
from kvaudit.strategies import releases
from kvaudit.strategies.builtin import STRATEGIES
from kvaudit.strategies.resolve import resolve_strategy
from kvaudit.units import fmt_bytes
from conftest import ROOT, deployment, each_vllm, ending, plan_for, release, release_tree, skip_unless_planned

PARITY = {"0.11.0rc1": "ascend-0.11", "0.11.0": "ascend-0.11", "0.13.0": "ascend-0.12", "0.18.0": "ascend-0.16", "0.24.0rc1": "ascend-0.16",
          "0.26.0rc1": "ascend-0.16"}
"""A release of each era whose code allocates from the shared_by view, and the built-in that restates it
(0.11.0rc1 plans with the alignment-64 block-size rule; 0.24 added an SFA-indexer branch, 0.26 a
hidden-state buffer and sparse KV offload: same storages for the models kvaudit ships)."""
LAYER_STRIDED = ("0.28.0rc1", "0.29.0rc1", "0.30.0rc2")
"""Releases whose code reads vLLM 0.29+'s plan format (KVCacheTensor.layers, layer_stride): 0.28 (two
paths), 0.29 (KV-transfer gate by connector), 0.30 (the newest published; no gate)."""


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


@each_vllm
@pytest.mark.parametrize("kv_transfer", [False, True])
@pytest.mark.parametrize("version", list(PARITY))
def test_release_code_allocates_exactly_the_builtin_strategys_storages(version, kv_transfer):
    real = release(version)
    builtin = STRATEGIES[PARITY[version]]
    assert real.platform == releases.platform_for(version)
    builtin = dataclasses.replace(builtin, platform=real.platform)  # the same algorithm on that era's plan
    d = deployment(kv_transfer=kv_transfer)
    plan = plan_for(d, real.platform)
    meta = torch.device("meta")
    ours = builtin.allocate(plan, meta, kv_transfer)
    theirs = real.allocate(plan, meta, kv_transfer)
    assert set(ours) == set(theirs) == set(plan.layer_specs)
    assert _layout(theirs) == _layout(ours)


@each_vllm
@pytest.mark.parametrize("version", ["0.11.0", "0.13.0", "0.18.0", "0.20.2rc1", "0.24.0rc1", "0.26.0rc1", "0.29.0rc1",
                                     "0.30.0rc2"])
def test_release_code_on_the_dense_control(version):
    from kvaudit.measure.audit import run_audit
    from kvaudit.measure.meters import MetaMeter

    s = release(version)
    d = deployment("llama-3.1-8b")
    plan = plan_for(d, s.platform)
    if version in LAYER_STRIDED:
        _layers_plan_or_skip(plan)
    r = run_audit(d, plan, s, MetaMeter())
    assert r.ratio == 1.0


@pytest.mark.parametrize("version, soc, written", [
    # 0.11: custom_build_info.run writes the chip itself (and whether sleep mode's kernels were compiled)
    ("0.11.0", "ascend910b1", {"__soc_version__": "ascend910b1", "__sleep_mode_enabled__": True}),
    # 0.13-0.26: gen_build_info maps the chip to a device type with its own table
    ("0.13.0", "ascend910b1", {"__device_type__": "A2"}),
    ("0.20.2rc1", "ascend910_9391", {"__device_type__": "A3"}),
    ("0.20.2rc1", "ascend950pr_9599", {"__device_type__": "A5"}),
    # 0.27+: the mapping moved to vllm_ascend/device/hardware.py, which setup.py loads from the tree
    ("0.30.0rc2", "ascend910b1", {"__device_type__": "A2"}),
    ("0.30.0rc2", "ascend310p3", {"__device_type__": "_310P"}),
    # a chip the release's build refuses: nothing is known, and code that reads the module stops naming it
    ("0.20.2rc1", "ascend000", None),
])
def test_a_release_is_handed_the_build_info_its_own_setup_writes(version, soc, written, monkeypatch):
    """``vllm_ascend/_build_info.py`` is written by the release's build; kvaudit runs that build code (its
    setup.py against its own modules) for ``$SOC_VERSION``. 0.20.2rc1 reads ``__device_type__`` on every
    dense model: before, kvaudit answered ``__soc_version__`` only, and the audit stopped."""
    tree = release_tree(version)
    monkeypatch.setenv("SOC_VERSION", "ascend910b4")
    assert releases.build_info(tree, soc) == ({releases.BUILD_INFO: written} if written else {})
    assert os.environ["SOC_VERSION"] == "ascend910b4"  # set for the build's code, then restored
    monkeypatch.setenv("SOC_VERSION", soc)  # without a chip named, $SOC_VERSION's
    assert releases.build_info(tree) == releases.build_info(tree, soc)
    monkeypatch.delenv("SOC_VERSION")  # else ascend910b1, an Atlas A2
    assert releases.build_info(tree) == releases.build_info(tree, "ascend910b1") and "SOC_VERSION" not in os.environ


HARDWARE_PROFILED = ("0.27.1rc1", "0.28.0rc1")
"""Releases whose allocation code asks ``vllm_ascend/device/hardware_profile.py``'s hardware profile (a
module-level value computed when it is imported, from the device type ``_build_info`` names) on every model:
``quantization/utils.py``'s ``enable_fa_quant`` asks it before anything else (0.29+ first return ``False`` for a
KV-cache dtype other than fp8/int8)."""


def _sdist_or_skip(version: str) -> None:
    """Skip where the release's sdist is not cached and cannot be fetched (no network, no index)."""
    try:
        releases.fetch_sdist(version)
    except StrategyFailed as e:
        if "could not fetch" not in e.message:
            raise
        pytest.skip(f"vllm-ascend {version}'s sdist is not cached and cannot be fetched here: {e.message}")


@each_vllm
@pytest.mark.parametrize("preset", ["llama-3.1-8b", "qwen3-next"])
@pytest.mark.parametrize("version", HARDWARE_PROFILED)
def test_releases_that_read_the_hardware_profile_are_audited(version, preset):
    """0.27-0.28's code runs as on an Atlas A2 (the chip kvaudit's build info is for): the hardware profile
    is computed from the release's own ``device/`` modules, and without the A5-only FP8_ATTENTION capability
    no FA-quantization cache is made. Before, every dense model stopped: ``uses _CURRENT_HARDWARE_PROFILE``."""
    from kvaudit.measure.audit import run_audit
    from kvaudit.measure.meters import MetaMeter

    _sdist_or_skip(version)
    skip_unless_planned(preset)
    s = release(version)
    d = deployment(preset)
    plan = plan_for(d, s.platform)
    if version in LAYER_STRIDED:
        _layers_plan_or_skip(plan)
    r = run_audit(d, plan, s, MetaMeter())
    assert (r.verdict.value, r.ratio) == ("PASS", 1.0)


@each_vllm
def test_a_release_budget_rule_that_raises_leaves_the_others_audited(capsys):
    """vllm-ascend 0.28's worker scales the budget with ``CacheConfig.get_resolved_kv_cache_layout`` (vLLM 0.28+).
    Planned by a vLLM without it (0.23), that release is not audited, with the reason; upstream vLLM still is."""
    from kvaudit.cli import main
    from conftest import VLLM_VERSION

    if releases.version_key(VLLM_VERSION or "0") >= releases.version_key("0.28.0"):
        pytest.skip("needs a vLLM older than the one vllm-ascend 0.28 pins: the rule runs there")
    _sdist_or_skip("0.28.0rc1")
    code = main(["llama-3.1-8b", "-s", "vllm-ascend==0.28.0rc1", "-s", "vllm", "--format", "json"])
    import json

    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and [a["strategy"] for a in doc["audits"]] == ["vllm"]
    assert "get_resolved_kv_cache_layout" in doc["skipped"][0]["reason"]


@pytest.mark.parametrize("soc, device_type, fp8_attention", [("ascend910b1", "A2", False),
                                                             ("ascend950pr_9599", "A5", True)])
@pytest.mark.parametrize("version", HARDWARE_PROFILED)
def test_the_hardware_profile_is_the_one_of_the_chip_the_build_is_for(version, soc, device_type, fp8_attention):
    """The profile is ``_HARDWARE_PROFILES[get_device_config()._device_type]``, computed by the release's code
    from the ``_build_info`` its own setup.py writes for ``soc``: the A2 profile for kvaudit's default chip."""
    from kvaudit.strategies.runner_code import _Loader

    _sdist_or_skip(version)
    tree = release_tree(version)
    loader = _Loader(tree, releases.build_info(tree, soc))
    module = "vllm_ascend.device.hardware_profile"
    profile = loader.from_tree(module, "get_current_hardware_profile", "get_current_hardware_profile")()
    capability = loader.from_tree(module, "HardwareCapability", "HardwareCapability")
    assert profile._device_type.name == device_type
    assert profile.supports(capability.FP8_ATTENTION) is fp8_attention


def test_release_code_whose_hardware_profile_cannot_be_computed_stops_naming_it(monkeypatch):
    """For a chip the release's build refuses, nothing is known of ``_build_info``: the profile stays
    uncomputed and the audit stops naming it (exit 3), never a silent skip or a guessed chip."""
    _sdist_or_skip("0.28.0rc1")
    monkeypatch.setenv("SOC_VERSION", "ascend000")
    s = resolve_strategy("vllm-ascend==0.28.0rc1")
    d = deployment("llama-3.1-8b")
    plan = plan_for(d, s.platform)
    _layers_plan_or_skip(plan)
    with pytest.raises(StrategyFailed, match="vllm-ascend 0.28.0rc1's allocation code uses _CURRENT_HARDWARE_PROFILE"):
        s.allocate(plan, torch.device("meta"), False)


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
    published = release("0.13.0")
    assert s.name == f"vllm-ascend={root.name}" and s.releases == "vllm-ascend checkout (0.13.0) (pins vLLM 0.13.0)"
    assert s.platform == published.platform == "ascend-align128"
    d = deployment()
    plan = plan_for(d, s.platform)
    meta = torch.device("meta")
    assert _layout(s.allocate(plan, meta, False)) == _layout(published.allocate(plan, meta, False))


def test_a_checkout_without_a_version_is_planned_with_the_newest_rule(tmp_path):
    root = _checkout(tmp_path, "0.18.0")
    (root / "vllm_ascend" / "_version.py").unlink()
    s = resolve_strategy(f"vllm-ascend={root}")
    assert s.releases.startswith("vllm-ascend checkout (no version found)") and s.platform == releases.ERAS[-1][1]


def test_a_path_that_is_not_a_checkout_is_exit_2(tmp_path):
    with pytest.raises(UsageError, match="not a vllm-ascend source checkout"):
        resolve_strategy(f"vllm-ascend={tmp_path}")


def test_installed_says_when_vllm_ascend_is_absent():
    import importlib.util

    if importlib.util.find_spec("vllm_ascend") is not None:
        pytest.skip("vllm-ascend is installed here")
    s = resolve_strategy("installed")
    assert "vllm-ascend is not installed" in s.note and "no vllm-ascend" in s.releases


@each_vllm
def test_history_finds_where_the_allocation_changed():
    from kvaudit.ci.history import history

    rows = history(deployment(), ["0.10.1rc1", "0.11.0", "0.13.0", "0.18.0"])
    assert [(r.version, r.ratio, r.storages, r.verdict, r.changed) for r in rows] == [
        ("0.10.1rc1", None, None, "not audited", False), ("0.11.0", 4.0, 60, "FAIL", False),
        ("0.13.0", 2.0, 36, "FAIL", True), ("0.18.0", 1.0, 12, "PASS", True)]
    assert "cannot serve hybrid models" in rows[0].reason
    assert rows[2].pr is None  # 0.13.0 is not where PR #3760 landed; 0.12.0rc1 is
    from rich.console import Console

    from kvaudit.ci.history import CHART_BAR, chart

    console = Console(width=60, color_system=None)
    with console.capture() as cap:
        console.print(chart(rows))
    steps = [line.split() for line in cap.get().splitlines() if line[:1].isdigit()]
    assert steps == [["0.10.1rc1", "not", "audited"], ["0.11.0", "█" * CHART_BAR, "4.00×", "FAIL"],
                     ["0.13.0", "█" * (CHART_BAR // 2), "2.00×", "FAIL"], ["0.18.0", "█" * (CHART_BAR // 4), "1.00×",
                                                                           "PASS"]]
    assert releases.ERA_PRS["0.12.0rc1"].startswith("#3760") and releases.ERA_PRS["0.16.0rc1"].startswith("#6887")


def test_history_through_the_cli(capsys, monkeypatch, tmp_path):
    import json

    from kvaudit.ci import history
    from kvaudit.cli import main

    monkeypatch.setattr(history, "published", lambda since=None: (["0.13.0", "0.13.0rc3", "0.18.0"], "a test list"))
    html, svg = tmp_path / "history.html", tmp_path / "history.svg"
    code = main(["history", "qwen3-next", "--util", "0.7", "--format", "json", "--html", str(html), "--svg", str(svg)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and [(r["version"], r["ratio"], r["changed"]) for r in doc["releases"]] == [
        ("0.13.0", 2.0, False), ("0.13.0rc3", 2.0, False), ("0.18.0", 1.0, True)]
    assert doc["meter"] == "meta" and doc["planned_with_vllm"]
    import html as markup
    import re

    page = markup.unescape(re.sub(r"<[^>]+>", "", html.read_text()))  # the terminal's table and step chart
    assert re.search(r"0\.13\.0 – 0\.13\.0rc3 \(2\) +█{24} 2\.00× FAIL\n0\.18\.0 +█{12} +1\.00× PASS", page), page
    assert "← changed" in page and "(2)" in markup.unescape(svg.read_text())


def test_version_order_counts_post_releases():
    assert sorted(["0.23.0.post1", "0.24.0rc1", "0.23.0", "0.23.0rc1"], key=releases.version_key) == [
        "0.23.0rc1", "0.23.0", "0.23.0.post1", "0.24.0rc1"]



def _layers_plan_or_skip(plan):
    if plan.plan_format != "layers":
        pytest.skip("needs a vLLM 0.29+ plan (KVCacheTensor.layers); this vLLM plans in the shared_by format")


@pytest.mark.parametrize("version", LAYER_STRIDED)
def test_layer_strided_release_code_lays_layers_out_as_vllms_plan_says(version):
    """vllm-ascend 0.28+ on Qwen3-Next: one backing allocation, every layer at offset + l × layer_stride
    for num_blocks × page bytes, exactly where vLLM's KVCacheTensor puts it (no private buffers)."""
    s = release(version)
    d = deployment()
    plan = plan_for(d, s.platform)
    _layers_plan_or_skip(plan)
    raw = s.allocate(plan, torch.device("meta"), False)
    cfg = plan.kv_cache_config
    assert set(raw) == set(plan.layer_specs)
    storages = {storage_key(t) for v in raw.values() for t in (v if isinstance(v, tuple) else (v,))}
    assert len(storages) == 1
    (backing,) = {t.untyped_storage().nbytes() for v in raw.values() for t in (v if isinstance(v, tuple) else (v,))}
    assert backing == max(t.size for t in cfg.kv_cache_tensors) == plan.planned_bytes
    pages = {n: g.kv_cache_spec.page_size_bytes for g in cfg.kv_cache_groups for n in g.layer_names}
    for t in cfg.kv_cache_tensors:
        for i, layer in enumerate(t.layers):
            page = pages[layer]
            view = raw[layer] if not isinstance(raw[layer], tuple) else raw[layer][0]
            start, end = byte_span(view)
            assert (start, end - start) == (t.offset + i * t.layer_stride, cfg.num_blocks * page), layer


@pytest.mark.parametrize("version,storages", [("0.28.0rc1", 48), ("0.29.0rc1", 1), ("0.30.0rc2", 1)])
def test_layer_strided_release_code_with_kv_transfer(version, storages):
    """With a KV connector (Mooncake V1, as vllm-ascend's P/D guides deploy): 0.28 keeps the shared
    backing only for the connectors it lists, so it gives each layer a private buffer (4.03× vLLM's plan
    for the whole budget); 0.29 lists Mooncake V1; 0.30 drops the gate."""
    from kvaudit.measure.audit import run_audit
    from kvaudit.measure.meters import MetaMeter

    s = release(version)
    d = deployment(kv_transfer=True)
    plan = plan_for(d, s.platform)
    _layers_plan_or_skip(plan)
    r = run_audit(d, plan, s, MetaMeter())
    assert r.allocations == storages
    assert (r.verdict.value, round(r.ratio, 2)) == (("FAIL", 4.03) if storages > 1 else ("PASS", 1.0))


def _budget_scale(plan) -> float:
    """What vllm-ascend 0.28+'s worker docstring says it gives the planner for per-layer buffers: the
    budget × the largest group's page bytes per block over all groups' page bytes."""
    per_group = [g.page_size_bytes * len(g.layer_names) for g in plan.groups]
    return max(per_group) / sum(per_group)


@pytest.mark.parametrize("preset,version,scale,ratio", [
    ("gpt-oss-120b", "0.29.0rc1", 0.5, 2.0), ("gpt-oss-120b", "0.30.0rc2", 0.5, 2.0),
    ("gemma-3-27b", "0.30.0rc2", 10 / 62, 6.2),
])
def test_a_release_worker_that_shrinks_the_budget_plans_with_it(preset, version, scale, ratio):
    """vllm-ascend 0.29+ give every layer of an attention-only model with several KV-cache groups a private
    buffer, and their worker (NPUWorker._scale_kv_cache_memory_for_multi_group, run from the sdist) hands
    vLLM's planner a budget shrunk to fit them. The strategy's plan is made with that budget: the buffers
    are 2.00× (6.20×) that plan, within the device budget, and the report says the capacity lost."""
    from kvaudit.measure.audit import run_audit
    from kvaudit.measure.meters import MetaMeter
    from kvaudit.plan.planner import plan_for as strategy_plan

    skip_unless_planned(preset)
    s = release(version)
    d = deployment(preset, gpu_memory_utilization=0.9)
    whole = plan_for(d, s.platform)
    _layers_plan_or_skip(whole)
    assert _budget_scale(whole) == pytest.approx(scale)
    plan = strategy_plan(d, s)
    assert plan.kv_budget_bytes == int(d.kv_budget_bytes * _budget_scale(whole))
    assert plan.kv_budget_by == f"vllm-ascend {version}'s NPUWorker._scale_kv_cache_memory_for_multi_group"
    assert plan.name == f"{plan.platform}, budget {fmt_bytes(plan.kv_budget_bytes)}"
    assert plan.num_blocks == pytest.approx(whole.num_blocks * scale, abs=1)
    r = run_audit(d, plan, s, MetaMeter())
    assert (r.verdict.value, round(r.ratio, 2)) == ("FAIL", ratio)
    # the buffers fill the deployment's budget, no more: a capacity loss, not an out-of-memory
    assert r.allocated_bytes <= d.kv_budget_bytes and r.oom is None
    assert r.projected_utilization <= d.gpu_memory_utilization
    assert f"{s.kv_budget.by} gave vLLM's planner {fmt_bytes(plan.kv_budget_bytes)} of the deployment's" in \
        r.reasons[-1] and f"hold {plan.num_blocks:,} blocks where the planned sharing would fit {ratio:.2f}×" in \
        r.reasons[-1]


def test_0_28_with_kv_transfer_plans_a_quarter_of_the_budget():
    """0.28.0rc1 with Mooncake V1 gives Qwen3-Next's 48 layers private buffers: its worker plans with a
    quarter of the budget (4 groups of 12 layers, equal pages); the buffers' 2 MiB alignment units are
    what takes them past the budget (4.11× the plan, util 0.702 of 0.7)."""
    from kvaudit.measure.audit import run_audit
    from kvaudit.measure.meters import MetaMeter
    from kvaudit.plan.planner import plan_for as strategy_plan

    s = release("0.28.0rc1")
    d = deployment(kv_transfer=True)
    _layers_plan_or_skip(plan_for(d, s.platform))
    plan = strategy_plan(d, s)
    assert plan.kv_budget_bytes == d.kv_budget_bytes // 4
    r = run_audit(d, plan, s, MetaMeter())
    assert (r.allocations, r.verdict.value, round(r.ratio, 2), round(r.projected_utilization, 3)) == (
        48, "FAIL", 4.11, 0.702)


def test_a_release_worker_keeps_the_budget_where_its_runner_shares_the_backing():
    """Qwen3-Next (attention + Mamba, the layer/block-compact layout) under 0.30: the runner class declares
    ``supports_standardized_shared_kv_backing`` and keeps one backing, so the worker keeps the budget."""
    from kvaudit.plan.planner import plan_for as strategy_plan

    s = release("0.30.0rc2")
    d = deployment()
    whole = plan_for(d, s.platform)
    _layers_plan_or_skip(whole)
    assert s.kv_budget is not None and _budget_scale(whole) < 1
    plan = strategy_plan(d, s)
    assert (plan.kv_budget_by, plan.kv_budget_bytes, plan.num_blocks) == ("", d.kv_budget_bytes, whole.num_blocks)
    # with --kv-cache-memory the worker takes the budget as given, before any scaling
    fixed = deployment("gpt-oss-120b", kv_cache_memory_bytes=8 << 30)
    assert strategy_plan(fixed, s).kv_budget_bytes == 8 << 30


def test_a_report_holds_each_strategys_own_plan_and_its_capacity(capsys):
    """One audit, two strategies under one platform rule: ascend-0.16 on vLLM's plan for the whole budget,
    vllm-ascend 0.30.0rc2 on the plan for the budget its worker gives the planner; each plan's capacity
    is reported under its own name."""
    import json

    import jsonschema

    from kvaudit.cli import main

    d = deployment("gpt-oss-120b")
    _layers_plan_or_skip(plan_for(d, "ascend-contiguous"))
    code = main(["gpt-oss-120b", "-s", "ascend-0.16", "-s", "vllm-ascend==0.30.0rc2", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    jsonschema.validate(doc, json.loads((ROOT / "kvaudit/report.schema.json").read_text()))
    ours, theirs = doc["audits"]
    assert "kv_budget_by" not in ours["plan"] and ours["ratio"] == 1.0
    assert theirs["plan"]["kv_budget_by"].endswith("NPUWorker._scale_kv_cache_memory_for_multi_group")
    assert theirs["plan"]["num_blocks"] * 2 in (ours["plan"]["num_blocks"], ours["plan"]["num_blocks"] - 1)
    budget = fmt_bytes(theirs["plan"]["kv_budget_bytes"])
    assert set(doc["capacity"]) == {"ascend-contiguous", f"ascend-contiguous, budget {budget}"}
    assert doc["capacity"][f"ascend-contiguous, budget {budget}"]["tokens"] * 2 == pytest.approx(
        doc["capacity"]["ascend-contiguous"]["tokens"], rel=1e-3)


def test_releases_before_0_28_plan_with_the_whole_budget():
    assert release("0.26.0rc1").kv_budget is None
    assert release("0.28.0rc1").kv_budget is not None


def test_history_names_the_shrunk_budget():
    from kvaudit.ci.history import history

    d = deployment("gpt-oss-120b", gpu_memory_utilization=0.9)
    if plan_for(d, "ascend-contiguous").plan_format != "layers":
        pytest.skip("needs a vLLM 0.29+ plan (KVCacheTensor.layers); this vLLM plans in the shared_by format")
    old, new = history(d, ["0.26.0rc1", "0.30.0rc2"])
    assert (old.ratio, old.verdict, old.kv_budget_scale) == (1.0, "PASS", None)
    assert (new.ratio, new.verdict, new.kv_budget_scale, new.changed) == (2.0, "FAIL", 0.5, True)


def test_layer_strided_code_receives_vllms_own_plan_objects(monkeypatch):
    from kvaudit.plan.planner import load_vllm
    from kvaudit.strategies.runner_code import Extracted

    seen = []
    real_call = Extracted.call

    def spy(self, kv_cache_config, attributes, methods=None, modules=None):
        seen.append((kv_cache_config, attributes, methods))
        return real_call(self, kv_cache_config, attributes, methods, modules)

    monkeypatch.setattr(Extracted, "call", spy)
    s = release("0.30.0rc2")
    d = deployment()
    plan = plan_for(d, s.platform)
    _layers_plan_or_skip(plan)
    s.allocate(plan, torch.device("meta"), False)
    (cfg, attributes, methods), = seen
    iface = load_vllm().iface
    assert cfg is plan.kv_cache_config and isinstance(cfg, iface.KVCacheConfig)
    assert all(type(t) is iface.KVCacheTensor for t in cfg.kv_cache_tensors)
    assert attributes["vllm_config"].model_config is plan.vllm_config.model_config  # vLLM's own config objects
    groups = [g for per_group in attributes["attn_groups"] for g in per_group]
    assert groups and {type(g).__module__ for g in groups} == {"vllm.v1.worker.utils"}
    assert {n for g in groups for n in g.layer_names} == set(plan.layer_specs)
    assert "_kv_cache_spec_attn_group_iterator" in methods  # vLLM's own method, compiled from its source


def test_a_release_names_the_vllm_it_pins():
    s = release("0.30.0rc2")
    assert s.releases == "vllm-ascend 0.30.0rc2 (pins vLLM 0.30.0)"
    assert "built against vLLM 0.30.0" in s.note and "made by vLLM" in s.note


@each_vllm
def test_a_release_before_hybrid_support_says_so_in_one_line():
    from kvaudit.errors import NotAuditable

    s = release("0.9.1")
    d = deployment()
    with pytest.raises(NotAuditable, match="cannot serve hybrid models: its allocation asserts one layer per"):
        s.allocate(plan_for(d, s.platform), torch.device("meta"), False)


def test_guarded_reads_get_their_default_and_unguarded_ones_stop():
    from kvaudit.strategies.runner_code import Unprovided, _Attrs, _missing

    runner = _Attrs("vllm-ascend X's runner", "self", {"device": "meta"})
    assert getattr(runner, "compilation_config", None) is None  # getattr(self, name, default): the default
    with pytest.raises(Unprovided, match="reads self.ascend_config"):
        runner.ascend_config
    placeholder = _missing("vllm-ascend X", "AscendSFAIndexerCacheSpec", "vllm_ascend.core.kv_cache_interface")
    assert not isinstance(object(), placeholder)  # no vLLM object is an instance of it
    with pytest.raises(StrategyFailed, match="uses AscendSFAIndexerCacheSpec"):
        placeholder()
    with pytest.raises(StrategyFailed, match="uses AscendSFAIndexerCacheSpec"):
        "x" in placeholder


def test_plan_with_another_environments_vllm(capfd):
    """--vllm-python runs the command with another environment's interpreter: its vLLM plans."""
    import json
    import sys
    from pathlib import Path

    from conftest import ROOT, VLLM_VERSION
    from kvaudit.cli.app import _elsewhere, main

    with pytest.raises(UsageError, match="not an executable python"):
        _elsewhere(["qwen3-next", "--vllm-python", "/nonexistent/python"])
    here = Path(sys.prefix).resolve()
    other = next((p for p in (ROOT / ".venv-vllm-0.23.0" / "bin" / "python", ROOT / ".venv" / "bin" / "python")
                  if p.is_file() and p.parent.parent.resolve() != here), None)
    if other is None:
        pytest.skip("no second kvaudit environment here (scripts/test makes one per tested vLLM)")
    code = main(["qwen3-next", "--util", "0.7", "-s", "vllm", "--vllm-python", str(other), "--format", "json"])
    out, err = capfd.readouterr()
    doc = json.loads(out)
    assert code == 0 and f"running with {other}" in err
    assert doc["vllm_version"] != VLLM_VERSION


def test_release_properties_are_read_as_properties(monkeypatch):
    """0.29 decides shared backing under KV transfer in a ``@property`` (its connector list): with a
    connector it does not list, every layer gets a private buffer. Compiled as a plain method, the
    property would read as a bound method, always true, and hide that."""
    from kvaudit.measure.audit import run_audit
    from kvaudit.measure.meters import MetaMeter

    monkeypatch.setattr(releases, "KV_CONNECTOR", "LLMDataDistCMgrConnector")
    s = resolve_strategy("vllm-ascend==0.29.0rc1")
    d = deployment(kv_transfer=True)
    plan = plan_for(d, s.platform)
    _layers_plan_or_skip(plan)
    r = run_audit(d, plan, s, MetaMeter())
    assert (r.allocations, r.verdict.value, round(r.ratio, 2)) == (48, "FAIL", 4.03)


def _cache_with(tmp_path, monkeypatch, version="0.13.0"):
    """A cache folder holding a copy of the release's cached sdist and its record; ``_download`` copies the
    good sdist again (no network)."""
    import shutil

    good = releases.fetch_sdist(version)
    monkeypatch.setenv("KVAUDIT_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "sdists" / f"vllm-ascend-{version}"
    folder.mkdir(parents=True)
    copy = folder / good.name
    shutil.copy(good, copy)
    shutil.copy(releases._record(good), releases._record(copy))
    fetched = []

    def download(v, into):
        fetched.append(v)
        shutil.copy(good, into / good.name)
        return into / good.name, None

    monkeypatch.setattr(releases, "_download", download)
    return good, copy, fetched


def _recorded(sdist):
    return json.loads(releases._record(sdist).read_text())["sha256"]


def test_a_truncated_cached_sdist_is_fetched_again(tmp_path, monkeypatch):
    good, copy, fetched = _cache_with(tmp_path, monkeypatch)
    assert releases.fetch_sdist("0.13.0") == copy and fetched == []  # intact: used as it is
    copy.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # a fetch cut short, a full disk
    assert releases.fetch_sdist("0.13.0") == copy and fetched == ["0.13.0"]
    assert releases._sha256(copy) == releases._sha256(good) == _recorded(copy)


def test_a_cached_sdist_the_lock_verifies_is_used_without_its_record(tmp_path, monkeypatch):
    good, copy, fetched = _cache_with(tmp_path, monkeypatch)
    releases._record(copy).unlink()
    assert releases.fetch_sdist("0.13.0") == copy and fetched == []
    assert releases.VERIFIED[copy].startswith("kvaudit's lock")


def test_the_lock_holds_pypis_hash_of_every_release_kvaudit_names():
    """The lock is PyPI's (scripts/lock_releases.py); every release an era or a test names is in it."""
    lock = json.loads(releases.HASH_LOCK.read_text())
    assert lock["source"] == releases.PYPI_JSON
    for v in ("0.9.1", "0.11.0", "0.13.0", "0.18.0", "0.29.0rc1", "0.30.0rc2"):
        name, digest = releases.locked_sha256(v)
        assert name == f"vllm_ascend-{v}.tar.gz" and len(digest) == 64 and int(digest, 16) >= 0


def _tampered(good, tmp_path):
    """The release's sdist with one source file changed, as whoever can write the cache could make it."""
    import io
    import tarfile

    out = tmp_path / "tampered.tar.gz"
    with tarfile.open(good) as src, tarfile.open(out, "w:gz") as dst:
        for m in src:
            f = src.extractfile(m) if m.isfile() else None
            data = f.read() if f else None
            if m.name.endswith("/setup.py"):
                data = b"import os; os.system('touch /tmp/pwned')\n" + data
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    return out.read_bytes()


def test_a_replaced_sdist_with_its_record_rewritten_is_never_run(tmp_path, monkeypatch):
    """Anyone who can write the cache can replace an sdist and the hash recorded beside it: the lock decides."""
    good, copy, fetched = _cache_with(tmp_path, monkeypatch)
    copy.write_bytes(_tampered(good, tmp_path))
    releases._record(copy).write_text(json.dumps({"sha256": releases._sha256(copy), "index": None,
                                                  "published": True}))
    assert releases.fetch_sdist("0.13.0") == copy and fetched == ["0.13.0"]
    assert releases._sha256(copy) == releases._sha256(good)


@pytest.fixture
def unlocked(tmp_path, monkeypatch):
    """A release newer than kvaudit's lock: an empty lock."""
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"sdists": {}}))
    monkeypatch.setattr(releases, "HASH_LOCK", lock)


def _index_page(tmp_path, name, digest):
    page = tmp_path / "index" / "vllm-ascend"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="../../files/{name}#sha256={digest}">{name}</a>')
    return page.as_uri() + "/"


def test_a_release_newer_than_the_lock_is_verified_against_the_index_before_it_runs(tmp_path, monkeypatch, unlocked):
    good, copy, fetched = _cache_with(tmp_path, monkeypatch)
    page = _index_page(tmp_path, good.name, releases._sha256(good))
    releases._record(copy).write_text(json.dumps({"sha256": "0" * 64, "index": page, "published": True}))
    assert releases.fetch_sdist("0.13.0") == copy and fetched == []  # the index's hash, not the record's
    assert releases.VERIFIED[copy] == f"the hash {page} publishes"
    copy.write_bytes(_tampered(good, tmp_path))
    with pytest.raises(StrategyFailed, match="has no hash None publishes, so it cannot be verified"):
        releases.fetch_sdist("0.13.0")  # (the stand-in download names no index page)


def test_a_release_newer_than_the_lock_is_not_run_when_the_index_does_not_answer(tmp_path, monkeypatch, unlocked):
    good, copy, fetched = _cache_with(tmp_path, monkeypatch)
    releases._record(copy).write_text(json.dumps({"sha256": releases._sha256(copy),
                                                  "index": (tmp_path / "gone").as_uri() + "/", "published": True}))
    with pytest.raises(StrategyFailed, match="not in kvaudit's lock .* did not give its hash; nothing of it was run"):
        releases.fetch_sdist("0.13.0")
    assert fetched == []


def test_a_huge_member_is_refused_before_it_is_read(tmp_path):
    import io
    import tarfile

    from kvaudit.strategies.runner_code import MAX_MEMBER_BYTES, SourceTree

    tarball = tmp_path / "vllm_ascend-9.9.9.tar.gz"
    with tarfile.open(tarball, "w:gz") as tf:
        info = tarfile.TarInfo("vllm_ascend-9.9.9/vllm_ascend/big.py")
        info.size = MAX_MEMBER_BYTES + 1
        tf.addfile(info, io.BytesIO(b"#" * info.size))
    with pytest.raises(StrategyFailed, match="big.py is 4,194,305 B .a source file is at most 4,194,304 B"):
        SourceTree("vllm-ascend 9.9.9", tarball=tarball).read("vllm_ascend/big.py")


def test_stale_temporary_folders_of_killed_fetches_are_swept(tmp_path, monkeypatch):
    import time

    good, copy, fetched = _cache_with(tmp_path, monkeypatch)
    stale, live = tmp_path / "sdists" / "tmpstale", tmp_path / "sdists" / "tmplive"
    for d in (stale, live):
        (d / "half").mkdir(parents=True)
    old = time.time() - releases.STALE_S - 60
    os.utime(stale, (old, old))
    releases.fetch_sdist("0.13.0")
    assert not stale.exists() and live.exists()


def test_the_release_code_that_runs_in_process_is_said_once(capsys):
    releases._SAID.discard("0.13.0")
    for _ in range(2):
        releases._say_running("0.13.0", Path("vllm_ascend-0.13.0.tar.gz"))
    err = capsys.readouterr().err
    assert err.count("kvaudit: running vllm-ascend 0.13.0's own code in this process") == 1, err


def test_processes_that_fetch_one_release_at_once_fetch_it_once(tmp_path, monkeypatch):
    """Two suites (or a user's two runs) that want the same release together: the second waits for the first's
    fetch and uses it. Separate processes, as flock(2) locks are between open files."""
    good, copy, _ = _cache_with(tmp_path, monkeypatch)
    for path in (copy, releases._record(copy)):
        path.unlink()  # an empty cache
    assert _two_runs_at_once(good, tmp_path) == ["fetched", f"got:{copy}", f"got:{copy}"]


def test_processes_that_repair_one_corrupt_sdist_at_once_both_go_on(tmp_path, monkeypatch):
    """Two runs that find the same cut-short sdist: one repairs it, the other uses the repair (one had exited 3,
    "the cache is not writable", from an unlink of what the first had removed)."""
    good, copy, _ = _cache_with(tmp_path, monkeypatch)
    copy.write_bytes(good.read_bytes()[:1000])
    assert _two_runs_at_once(good, tmp_path) == ["fetched", f"got:{copy}", f"got:{copy}"]


def test_a_corrupt_sdist_another_process_removes_meanwhile_is_fetched_again(tmp_path, monkeypatch):
    """Where the cache's lock cannot be taken (a file system without flock), a second run may remove the corrupt
    sdist and its record between this run's look and its repair: that is no unwritable cache."""
    good, copy, fetched = _cache_with(tmp_path, monkeypatch)
    copy.write_bytes(good.read_bytes()[:1000])
    real = releases._sha256

    def hashed_then_removed(path):
        digest = real(path)
        if path == copy and fetched == []:
            path.unlink()
            releases._record(path).unlink()
        return digest

    monkeypatch.setattr(releases, "_sha256", hashed_then_removed)
    assert releases.fetch_sdist("0.13.0") == copy and fetched == ["0.13.0"]


def _two_runs_at_once(good, tmp_path) -> list[str]:
    """Two forked processes fetching the release at once, both ending well; what they logged (``_fetch_logged``)."""
    import multiprocessing

    log = tmp_path / "fetches.log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_fetch_logged, args=(str(good), str(log))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    return log.read_text().split()


def _fetch_logged(good: str, log: str) -> None:
    """In a forked process: ``fetch_sdist`` with a ``_download`` that is slow and says so in ``log``."""
    import shutil
    import time

    def download(v, into):
        time.sleep(0.5)
        with open(log, "a") as f:
            f.write("fetched\n")
        shutil.copy(good, into / Path(good).name)
        return into / Path(good).name, None

    releases._download = download
    got = releases.fetch_sdist("0.13.0")
    with open(log, "a") as f:
        f.write(f"got:{got}\n")


def test_an_sdist_that_is_not_the_published_one_is_refused_and_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KVAUDIT_CACHE_DIR", str(tmp_path))

    def download(v, into):
        (into / "vllm_ascend-0.13.0.tar.gz").write_bytes(b"not the release")
        return into / "vllm_ascend-0.13.0.tar.gz", "https://pypi.org/simple/vllm-ascend/"

    monkeypatch.setattr(releases, "_download", download)
    monkeypatch.setattr(releases, "_published_sha256", lambda page, name: "0" * 64)
    with pytest.raises(StrategyFailed, match="is not the one kvaudit's lock .release_hashes.json. holds"):
        releases.fetch_sdist("0.13.0")
    assert not list(tmp_path.rglob("*.tar.gz"))


def test_an_sdist_newer_than_the_lock_that_is_not_the_published_one_is_refused(tmp_path, monkeypatch, unlocked):
    monkeypatch.setenv("KVAUDIT_CACHE_DIR", str(tmp_path / "cache"))

    def download(v, into):
        (into / "vllm_ascend-0.13.0.tar.gz").write_bytes(b"not the release")
        return into / "vllm_ascend-0.13.0.tar.gz", "https://pypi.org/simple/vllm-ascend/"

    monkeypatch.setattr(releases, "_download", download)
    monkeypatch.setattr(releases, "_published_sha256", lambda page, name: "0" * 64)
    with pytest.raises(StrategyFailed, match="is not the one https://pypi.org/simple/vllm-ascend/ publishes"):
        releases.fetch_sdist("0.13.0")
    assert not list(tmp_path.rglob("*.tar.gz"))


def test_the_published_hash_is_read_from_the_index_page(tmp_path):
    page = tmp_path / "simple" / "vllm-ascend"
    page.mkdir(parents=True)
    digest = "ab" * 32
    (page / "index.html").write_text(f'<a href="../../files/vllm_ascend-0.13.0.tar.gz#sha256={digest}">x</a>')
    assert releases._published_sha256(page.as_uri() + "/", "vllm_ascend-0.13.0.tar.gz") == digest
    assert releases._published_sha256(page.as_uri() + "/", "vllm_ascend-0.12.0.tar.gz") is None


def test_a_corrupt_archive_is_one_line_not_an_interrupt(tmp_path):
    bad = tmp_path / "vllm_ascend-0.13.0.tar.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 64)  # a gzip header, then nothing
    with pytest.raises(StrategyFailed, match="cannot read .*vllm_ascend-0.13.0.tar.gz"):
        releases.SourceTree("vllm-ascend 0.13.0", tarball=bad).read("vllm_ascend/__init__.py")


def test_a_cache_that_cannot_be_written_is_one_line(capsys, monkeypatch):
    from kvaudit.cli import main

    monkeypatch.setenv("KVAUDIT_CACHE_DIR", "/proc/kvaudit-cache")  # no folder can be made there, even by root
    code = main(["llama-3.1-8b", "--meter", "meta", "-s", "vllm-ascend==0.0.98"])
    err = ending(capsys.readouterr().err)
    assert code == 3 and len(err) == 1 and err[0].startswith("kvaudit: error: cannot use the release cache "
                                                             "/proc/kvaudit-cache"), err


@pytest.mark.parametrize("version", ["0.13.0\n", "0.13.0 ", " 0.13.0", "0.13.0\n; rm -rf /"])
def test_a_version_with_anything_around_it_is_not_a_version(version):
    with pytest.raises(UsageError, match="not a release version"):
        releases.fetch_sdist(version)
