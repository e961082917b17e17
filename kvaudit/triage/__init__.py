"""On top, triage: a pasted report read by vLLM's own formats and parsers (``evidence``, over ``lines``,
``loglines``, ``commands``, ``failures`` and ``changes``), then concluded: the deployment reconstructed, its memory
ledger and the inequality of vLLM's budget it breaks (``ledger``), the reported release's allocator and the fixed one
audited, the cause where the allocation matches the plan or the terms that decide it (``causes``, each value quoted
with its line: ``sourced``), a report to paste back (``conclude``); a vLLM server's Prometheus ``/metrics`` read with
prometheus_client's parser (``metrics``: its CacheConfig, KV-cache usage and requests per engine).

Imports the stages below it; never ``ci`` or ``cli``."""

__all__ = ["conclude", "evidence"]
