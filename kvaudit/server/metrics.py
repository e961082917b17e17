"""A vLLM server's Prometheus ``/metrics`` text read with ``prometheus_client``'s own parser: the CacheConfig it
runs with (``vllm:cache_config_info``, whose labels are ``CacheConfig.metrics_info()``: every field as a string, and
the engine's index), its KV-cache usage, and its running and waiting requests, per engine.

vLLM emits ``vllm:cache_config_info`` as a gauge set to 1 whose labels carry the config (``log_metrics_info`` in
``vllm/v1/metrics/loggers.py``; ``vllm/engine/metrics.py`` before V1). The KV-cache usage is
``vllm:kv_cache_usage_perc`` in recent releases and ``vllm:gpu_cache_usage_perc`` before; both are read. The same
reader serves a live server's endpoint and a ``/metrics`` block pasted into a report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvaudit.errors import UsageError

CACHE_CONFIG = "vllm:cache_config_info"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
"""The KV-cache usage gauge, newest name first (a fraction of the KV cache's blocks in use, 0-1)."""
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"


@dataclass(frozen=True)
class EngineMetrics:
    """What one engine (a DP rank; ``engine`` label) says of itself."""

    engine: str
    cache_config: dict[str, str] = field(default_factory=dict)
    """``vllm:cache_config_info``'s labels as vLLM wrote them (strings: ``"None"``, ``"True"``, ``"0.9"``)."""
    kv_cache_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    model_name: str | None = None
    """The ``model_name`` label of its request metrics (the served model's name)."""

    def config_int(self, key: str) -> int | None:
        """An integer field of the CacheConfig (``num_gpu_blocks``, ``block_size``), ``None`` where unset."""
        return self._config(key, int, "a whole number")

    def config_float(self, key: str) -> float | None:
        """A fractional field of the CacheConfig (``gpu_memory_utilization``), ``None`` where unset."""
        return self._config(key, float, "a number")

    def _config(self, key: str, kind: Any, what: str) -> Any:
        """A CacheConfig field as ``kind``; vLLM's ``"None"`` (or no label) is ``None``, anything else a one-line
        ``UsageError``."""
        value = self.cache_config.get(key)
        if value in (None, "None", ""):
            return None
        try:
            return kind(value)
        except ValueError:
            pass
        try:  # (a whole number written as a float: "4294967296.0", as 0.11's labels write some)
            number = float(value)
            if kind is int and number.is_integer():
                return int(number)
        except (ValueError, OverflowError):
            pass
        raise UsageError(f"{CACHE_CONFIG}: {key}={value!r} is not {what}")


@dataclass(frozen=True)
class ServerMetrics:
    """A ``/metrics`` text read: each engine's figures, in the order of their engine index."""

    engines: tuple[EngineMetrics, ...]
    names: frozenset[str]
    """Every metric family the text holds (to tell a vLLM server from another)."""


def read_metrics(text: str, source: str = "/metrics") -> ServerMetrics:
    """The engines' CacheConfig, KV-cache usage and requests in a Prometheus text exposition; a text that is not
    one, or not a vLLM server's (no ``vllm:`` metric), is a one-line ``UsageError`` naming ``source``."""
    from prometheus_client.parser import text_string_to_metric_families

    engines: dict[str, dict[str, Any]] = {}
    names: set[str] = set()
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as e:  # a paste (a curl line, "......" between samples): its samples
        families = _samples_of(text)                   # one line at a time
        if not families:
            raise UsageError(f"{source} is not Prometheus text ({type(e).__name__}: {str(e)[:120]})") from None
    for family in families:
        for sample in family.samples:
            names.add(sample.name)
            engine = sample.labels.get("engine", "0")
            found = engines.setdefault(engine, {"engine": engine})
            if sample.name == CACHE_CONFIG:  # (a gauge; as an Info family its one sample has this name too)
                found["cache_config"] = {k: v for k, v in sample.labels.items() if k != "engine"}
            elif sample.name in KV_USAGE and "kv_cache_usage" not in found:
                found["kv_cache_usage"] = sample.value
            elif sample.name == RUNNING:
                found["running"] = sample.value
            elif sample.name == WAITING:
                found["waiting"] = sample.value
            if "model_name" in sample.labels and "model_name" not in found:
                found["model_name"] = sample.labels["model_name"]
    if not any(n.startswith("vllm:") for n in names):
        raise UsageError(f"{source} holds no vLLM metric (no 'vllm:' name among {len(names)} samples): not a vLLM "
                         "server, or its metrics are off")
    ordered = sorted(engines.values(), key=lambda e: (not e["engine"].isdigit(), int(e["engine"])
                                                       if e["engine"].isdigit() else 0, e["engine"]))
    return ServerMetrics(tuple(EngineMetrics(**e) for e in ordered if len(e) > 1), frozenset(names))


def _samples_of(text: str) -> list[Any]:
    """The metric families of each line of ``text`` that parses alone as a sample of a ``vllm:`` metric (what a person
    pasted around the exposition, or cut from it, is left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    families = []
    for line in text.splitlines():
        if line.lstrip().startswith("vllm:"):
            try:
                families += list(text_string_to_metric_families(line.strip() + "\n"))
            except (ValueError, TypeError, IndexError):
                continue
    return families
