"""A vLLM server's side, for the tests of ``kvaudit.server`` and ``bench/live.py``: a real HTTP server in the process
answering recorded bodies (``serving``), and a ``/metrics`` as the installed vLLM's own logger writes it
(``vllm_metrics``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def serving(routes: dict[str, tuple[int, str | bytes]], tokens: dict[str, str] | None = None) -> Iterator[str]:
    """A real HTTP server on a free local port answering ``routes`` (path → status, body); a path in ``tokens`` asks
    for that bearer token (401 without it); any other path is a 404. Yields its address."""
    tokens = tokens or {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path in tokens and self.headers.get("Authorization") != f"Bearer {tokens[self.path]}":
                status, body = 401, b""
            else:
                status, body = routes.get(self.path, (404, '{"detail":"Not Found"}'))
            data = body.encode() if isinstance(body, str) else body
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def vllm_metrics(num_gpu_blocks: int, usage: tuple[float, ...] = (), running: float | None = None, **config) -> str:
    """``/metrics`` as the installed vLLM's logger writes it (``log_metrics_info``): its ``CacheConfig(**config)``'s
    own ``metrics_info()`` labels through a prometheus_client gauge, an engine for each KV-cache usage given (one at
    least), and the running requests where given."""
    import prometheus_client as pc

    from kvaudit.model.vllm_modules import module

    cc = module("vllm.config").CacheConfig(**config)
    cc.num_gpu_blocks = num_gpu_blocks
    registry = pc.CollectorRegistry()
    info = pc.Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                    labelnames=[*cc.metrics_info(), "engine"], registry=registry)
    gauge = pc.Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                     labelnames=["model_name", "engine"], registry=registry)
    requests = pc.Gauge("vllm:num_requests_running", "Running.", ["model_name", "engine"], registry=registry)
    for engine in range(max(1, len(usage))):
        info.labels(**cc.metrics_info(), engine=str(engine)).set(1)
        if engine < len(usage):
            gauge.labels(model_name="Qwen/Qwen3-8B", engine=str(engine)).set(usage[engine])
        if running is not None:
            requests.labels(model_name="Qwen/Qwen3-8B", engine=str(engine)).set(running)
    return pc.generate_latest(registry).decode()
