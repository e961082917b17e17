"""Where words occur in a report's lines (kvaudit/triage/lines.py): the one-pass automaton and the search per word agree."""

from __future__ import annotations

import pytest

from conftest import ROOT
from kvaudit.triage import lines
from kvaudit.triage.evidence import _ALL_WORDS, clean_lines

_REPORTS = sorted(p for folder in ("threads", "develop", "held-out-1", "held-out-2")
                  for p in (ROOT / "fixtures" / "reports" / folder).glob("*.txt"))


def test_lines_holding_finds_each_word_on_its_lines():
    lows = ["out of memory on gpu 0", "no words here", "memory, memory", "", "GPU".lower()]
    got = lines.lines_holding(lows, ("memory", "out of memory", "gpu", "absent"))
    assert got == {"memory": {1, 3}, "out of memory": {1}, "gpu": {1, 5}}  # (only the words found)
    assert got["absent"] == set() and "absent" not in got
    assert got.any_of({"gpu", "out of memory", "absent"}) == {1, 5} and got.any_of(("memory", "gpu")) == {1, 3, 5}
    assert got.any_of(()) == set()


@pytest.mark.skipif(lines.ahocorasick_rs is None, reason="ahocorasick_rs is not installed")
def test_the_automaton_and_the_search_per_word_agree_on_every_shipped_report(monkeypatch):
    for path in _REPORTS:
        lows = [line.lower() for line in clean_lines(path.read_text(errors="replace"))]
        fast = lines.lines_holding(lows, _ALL_WORDS)
        monkeypatch.setattr(lines, "ahocorasick_rs", None)
        assert lines.lines_holding(lows, _ALL_WORDS) == fast, path.name
        monkeypatch.undo()
