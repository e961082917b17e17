"""Help screens: typer's rich panels (one per option group), each option drawn as one row of its names and value,
whole at any width, beside its help text.

typer's own panel (``typer.rich_utils._print_options_panel``, private) lays an option out over five columns that
shrink alike: at 80 columns it cut "--tp,--tensor-parallel-size" to "--tp,--tensor-para…", wrote ``<bool>`` beside
flags that take no value, and put ``-h`` on a row of its own. ``install`` puts this module's panel in its place;
typer still draws the usage, the command's text, the panels' order and titles, and each option's help and default.
"""

from __future__ import annotations

from typing import Any

_INDENT = 4
"""How far a help text starts under a name that is too long to have it beside."""


def install() -> None:
    """Draw every options panel with ``panel`` (once per process)."""
    from typer import rich_utils

    if not getattr(rich_utils._print_options_panel, "kvaudit", False):
        rich_utils._print_options_panel = panel


def panel(*, name: str, params: list[Any], ctx: Any, console: Any, **kwargs: Any) -> None:
    """One titled panel of ``params``: each row the option's names and value (``--tp, --tensor-parallel-size
    INT``), its help beside them; a name wider than a third of the panel has the help under it instead."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text
    from typer import rich_utils

    if not params:
        return
    rows = [(names(p), help_text(p, ctx, kwargs.get("markup_mode", "rich"))) for p in params]
    inner = max(20, console.width - 4)  # (the panel's border and padding)
    column = min(max(len(n) for n, _ in rows), max(12, inner // 3))
    parts: list[Any] = []
    for name_text, help_ in rows:
        grid = Table.grid(padding=(0, 2), expand=True)
        if len(name_text) > column:
            parts.append(Text(name_text, style="bold cyan", no_wrap=True, overflow="fold"))
            grid.add_column(width=_INDENT - 2, no_wrap=True)
            grid.add_column(ratio=1, overflow="fold")
            grid.add_row("", help_)
        else:
            grid.add_column(width=column, no_wrap=True)
            grid.add_column(ratio=1, overflow="fold")
            grid.add_row(Text(name_text, style="bold cyan"), help_)
        parts.append(grid)
    console.print(Panel(Group(*parts), title=name, title_align="left",
                        border_style=getattr(rich_utils, "STYLE_OPTIONS_PANEL_BORDER", "dim")))


panel.kvaudit = True  # type: ignore[attr-defined]


def names(param: Any) -> str:
    """An option's names as typed, then the value it takes (``--strategy, -s TEXT``, as ``Opt.metavar`` declares
    it; a flag none; a switch ``--x / --no-x``); an argument's name in capitals."""
    if getattr(param, "param_type_name", "") == "argument":
        return (param.metavar or str(param.name).upper()) + ("..." if param.nargs != 1 else "")
    shown = ", ".join(param.opts)
    if param.secondary_opts:
        return f"{shown} / {', '.join(param.secondary_opts)}"
    return f"{shown} {param.metavar}" if param.metavar and not getattr(param, "is_flag", False) else shown


def help_text(param: Any, ctx: Any, markup_mode: str) -> Any:
    """The option's help as typer writes it (with ``[default: ...]`` and ``[required]``), as one text that wraps
    at spaces."""
    from rich.columns import Columns
    from rich.text import Text
    from typer import rich_utils

    made = rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
    if isinstance(made, Columns):
        return Text(" ").join(r if isinstance(r, Text) else Text(str(r)) for r in made.renderables)
    return made
