"""Stage 1, the model: a config read as vLLM reads it (``spec``; a Hub id, folder or file: ``hub``), vLLM's own
model built on ``meta`` (``vllm_model``; vLLM itself imported only through ``vllm_modules``), and the deployment being audited with its KV budget (``deployment``;
the memory beside weights and KV cache: ``memory``; the options under vLLM's flag names: ``options``).

Imports only kvaudit's shared modules (``errors``, ``units``, ``versions``, ``results``, ``jsonfile``)."""

__all__ = ["deployment", "hub", "memory", "options", "spec", "vllm_model", "vllm_modules"]
