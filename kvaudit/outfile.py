"""Write a file a user names (a page, a JUnit report, a saved plan): checked before the work, written atomically.

A regular file is written to a temporary file in the same folder, flushed to the disk, and renamed over the old
one (``os.replace``), so the old file stays whole until the new one is complete: a full disk or an interrupted run
leaves the previous file as it was and no partial one. A symbolic link is followed (its target is written and the
link kept). A device or a FIFO the user names (``/dev/null``, ``/dev/stdout``) is written in place, since it cannot
be renamed over.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from kvaudit.errors import UsageError

_TMP_PREFIX = ".kvaudit-"


def target(path: str | Path) -> Path:
    """The file a write to ``path`` changes: ``~`` expanded and symbolic links followed (a dangling link's target)."""
    return Path(os.path.realpath(Path(path).expanduser()))


def _in_place(t: Path) -> bool:
    """Whether ``t`` is a device or FIFO, written in place rather than renamed over."""
    try:
        return not stat.S_ISREG(t.stat().st_mode) and not t.is_dir()
    except OSError:
        return False


def check(path: str | Path) -> None:
    """Refuse, before any work, a file that cannot be written: a folder, a missing folder (a dangling link's
    too), no write permission, a read-only or pseudo file system (/proc), a full disk. ``UsageError`` (exit 2)."""
    name = str(path)
    t = target(path)
    shown = name if str(t) == os.path.abspath(os.path.expanduser(name)) else f"{name} (→ {t})"
    if t.is_dir():
        raise UsageError(f"{shown} is a directory, not a file to write")
    if _in_place(t):
        if not os.access(t, os.W_OK):
            raise UsageError(f"cannot write {shown}: Permission denied")
        return
    if not t.parent.is_dir():
        raise UsageError(f"cannot write {shown}: folder {t.parent} does not exist")
    try:
        if t.exists() and not os.access(t, os.W_OK):
            raise PermissionError(13, "Permission denied")
        fd, probe = tempfile.mkstemp(dir=t.parent, prefix=_TMP_PREFIX + "write-check-")
        os.close(fd)
        os.unlink(probe)
        if shutil.disk_usage(t.parent).free == 0:
            raise OSError(28, "No space left on device")
    except OSError as e:
        raise UsageError(f"cannot write {shown}: {e.strerror or e}") from None


def write(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically and return the file written; ``OSError`` if it could not be,
    with nothing changed at ``path``."""
    data = text.encode("utf-8", "replace")
    t = target(path)
    if _in_place(t):
        with open(t, "wb") as f:
            f.write(data)
        return t
    fd, tmp = tempfile.mkstemp(dir=t.parent, prefix=_TMP_PREFIX + t.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:  # the old file's permissions, or a new file's as open() would make it (mkstemp makes 0600)
            mode = stat.S_IMODE(t.stat().st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, t)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return t
