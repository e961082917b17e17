"""The ``kvaudit`` command: ``app`` (the application, parsing and exit codes), ``options`` (every option,
declared once), ``output`` and ``deployments`` (what the commands share), and one module per command.
The rest of kvaudit imports nothing from here; ``main`` and ``run`` (``kvaudit.cli.app``) are the entry points."""

from __future__ import annotations

__all__ = ["main", "run"]


def __getattr__(name: str):
    # Lazy, as kvaudit's own __init__: importing one command module must not build the application.
    if name in __all__:
        from kvaudit.cli import app

        return getattr(app, name)
    raise AttributeError(name)
