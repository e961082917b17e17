"""A vLLM server's ``/metrics`` read with prometheus_client's parser (``kvaudit.server.metrics``): the exposition vLLM's
own code writes (its ``CacheConfig.metrics_info()`` through a prometheus_client gauge, as ``log_metrics_info`` in
``vllm/v1/metrics/loggers.py`` does), real pasted ones (``fixtures/live/``, each cited in its SOURCES.md), text that
is not a vLLM server's, and a real HTTP server in this process answering them (``kvaudit.network.http_get``: bearer
token, refusals, timeouts, size)."""

from __future__ import annotations

import pytest
from conftest import ROOT
from served import serving, vllm_metrics

from kvaudit.errors import UsageError
from kvaudit.server.metrics import read_metrics

pytestmark = pytest.mark.fast


def test_the_cache_config_vllms_own_logger_writes_is_read_per_engine():
    pytest.importorskip("vllm")
    m = read_metrics(vllm_metrics(4096, usage=(0.125, 0.25), block_size=32, gpu_memory_utilization=0.85))
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
    # 0.11's labels write some whole numbers as floats (swap_space_bytes="4294967296.0"); 16.5 blocks are none
    dump = read_metrics((LIVE / "hardware-aware-router-vllm_metrics-v0.11-era.metrics.txt").read_text())
    assert dump.engines[0].config_int("swap_space_bytes") == 4 << 30
    half = read_metrics('vllm:cache_config_info{block_size="16.5"} 1.0\n')
    with pytest.raises(UsageError, match="block_size='16.5' is not a whole number"):
        half.engines[0].config_int("block_size")


# --- a real server's endpoint, over HTTP (kvaudit.network.http_get) ----------------------------------------------------


@pytest.fixture
def server():
    """A real HTTP server in this process: ``/metrics`` answers the whole dump of a V1 server
    (fixtures/live/metrics), ``/secure/metrics`` the same behind a bearer token, ``/broken`` a proxy's 502 page."""
    body = (LIVE / "hardware-aware-router-vllm_metrics-v0.11-era.metrics.txt").read_bytes()
    with serving({"/metrics": (200, body), "/secure/metrics": (200, body),
                  "/broken": (502, b"<html><body><h1>502 Bad Gateway</h1></body></html>")},
                 tokens={"/secure/metrics": "s3cret-key"}) as url:
        yield url


def test_a_servers_metrics_read_over_http_are_the_servers(server):
    from kvaudit.network import http_get

    m = read_metrics(http_get(server + "/metrics"), server + "/metrics")
    assert (m.engines[0].config_int("num_gpu_blocks"), m.engines[0].model_name) == (2452, "Qwen/Qwen1.5-0.5B-Chat")
    assert read_metrics(http_get(server + "/secure/metrics", api_key="s3cret-key")).engines[0].config_int(
        "num_gpu_blocks") == 2452


def test_what_a_server_answers_instead_is_one_line_with_its_exit_code(server, monkeypatch):
    """A key missing or refused, an address that is not there: exit 2, what to fix; a proxy's 502, a refused
    connection, a server that never answers: exit 3. No message holds the key or a password of the address."""
    import socket
    import time

    from kvaudit import network
    from kvaudit.network import ENV, NetworkError, http_get

    with pytest.raises(UsageError, match=r"/secure/metrics: HTTP 401: the server wants an API key \(--api-key"):
        http_get(server + "/secure/metrics")
    with pytest.raises(UsageError, match="refused the API key given") as refused:
        http_get(server.replace("http://", "http://admin:hunter2@") + "/secure/metrics", api_key="wrong-key")
    assert "wrong-key" not in refused.value.message and "hunter2" not in refused.value.message
    with pytest.raises(UsageError, match="HTTP 404: no such address"):
        http_get(server + "/nothing")
    with pytest.raises(NetworkError, match="/broken: HTTP 502") as proxy:
        http_get(server + "/broken")
    assert proxy.value.exit_code == 3
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(NetworkError, match="cannot connect"):
        http_get(f"http://127.0.0.1:{port}/metrics")
    silent = socket.socket()  # accepts (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    monkeypatch.setenv(ENV, "0.5")
    start = time.monotonic()
    try:
        with pytest.raises(NetworkError, match=r"did not answer within 0.5 s \(KVAUDIT_NETWORK_TIMEOUT\)"):
            http_get(f"http://127.0.0.1:{silent.getsockname()[1]}/metrics")
    finally:
        silent.close()
    assert time.monotonic() - start < 10
    monkeypatch.setattr(network, "MAX_BODY_BYTES", 1000)  # (the dump is 45 KB)
    with pytest.raises(UsageError, match=r"/metrics: the answer is larger than 1000 B; kvaudit reads no more"):
        http_get(server + "/metrics")
    with pytest.raises(UsageError, match="is not an http:// or https:// address"):
        http_get("file:///etc/passwd")
