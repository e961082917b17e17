"""Release versions as sortable keys, for vLLM's and vllm-ascend's release eras alike."""

from __future__ import annotations

import re


def version_key(v: str) -> tuple:
    """A sortable key for a release version: ``0.11.0rc2`` < ``0.11.0`` < ``0.11.0.post1`` < ``0.11.1``; what is
    no version (a part of more than 18 digits, too) sorts first."""
    m = re.match(r"^(\d{1,18})\.(\d{1,18})(?:\.(\d{1,18}))?(?:rc(\d{1,18}))?(?:\.post(\d{1,18}))?(?!\d)", v)
    if not m:
        return (0,)
    major, minor, patch, rc, post = m.groups()
    return (int(major), int(minor), int(patch or 0), int(rc) if rc is not None else 1 << 20, int(post or 0))


def is_release(text: str) -> bool:
    """Whether ``text`` names a release to emulate (``0.11.0``, ``0.11.1rc2.dev148+gabc``): ``--vllm-version``, and a
    server's ``/version``."""
    return re.fullmatch(r"\d{1,3}\.\d{1,3}(\.\d{1,3})?\S{0,40}", text) is not None
