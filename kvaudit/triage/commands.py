"""Launches in a report read as vLLM reads them: a command line split as a shell splits it, then parsed by the
installed vLLM's own parser (``FlexibleArgumentParser`` with ``EngineArgs.add_cli_args``: every flag, ``=`` forms,
underscores, aliases such as ``-tp``, JSON flags, human-readable sizes); ``LLM(...)``/``EngineArgs(...)`` keyword
arguments, ``non-default args: {...}`` and ``args: Namespace(...)`` read through Python's ``ast``, never executed.

Where vLLM is not installed, a small reader of kvaudit's own takes the common flags, and says so (``Launch.parser``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import logging
import re
import shlex
from dataclasses import dataclass
from typing import Any

from kvaudit.model.hub import is_hub_id
from kvaudit.triage.loglines import RECORD_CUT

FACTS: dict[str, str] = {
    "model": "model", "model_tag": "model", "tensor_parallel_size": "tp", "pipeline_parallel_size": "pp",
    "data_parallel_size": "dp", "max_model_len": "max_model_len", "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_dtype": "kv_cache_dtype", "dtype": "dtype", "block_size": "block_size",
    "kv_cache_memory_bytes": "kv_cache_memory", "kv_cache_memory": "kv_cache_memory", "enforce_eager": "enforce_eager",
    "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
    "kv_transfer_config": "kv_connector", "cpu_offload_gb": "cpu_offload_gb", "swap_space": "swap_space",
    "quantization": "quantization", "enable_expert_parallel": "enable_expert_parallel",
}
"""vLLM's engine-argument names (the parser's ``dest``, ``EngineArgs`` fields) and the facts kvaudit takes from them."""
_KINDS: dict[str, type] = {"tp": int, "pp": int, "dp": int, "max_model_len": int, "block_size": int, "max_num_seqs": int,
                           "max_num_batched_tokens": int, "kv_cache_memory": int, "gpu_memory_utilization": float,
                           "cpu_offload_gb": float, "swap_space": float, "enforce_eager": bool,
                           "enable_expert_parallel": bool}
"""The type each fact has, whichever reader found it."""


@dataclass(frozen=True)
class Launch:
    """What one launch sets, as a parser read it."""

    facts: tuple[tuple[str, Any], ...]
    unread: tuple[str, ...] = ()
    """Flags the parser did not take: another vLLM's, or a value it refused (an unexpanded ``$TP``)."""
    parser: str = ""
    """Which parser read it: ``vLLM 0.33.0's engine-argument parser`` or kvaudit's own reader."""


# --- shell words ------------------------------------------------------------------------------------

_VAR = re.compile(r"\$\{(?P<a>[A-Za-z_]\w*)(?::?-(?P<d>[^}]*))?\}|\$(?P<b>[A-Za-z_]\w*)")


def expand(text: str, variables: dict[str, str]) -> str:
    """Shell variables set earlier in the paste expanded (``${X:-default}`` too); unknown ones are left as they are."""
    def one(m: re.Match) -> str:
        name = m["a"] or m["b"]
        if name in variables:
            return variables[name]
        return m["d"] if m["d"] is not None else m.group(0)
    return _VAR.sub(one, text)


def split(text: str) -> list[str]:
    """Words as a POSIX shell splits them (quotes, backslashes, ``#`` comments); a paste with an unbalanced quote
    is split at blanks instead."""
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars=False)
        lex.whitespace_split = True
        lex.commenters = "#"
        return list(lex)
    except ValueError:
        return text.split()


_SHELL_STOP = {"|", "||", "&&", ";", "&", ">", ">>", "2>&1", "2>", "1>", "&>", "&>>", "|&"}


def command_words(words: list[str]) -> list[str]:
    """The words of one command: up to a pipe, ``;``, ``&&`` or a redirection (``... 2>&1 | tee log``)."""
    out: list[str] = []
    for w in words:
        if w in _SHELL_STOP or w.startswith(("2>", ">", "1>", "&>")) or w.endswith(";") and not w.startswith("-"):
            if w.endswith(";") and w not in _SHELL_STOP:
                out.append(w[:-1])
            break
        out.append(w)
    return out


