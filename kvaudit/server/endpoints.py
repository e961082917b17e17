"""What a running vLLM server says of itself over HTTP, each fact with the endpoint that said it: ``/version``
(``{"version": ...}``), ``/v1/models`` (the served model: its ``root``, the Hub id or path it was loaded from, and
``max_model_len``), ``/server_info`` (only with ``VLLM_SERVER_DEV_MODE=1``: ``vllm_config``, the engine config as
``VllmConfig.__str__`` writes it) and ``/metrics`` (``kvaudit.server.metrics``). Endpoints are those of vLLM's OpenAI
server (``vllm/entrypoints/openai/api_server.py``; ``/server_info`` in ``vllm/entrypoints/serve/dev``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvaudit.errors import UsageError
from kvaudit.server.metrics import ServerMetrics, read_metrics

VERSION, MODELS, SERVER_INFO, METRICS = "/version", "/v1/models", "/server_info", "/metrics"


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``/v1/models``: the name it is served as, what it was loaded from, its length."""

    id: str
    root: str | None = None
    max_model_len: int | None = None
    parent: str | None = None
    """A LoRA adapter's base model (``None`` for a base model)."""


@dataclass(frozen=True)
class Served:
    """A server's own account of itself, as its endpoints gave it."""

    url: str
    metrics: ServerMetrics
    version: str | None = None
    models: tuple[ServedModel, ...] = ()
    engine_config: dict[str, str] = field(default_factory=dict)
    """``/server_info``'s ``vllm_config``, field by field as written (``tensor_parallel_size``: ``"2"``)."""
    notes: tuple[str, ...] = ()
    """What an endpoint did not give, and why (``/server_info``: 404, dev mode off)."""

    @property
    def base_model(self) -> ServedModel | None:
        """The model served (the first that is not a LoRA adapter)."""
        return next((m for m in self.models if m.parent is None), self.models[0] if self.models else None)


def read_version(text: str) -> str:
    """``/version``'s answer: ``{"version": "0.26.0"}``."""
    doc = _json(text, VERSION)
    version = doc.get("version") if isinstance(doc, dict) else None
    if not isinstance(version, str) or not version.strip():
        raise UsageError(f"{VERSION} gives no version (not a vLLM server's answer: {text.strip()[:80]!r})")
    return version.strip()


def read_models(text: str) -> tuple[ServedModel, ...]:
    """``/v1/models``'s answer: an OpenAI model list, with vLLM's ``root``, ``parent`` and ``max_model_len``."""
    doc = _json(text, MODELS)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list) or not data or not all(isinstance(m, dict) and isinstance(m.get("id"), str)
                                                           for m in data):
        raise UsageError(f"{MODELS} lists no model (not an OpenAI model list: {text.strip()[:80]!r})")

    def length(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    return tuple(ServedModel(m["id"], m.get("root") if isinstance(m.get("root"), str) else None,
                             length(m.get("max_model_len")),
                             m.get("parent") if isinstance(m.get("parent"), str) else None) for m in data)


def read_server_info(text: str) -> dict[str, str]:
    """``/server_info``'s ``vllm_config``, top-level field by field (``VllmConfig.__str__``: ``model='/model',
    ..., tensor_parallel_size=1, ...``; a nested config's commas and quotes stay inside its field)."""
    doc = _json(text, SERVER_INFO)
    config = doc.get("vllm_config") if isinstance(doc, dict) else None
    if isinstance(config, dict):  # (``?config_format=json``: the configs nested, each field once)
        flat = {str(k): v for k, v in config.items() if not isinstance(v, dict)}
        for nested in (v for v in config.values() if isinstance(v, dict)):
            flat.update({str(k): v for k, v in nested.items() if not isinstance(v, dict)})
        return {k: str(v) for k, v in flat.items()}
    if not isinstance(config, str):
        raise UsageError(f"{SERVER_INFO} gives no vllm_config")
    return config_fields(config)


def config_fields(text: str) -> dict[str, str]:
    """``key=value, key=value`` at the top level of ``text``, values unquoted (``'/model'`` → ``/model``)."""
    fields: dict[str, str] = {}
    depth, quote, start = 0, "", 0
    for i, ch in enumerate(text + ","):
        if quote:
            quote = "" if ch == quote and text[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            key, eq, value = text[start:i].strip().partition("=")
            if eq and key.isidentifier():
                value = value.strip()
                fields[key] = value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else value
            start = i + 1
    return fields


def _json(text: str, endpoint: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        head = " ".join(text.strip().split())[:80]
        raise UsageError(f"{endpoint} is not JSON ({e.msg} at column {e.colno}): {head!r}; not a vLLM server, or a "
                         "proxy's page") from None


def check_url(url: str) -> None:
    """A server's address is ``http://`` or ``https://`` (a bare ``HOST:PORT`` is refused in one line)."""
    if not url.lower().startswith(("http://", "https://")):
        raise UsageError(f"{url!r} is not a server's address: give it as http://HOST:PORT (e.g. http://localhost:8000)")


def is_local(url: str) -> bool:
    """Whether ``url``'s host is this machine (a loopback address, localhost, or this host's name)."""
    import ipaddress
    import socket
    import urllib.parse

    host = urllib.parse.urlsplit(url if "//" in url else "http://" + url).hostname or ""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_base(url: str) -> str:
    """The server's address without an endpoint given with it (``http://host:8000/metrics`` → ``http://host:8000``);
    one that is not ``http://`` or ``https://`` is refused in one line."""
    check_url(url)
    base = url.rstrip("/")
    for suffix in (METRICS, MODELS, "/v1"):
        base = base.removesuffix(suffix)
    return base


def read_server_metrics(base: str, api_key: str | None = None) -> ServerMetrics:
    """The server's ``/metrics`` (``base``: its address, as ``server_base`` gives it), read; what ``--watch`` reads
    again."""
    from kvaudit.network import http_get

    return read_metrics(http_get(base + METRICS, api_key), f"{base}{METRICS}")


def read_server(url: str, api_key: str | None = None) -> Served:
    """The server at ``url`` (``http://HOST:PORT``): ``/metrics`` (needed), ``/v1/models``, ``/version`` and
    ``/server_info`` (each noted where the server does not give it), each read by ``kvaudit.network.http_get``."""
    from kvaudit.network import http_get

    base = server_base(url)
    notes: list[str] = []
    metrics = read_server_metrics(base, api_key)

    def optional(endpoint: str, reader: Any, why: str) -> Any:
        try:
            return reader(http_get(base + endpoint, api_key))
        except UsageError as e:
            if "HTTP 404" not in str(e):
                raise
            notes.append(f"{endpoint}: HTTP 404 ({why})")
            return None

    models = optional(MODELS, read_models, "not an OpenAI-compatible server") or ()
    version = optional(VERSION, read_version, "a release before vLLM's /version route")
    config = optional(SERVER_INFO, read_server_info, "the server runs without VLLM_SERVER_DEV_MODE=1") or {}
    return Served(base, metrics, version, models, config, tuple(notes))
