"""The policy file of ``kvaudit check`` (TOML): the matrix of cells, validated with the line of each key."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvaudit.errors import UsageError
from kvaudit.escape import terminal_safe_tree
from kvaudit.model.options import accepts
from kvaudit.results import DEFAULT_TOLERANCE, valid_tolerance

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (vllm-ascend hosts): the same parser, from PyPI
    import tomli as tomllib

OUTCOMES = ("pass", "fail", "not-audited")
"""What a cell may be expected to do: pass, fail (a legacy strategy pinned as known-bad), or not be
audited (a strategy that cannot allocate this plan, with its reason)."""

AXES = ("tp", "pp", "util", "kv_cache_dtype", "max_model_len", "device", "kv_transfer", "dtype")
"""Deployment options a ``[[model]]`` entry may give as a list: the matrix runs every combination."""

CHECK_KEYS = {"meter": str, "tolerance": float, "strategies": list, "expect": str}
"""Keys of ``[check]``: the defaults of every ``[[model]]`` entry."""

MODEL_KEYS = {"name": str, "config": str, "meter": str, "tolerance": float, "strategies": list,
              "expect": (str, dict), "why": (str, dict)}
"""Keys of a ``[[model]]`` entry besides the deployment options (which the command line declares)."""


MAX_CELLS = 10_000
"""The most cells a policy may expand to (the example policy has 84; a cell is planned and audited in about
0.15 s): a larger matrix is refused before anything runs, naming the entry that passes the limit."""
MAX_POLICY_BYTES = 1 << 20
"""A policy file larger than this is refused unread (the example policy is 6 KB)."""


class PolicyError(UsageError):
    """A policy file that cannot be run: ``path:line: message`` (exit 2)."""


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: a deployment of one model, audited with one strategy."""

    model: str
    """The preset name, or the config path as the policy gives it."""
    preset: str | None
    config: str | None
    """The config path resolved against the policy's folder, or a Hub id."""
    options: tuple[tuple[str, Any], ...]
    """The deployment options this cell sets (vLLM's flag names), in the policy's order."""
    strategy: str
    meter: str
    tolerance: float
    expect: str
    """``pass``, ``fail`` or ``not-audited``."""
    why: str
    """Why the expectation is what it is (the policy's ``why``), for the reports."""
    line: int
    """The line of the cell's ``[[model]]`` entry in the policy."""

    @property
    def deployment_key(self) -> tuple:
        """Cells with equal keys share one deployment (planned once, every strategy audited against it)."""
        return (self.preset, self.config, tuple((k, _text(v)) for k, v in self.options), self.meter, self.tolerance)

    @property
    def label(self) -> str:
        """``qwen3-next tp=4 util=0.7``: the model and the options that set this cell apart."""
        return " ".join([self.model, *(f"{k}={_text(v)}" for k, v in self.options)])


@dataclass(frozen=True)
class Policy:
    """A validated policy: where it came from and its cells, in the file's order."""

    path: Path
    cells: tuple[Cell, ...]

    def line_of_strategy(self, strategy: str) -> int:
        """The first line whose cells use ``strategy`` (for an error about that strategy)."""
        return min(c.line for c in self.cells if c.strategy == strategy)


def _text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else str(value).lower() \
        if isinstance(value, bool) else str(value)


_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list of strings",
          dict: "a table"}


def _want_name(want: Any) -> str:
    return " or ".join(_NAMES[w] for w in want) if isinstance(want, tuple) else _NAMES[want]


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


class _Lines:
    """Where each key of the policy is: TOML parsers give values, not lines, so the file is scanned for
    its table headers and ``key =`` lines (a key in an inline table is on its table's line)."""

    _HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?")
    _KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_.-]+)\s*=""")

    def __init__(self, text: str) -> None:
        self.where: dict[tuple[str, int, str], int] = {}
        self.headers: dict[tuple[str, int], int] = {}
        table, index, counts = "", 0, {}
        for n, line in enumerate(text.splitlines(), 1):
            m = self._HEADER.match(line)
            if m:
                name = m.group(2).strip()
                top, _, rest = name.partition(".")
                if m.group(1) == "[[" and not rest:
                    counts[top] = counts.get(top, -1) + 1
                table, index = top, counts.get(top, 0)
                self.headers.setdefault((table, index), n)
                if rest:  # [model.expect]: the key of its parent entry
                    self.where.setdefault((table, index, rest), n)
                continue
            m = self._KEY.match(line)
            if m:
                key = m.group(1).strip("\"'")
                self.where.setdefault((table, index, key), n)

    def line(self, table: str, index: int, key: str | None = None) -> int:
        """The line of ``key`` in the ``index``-th ``table``, else of the table's header, else 1."""
        if key is not None and (table, index, key) in self.where:
            return self.where[(table, index, key)]
        return self.headers.get((table, index), 1)


