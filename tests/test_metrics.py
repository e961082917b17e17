"""A vLLM server's ``/metrics`` read with prometheus_client's parser (``kvaudit.triage.metrics``): the exposition vLLM's
own code writes (its ``CacheConfig.metrics_info()`` through a prometheus_client gauge, as ``log_metrics_info`` in
``vllm/v1/metrics/loggers.py`` does), real pasted ones (``fixtures/live/``, each cited in its SOURCES.md), and text
that is not a vLLM server's."""

from __future__ import annotations

import pytest
from conftest import ROOT

from kvaudit.errors import UsageError
from kvaudit.triage.metrics import read_metrics

pytestmark = pytest.mark.fast


def _exposition(engines: int = 2, **config) -> str:
    """``/metrics`` as the installed vLLM's logger writes it: its CacheConfig's own ``metrics_info()`` labels, one
    gauge per engine, and the KV-cache usage gauge."""
    pytest.importorskip("vllm")
    import prometheus_client as pc

    from kvaudit.model.vllm_modules import module

    cc = module("vllm.config").CacheConfig(**config)
    cc.num_gpu_blocks = 4096
    registry = pc.CollectorRegistry()
    info = pc.Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                    labelnames=[*cc.metrics_info(), "engine"], registry=registry)
    usage = pc.Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                     labelnames=["model_name", "engine"], registry=registry)
    for engine in range(engines):
        info.labels(**cc.metrics_info(), engine=str(engine)).set(1)
        usage.labels(model_name="Qwen/Qwen3-8B", engine=str(engine)).set(0.125 * (engine + 1))
    return pc.generate_latest(registry).decode()


def test_the_cache_config_vllms_own_logger_writes_is_read_per_engine():
    m = read_metrics(_exposition(engines=2, block_size=32, gpu_memory_utilization=0.85))
    assert [e.engine for e in m.engines] == ["0", "1"]
    for e, usage in zip(m.engines, (0.125, 0.25)):
        assert (e.config_int("num_gpu_blocks"), e.config_int("block_size"), e.config_float("gpu_memory_utilization"),
                e.cache_config["cache_dtype"], e.kv_cache_usage, e.model_name) == (4096, 32, 0.85, "auto", usage,
                                                                                   "Qwen/Qwen3-8B")


@pytest.mark.parametrize("text, message", [
    ("<html><body>502 Bad Gateway</body></html>", "is not Prometheus text"),
    ("# HELP up 1 if up\n# TYPE up gauge\nup 1\n", "holds no vLLM metric"),
    ("", "holds no vLLM metric"),
])
def test_what_is_not_a_vllm_servers_metrics_is_one_line(text, message):
    with pytest.raises(UsageError, match=message):
        read_metrics(text, "http://host:8000/metrics")


LIVE = ROOT / "fixtures" / "live" / "metrics"


@pytest.mark.parametrize("name, engines", [
    # (file, [(engine, num_gpu_blocks, block_size, gpu_memory_utilization, cache_dtype, prefix caching, usage, running)])
    ("vllm-pr3100-v0.3.x.metrics.txt", [("0", 24188, 16, 0.9, "auto", None, None, None)]),
    ("oci-ai-blueprints-INSTALLING_README.metrics.txt", [("0", 10947, 16, 0.9, "auto", "False", None, 0.0)]),
    ("vllm-28924-v0.11.0.metrics.txt", [("0", 9271, 16, 0.65, "auto", "True", None, None)]),
    ("hardware-aware-router-vllm_metrics-v0.11-era.metrics.txt", [("0", 2452, 16, 0.25, "auto", "True", 0.0, 0.0)]),
    ("production-stack-318-v0.8-V1.partial.metrics.txt", [("0", None, None, None, None, None, 0.0, 0.0)]),
    ("production-stack-617-v0.10.0.partial.metrics.txt", [("0", None, None, None, None, None, 9.75010481363281e-06,
                                                            None)]),
])
def test_real_servers_metrics_are_read_as_they_say(name, engines):
    """Each real paste (fixtures/live/metrics/SOURCES.md): across the label sets of vLLM 0.3 to 0.11, with the curl
    line and the author's "..." a paste carries around the samples, and a paste cut before its CacheConfig."""
    m = read_metrics((LIVE / name).read_text(), name)
    assert [(e.engine, e.config_int("num_gpu_blocks"), e.config_int("block_size"),
             e.config_float("gpu_memory_utilization"), e.cache_config.get("cache_dtype"),
             e.cache_config.get("enable_prefix_caching"), e.kv_cache_usage, e.running) for e in m.engines] == engines
    assert all(e.model_name is None or e.model_name.strip() for e in m.engines)


def test_a_sample_split_across_lines_is_not_read_as_a_config():
    """vllm#16560's paste: the reporter's blank lines split the sample, so no CacheConfig can be read from it."""
    with pytest.raises(UsageError, match="vllm-16560.*is not Prometheus text"):
        read_metrics((LIVE / "vllm-16560-v0.8.x-V1.metrics.txt").read_text(), "vllm-16560-v0.8.x-V1.metrics.txt")


def test_a_config_figure_that_is_not_one_is_refused_in_one_line():
    m = read_metrics('vllm:cache_config_info{block_size="sixteen",num_gpu_blocks="None"} 1.0\n')
    assert m.engines[0].config_int("num_gpu_blocks") is None
    with pytest.raises(UsageError, match="block_size='sixteen' is not a whole number"):
        m.engines[0].config_int("block_size")
