"""kvalloc_demo's allocators against vLLM's plan, through kvaudit's pytest plugin.

Some fail on purpose (the per-layer allocator on Qwen3-Next, padding past the allowance): kvaudit's
tests/test_pytest_plugin.py runs this suite and checks every outcome and message."""

import functools

import pytest

import kvalloc_demo

WITHIN = 1.0
"""Percent of vLLM's planned bytes an allocator may allocate beyond (or short of) the plan."""
QWEN3_NEXT = pytest.mark.kv_cache_within(WITHIN, model="qwen3-next", util=0.9)


@QWEN3_NEXT
def test_allocate_matches_the_plan(kvaudit_plan):
    result = kvaudit_plan.audit(kvalloc_demo.allocate)
    assert result.ratio == 1.0


@QWEN3_NEXT
def test_per_layer_allocator(kvaudit_plan):
    kvaudit_plan.audit(kvalloc_demo.allocate_per_layer)


@QWEN3_NEXT
def test_every_audit_counts(kvaudit_plan):
    kvaudit_plan.audit(kvalloc_demo.allocate)
    kvaudit_plan.audit(kvalloc_demo.allocate_per_layer)


@pytest.mark.kv_cache_within(WITHIN, model="llama-3.1-8b")
def test_per_layer_allocator_on_a_dense_model(kvaudit_plan):
    kvaudit_plan.audit(kvalloc_demo.allocate_per_layer)


@QWEN3_NEXT
@pytest.mark.parametrize("beyond", [0, 1])
def test_padding(kvaudit_plan, beyond):
    allowed = round(WITHIN / 100 * kvaudit_plan.planned_bytes)
    kvaudit_plan.audit(functools.partial(kvalloc_demo.allocate_padded, pad_bytes=allowed + beyond))


@QWEN3_NEXT
@pytest.mark.parametrize("beyond", [0, 1])
def test_trimming(kvaudit_plan, beyond):
    allowed = round(WITHIN / 100 * kvaudit_plan.planned_bytes)
    kvaudit_plan.audit(functools.partial(kvalloc_demo.allocate_padded, pad_bytes=-(allowed + beyond)))


@pytest.mark.kv_cache_within(0, model="qwen3-next", util=0.9)
@pytest.mark.parametrize("pad", [0, 1])
def test_zero_percent(kvaudit_plan, pad):
    kvaudit_plan.audit(functools.partial(kvalloc_demo.allocate_padded, pad_bytes=pad))


def test_audit_fixture(kvaudit_audit):
    result = kvaudit_audit(kvalloc_demo.allocate_per_layer, WITHIN, model="qwen3-next", util=0.9)
    assert result.verdict.value == "FAIL" and f"{result.ratio:.2f}" == "4.00"
    assert kvaudit_audit(kvalloc_demo.allocate, WITHIN, model="qwen3-next", util=0.9).verdict.value == "PASS"


@pytest.mark.kv_cache_within(WITHIN, model="qwen3-next", max_model_len=1024, num_blocks=16, meter="cpu")
@pytest.mark.parametrize("allocate", [kvalloc_demo.allocate, kvalloc_demo.allocate_per_layer])
def test_real_host_allocations(kvaudit_plan, allocate):
    kvaudit_plan.audit(allocate)
