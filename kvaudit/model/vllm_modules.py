"""vLLM reached through one door: its version read without importing it, and each of its modules imported with
what kvaudit quiets first (vLLM's logging and prints kept off stdout, which belongs to the report; no Hub access; no
device plugin autoloaded; a cache folder where HOME has none) and torchvision's ops declared. The planner, vLLM's
model built on meta, the triage's reading of vLLM's argument parser and a release's own code all import vLLM here."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.metadata
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from kvaudit.errors import MissingDependency

CACHE_DIRS: list[str] = []
"""Folders made for vLLM's cache where HOME has none (removed with the planner's temporary folders)."""


def vllm_version() -> str | None:
    """The installed vLLM's version, read from package metadata without importing vLLM."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def quiet_vllm() -> Iterator[None]:
    """Keep vLLM's logging and prints off stdout, which belongs to the report."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    if not (os.environ.get("VLLM_CACHE_ROOT") or os.environ.get("XDG_CACHE_HOME")) and not Path.home().is_dir():
        # vLLM caches its model registry's answers under ~/.cache/vllm, and would make a HOME that does not exist
        os.environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="kvaudit-vllm-cache-")
        CACHE_DIRS.append(os.environ["VLLM_CACHE_ROOT"])  # (removed with the model folders)
        atexit.register(shutil.rmtree, os.environ["VLLM_CACHE_ROOT"], True)
    for name in ("vllm", "torch._library.triton", "transformers"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    with contextlib.redirect_stdout(sys.stderr):
        yield


def require_vllm() -> None:
    """Refuse, in one line that says what to do instead, where vLLM is not installed."""
    if vllm_version() is None:
        raise MissingDependency("vLLM is not installed in this environment; kvaudit plans with vLLM's own planner: "
                                "install vllm (see README: install), or audit a saved plan with kvaudit audit --plan "
                                "PLAN.json, which needs only torch")


def module(name: str) -> ModuleType:
    """vLLM's module ``name`` (``vllm.config``), imported quietly (``quiet_vllm``) with torchvision's ops declared
    first (a missing package raises ``ModuleNotFoundError``, which the command line names in one line)."""
    with quiet_vllm():
        declare_torchvision_ops()  # before transformers looks for torchvision
        return importlib.import_module(name)


def declare_torchvision_ops() -> None:
    """Let a torchvision whose C++ extension cannot load (a CUDA wheel beside a CPU torch) import.

    vLLM's multimodal model files (Qwen3.5, Gemma 3) import transformers' image processors, which
    import torchvision. torchvision registers fake kernels for ``torchvision::nms`` and ``::qnms``
    at import, and that fails when its extension did not define them. On the first import of
    torchvision (a meta-path hook, so models that never import it pay nothing), kvaudit loads the
    extension itself; only when that fails does it declare the two schemas, which lets torchvision's
    Python part import. The ops stay unimplemented; nothing kvaudit runs calls them.
    """
    if "torchvision" in sys.modules or any(isinstance(f, _TorchvisionHook) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TorchvisionHook())


class _TorchvisionHook:
    """A meta-path finder that acts once, on the first ``import torchvision``, and finds nothing itself."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec("torchvision")
        if spec is None or not spec.submodule_search_locations:
            return None
        import glob
        import os

        import torch

        libs = glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "_C*.so"))
        try:
            for lib in libs:
                torch.ops.load_library(lib)
            if libs:
                return None
        except (OSError, RuntimeError):
            pass
        global _TORCHVISION_LIB
        _TORCHVISION_LIB = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            _TORCHVISION_LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        return None


_TORCHVISION_LIB: Any = None