# --- vLLM's parser ----------------------------------------------------------------------------------


_UNSET = object()
"""What an engine argument the words did not give holds after parsing."""


class _Refused(Exception):
    """argparse refused the words (a value of the wrong type, a missing value)."""


_PARSER: list[Any] = []


def _vllm_parser() -> Any:
    """The installed vLLM's engine-argument parser (built once), or ``None`` where vLLM is not installed or its
    parser cannot be built here."""
    if _PARSER:
        return _PARSER[0]
    parser = None
    with contextlib.suppress(Exception):  # (a finder that hides vLLM raises ModuleNotFoundError)
        if importlib.util.find_spec("vllm") is not None:
            parser = _build_parser()
    _PARSER.append(parser)
    return parser


def _build_parser() -> Any:
    from kvaudit.model.vllm_modules import module, quiet_vllm
    from kvaudit.plan.planner import vllm_version

    with quiet_vllm(), contextlib.redirect_stderr(io.StringIO()):
        EngineArgs = module("vllm.engine.arg_utils").EngineArgs
        current_platform = module("vllm.platforms").current_platform
        try:
            FlexibleArgumentParser = module("vllm.utils.argparse_utils").FlexibleArgumentParser
        except ImportError:  # vLLM before 0.11 kept it in vllm.utils
            FlexibleArgumentParser = module("vllm.utils").FlexibleArgumentParser

        class _Parser(FlexibleArgumentParser):  # type: ignore[misc, valid-type]
            """vLLM's parser that hands back what it does not know, and raises where argparse would exit."""

            def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
                namespace, extra = super().parse_known_args(args, namespace)
                self.extra = extra
                return namespace, []

            def error(self, message):  # type: ignore[override]
                raise _Refused(message)

            def exit(self, status=0, message=None):  # type: ignore[override]
                raise _Refused(message or f"exit {status}")

        cls = type(current_platform)
        unset = not getattr(current_platform, "device_type", "")
        if unset:  # DeviceConfig's default asks the platform for a device type: none on a host without one
            cls.device_type = "cpu"
        try:
            parser = _Parser(prog="vllm serve", add_help=False)
            parser.add_argument("model_tag", nargs="?", default=None)
            EngineArgs.add_cli_args(parser)
            parser.defaults = vars(parser.parse_args([]))
        finally:
            if unset:
                cls.device_type = ""
    parser.label = f"vLLM {vllm_version()}'s engine-argument parser"
    logging.getLogger("vllm.utils.argparse_utils").addFilter(lambda record: False)  # its notes on the words it reads
    return parser


def parser_name() -> str | None:
    """Which vLLM parser reads launches here, or ``None`` (kvaudit's own reader then)."""
    p = _vllm_parser()
    return p.label if p is not None else None


def read_words(words: list[str]) -> Launch:
    """What a launch's words after the program (``vllm serve``'s, the api_server's) set: parsed by vLLM's parser,
    each flag it does not take left as evidence; kvaudit's reader where vLLM is not installed."""
    p = _vllm_parser()
    if p is None:
        return _own_reading(words)
    key = tuple(words)
    if key in _READ:  # the same launch pasted again
        return _READ[key]
    _READ[key] = launch = _parse(p, list(words))
    if len(_READ) > 4096:
        _READ.pop(next(iter(_READ)))
    return launch


_READ: dict[tuple[str, ...], Launch] = {}


