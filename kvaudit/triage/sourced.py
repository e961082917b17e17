"""How triage quotes what it read: a deployment value with where it came from (a report's line, a derivation or an
assumption), and a report's line as an answer shows it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvaudit.escape import md_code
from kvaudit.triage.evidence import Fact


@dataclass(frozen=True)
class Sourced:
    """A deployment value and where it came from: a report line, a derivation, or an assumption."""

    value: Any
    source: str

    @property
    def reported(self) -> bool:
        """Whether the report itself states the value: its source is a line or the title (``from_fact``), not a
        derivation or an assumption."""
        return self.source.startswith(("line ", "title"))

    def to_dict(self) -> dict:
        """JSON form."""
        return {"value": self.value, "source": self.source}


def from_fact(f: Fact, value: Any = None, note: str = "") -> Sourced:
    """A value the report states, with its line (``note`` appended to the source)."""
    return Sourced(f.value if value is None else value, f.source + note)


def assumed(value: Any, why: str) -> Sourced:
    """A value the report does not state: a default, and why it was taken."""
    return Sourced(value, f"assumed: {why}")


def short(text: str, limit: int = 150) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def where(f: Fact, width: int = 160) -> str:
    """``line N: `text` `` (or ``title: ...``) of a fact, its text cut to ``width``, as Markdown code."""
    return ("title" if f.line == 0 else f"line {f.line}") + f": {md_code(f.text[:width])}"
