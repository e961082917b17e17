"""Run ``kvaudit`` as if some packages were not installed: ``python tests/without.py vllm,torch ARGS...``.

The packages named are hidden from imports (``ModuleNotFoundError``, as on a host without them) and
from package metadata (``PackageNotFoundError``); the command's exit code is the process's. Before
exiting it prints, on stderr, which of the hidden packages' modules were imported (none can be).
"""

import importlib.abc
import importlib.metadata
import sys

HIDDEN = set(sys.argv[1].split(","))


class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Hide())
_version = importlib.metadata.version


def _hidden_version(name):
    if name in HIDDEN:
        raise importlib.metadata.PackageNotFoundError(name)
    return _version(name)


importlib.metadata.version = _hidden_version

from kvaudit.cli import main  # noqa: E402

code = main(sys.argv[2:])
imported = sorted({m.split(".")[0] for m in sys.modules} & HIDDEN)
print("imported: " + (",".join(imported) or "none"), file=sys.stderr)
sys.exit(code)
