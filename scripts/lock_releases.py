"""Refresh kvaudit's lock of vllm-ascend release hashes (``kvaudit/strategies/release_hashes.json``) from PyPI.

    .venv/bin/python scripts/lock_releases.py

kvaudit runs a release's own ``setup.py`` and ``envs.py`` code in-process (``kvaudit.strategies.releases``), so
a cached sdist is trusted only when its SHA-256 is the one this lock holds, which comes from PyPI's JSON API
(``https://pypi.org/pypi/vllm-ascend/json``: each release's sdist and the ``sha256`` digest PyPI publishes for it).
A release newer than the lock is checked against the index when it is fetched and used; run this script to add it.
"""

from __future__ import annotations

import datetime
import json
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvaudit.strategies.releases import HASH_LOCK, PACKAGE, PYPI_JSON  # noqa: E402
from kvaudit.versions import version_key  # noqa: E402


def main() -> None:
    with urllib.request.urlopen(PYPI_JSON, timeout=60) as r:  # noqa: S310 - PyPI, the one source named
        doc = json.load(r)
    sdists = {}
    for version, files in doc["releases"].items():
        for f in files:
            if f.get("packagetype") == "sdist" and not f.get("yanked") and f.get("digests", {}).get("sha256"):
                sdists[version] = {"filename": f["filename"], "sha256": f["digests"]["sha256"].lower()}
    lock = {"package": PACKAGE, "source": PYPI_JSON, "refreshed": datetime.date.today().isoformat(),
            "sdists": {v: sdists[v] for v in sorted(sdists, key=version_key)}}
    HASH_LOCK.write_text(json.dumps(lock, indent=1) + "\n")
    print(f"{HASH_LOCK.relative_to(ROOT)}: {len(sdists)} {PACKAGE} sdists from {PYPI_JSON}")


if __name__ == "__main__":
    main()