def _parse(p: Any, words: list[str]) -> Launch:
    unread: list[str] = []
    for i in reversed(range(len(words))):  # a config file is on the reporter's machine, not in the report
        if words[i] == "--config" or words[i].startswith("--config="):
            end = i + 1 if "=" in words[i] else i + 2
            unread.append(f"{' '.join(words[i:end])} (a config file the report does not hold)")
            del words[i:end]
    wrapped: list[tuple[str, Any]] = []
    for i, w in enumerate(words):  # a wrapper's own model flag (FastChat's --model-path), before vLLM's parser
        flag, eq, value = w.partition("=")
        if _WRAPPER_MODEL.fullmatch(flag) and (eq or i + 1 < len(words)):
            wrapped.append(("model", value if eq else words[i + 1]))
            unread.append(" ".join(words[i:i + (1 if eq else 2)]))
            del words[i:i + (1 if eq else 2)]
            break
    for _ in range(64):  # each round drops one flag argparse refused
        try:
            given = argparse.Namespace(**dict.fromkeys(p.defaults, _UNSET))  # argparse keeps what it finds set
            with contextlib.redirect_stderr(io.StringIO()):
                ns = p.parse_args(words, given)
            break
        except _Refused as e:
            bad = _refused_flag(str(e), words)
            if bad is None:
                return Launch((), tuple(unread) + (f"{' '.join(words)[:120]} ({_said(e)})",), p.label)
            unread.append(f"{' '.join(words[bad[0]:bad[1]])} ({_said(e)[:100]})")
            del words[bad[0]:bad[1]]
        except Exception as e:  # noqa: BLE001 - vLLM's own validation of a value (a JSON flag that is no JSON)
            return Launch((), tuple(unread) + (f"{' '.join(words)[:120]} ({type(e).__name__}: {_said(e)})",), p.label)
    else:
        return Launch((), tuple(unread), p.label)
    extra = list(getattr(p, "extra", []))
    tag = ns.model_tag if ns.model_tag is not _UNSET else None
    if tag is not None and _follows_unknown(words, tag, extra):  # the value of a flag it does not know: --host 0.0.0.0
        ns.model_tag = _UNSET
        at = extra.index(next(w for i, w in enumerate(words) if i + 1 < len(words) and words[i + 1] == tag
                              and w in extra))
        extra[at] = f"{extra[at]}={tag}"
    elif tag is not None and ns.model not in (None, _UNSET):
        ns.model_tag = _UNSET  # --model says it
    facts: list[tuple[str, Any]] = list(wrapped)
    for dest, value in vars(ns).items():
        if dest in FACTS and value is not _UNSET and value is not None:
            fact = _fact(FACTS[dest], value)
            if fact is not None:
                facts.append(fact)
    named = any(k == "model" for k, _ in facts)
    i = 0
    while i < len(extra):  # what the engine parser does not know: a frontend's flags (--host 0.0.0.0), another vLLM's
        w = extra[i]
        if w.startswith("-"):
            takes = "=" not in w and i + 1 < len(extra) and not extra[i + 1].startswith("-")
            unread.append(" ".join(extra[i:i + 1 + takes]))

            i += 1 + takes
            continue
        if not named:  # a model after flags that take none
            facts.append(("model", w))
            named = True
        i += 1
    return Launch(tuple(facts), tuple(unread), p.label)


_WRAPPER_MODEL = re.compile(r"--model[-_](?:path|dir|name[-_]or[-_]path)")
"""The model flag of programs that pass the rest to vLLM's engine arguments (FastChat's vllm_worker: --model-path)."""


def _follows_unknown(words: list[str], value: str, extra: list[str]) -> bool:
    """Whether ``value`` comes right after a flag the parser did not know (argparse then takes it as positional)."""
    unknown = {w for w in extra if w.startswith("-")}
    return any(w == value and i and words[i - 1] in unknown for i, w in enumerate(words))


def _refused_flag(message: str, words: list[str]) -> tuple[int, int] | None:
    """The span of words (the flag and its value) argparse's message names: ``argument --tensor-parallel-size/-tp:
    invalid int value: '$TP'``."""
    m = re.match(r"argument (?P<flags>[^:]+):", message)
    if not m:
        return None
    names = set(m["flags"].split("/"))
    for i, w in enumerate(words):
        flag = w.split("=", 1)[0]
        if flag in names or flag.replace("_", "-") in names:
            end = i + 1 if "=" in w or i + 1 >= len(words) or words[i + 1].startswith("-") else i + 2
            return i, end
    return None


