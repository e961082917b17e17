"""Foreign text (from reports, policies, configs, saved files) made safe for each document kvaudit writes:
XML 1.0 (JUnit, SVG, HTML), GitHub Markdown (triage's report) and the terminal. No torch, no vLLM, no rich."""

from __future__ import annotations

import re
from typing import Any

XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
"""Characters XML 1.0 allows in no document (https://www.w3.org/TR/xml/#charsets), escaped or not."""


def xml_safe(text: Any) -> str:
    """``text`` without the characters XML 1.0 forbids (a control character in a policy's ``why`` made the
    JUnit file and the SVG unreadable to every XML parser)."""
    return XML_INVALID.sub("", str(text))


TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 and C1 control characters but newline and tab: ESC starts the sequences that set a window's title, clear the
screen or move the cursor, and rich passes it through."""


def terminal_safe(text: Any) -> str:
    """``text`` with each control character shown as its escape (``\\x1b``), so a name from a policy, a saved report
    or a config reaches the terminal as text, never as a command to it."""
    return TERMINAL_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def terminal_safe_tree(value: Any) -> Any:
    """Every string of decoded JSON or TOML (keys too) through ``terminal_safe``; other values as they are."""
    if isinstance(value, str):
        return terminal_safe(value) if TERMINAL_CONTROL.search(value) else value
    if isinstance(value, dict):
        return {terminal_safe_tree(k): terminal_safe_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [terminal_safe_tree(v) for v in value]
    return value


_TICKS = re.compile(r"`+")
_LINKISH = re.compile(r"(?<!\S)\S*?(?:@|://)\S*|(?<!\S)www\.\S*")
"""Tokens GitHub turns into a mention, an e-mail link or a URL link even without Markdown syntax (each tried from
a token's start only: a long token without one costs one pass, not one per character)."""
_ACTIVE = re.compile(r"[\\`*_~\[\]<>&#|!]")
_ENTITY = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
_BLOCK_START = re.compile(r"^(\s*)([-+>=]|\d+[.)])")


def md_code(text: Any) -> str:
    """``text`` as one inline code span, whatever it holds: fenced by more backticks than its longest run
    (CommonMark's rule), spaced where it starts or ends with one, on one line."""
    text = " ".join(str(text).split("\n"))
    longest = max((len(m.group(0)) for m in _TICKS.finditer(text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or (text.startswith(" ") and text.endswith(" ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _literal(text: str) -> str:
    """Plain text that Markdown shows as it is: no emphasis, link, image, HTML, heading or list starts, and the
    tokens GitHub links by themselves (mentions, e-mail addresses, URLs) inside code spans."""
    out, at = [], 0
    for m in _LINKISH.finditer(text):
        out.append(_escaped(text[at:m.start()]))
        out.append(md_code(m.group(0)))
        at = m.end()
    out.append(_escaped(text[at:]))
    return "".join(out)


def _escaped(text: str) -> str:
    return _ACTIVE.sub(lambda m: _ENTITY.get(m.group(0), "\\" + m.group(0)), text)


def md(text: Any, cell: bool = False) -> str:
    """A line of kvaudit's Markdown (its words, with values and report lines in it) that renders as written:
    code spans (a run of backticks up to the next run of the same length, as CommonMark reads them) are kept,
    everything else is literal text (``_literal``); on one line. In a table ``cell`` a ``|`` in a code span is
    escaped too (GitHub splits a table's cells before it reads code spans)."""
    text = " ".join(str(text).splitlines())
    out, at = [], 0
    runs = list(_TICKS.finditer(text))
    i = 0
    while i < len(runs):
        opening = runs[i]
        close = next((j for j in range(i + 1, len(runs)) if len(runs[j].group(0)) == len(opening.group(0))), None)
        if close is None:  # no closing run: the backticks are literal
            i += 1
            continue
        out.append(_literal(text[at:opening.start()]))
        span = text[opening.start():runs[close].end()]
        out.append(span.replace("|", "\\|") if cell else span)
        at = runs[close].end()
        i = close + 1
    out.append(_literal(text[at:]))
    line = "".join(out)
    if cell:  # a cell starts no block
        return line
    return _BLOCK_START.sub(lambda m: m.group(1) + "\\" + m.group(2) if not m.group(2)[0].isdigit()
                            else m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], line, count=1)


