"""Ways to misuse kvaudit's plugin: each must end in one clear line (kvaudit's tests/test_pytest_plugin.py
runs this suite and checks every outcome and message)."""

import pytest

import kvalloc_demo


@pytest.mark.kv_cache_within(1, model="no-such-model")
def test_unknown_model(kvaudit_plan):
    kvaudit_plan.audit(kvalloc_demo.allocate)


@pytest.mark.kv_cache_within(-1)
def test_negative_percent(kvaudit_plan):
    kvaudit_plan.audit(kvalloc_demo.allocate)


@pytest.mark.kv_cache_within(100)
def test_percent_of_100(kvaudit_plan):
    kvaudit_plan.audit(kvalloc_demo.allocate)


@pytest.mark.kv_cache_within("1%")
def test_percent_as_text(kvaudit_plan):
    kvaudit_plan.audit(kvalloc_demo.allocate)


@pytest.mark.kv_cache_within(1, utl=0.9)
def test_misspelt_keyword(kvaudit_plan):
    kvaudit_plan.audit(kvalloc_demo.allocate)


@pytest.mark.kv_cache_within(1, model="qwen3-next", util=0.9, tp=3)
def test_tp_that_does_not_divide_the_heads(kvaudit_plan):
    kvaudit_plan.audit(kvalloc_demo.allocate)


@pytest.mark.kv_cache_within(1, model="qwen3-next", util=0.9)
def test_marker_without_the_fixture():
    kvalloc_demo.allocate


def test_fixture_without_the_marker(kvaudit_plan):
    kvaudit_plan.audit(kvalloc_demo.allocate)


@pytest.mark.kv_cache_within(1, model="qwen3-next", util=0.9)
def test_nothing_audited(kvaudit_plan):
    kvaudit_plan.kv_cache_config


def broken_allocator(kv_cache_config, device):
    raise ValueError("no room for layer 0")


@pytest.mark.kv_cache_within(1, model="qwen3-next", util=0.9)
def test_allocator_that_raises(kvaudit_plan):
    kvaudit_plan.audit(broken_allocator)


def test_audit_fixture_with_a_bad_percent(kvaudit_audit):
    kvaudit_audit(kvalloc_demo.allocate, 250, model="qwen3-next")
