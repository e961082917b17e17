"""Tables that fit the terminal they are printed in: figures, ratios and verdicts are never cut, text columns wrap,
and a terminal too narrow for every column gets one block per row instead.

rich shrinks every column of a table wider than the console and cuts what no longer fits with an ellipsis ("3.1…",
"P…"). ``Fitted`` lays a rich ``Table`` out at render time, for the width it is given: as built where it fits; else
with its text columns narrowed and wrapped (``overflow="fold"``: a word longer than its column is broken, never cut)
and every other column at its full width; else the same without the box; else with a text column moved under the
table or a column another table shows left out; else, where even that does not fit, as one key-value block per row.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable
from typing import Any

_FLOOR = 8
"""The narrowest a wrapped text column is made (wider where its longest figure needs it)."""
_DIGIT = re.compile(r"\d")


def fitted(table: Any, wrap: Iterable[str] = (), below: Iterable[str] = (), drop: Iterable[str] = (),
           narrow: Any = None) -> "Fitted":
    """``table`` laid out for any width; ``wrap`` names its text columns (by header), the ones that may wrap;
    ``below`` the text columns a narrow terminal may move under the table; ``drop`` those it may leave out (what
    another table shows too); ``narrow`` what to show where the table does not fit even wrapped (a smaller
    ``Fitted``, such as a grid of verdicts), in place of one block per row."""
    return Fitted(table, wrap, below, drop, narrow)


class Fitted:
    """A rich ``Table`` that chooses its layout when rendered (``__rich_console__``); see the module's docstring."""

    def __init__(self, table: Any, wrap: Iterable[str] = (), below: Iterable[str] = (),
                 drop: Iterable[str] = (), narrow: Any = None) -> None:
        self.table = table
        self.wrap = frozenset(wrap)
        self.below = frozenset(below)
        self.drop = frozenset(drop)
        self.narrow = narrow

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield self.layout(console, options.max_width)

    def __rich_measure__(self, console: Any, options: Any) -> Any:
        from rich.measure import Measurement

        return Measurement.get(console, options, self.layout(console, options.max_width))

    def layout(self, console: Any, width: int) -> Any:
        """The renderable for ``width`` columns, the first of these that fits: the table as built; with its text
        columns wrapped at spaces; the same without the box (one space between columns); that with the columns
        ``below`` names moved under it and those ``drop`` names left out; those with words broken; ``narrow``
        where given, else one block per row."""
        t = self.table
        if _natural_width(console, t) <= width:
            return t
        compact = copy.copy(t)
        compact.box, compact.padding, compact.pad_edge = None, (0, 1, 0, 0), False
        candidates = [t, compact]
        if self.below or self.drop:
            candidates.append(self._fewer(compact))
        for whole_words in (True, False):
            for candidate in candidates:
                narrowed = self._wrapped(console, candidate, width, whole_words)
                if narrowed is not None:
                    return narrowed
        return self.narrow if self.narrow is not None else self._blocks()

    def _fewer(self, t: Any) -> Any:
        """``t`` without the columns ``below`` and ``drop`` name: the first under the table, one line per row (its
        first cell, then the moved ones), the others named as left out."""
        from rich.console import Group
        from rich.text import Text

        moved = [c for c in t.columns if str(c.header) in self.below]
        left_out = [str(c.header) for c in t.columns if str(c.header) in self.drop]
        fewer = copy.copy(t)
        kept = [c for c in t.columns if c not in moved and str(c.header) not in self.drop]
        fewer.columns = [dataclasses.replace(c, _index=i) for i, c in enumerate(kept)]  # (rich pads by position)
        lines: list[Any] = [t.caption] if t.caption else []
        for c in moved:
            key = t.columns[0]
            lines += [Text.assemble(f"{c.header} of ", _text(key._cells[r]), ": ", _text(c._cells[r]), justify="left")
                      for r in range(t.row_count)]
        if left_out:
            lines.append(Text(f"({', '.join(left_out)}: left out at this width)", justify="left"))
        fewer.caption_justify = "left"
        fewer.caption = Group(*(Text.from_markup(x) if isinstance(x, str) else x for x in lines)) if lines else None
        return fewer

    def _wrapped(self, console: Any, t: Any, width: int, whole_words: bool) -> Any:
        """``t`` with its text columns narrowed to fit ``width`` and wrapped (at spaces, or also inside words), every
        other column as wide as its widest cell (its header may wrap at a space); ``None`` where that does not
        fit."""
        cols = t.columns
        text = [i for i, c in enumerate(cols) if str(c.header) in self.wrap]
        sizes = [_Sizes.of(console, c) for c in cols]
        widths = [max(z.cells_max, z.header_min) for z in sizes]
        natural = [max(widths[i], sizes[i].header_max) if i in text else widths[i] for i in range(len(cols))]
        floors = {i: min(natural[i], max(sizes[i].cells_min, sizes[i].header_min) if whole_words
                         else max(_FLOOR, _longest_figure(cols[i]._cells), sizes[i].header_min)) for i in text}
        room = width - _extra_width(t) - sum(w for i, w in enumerate(widths) if i not in text)
        if room < sum(floors.values()):
            return None
        spare = room - sum(floors.values())
        want = {i: natural[i] - floors[i] for i in text}
        for n, i in enumerate(sorted(text, key=lambda i: want[i])):  # the room left, shared evenly; a column that
            give = min(want[i], spare // (len(text) - n))            # needs less than its share is made whole and
            widths[i] = floors[i] + give                              # leaves the rest to the wider ones
            spare -= give
        narrowed = copy.copy(t)
        narrowed.columns = [dataclasses.replace(c, width=widths[i], min_width=None, max_width=None, no_wrap=False,
                                                overflow="fold") for i, c in enumerate(cols)]
        return narrowed

    def _blocks(self) -> Any:
        """One block per row: each column's header beside the row's cell, the cell wrapped, never cut."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        t = self.table
        parts: list[Any] = []
        if t.title:
            parts.append(t.title if not isinstance(t.title, str) else Text.from_markup(t.title, style="table.title"))
        for r in range(t.row_count):
            grid = Table.grid(padding=(0, 2))
            grid.add_column(no_wrap=True, style="bold")
            grid.add_column(overflow="fold")
            for c in t.columns:
                cell = c._cells[r]
                if cell not in ("", None):
                    grid.add_row(c.header, cell)
            parts.append(Text(""))
            parts.append(grid)
        if t.caption:
            parts.append(Text(""))
            parts.append(t.caption if not isinstance(t.caption, str) else Text.from_markup(t.caption,
                                                                                           style="table.caption"))
        return Group(*parts)


@dataclasses.dataclass(frozen=True)
class _Sizes:
    """A column's widths as rich measures them: its cells' and its header's, widest (maximum) and longest word
    (minimum)."""

    cells_max: int
    cells_min: int
    header_max: int
    header_min: int

    @classmethod
    def of(cls, console: Any, c: Any) -> "_Sizes":
        return cls(_width(console, c._cells, lambda m: m.maximum), _width(console, c._cells, lambda m: m.minimum),
                   _width(console, [c.header], lambda m: m.maximum), _width(console, [c.header], lambda m: m.minimum))


def _width(console: Any, renderables: list[Any], pick: Any) -> int:
    from rich.measure import Measurement

    options = console.options.update(max_width=10_000)
    return max((pick(Measurement.get(console, options, r)) for r in renderables if r is not None), default=0)


def _text(cell: Any) -> Any:
    from rich.text import Text

    return cell if isinstance(cell, Text) else Text.from_markup(cell) if isinstance(cell, str) else Text(str(cell))


def _natural_width(console: Any, t: Any) -> int:
    """The width ``t`` takes with every column as wide as its widest cell or header."""
    return _extra_width(t) + sum(_width(console, [c.header, *c._cells], lambda m: m.maximum) for c in t.columns)


def _longest_figure(cells: list[Any]) -> int:
    """The widest word that holds a figure in a text column's cells ("0.12–0.15", "21/60"): a column whose words
    are broken is never made too narrow to hold such a word whole."""
    return max((len(w) for cell in cells for w in _text(cell).plain.split() if _DIGIT.search(w)), default=0)


def _extra_width(t: Any) -> int:
    """What a rich table adds to its columns' content: the padding of each column and the box's rules."""
    n = len(t.columns)
    borders = ((2 if t.show_edge else 0) + n - 1) if t.box else 0
    return borders + sum(t._get_padding_width(i) for i in range(n))

