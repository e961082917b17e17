"""``python -m kvaudit``: the same as the ``kvaudit`` command."""

from kvaudit.cli import run

run()
