"""Stage 5, a running server: what a vLLM or vllm-ascend server says of itself over HTTP (``endpoints``: its
``/version``, ``/v1/models``, ``/server_info`` and ``/metrics``, the last read with prometheus_client's parser:
``metrics``), what the device's own tools say of its memory (``smi``: nvidia-smi, npu-smi), and the served
deployment audited against vLLM's plan from both (``live``, for ``kvaudit live`` and the pytest plugin). Triage reads
pasted smi tables and ``/metrics`` with the same readers.

Imports the stages below it."""

__all__ = ["endpoints", "live", "metrics", "smi"]
