"""On top, the CI gate: policy files (``policy``), their matrix run and judged (``check``), every vllm-ascend
release audited on one model (``history``), and the pytest plugin for allocators' own test suites
(``pytest_plugin``, the ``pytest11`` entry point).

Imports the stages below it; never ``triage`` or ``cli``."""

__all__ = ["check", "history", "policy", "pytest_plugin"]
