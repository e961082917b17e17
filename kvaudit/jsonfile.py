"""Read a file a user names (a config.json, a saved plan or report, a policy): every failure one line naming the file.

Only regular files are read (``/dev/zero``, a FIFO or a folder is refused before a byte is read), at most
``MAX_BYTES`` of them; JSON as Python reads it (``Infinity`` too, which configs such as Nemotron-H's hold),
but no integer over Python's 4,300 digits and no nesting deeper than its recursion allows; each refusal a
``UsageError`` (exit 2).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from kvaudit.errors import UsageError

MAX_BYTES = 64 << 20
"""Far above any file kvaudit reads (Gemma 3 27B's 62 layers under the four built-ins: a 330 KB report;
the largest config.json shipped: 6 KB)."""


def read_bytes(path: str | Path, kind: str, how: str, limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path``, or ``UsageError`` (exit 2) saying why not: ``kind`` is what the
    file should be ("kvaudit plan file"), ``how`` how to get one ("write one with kvaudit plan ..."); at most
    ``limit`` bytes (default ``MAX_BYTES``)."""
    name = str(path)
    limit = MAX_BYTES if limit is None else limit
    p = Path(path).expanduser()
    try:
        st = p.stat()
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{name}: a directory, not a {kind} ({how})")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{name}: not a regular file (a device, pipe or socket), not a {kind} ({how})")
        if st.st_size > limit:
            raise UsageError(f"{name}: larger than {limit:,} B, not a {kind} ({how})")
        with p.open("rb") as f:
            raw = f.read(limit + 1)  # a file that grows while read stops at the limit too
    except FileNotFoundError:
        raise UsageError(f"{name}: no such file ({how})") from None
    except OSError as e:
        raise UsageError(f"{name}: cannot be read: {e.strerror or e}") from None
    if len(raw) > limit:
        raise UsageError(f"{name}: larger than {limit:,} B, not a {kind} ({how})")
    if not raw.strip():
        raise UsageError(f"{name}: empty file, not a {kind} ({how})")
    return raw


def parse_json(raw: bytes | str, name: str, kind: str, how: str) -> Any:
    """The JSON document ``raw`` holds; ``UsageError`` naming ``name`` when it is not one."""
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise UsageError(f"{name}: not JSON (not UTF-8 text; {how})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{name}: not JSON ({e.msg} at line {e.lineno} column {e.colno}; {how})") from None
    except RecursionError:
        raise UsageError(f"{name}: not a {kind} (JSON nested too deeply)") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise UsageError(f"{name}: not a {kind} ({' '.join(str(e).split()[:12])})") from None


def read_json(path: str | Path, kind: str, how: str) -> Any:
    """The JSON document at ``path`` (``read_bytes``, then ``parse_json``)."""
    return parse_json(read_bytes(path, kind, how), str(path), kind, how)