def _fact(key: str, value: Any) -> tuple[str, Any] | None:
    """A parsed engine argument as a fact: a KV-transfer config as its connector's name, numbers as numbers."""
    if key == "kv_connector":
        name = getattr(value, "kv_connector", None) or (value.get("kv_connector") if isinstance(value, dict) else None)
        return ("kv_connector", str(name)) if name else None
    kind = _KINDS.get(key)
    try:
        if kind is bool:
            return key, value if isinstance(value, bool) else str(value).lower() in ("true", "1")
        if kind is int:
            return (key, int(value)) if not isinstance(value, bool) and float(value) == int(float(value)) else None
        if kind is float:
            return key, float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return key, str(value)


# --- kvaudit's own reader, where vLLM is not installed --------------------------------------------------

OWN_READER = "kvaudit's own flag reader (vLLM is not installed here)"
_ALIASES = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size"}
_VALUELESS = {"trust-remote-code", "enforce-eager", "enable-prefix-caching", "no-enable-prefix-caching",
              "enable-chunked-prefill", "disable-log-requests", "disable-log-stats", "enable-expert-parallel",
              "enable-auto-tool-choice", "disable-custom-all-reduce", "async-scheduling", "headless"}


def _own_reading(words: list[str]) -> Launch:
    facts: list[tuple[str, Any]] = []
    unread: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("-"):
            if not any(k == "model" for k, _ in facts):
                facts.append(("model", w))
            i += 1
            continue
        flag, eq, value = w.lstrip("-").partition("=")
        flag = _ALIASES.get(flag, flag.replace("_", "-"))
        if not eq and flag not in _VALUELESS and i + 1 < len(words) and not words[i + 1].startswith("--"):
            value, i = words[i + 1], i + 1
        i += 1
        dest = flag.replace("-", "_")
        if dest == "enforce_eager":
            facts.append(("enforce_eager", True))
        elif dest == "kv_transfer_config":
            with contextlib.suppress(ValueError, AttributeError):
                connector = json.loads(value).get("kv_connector")
                if connector:
                    facts.append(("kv_connector", str(connector)))
        elif dest in FACTS and value:
            fact = _fact(FACTS[dest], _human(value))
            if fact is not None:
                facts.append(fact)
            else:
                unread.append(f"--{flag} {value}")
    return Launch(tuple(facts), tuple(unread), OWN_READER)


def _human(value: str) -> Any:
    """``32k``/``1M`` as vLLM's ``human_readable_int`` reads them (decimal ``k``/``m``/``g``, binary ``K``/``M``/``G``)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if not m:
        return value
    unit = m[2]
    power = "kmgt".index(unit.lower()) + 1
    return int(float(m[1]) * ((1000 if unit.islower() else 1024) ** power))


# --- settings stated outside a launch ---------------------------------------------------------------

_STATED = re.compile(r"(?<![A-Za-z0-9_/.$-])(?P<flag>--?[A-Za-z][A-Za-z0-9_-]*|[A-Za-z][A-Za-z_]*)"
                     r"(?=(?P<eq>[ \t]*[=:：][ \t]*)?(?(eq)|[ \t]*)(?P<value>[^\s`'\"，,;；。=:：()（）\[\]{}<>]+)?)")
"""A flag or a setting's name and the value after it (``--gpu-memory-utilization=0.95``, ``TP=8``,
``gpu_memory_utilization: 0.9``); the names are checked against vLLM's parser."""
BARE_ALIASES = ("tp", "pp", "dp", "ep", "dcp", "pcp")
"""The parser's short aliases people write without the dash, as words (``TP=8, PP=2``); single letters (``-n``,
``-q``) are left out: as words they are no settings."""
_NAMES: list[dict[str, tuple[str, bool]]] = []


