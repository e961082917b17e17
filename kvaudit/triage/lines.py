"""Where words occur in a report's lines: one pass over the whole text for every word at once (Aho-Corasick, by the
``ahocorasick_rs`` package), else one substring search per word, so that each pattern runs only on the lines that can
hold it (most log lines hold none)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

try:
    import ahocorasick_rs
except ImportError:  # (a platform without its wheel: the same answer, one search per word)
    ahocorasick_rs = None

_NONE: frozenset[int] = frozenset()


class Words:
    """A fixed set of words to find, prepared once: sorted, with its automaton (a reader holds one per word list)."""

    def __init__(self, words: Iterable[str]):
        self.ordered = tuple(sorted(set(words)))
        self.automaton = (ahocorasick_rs.AhoCorasick(self.ordered)
                          if ahocorasick_rs is not None and self.ordered and "" not in self.ordered else None)


class Where(dict):
    """For each word some line holds, the (1-based) lines holding it; a word no line holds has none."""

    def __missing__(self, word: str) -> frozenset[int]:
        return _NONE

    def any_of(self, words: Iterable[str]) -> set[int]:
        """The lines that hold one of ``words``."""
        out: set[int] = set()
        for word in self.keys() & words if isinstance(words, (set, frozenset)) else words:
            out |= self[word]
        return out


def lines_holding(lows: list[str], words: Words | Iterable[str]) -> Where:
    """For each word of ``words`` that ``lows`` (lower-cased lines) hold, the (1-based) lines holding it; ``words``
    prepared (``Words``) or, built here each call, any iterable."""
    if not isinstance(words, Words):
        words = Words(words)  # (a reader prepares its words once, at import)
    text = "\n".join(lows)
    starts = [0]
    for low in lows:
        starts.append(starts[-1] + len(low) + 1)
    where = Where()
    if ahocorasick_rs is not None and words.automaton is not None:  # (the module's flag: a test turns it off)
        ordered = words.ordered
        for k, start, _ in words.automaton.find_matches_as_indexes(text, overlapping=True):
            n = bisect.bisect_right(starts, start)
            found = where.get(ordered[k])
            if found is None:
                where[ordered[k]] = {n}
            else:
                found.add(n)
        return where
    return _one_word_at_a_time(text, starts, words.ordered, where)


def _one_word_at_a_time(text: str, starts: list[int], ordered: tuple[str, ...], where: Where) -> Where:
    """One substring search over the whole text per word."""
    for word in ordered:
        i = text.find(word)
        while i != -1:
            n = bisect.bisect_right(starts, i)  # 1-based line number
            where.setdefault(word, set()).add(n)
            i = text.find(word, starts[n])
    return where
