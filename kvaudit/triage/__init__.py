"""On top, triage: a pasted report read by vLLM's own formats and parsers (``evidence``, over ``lines``,
``loglines``, ``commands``, ``failures`` and ``changes``), then concluded: the deployment reconstructed, its memory
ledger and the inequality of vLLM's budget it breaks (``ledger``), the reported release's allocator and the fixed one
audited, the cause where the allocation matches the plan or the terms that decide it (``causes``, each value quoted
with its line: ``sourced``), a report to paste back (``conclude``). Smi tables and a pasted ``/metrics`` are read with
``kvaudit.server``'s readers, as ``kvaudit live`` reads them from a running server.

Imports the stages below it; never ``ci`` or ``cli``."""

__all__ = ["conclude", "evidence"]
