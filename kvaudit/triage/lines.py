"""Where words occur in a report's lines: one pass over the whole text for every word at once (Aho-Corasick, by the
``ahocorasick_rs`` package), else one substring search per word, so that each pattern runs only on the lines that can
hold it (most log lines hold none)."""

from __future__ import annotations

import bisect

try:
    import ahocorasick_rs
except ImportError:  # (a platform without its wheel: the same answer, one search per word)
    ahocorasick_rs = None

_AUTOMATA: dict[tuple[str, ...], object] = {}


def lines_holding(lows: list[str], words: tuple[str, ...] | set[str]) -> dict[str, set[int]]:
    """For each word, the (1-based) lines of ``lows`` (lower-cased) that hold it."""
    text = "\n".join(lows)
    starts = [0]
    for low in lows:
        starts.append(starts[-1] + len(low) + 1)
    ordered = tuple(sorted(set(words)))
    where: dict[str, set[int]] = {word: set() for word in ordered}
    if ahocorasick_rs is not None and "" not in where:
        automaton = _AUTOMATA.get(ordered)
        if automaton is None:
            automaton = _AUTOMATA[ordered] = ahocorasick_rs.AhoCorasick(ordered)
        for k, start, _ in automaton.find_matches_as_indexes(text, overlapping=True):
            where[ordered[k]].add(bisect.bisect_right(starts, start))
        return where
    return _one_word_at_a_time(text, starts, where)


def _one_word_at_a_time(text: str, starts: list[int], where: dict[str, set[int]]) -> dict[str, set[int]]:
    """One substring search over the whole text per word."""
    for word, found in where.items():
        i = text.find(word)
        while i != -1:
            n = bisect.bisect_right(starts, i)  # 1-based line number
            found.add(n)
            i = text.find(word, starts[n])
    return where