def _stated_names() -> dict[str, tuple[str, bool]]:
    """Each way a report may name an engine argument, lower-cased (``--max-model-len``, ``max_model_len``, ``-tp``,
    ``tp``) -> (the flag vLLM's parser takes, whether it takes a value); from the installed vLLM's parser, else from
    kvaudit's own reader's flags."""
    if _NAMES:
        return _NAMES[0]
    p = _vllm_parser()
    names: dict[str, tuple[str, bool]] = {}
    if p is not None:
        for option, action in p._option_string_actions.items():
            if action.dest not in FACTS:
                continue
            takes = action.nargs != 0
            names[option.lower()] = (option, takes)
            bare = option.lstrip("-").lower()
            if option.startswith("--") or bare in BARE_ALIASES:
                names.setdefault(bare, (option, takes))
                names.setdefault(bare.replace("-", "_"), (option, takes))
    else:
        for dest in FACTS:
            if dest != "model_tag":
                flag = "--" + dest.replace("_", "-")
                takes = flag[2:] not in _VALUELESS
                for name in (flag, dest, flag.lstrip("-")):
                    names[name] = (flag, takes)
        for alias in _ALIASES:
            names[alias] = names["-" + alias] = ("--" + _ALIASES[alias], True)
    _NAMES.append(names)
    return names


def stated_settings(text: str) -> Launch:
    """Engine arguments a report states outside a launch: a flag in a sentence or in backticks
    (```--gpu-memory-utilization=0.95```, "我使用了--max-model-len 8192 参数"), an argument's name with a value
    (``gpu_memory_utilization=0.9``, ``tensor_parallel_size: 8``), the parser's short aliases written as words
    (``TP=8, PP=2``). Each is checked against the names vLLM's parser takes, then read by that parser on its own (a
    sentence may state a value and another beside it: "4096 ... the docs say 25480")."""
    facts: list[tuple[str, Any]] = []
    unread: list[str] = []
    if RECORD_CUT.search(text):
        return Launch((), ())  # a log message's advice ("use '--enforce-eager'") sets nothing
    for m in _STATED.finditer(text):
        flag = m["flag"]
        dashed = flag.startswith("-")
        if not dashed and not m["eq"]:
            continue  # a word with no "=" or ":" after it is prose
        bare = flag.lstrip("-").lower().replace("-", "_")
        if bare not in FACTS and bare not in BARE_ALIASES:
            continue  # no argument kvaudit reads (checked before vLLM's parser is built: a log needs no vLLM)
        names = _stated_names()
        found = names.get(flag.lower() if dashed else flag.lower().replace("-", "_")) or names.get(flag.lower())
        if found is None:
            continue
        option, takes = found
        value = (m["value"] or "").rstrip(".")
        if not (takes and value):
            continue  # a switch named in a sentence is a condition or a workaround ("works with --enforce-eager")
        if option == "--model" and not (is_hub_id(value) or value.startswith(("/", "~/", "./"))):
            continue  # "model: the 7B one": a model is stated as a Hub id or a path, as vLLM takes it
        end = _SENTENCE_END.search(text, m.end())
        start = max(text.rfind(c, 0, m.start()) for c in ".!?。！？") + 1
        if end is not None and end.group(0) in ("?", "？") and _ADDRESSED.search(text, start, end.end()):
            continue  # a suggestion put as a question ("can you retry with `--enforce-eager`?") states what did not run
        read = read_words([option, value])  # each on its own: "4096 ... the docs say 25480"
        facts += read.facts
        unread += read.unread
    return Launch(tuple(facts), tuple(unread), (parser_name() or OWN_READER) if facts or unread else "")


_ADDRESSED = re.compile(r"\b(?:you|your)\b|您|你", re.IGNORECASE)
"""A sentence put to the reader."""
_SENTENCE_END = re.compile(r"[.!?。！？](?=\s|$)|[！？]|$")


