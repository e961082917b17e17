"""Read a JSON file a user names (a saved plan, a saved report), every failure one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvaudit.errors import UsageError

MAX_BYTES = 64 << 20
"""Far above any plan or report kvaudit writes (Gemma 3 27B's 62 layers under the four built-ins: a 330 KB report)."""


def read_json(path: str | Path, kind: str, how: str) -> Any:
    """The JSON document at ``path``, or ``UsageError`` (exit 2) saying why it cannot be one: ``kind`` is what
    the file should be ("kvaudit plan file"), ``how`` how to get one ("write one with kvaudit plan ...")."""
    name = str(path)
    p = Path(path).expanduser()
    try:
        if p.is_file() and p.stat().st_size > MAX_BYTES:
            raise UsageError(f"{name}: larger than {MAX_BYTES:,} B, not a {kind} ({how})")
        raw = p.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{name}: no such file ({how})") from None
    except IsADirectoryError:
        raise UsageError(f"{name}: a directory, not a {kind} ({how})") from None
    except OSError as e:
        raise UsageError(f"{name}: cannot be read: {e.strerror or e}") from None
    if not raw.strip():
        raise UsageError(f"{name}: empty file, not a {kind} ({how})")
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise UsageError(f"{name}: not JSON (not UTF-8 text; {how})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{name}: not JSON ({e.msg} at line {e.lineno} column {e.colno}; {how})") from None
    except RecursionError:
        raise UsageError(f"{name}: not a {kind} (JSON nested too deeply)") from None
