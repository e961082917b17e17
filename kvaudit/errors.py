"""Typed errors that carry kvaudit's exit code, so the CLI maps them in one place."""

from __future__ import annotations

from typing import Iterable, Mapping


class KvauditError(Exception):
    """Base error: a one-line message for the user and the exit code that goes with it."""

    exit_code: int = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))

    @property
    def message(self) -> str:
        """The message as one line."""
        return str(self)


class ConfigError(KvauditError):
    """A model config, preset or deployment figure that cannot be used (exit 2)."""

    exit_code = 2


class UsageError(KvauditError):
    """An option value that is out of range or unknown (exit 2)."""

    exit_code = 2


class MeterUnavailable(KvauditError):
    """The meter asked for cannot measure on this machine (exit 3)."""

    exit_code = 3


class MissingDependency(KvauditError):
    """A package the command needs is not installed here: torch, vLLM, rich, ... (exit 3: nothing was
    measured; the message names what to install)."""

    exit_code = 3


def first_line(e: BaseException, limit: int | None = None) -> str:
    """An exception's message as one line (its first), at most ``limit`` characters; its type's name when it has
    none: for reasons quoted from code kvaudit does not own (vLLM, a release, a plugin, torch_npu)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:limit]


_WHY = {
    "torch": "kvaudit allocates with torch (install the serving environment's torch, or a CPU wheel from "
             "https://download.pytorch.org/whl/cpu)",
    "vllm": "kvaudit plans with vLLM's own planner (install vllm, or audit a saved plan: kvaudit audit --plan, "
            "which needs only torch)",
    "rich": "kvaudit's tables are drawn with rich (pip install rich)",
}


def did_you_mean(word: str, choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """`` (did you mean 'X'?)`` for the choice nearest to ``word``: the same but for case and the ``-``, ``_`` and
    ``.`` between its parts (``qwen3next``: ``qwen3-next``), an alias (``gpu``: ``cuda``), else the closest spelling
    (difflib's ratio of 0.6 or more); ``""`` where none is near."""
    import difflib

    def bare(text: str) -> str:
        return "".join(c for c in text.lower() if c not in "-_.")

    choices = list(choices)
    found = next((c for c in choices if bare(c) == bare(word)), None) or (aliases or {}).get(word.lower())
    if found is None:
        near = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
        found = near[0] if near else None
    return f" (did you mean {found!r}?)" if found is not None and found != word else ""


def missing_dependency(e: ModuleNotFoundError) -> MissingDependency:
    """The one-line error for a package that is not installed, naming it and what to install."""
    name = (e.name or str(e)).split(".")[0]
    why = _WHY.get(name, f"pip install {name}")
    return MissingDependency(f"this command needs the Python package {name!r}, which is not installed in this "
                             f"environment: {why}")


class StrategyFailed(KvauditError):
    """A strategy could not be run to the end for a reason other than a finding (exit 3)."""

    exit_code = 3


class NotAuditable(KvauditError):
    """A strategy cannot allocate this plan at all, e.g. code written for ``shared_by`` regions and a
    plan that interleaves layers within blocks (exit 3; the other strategies are still audited)."""

    exit_code = 3


EXIT_PASS = 0
"""Every audited strategy allocated what vLLM planned, within tolerance."""
EXIT_FAIL = 1
"""At least one audited strategy over- or under-allocated: a finding."""
EXIT_BAD_INPUT = 2
"""Bad input: config, preset, option, file, or a deployment vLLM refuses or that cannot hold one block."""
EXIT_NOT_MEASURED = 3
"""The audit could not measure: meter unavailable, host too small, a package missing, strategy broke."""
EXIT_BUG = 4
"""kvaudit itself failed: an exception kvaudit does not expect, i.e. a bug in kvaudit, never a finding
(one line naming it; ``--debug`` prints the traceback)."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C, SIGINT), as shells report a process ended by SIGINT (128 + 2)."""

EXIT_CODES = {
    EXIT_PASS: "every audited strategy allocated what vLLM planned",
    EXIT_FAIL: "a strategy over- or under-allocated (a finding)",
    EXIT_BAD_INPUT: "bad input (a config, option or file; a deployment vLLM refuses)",
    EXIT_NOT_MEASURED: "could not measure (no meter, host too small, a package missing, a strategy broke, no answer from the network)",
    EXIT_BUG: "kvaudit failed: a bug in kvaudit, not a finding (--debug shows the traceback)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C, or SIGTERM)",
}
"""Every exit code kvaudit ends with, in one place (``--help``, the README and the tests read it)."""