# --- Python: LLM(...), non-default args, Namespace ---------------------------------------------------


def _literal(node: ast.AST, variables: dict[str, str]) -> Any:
    """A node's value where it is a literal, or a name the paste assigned; else ``None``. Nothing is executed."""
    if isinstance(node, ast.Name):
        return variables.get(node.id)
    if isinstance(node, ast.Call):  # KVTransferConfig(kv_connector="...") in a reproducer or a logged dict
        return {k.arg: _literal(k.value, variables) for k in node.keywords if k.arg}
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def parse_python(text: str) -> ast.AST | None:
    """``text`` as a Python expression (a call, a dict), cut back to its longest prefix that parses."""
    text = text.strip()
    for end in _closing(text):
        try:
            return ast.parse(text[:end], mode="eval").body
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
    return None


def _closing(text: str) -> list[int]:
    """Ends of the text where its brackets balance (the call's own close first), outside string literals."""
    depth, quote, out = 0, "", []
    for i, c in enumerate(text[:20000]):
        if quote:
            if c == quote and text[i - 1] != "\\":
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                out.append(i + 1)
                break
    return out


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+(?=>)")


def _said(e: BaseException) -> str:
    """What the parser said, without the memory address of the function it names (argparse's "cannot be converted to
    <function loads at 0x7f8c...>" differs from run to run): a report reads the same every time."""
    return _ADDRESS.sub("", str(e))


def read_call(text: str, variables: dict[str, str]) -> Launch:
    """What ``LLM(...)``, ``EngineArgs(...)``, ``Namespace(...)`` or a ``{...}`` of engine arguments sets."""
    node = parse_python(text)
    pairs: list[tuple[str, Any]] = []
    if isinstance(node, ast.Call):
        if node.args:
            pairs.append(("model", _literal(node.args[0], variables)))
        pairs += [(k.arg, _literal(k.value, variables)) for k in node.keywords if k.arg]
    elif isinstance(node, ast.Dict):
        pairs += [(_literal(k, variables), _literal(v, variables)) for k, v in zip(node.keys, node.values) if k]
    facts: list[tuple[str, Any]] = []
    unread: list[str] = []
    for name, value in pairs:
        if not isinstance(name, str) or name not in FACTS or value is None:
            continue
        fact = _fact(FACTS[name], value)
        if fact is None:
            unread.append(f"{name}={value!r}")
        else:
            facts.append(fact)
    return Launch(tuple(facts), tuple(unread), "Python's ast (keyword arguments, never executed)")


# --- YAML/JSON: vLLM's --config file, a container's command and args ---------------------------------

_KEY_LINE = re.compile(r"^(?P<ind>[ \t]*)(?:-[ \t]+)?(?P<k>[A-Za-z_][\w.-]*)[ \t]*:(?:[ \t]|$)")
_ITEM_LINE = re.compile(r"^[ \t]*-(?:[ \t]|$)")
_LAUNCH_KEYS = ("command", "args", "entrypoint")
"""A container spec's keys (Kubernetes, Docker Compose) that hold a launch's words."""


def config_blocks(lines: list[str]) -> list[tuple[int, int, str]]:
    """Runs of lines that read as YAML mappings (``key: value``, list items, indented lines) holding an engine
    argument kvaudit reads (``FACTS``) or a container's command: ``(first line, last line, text)``, 1-based. (vLLM's
    parser is not needed to find them: a paste with none never imports it.)"""
    keys = set(FACTS)
    out: list[tuple[int, int, str]] = []
    n = 0
    while n < len(lines):
        m = _KEY_LINE.match(lines[n])
        if not m:
            n += 1
            continue
        start, indent, known = n, len(m["ind"]), 0
        while n < len(lines) and n - start < 400:
            line = lines[n]
            k = _KEY_LINE.match(line)
            if k and len(k["ind"]) < indent:  # a mapping less indented than the one begun: another document
                break
            if k:
                name = k["k"].replace("-", "_")
                known += name in keys or name in _LAUNCH_KEYS
            elif not (_ITEM_LINE.match(line) or line.strip() and len(line) - len(line.lstrip()) > indent):
                break
            n += 1
        if known and n - start >= 2 or known >= 2:
            out.append((start + 1, n, "\n".join(lines[start:n])))
    return out


