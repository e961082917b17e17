"""Test plugins for kvaudit's ``kvaudit.strategies`` entry points and ``module:function`` strategies."""

import torch


def one_buffer_per_tensor(kv_cache_config, device):
    """vLLM's terms: one int8 buffer per KVCacheTensor, shared by its layers (either plan format)."""
    raw = {}
    for t in kv_cache_config.kv_cache_tensors:
        layers = getattr(t, "shared_by", None) or t.layers
        if not hasattr(t, "shared_by"):  # 0.29+: every tensor describes the same backing allocation
            buf = raw.get("__backing__")
            if buf is None:
                buf = raw["__backing__"] = torch.zeros(t.size, dtype=torch.int8, device=device)
        else:
            buf = torch.zeros(t.size, dtype=torch.int8, device=device)
        for name in layers:
            raw[name] = buf
    raw.pop("__backing__", None)
    return raw


def doubled(plan, device, kv_transfer):
    """kvaudit's terms: every planned region twice (a 2x over-allocation)."""
    raw = {}
    for t in plan.tensors:
        a = torch.zeros(t.size, dtype=torch.int8, device=device)
        b = torch.zeros(t.size, dtype=torch.int8, device=device)
        for i, name in enumerate(t.shared_by):
            raw[name] = a if i % 2 == 0 else b
    return raw


def unknown_signature(config, where, how_much):
    """A signature kvaudit does not know."""
    raise AssertionError("never called")


NOT_CALLABLE = 42


def _as_strategy():
    """A plugin that is a ``kvaudit.strategies.Strategy``, built with the names the strategies folder gives plugin
    authors (``Strategy``; ``KVBudget`` for a worker's own budget rule, not used here)."""
    from kvaudit.strategies import Strategy

    return Strategy(name="test-strategy-object", title="a Strategy object", platform="cuda", releases="a test",
                    allocate=doubled)


DOUBLED_STRATEGY = _as_strategy()
