"""The network calls kvaudit makes, each under a timeout kvaudit sets: the Hugging Face Hub (a model's config), the
package index (``pip download`` of a release, ``pip index versions``, a release's published hash).

``KVAUDIT_NETWORK_TIMEOUT`` (seconds, default ``TIMEOUT_S``) bounds each connection and each read. A note on stderr
says when a call starts and what bounds it; a call that gives up falls back to the cache where kvaudit or the Hub
holds one, and otherwise ends the command with one line and exit 3 (``NetworkError``).
"""

from __future__ import annotations

import os
import sys

from kvaudit.errors import KvauditError, UsageError

TIMEOUT_S = 20.0
"""Seconds a connection or a read may take before kvaudit gives up on it (pip's own default is 15 s per try, with 5
retries: 109 s of silence against an index that does not answer)."""
ENV = "KVAUDIT_NETWORK_TIMEOUT"


class NetworkError(KvauditError):
    """A server that did not answer in time, with nothing cached to fall back to."""

    exit_code = 3


def timeout_s() -> float:
    """The timeout in seconds: ``KVAUDIT_NETWORK_TIMEOUT`` where set (a positive number), else ``TIMEOUT_S``."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < 86400:  # (NaN fails this too)
        raise UsageError(f"{ENV}={raw!r}: give the network timeout in seconds, above 0 and under a day "
                         f"(default {TIMEOUT_S:g})")
    return value


def started(what: str) -> None:
    """The note on stderr before a network call: what is fetched from where, and the bound."""
    print(f"kvaudit: {what} (timeout {timeout_s():g} s, {ENV})", file=sys.stderr, flush=True)


def gave_up(what: str, instead: str) -> None:
    """The one line on stderr when a call did not answer in time and kvaudit goes on with ``instead``."""
    print(f"kvaudit: {what} did not answer within {timeout_s():g} s ({ENV}); {instead}", file=sys.stderr, flush=True)


def pip_options() -> list[str]:
    """pip's own options for one try under kvaudit's timeout."""
    return ["--timeout", f"{timeout_s():g}", "--retries", "1"]


def hub_session() -> None:
    """Bound every request huggingface_hub makes (its client has no timeout of its own; a Hub that accepts a
    connection and never answers hung ``repo_info`` for as long as one waited)."""
    import huggingface_hub

    limit = timeout_s()

    def bounded(request: object) -> None:  # each call passes timeout=None, which the client's default cannot outdo
        request.extensions["timeout"] = dict.fromkeys(("connect", "read", "write", "pool"), limit)  # type: ignore

    client = huggingface_hub.get_session()
    hooks = dict(client.event_hooks)
    hooks["request"] = [h for h in hooks.get("request", []) if getattr(h, "__name__", "") != "bounded"] + [bounded]
    client.event_hooks = hooks