def _engine_keys() -> set[str]:
    p = _vllm_parser()
    return set(p.defaults) - {"model_tag"} if p is not None else set(FACTS)


def read_config(text: str) -> Launch | None:
    """What a pasted YAML (or JSON) config sets: vLLM's ``--config`` file, its keys engine arguments, turned into
    words by the parser's own ``load_config_file``; or a container spec's ``command``/``args``. ``None`` where the
    text is no such config, or no YAML reader is installed."""
    try:
        import yaml
    except ImportError:
        return None
    dedented = "\n".join(line[_indent(text):] for line in text.splitlines())
    try:
        data = yaml.load(dedented, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # (libyaml's, where built)
    except Exception:  # noqa: BLE001 - yaml.YAMLError, and a recursion depth on hostile nesting
        return None
    found = _config_words(data, _engine_keys())
    return read_words(found) if found else None


def _indent(text: str) -> int:
    return min((len(line) - len(line.lstrip()) for line in text.splitlines() if line.strip()), default=0)


def _config_words(data: Any, keys: set[str], depth: int = 0) -> list[str] | None:
    """The launch words a parsed YAML document holds, searched through a container spec's nesting."""
    if depth > 12:
        return None
    if isinstance(data, dict):
        spoken = [str(w) for k in _LAUNCH_KEYS for w in _as_words(data.get(k))]
        if any(w.startswith("--") for w in spoken):
            return _after_program(spoken)
        engine = {k: v for k, v in data.items() if isinstance(k, str) and k.replace("-", "_") in keys
                  and not (isinstance(v, str) and (not v.strip() or any(c.isspace() for c in v.strip())))}
        if len(engine) >= 2 or engine and len(engine) == len(data):  # (a docstring's prose values are no config)
            return _config_file_words(engine)
        children = list(data.values())
    elif isinstance(data, list):
        children = data
    else:
        return None
    for child in children:
        if (found := _config_words(child, keys, depth + 1)) is not None:
            return found
    return None


def _as_words(value: Any) -> list[str]:
    if isinstance(value, str):
        return split(value)
    if isinstance(value, list):
        return [w for item in value if isinstance(item, (str, int, float)) for w in (split(str(item)) or [""])]
    return []


def _after_program(words: list[str]) -> list[str]:
    """The arguments after the program (``vllm serve``, ``python -m vllm.entrypoints...``) in a command list."""
    for i, w in enumerate(words):
        if w == "serve" or "vllm.entrypoints" in w or w.endswith("api_server.py"):
            return words[i + 1:]
    first = next(i for i, w in enumerate(words) if w.startswith("-"))
    return words[first:]


def _config_file_words(config: dict[str, Any]) -> list[str]:
    """A ``--config`` file's mapping as vLLM turns it into words (``FlexibleArgumentParser.load_config_file``:
    ``true`` a bare flag, lists spread, mappings as JSON); kvaudit's own turning where vLLM is not installed."""
    p = _vllm_parser()
    if p is not None and hasattr(p, "load_config_file"):
        import tempfile

        import yaml

        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(config, f)
            f.flush()
            with contextlib.suppress(Exception):  # noqa: BLE001 - its own refusal of a value
                return list(p.load_config_file(f.name))
    words: list[str] = []
    for key, value in config.items():
        if value is True:
            words.append(f"--{key}")
        elif isinstance(value, (dict, list)):
            words += [f"--{key}", json.dumps(value)]
        elif value is not False and value is not None:
            words += [f"--{key}", str(value)]
    return words
