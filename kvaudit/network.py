"""The network calls kvaudit makes, each under a timeout kvaudit sets: the Hugging Face Hub (a model's config), the
package index (``pip download`` of a release, ``pip index versions``, a release's published hash), and a running
server's own endpoints (``http_get``: its ``/metrics``).

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


MAX_BODY_BYTES = 64 << 20
"""The most a server's answer may hold (a vLLM server's whole ``/metrics`` is tens of KiB; vllm#44691 reports one of
a few MiB): a larger body is refused unread past this."""


def http_get(url: str, api_key: str | None = None) -> str:
    """A server's answer to ``GET url`` as text, under kvaudit's timeout, with ``Authorization: Bearer`` when an API
    key is given (the key is never written anywhere). One line and exit 3 (``NetworkError``) for a server that refuses
    the connection, does not answer in time or fails (HTTP 5xx); one line and exit 2 (``UsageError``) for what the
    user can fix: a key refused or missing (401, 403), an address that is not there (404), a body too large."""
    import socket
    import urllib.error
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{url!r} is not an http:// or https:// address")
    host = (f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname) + (f":{parts.port}" if parts.port
                                                                                    else "")
    # a message names the address without its query or a user:password@ in it, which is not sent on either
    shown = urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
    target = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, ""))
    request = urllib.request.Request(target, headers={"Accept": "text/plain, application/json",
                                                   **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s()) as answer:
            body = answer.read(MAX_BODY_BYTES + 1)
            charset = answer.headers.get_content_charset() or "utf-8"
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise UsageError(f"{shown}: HTTP {e.code}: the server " + ("refused the API key given" if api_key else
                             "wants an API key (--api-key, or VLLM_API_KEY)")) from None
        if e.code == 404:
            raise UsageError(f"{shown}: HTTP 404: no such address on this server") from None
        raise NetworkError(f"{shown}: HTTP {e.code} {e.reason}") from None
    except (TimeoutError, socket.timeout):
        raise NetworkError(f"{shown} did not answer within {timeout_s():g} s ({ENV})") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise NetworkError(f"{shown} did not answer within {timeout_s():g} s ({ENV})") from None
        raise NetworkError(f"{shown}: cannot connect ({getattr(reason, 'strerror', None) or reason})") from None
    except (ConnectionError, OSError) as e:  # a connection reset or cut while reading
        raise NetworkError(f"{shown}: the connection failed ({e.strerror or type(e).__name__})") from None
    if len(body) > MAX_BODY_BYTES:
        from kvaudit.units import fmt_bytes

        raise UsageError(f"{shown}: the answer is larger than {fmt_bytes(MAX_BODY_BYTES)}; kvaudit reads no more")
    return body.decode(charset, errors="replace")