def load_policy(path: str | Path, strategies: tuple[str, ...]) -> Policy:
    """Read and validate a policy file: ``[[model]]`` entries may set every deployment option of the
    command line (``kvaudit.model.options``: ``tp``, ``util``, ``kv_cache_dtype``, ...); ``strategies`` are
    the default strategies. Every error is ``path:line: message`` (``PolicyError``, exit 2), before
    anything runs."""
    from kvaudit.model.deployment import PRESETS
    from kvaudit.model.hub import is_hub_id
    from kvaudit.model.options import deployment_option_names, value_type

    from kvaudit.jsonfile import read_bytes

    p = Path(path)
    if not p.exists():
        raise PolicyError(f"{path}: policy file not found (start from examples/kvaudit.toml; docs/ci.md describes "
                          "every key)")
    try:
        text = read_bytes(p, "kvaudit policy (TOML)", "see 'kvaudit check --help'", MAX_POLICY_BYTES).decode(
            "utf-8", errors="replace")
    except UsageError as e:
        raise PolicyError(e.message) from None
    try:
        doc = terminal_safe_tree(tomllib.loads(text))  # (a name shown in check's table is text, not a terminal command)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        raise PolicyError(f"{path}:{m.group(1) if m else 1}: not valid TOML: {msg}"
                          + (f" (column {m.group(2)})" if m else "")) from None
    except RecursionError:
        raise PolicyError(f"{path}:1: not a policy: TOML nested too deeply") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise PolicyError(f"{path}:1: not a policy: {' '.join(str(e).split()[:12])}") from None
    lines = _Lines(text)

    def fail(table: str, index: int, key: str | None, message: str) -> PolicyError:
        return PolicyError(f"{path}:{lines.line(table, index, key)}: {message}")

    for key in doc:
        if key not in ("check", "model"):
            raise fail(key, 0, None, f"unknown table [{key}] (a policy has [check] and [[model]] entries)")
    check = doc.get("check", {})
    if not isinstance(check, dict):
        raise fail("check", 0, None, "'check' must be a table: [check]")
    models = doc.get("model", [])
    if not isinstance(models, list) or not models:
        raise fail("model", 0, None, "a policy needs at least one [[model]] entry (name = a preset, or config = a "
                                     "config.json path)")
    for key, value in check.items():
        if key not in CHECK_KEYS:
            raise fail("check", 0, key, f"unknown key '{key}' in [check] (known: {', '.join(CHECK_KEYS)})")
        if not accepts(value, CHECK_KEYS[key]):
            raise fail("check", 0, key, f"'{key}' in [check] must be {_want_name(CHECK_KEYS[key])}, "
                                        f"got {_kind(value)}")
    defaults = {"meter": check.get("meter", "meta"), "tolerance": check.get("tolerance", DEFAULT_TOLERANCE),
                "strategies": check.get("strategies", list(strategies)), "expect": check.get("expect", "pass")}
    _check_values("check", 0, defaults, fail)

    known = {**MODEL_KEYS, **{k: value_type(k) for k in deployment_option_names()}}
    cells: list[Cell] = []
    for i, entry in enumerate(models):
        entry = dict(entry)
        for key, value in entry.items():
            if key not in known:
                raise fail("model", i, key, f"unknown key '{key}' in [[model]] (known: {', '.join(known)})")
            want = known[key]
            values = value if key in AXES and isinstance(value, list) else [value]
            if key in AXES and isinstance(value, list) and not value:
                raise fail("model", i, key, f"'{key}' is an empty list")
            for v in values:
                if not accepts(v, want):
                    axis = " or a list of them" if key in AXES else ""
                    raise fail("model", i, key, f"'{key}' in [[model]] must be {_want_name(want)}{axis}, "
                                                f"got {_kind(v)}")
            if len({_text(v) for v in values}) != len(values):
                raise fail("model", i, key, f"'{key}' lists a value twice")
        if ("name" in entry) == ("config" in entry):
            raise fail("model", i, None, "a [[model]] entry needs exactly one of name = PRESET or config = PATH")
        if "name" in entry and entry["name"] not in PRESETS:
            raise fail("model", i, "name", f"unknown preset '{entry['name']}' (presets: {', '.join(PRESETS)}; "
                                           "or give config = PATH)")
        config = None
        if "config" in entry:
            try:
                resolved = (p.parent / entry["config"]).resolve()
                exists = resolved.exists()
            except (OSError, ValueError):  # a NUL byte, a path too long
                raise fail("model", i, "config", f"config {entry['config']!r} is not a path") from None
            if not exists and not is_hub_id(entry["config"]):
                raise fail("model", i, "config", f"config not found: {entry['config']} (resolved against the "
                                                 f"policy's folder: {resolved}; a Hub id is org/name)")
            config = str(resolved) if exists else entry["config"]  # a Hub id, fetched when the check runs
        settings = {k: entry.get(k, defaults[k]) for k in defaults}
        _check_values("model", i, settings, fail)
        expect, why = entry.get("expect", defaults["expect"]), entry.get("why", "")
        for key, table in (("expect", expect), ("why", why)):
            if isinstance(table, dict):
                for s, v in table.items():
                    if s not in settings["strategies"]:
                        raise fail("model", i, key, f"'{key}' names strategy '{s}', which this entry does not run "
                                                    f"(strategies: {', '.join(settings['strategies'])})")
                    if not isinstance(v, str) or (key == "expect" and v not in OUTCOMES):
                        raise fail("model", i, key, f"'{key}.{s}' must be " + (
                            f"one of {', '.join(OUTCOMES)}" if key == "expect" else "a string") + f", got {v!r}")
        if isinstance(expect, str) and expect not in OUTCOMES:
            raise fail("model", i, "expect", f"'expect' must be one of {', '.join(OUTCOMES)} (or a table "
                                             f"strategy = outcome), got {expect!r}")
        axes = [(k, v if k in AXES and isinstance(v, list) else [v]) for k, v in entry.items()
                if k not in MODEL_KEYS]
        count = math.prod(len(vals) for _, vals in axes) * len(settings["strategies"])
        if len(cells) + count > MAX_CELLS:
            raise fail("model", i, None, f"the policy expands to more than {MAX_CELLS:,} cells here ({len(cells):,} "
                                         f"before this entry, {count:,} in it): split it into several policies")
        for combo in itertools.product(*(vals for _, vals in axes)):
            options = tuple((k, v) for (k, _), v in zip(axes, combo))
            for s in settings["strategies"]:
                cells.append(Cell(
                    model=entry.get("name") or entry["config"], preset=entry.get("name"), config=config,
                    options=options, strategy=s, meter=settings["meter"], tolerance=float(settings["tolerance"]),
                    expect=expect.get(s, defaults["expect"]) if isinstance(expect, dict) else expect,
                    why=why.get(s, "") if isinstance(why, dict) else why, line=lines.line("model", i)))
    return Policy(path=p, cells=tuple(cells))


def _check_values(table: str, index: int, settings: dict, fail: Any) -> None:
    """Ranges of the settings shared by [check] and [[model]] (types are checked already)."""
    from kvaudit.measure.meters import METER_NAMES

    where = "[check]" if table == "check" else "[[model]]"
    if settings["meter"] not in ("auto", *METER_NAMES):
        raise fail(table, index, "meter", f"unknown meter '{settings['meter']}' in {where} (known: auto, "
                                          f"{', '.join(METER_NAMES)})")
    if not valid_tolerance(settings["tolerance"]):
        raise fail(table, index, "tolerance", f"'tolerance' in {where} must be in [0, 1), got {settings['tolerance']}")
    if not settings["strategies"]:
        raise fail(table, index, "strategies", f"'strategies' in {where} is an empty list")
    if len(set(settings["strategies"])) != len(settings["strategies"]):
        raise fail(table, index, "strategies", f"'strategies' in {where} names a strategy twice")
    if table == "check" and isinstance(settings["expect"], str) and settings["expect"] not in OUTCOMES:
        raise fail(table, index, "expect", f"'expect' in [check] must be one of {', '.join(OUTCOMES)}, "
                                           f"got {settings['expect']!r}")
