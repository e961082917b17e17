"""Facts read from pasted vLLM and vllm-ascend log lines, by the format strings of their own sources.

``log_formats.json`` (written by ``scripts/log_catalogue.py`` from the sdists of a spread of vLLM and vllm-ascend
releases) holds each logger message and exception message that carries a KV-cache or memory figure, with the fact
each placeholder gives. Each format is compiled here to one regex; ``read_line`` returns the ``(fact_key, value)``
pairs of every format a line matches. Standard library only, no torch and no vLLM: a 1 MB paste of 10,000 lines reads
in under a tenth of a second, each entry tried only on the lines that hold its longest word and its longest literal
fragment.

Values: memory figures in bytes (``int``; printed in GiB, GB, MiB or MB, each by the unit the source really divides
by: vLLM's old "Loading model weights took 1.23 GB" divides by ``float(2**30)``, so GiB), counts as ``int``
(thousands separators allowed), ratios and concurrency as ``float``. A budget may be negative.

Fact keys (the ones ``kvaudit.triage.evidence`` already knows, then the ones this catalogue adds):

- ``available_kv``: the KV cache budget ("Available KV cache memory", V0's "the rest of the memory reserved for KV
  Cache", the profile breakdown's "Current kv cache memory", vllm-ascend's "Available memory: A"), bytes, may be < 0
- ``device_memory``: the device's total memory; ``startup_free``: its free memory on startup
- ``gpu_memory_utilization``: the utilization asked for; ``weights``: the weights' memory after loading
- ``peak_activation``, ``non_torch``, ``profiled_weights``, ``profiled_consumed``: the profile's parts
- ``cudagraph_memory``, ``cudagraph_estimate``, ``graph_capture``: CUDA/NPU graph memory (actual, estimated, as
  measured around capture)
- ``kv_cache_tokens``, ``gpu_blocks``, ``max_concurrency``, ``max_model_len``, ``block_size``: the KV cache's capacity
- ``kv_needed``, ``estimated_max_model_len``: the KV refusal's figures
- ``kv_capacity_error`` (a mark: the value is the refusal's own words): vLLM refused the KV cache ("No available
  memory for the cache blocks", "To serve at least one request with the model's max seq len ...", V0's "The model's
  max seq len (L) is larger than the maximum number of tokens that can be stored in KV cache (T)", "Cannot auto-fit
  max_model_len", the CPU worker's "leaving none for the KV cache")

New here:

- ``requested_memory``: the utilization budget in bytes (total x utilization: "Desired GPU memory utilization is
  (U, R GiB)", V0's "= R GiB")
- ``cpu_blocks``: V0's "# CPU blocks" (swap space)
- ``non_kv_memory``: the profiler's "Total non KV cache memory"
- ``weights_peak``: "Peak GPU memory after loading weights"
- ``kv_cache_memory``: a KV cache size given by hand ("reserved K GiB for KV Cache as specified by
  kv_cache_memory_bytes"; the CPU backend's KV space)
- ``kv_cache_memory_to_requested``, ``kv_cache_memory_to_gpu_limit``: the ``--kv-cache-memory=`` bytes the profile
  breakdown suggests (to fit the requested utilization; to fill the device)
- ``free_after_profile``: free device memory after profiling; ``free_after_graph``: vllm-ascend's free NPU memory
  after graph capture ("reduced to merely F GB")
- ``model_context_len``: the model's full context length before auto-fit shortened it (``max_model_len=-1``)
- ``max_num_seqs``, ``mamba_blocks``: a hybrid model refused because its KV budget holds fewer Mamba states
  (``mamba_blocks``) than ``--max-num-seqs`` (vLLM 0.24's "max_num_seqs (N) exceeds available Mamba cache blocks (B)")
- ``suggested_gpu_memory_utilization``: the utilization vLLM suggests once CUDA graph memory is profiled
- ``startup_memory_error`` (a mark): free memory on startup is below the utilization budget (the engine refuses to
  start); ``memory_profiling_error`` (a mark): free memory grew during profiling
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

CATALOGUE_PATH = Path(__file__).with_name("log_formats.json")

_LEVEL = r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)"
RECORD_START = r"^\s*(?:\(\w+ pid=\d+\)\s*)?(?:\[rank\d+\]:\s*)?"
"""What comes before a log record's level: the process a Ray or multiprocessing worker prints, torch's rank."""
RECORD = re.compile(RECORD_START + rf"(?:\x1b\[[0-9;]*m)?{_LEVEL}(?:\x1b\[[0-9;]*m)?\s+\S+\s+\S+\s+\[[\w.]+:\d+\]")
"""A vLLM log record's prefix (``(EngineCore_DP0 pid=1) INFO 12-05 10:00:00 [gpu_worker.py:276]``), from the line's
start (vLLM's ``_FORMAT`` in ``vllm/logger.py``: level, date, time, ``[file:line]``)."""
RECORD_CUT = re.compile(rf"\b{_LEVEL}\b.{{0,40}}?\[[\w.]+:\d+\]")
"""The same prefix wherever a paste cut the line (``INFO 03-27 10:29:03 [model_runner.py:1442]``)."""
LEVEL_START = re.compile(RECORD_START + _LEVEL + r"\b")
"""A line that starts with a log record's level, whatever follows."""

_SCALE = {"GiB": float(1 << 30), "GB": 1e9, "MiB": float(1 << 20), "MB": 1e6}
_NUMERIC = {"GiB", "GB", "MiB", "MB", "bytes", "int", "float", "ratio"}
_DIGITS = r"(?:\d{1,3}(?:,\d{3}){1,8}|\d{1,24})"
_NUM = rf"-?{_DIGITS}(?:\.\d{{1,24}})?(?:[eE][-+]?\d{{1,3}})?"
"""A number as Python prints it (``str``, ``%.2f``, ``{:,}``); longer digit runs are no figure."""
_PERCENT = re.compile(r"%(?:\(\w+\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")
_WORD = re.compile(r"[A-Za-z]{3,}")


def _split_percent(fmt: str) -> list:
    """A %-format as pieces: literal text (str) and placeholders (``(directive, "", spec)``: ``("%.2f", "", ".2f")``)."""
    out: list = []
    pos = 0
    for m in _PERCENT.finditer(fmt):
        out.append(fmt[pos:m.start()])
        out.append("%" if m.group(0) == "%%" else (m.group(0), "", m.group(0)[1:]))
        pos = m.end()
    out.append(fmt[pos:])
    return out


def _after_string(text: str, j: int) -> int:
    """The index after the Python string literal that opens at ``text[j]`` (a quote, or three), escapes skipped."""
    q = text[j] * 3 if text.startswith(text[j] * 3, j) else text[j]
    j += len(q)
    while j < len(text) and not text.startswith(q, j):
        j += 2 if text[j] == "\\" else 1
    return j + len(q)


def _outside_strings(text: str, j: int):
    """``(index, char)`` of ``text`` from ``j`` on, each Python string literal in it skipped whole."""
    while j < len(text):
        if text[j] in "'\"":
            j = _after_string(text, j)
            continue
        yield j, text[j]
        j += 1


def _field_end(fmt: str, i: int) -> int:
    """The index of the ``}`` closing the replacement field that opens at ``fmt[i]``: brackets and quotes inside an
    f-string's expression (``{d['a']}``, ``{x[:2]}``) and a nested spec (``{x:{w}}``) are skipped."""
    depth = 0
    for j, ch in _outside_strings(fmt, i + 1):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                if ch == "}":
                    return j
                raise ValueError(f"unbalanced {ch!r} at {j} in {fmt!r}")
            depth -= 1
    raise ValueError(f"unclosed replacement field at {i} in {fmt!r}")


def _split_field(field: str) -> tuple[str, str, str]:
    """A replacement field's ``expr!conv:spec`` as (expr, conv, spec): the first ``!`` or ``:`` outside brackets and
    quotes (and not ``!=``) ends the expression."""
    depth = 0
    for j, ch in _outside_strings(field, 0):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and ch == "!" and not field.startswith("!=", j):
            conv, _, spec = field[j + 1:].partition(":")
            return field[:j], conv, spec
        elif depth == 0 and ch == ":":
            return field[:j], "", field[j + 1:]
    return field, "", ""


def _split_braces(fmt: str) -> list:
    """An f-string's or ``str.format``'s format as pieces: literal text (str) and placeholders (``(expr, conv,
    spec)``)."""
    out: list = []
    lit: list[str] = []
    i, n = 0, len(fmt)
    while i < n:
        ch = fmt[i]
        if ch in "{}" and fmt.startswith(ch * 2, i):
            lit.append(ch)
            i += 2
        elif ch == "{":
            out.append("".join(lit))
            lit = []
            end = _field_end(fmt, i)
            out.append(_split_field(fmt[i + 1:end]))
            i = end + 1
        elif ch == "}":
            raise ValueError(f"single '}}' at {i} in {fmt!r}")
        else:
            lit.append(ch)
            i += 1
    out.append("".join(lit))
    return out


def _parts(entry: dict) -> list:
    raw = _split_percent(entry["format"]) if entry["style"] == "percent" else _split_braces(entry["format"])
    out: list = []
    for p in raw:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    return out


def pieces(entry: dict) -> list:
    """An entry's format as pieces: literal text (str) and placeholders (None), literal runs merged."""
    return [p if isinstance(p, str) else None for p in _parts(entry)]


def placeholders(entry: dict) -> list[tuple[str, str, str]]:
    """Each placeholder of an entry's format as written: ``(expression, conversion, spec)`` for an f-string or a
    brace format (``("format_gib(x)", "", "")``, ``("n", "", ",")``), ``(directive, "", spec)`` for a %-format
    (``("%.2f", "", ".2f")``)."""
    return [p for p in _parts(entry) if not isinstance(p, str)]


def matched_part(entry: dict) -> tuple[list, list[str]]:
    """The part of an entry's format a line must hold, as pieces, and the units of its placeholders: the message up
    to the word after the last placeholder read (and through its anchor, where the message is itself a fact). What
    follows is advice whose wording changes from release to release, and often cut off in a paste."""
    ps = pieces(entry)
    lit = "".join(p if isinstance(p, str) else "\x00" for p in ps)
    slots = [i for i, ch in enumerate(lit) if ch == "\x00"]
    read = [j for j, k in enumerate(entry["fact_keys"]) if k]
    cut = 0
    if read and read[-1] < len(slots):
        pos = slots[read[-1]] + 1
        cut = pos + re.match(r"\s*[^\s\x00]*", lit[pos:]).end()
    anchor = (entry.get("anchor") or "").replace("…", "\x00")
    if entry.get("marks") and anchor and (at := lit.find(anchor)) >= 0:
        cut = max(cut, at + len(anchor))
    if cut == 0:
        cut = len(lit)
    kept = lit[:cut].split("\x00")
    out: list = []
    for i, text in enumerate(kept):
        if i:
            out.append(None)
        if text:
            out.append(text)
    return out, entry["units"][:len(kept) - 1]


def _literal(text: str) -> str:
    return r"\s+".join(re.escape(part) for part in re.split(r"\s+", text))


def compile_entry(entry: dict) -> re.Pattern:
    """The regex of one entry's ``matched_part``: its literal text escaped (runs of blanks as ``\\s+``), each
    placeholder a group (a number, or text), anywhere in a line (a log prefix before it, anything after)."""
    whole = pieces(entry)
    if sum(p is None for p in whole) != len(entry["units"]) or len(entry["units"]) != len(entry["fact_keys"]):
        raise ValueError(f"{entry['format']!r}: {sum(p is None for p in whole)} placeholders, {len(entry['units'])} "
                         f"units, {len(entry['fact_keys'])} fact keys")
    ps, units = matched_part(entry)
    out, n = [], 0
    for i, p in enumerate(ps):
        if p is not None:
            out.append(_literal(p.strip() if len(ps) == 1 else p.lstrip() if i == 0 else p.rstrip()
                                if i == len(ps) - 1 else p))
            continue
        unit = units[n]
        n += 1
        if unit in _NUMERIC:
            out.append(("(?<![\\d.])" if i == 0 else "") + f"({_NUM})")
        elif i == 0:  # text (a device name, a backend), bounded: a long line must not make a search quadratic
            out.append(r"(\S{0,120})")
        elif i == len(ps) - 1:
            out.append(r"(.{0,240})")
        else:
            out.append(r"(.{0,240}?)")
    # A line cut short (a paste's excerpt, a terminal's width) still gives the figures before the cut: after the first
    # placeholder and the word that follows it, the rest is optional, word by word and placeholder by placeholder.
    first = next((i for i, p in enumerate(ps) if p is None), len(ps))
    atoms: list[tuple[str, bool]] = []  # (regex, is a placeholder)
    for i, (part, piece) in enumerate(zip(out, ps)):
        if piece is None or i < first:
            atoms.append((part, piece is None))
        else:
            words = re.split(r"(\\s\+)", part)  # the literal's words and its \s+ runs
            atoms += [(w, False) for w in words if w]
    head_end = next((k for k in range(len(atoms)) if atoms[k][1]), len(atoms)) + 1  # through the first placeholder
    words = 0
    while head_end < len(atoms) and not atoms[head_end][1] and words < 3:  # and up to three words after it
        words += atoms[head_end][0] != r"\s+"
        head_end += 1
    chunks: list[str] = []  # a placeholder with the three words after it (what says what it is: "GiB for weight"),
    words_after = 3         # then each further word
    for regex, placeholder in atoms[head_end:]:
        if placeholder:
            chunks.append(regex)
            words_after = 0
        elif words_after < 3 and chunks:
            chunks[-1] += regex
            words_after += regex != r"\s+"
        else:
            chunks.append(regex)
    nested = ""
    for chunk in reversed(chunks):
        nested = f"(?:{chunk}{nested})?"
    return re.compile("".join(a for a, _ in atoms[:head_end]) + nested)


def _value(text: str, unit: str) -> Any:
    if unit == "text":
        return text.strip()
    plain = text.replace(",", "")
    if unit in _SCALE:
        return round(float(plain) * _SCALE[unit])
    if unit in ("bytes", "int"):
        return int(plain) if plain.lstrip("-").isdigit() else round(float(plain))
    return float(plain)


def _fragments(ps: list) -> list[tuple[str, bool, bool]]:
    """Each literal run, with whether a placeholder touches it on the left and on the right."""
    return [(p, i > 0, i < len(ps) - 1) for i, p in enumerate(ps) if p is not None]


def _keyword(ps: list) -> str | None:
    """The longest word (a run of letters) of the format's literal text that a line holding the message must hold
    as a word of its own: not at an edge of a literal run, where a placeholder's value or a log prefix could run
    into it; failing that, one at the message's own edges."""
    for edges in (False, True):
        best = None
        for text, left, right in _fragments(ps):
            for m in _WORD.finditer(text):
                if (m.start() == 0 and (left or not edges)) or (m.end() == len(text) and (right or not edges)):
                    continue
                if best is None or len(m.group(0)) > len(best):
                    best = m.group(0)
        if best is not None:
            return best
    return None


class _Compiled:
    __slots__ = ("entry", "rx", "needle", "keys", "units", "marks", "anchor_parts")

    def __init__(self, entry: dict):
        ps, _units = matched_part(entry)
        self.entry = entry
        self.rx = compile_entry(entry)
        first = next((i for i, p in enumerate(ps) if p is None), len(ps))
        head = [p for p in ps[:first + 2] if p is not None]  # what a line cut short still holds
        self.needle = max((w for text in head for w in re.split(r"\s+", text.strip())), key=len, default="")
        anchor = entry.get("anchor") or ""
        self.anchor_parts = [a.strip() for a in anchor.split("…") if a.strip()]
        self.keys = entry["fact_keys"]
        self.units = entry["units"]
        self.marks = [(k, entry.get("anchor") or k) for k in entry.get("marks", [])]


def _load() -> list[dict]:
    entries = json.loads(CATALOGUE_PATH.read_text(encoding="utf-8"))
    if not isinstance(entries, list):
        raise ValueError(f"{CATALOGUE_PATH.name}: not a list of entries")
    return entries


CATALOGUE: list[dict] = _load()
"""The entries of ``log_formats.json``, in its order."""

_COMPILED = [_Compiled(e) for e in CATALOGUE]
_BY_WORD: dict[str, list[int]] = {}
_ALWAYS: list[int] = []
for _i, _e in enumerate(CATALOGUE):
    _w = _keyword(matched_part(_e)[0])
    (_BY_WORD.setdefault(_w, []) if _w else _ALWAYS).append(_i)
_WORDS = tuple(sorted(_BY_WORD))
del _i, _e, _w


def needles() -> set[str]:
    """Each entry's longest literal fragment, lower-cased: a line holds one of them, or no entry matches it."""
    return {c.needle.lower() for c in _COMPILED}


def anchors() -> list[str]:
    """The anchor phrases the catalogue's entries were picked by (``…`` for a placeholder), each once."""
    return sorted({e["anchor"] for e in CATALOGUE if e.get("anchor")})


def match_line(line: str) -> list[tuple[dict, list[tuple[str, Any]]]]:
    """Each entry the line matches, with the facts it gives."""
    words = [w for w in _WORDS if w in line]  # (a substring test: the entries' own needles and patterns decide)
    if not words and not _ALWAYS:
        return []
    candidates = sorted({i for w in words for i in _BY_WORD[w]}.union(_ALWAYS))
    out = []
    for i in candidates:
        c = _COMPILED[i]
        if c.needle not in line:
            continue
        m = c.rx.search(line)
        if m is None:
            continue
        facts: list[tuple[str, Any]] = []
        for key, unit, text in zip(c.keys, c.units, m.groups()):
            if key is None or text is None:  # (a placeholder after where the line was cut)
                continue
            try:
                facts.append((key, _value(text, unit)))
            except (ValueError, OverflowError):  # a figure no float or integer holds: no fact
                continue
        if all(a in line for a in c.anchor_parts):  # a mark only where the message's own words are on the line
            facts.extend(c.marks)
        out.append((c.entry, facts))
    return out


def read_line(line: str) -> list[tuple[str, Any]]:
    """The ``(fact_key, value)`` pairs a log line gives, each pair once, in catalogue order."""
    seen: set[tuple[str, Any]] = set()
    out = []
    for _entry, facts in match_line(line):
        for f in facts:
            if f not in seen:
                seen.add(f)
                out.append(f)
    return out


def _literal_words(entry: dict) -> frozenset[str]:
    """The words (3 letters or more, lower-cased) of a format's literal text."""
    return frozenset(_WORD.findall(" ".join(p for p in pieces(entry) if isinstance(p, str)).lower()))


def _literal_runs(entry: dict) -> tuple[tuple[str, frozenset[str]], ...]:
    """The literal runs of a format between its placeholders that hold 8 words or more (3 letters or more, lower-cased,
    joined by one blank), each with its words."""
    return tuple((" ".join(w), frozenset(w)) for p in pieces(entry)
                 if isinstance(p, str) and len(w := _WORD.findall(p.lower())) >= 8)


_MARKED = [(c, words, _literal_runs(c.entry)) for c in _COMPILED if c.marks
           and len(words := _literal_words(c.entry)) >= 8]
"""The messages that mark a fact, each with its literal words (8 or more: a shorter one is a phrase) and its long
literal runs."""
_TOKEN = re.compile(r"[a-z0-9]+")
_ANCHORED = tuple(sorted({(" ".join(_TOKEN.findall(anchor.lower())), (key, anchor)) for c in _COMPILED
                          for key, anchor in c.marks if "…" not in anchor and len(_WORD.findall(anchor.lower())) >= 5}))
"""Each marking message's anchor, the phrase it was catalogued by (5 words of 3 letters or more, no placeholder), as
all its words (a "no" included) joined by one blank, with the fact it marks: a line that says that phrase, in any case,
retells the message."""
_ANCHOR_WORDS = tuple(sorted({max(anchor.split(), key=len) for anchor, _ in _ANCHORED}))
"""The longest word of each anchor, looked for first."""
_MARKED_WORDS = frozenset().union(*(words for _, words, _ in _MARKED))
_FEWEST = min(min(0.8 * len(words) for _, words, _ in _MARKED),
              min(len(its) for _, _, runs in _MARKED for _, its in runs))
"""Every word of those messages, and the fewest of them a line that retypes one (four in five) or quotes a run of one
(a run's distinct words) holds."""


def retyped(line: str) -> list[tuple[str, Any]]:
    """The marks of a message that marks a fact (vLLM's refusals: ``kv_capacity_error``, ...) where the line holds
    four in five of its words but no format matches it: the message retyped by hand, with a typo or without its
    figures ("the model's max seq len (32768) is larger than the maxinum number of tokens that can be stored in KV
    cache"), or cut from the log's prefix; or one literal run of it between two figures, whole ("KV cache is needed,
    which is larger than the available KV cache memory": the message quoted in part); or its anchor, the phrase it is
    known by, in any case ("received the error no available memory for the cache blocks during allocation",
    ``_ANCHORED``). Only messages and runs of 8 words or more, and anchors of 5: a shorter one is a phrase, not a
    message."""
    low = line.lower()
    if "cache" not in low and "memory" not in low:
        return []
    out: list[tuple[str, Any]] = []
    if any(w in low for w in _ANCHOR_WORDS):
        told = " " + " ".join(_TOKEN.findall(low)) + " "
        out = list(dict.fromkeys(m for anchor, m in _ANCHORED if f" {anchor} " in told))
    found = _WORD.findall(low)
    words = _MARKED_WORDS.intersection(found)
    if len(words) < _FEWEST:
        return out
    said = " " + " ".join(found) + " "
    for c, literal, runs in _MARKED:
        held = literal & words
        if len(held) < 0.8 * len(literal):
            quoted = [run for run, its in runs if its <= held]  # (a run is checked in order only where its words are)
            if not quoted:
                continue
            if not any(f" {run} " in said for run in quoted):
                continue
        out += [m for m in c.marks if m not in out]
    return out
