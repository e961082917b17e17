"""``--strategy vllm-ascend==X``: audit a published vllm-ascend release's own allocation code.

kvaudit fetches the release's source distribution with pip into its cache (never into the
project), reads ``NPUModelRunner``'s allocation method from ``vllm_ascend/worker/model_runner_v1.py``
and runs it unchanged (``kvaudit.runner_code``) against the ``shared_by`` view of vLLM's plan,
made with the block-size rule of that release. vllm_ascend itself is never imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvaudit.errors import StrategyFailed, UsageError
from kvaudit.results import KVPlan
from kvaudit.runner_code import Extracted, SourceTree, extract_allocator
from kvaudit.strategies import RawTensors, Strategy

PACKAGE = "vllm-ascend"
RUNNER_MODULE = "vllm_ascend.worker.model_runner_v1"
RUNNER_CLASS = "NPUModelRunner"
SOC_VERSION = "ascend910b1"
"""vllm-ascend's setup.py needs a target chip to prepare its metadata on a host without npu-smi."""
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")


def cache_dir() -> Path:
    """Where fetched releases are kept: ``$KVAUDIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvaudit``."""
    env = os.environ.get("KVAUDIT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvaudit"


def version_key(v: str) -> tuple:
    """A sortable key for a release version: ``0.11.0rc2`` < ``0.11.0`` < ``0.11.0.post1`` < ``0.11.1``."""
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:rc(\d+))?(?:\.post(\d+))?", v)
    if not m:
        return (0,)
    major, minor, patch, rc, post = m.groups()
    return (int(major), int(minor), int(patch or 0), int(rc) if rc is not None else 1 << 20, int(post or 0))


ERAS = (
    # (first release not in the era, block-size rule, built-in strategy): allocation reference §0, §5.4
    ("0.11.0rc2", "ascend-align64", "ascend-0.11"),
    ("0.12.0rc1", "ascend-align128", "ascend-0.11"),
    ("0.16.0rc1", "ascend-align128", "ascend-0.12"),
    (None, "ascend-contiguous", "ascend-0.16"),
)
"""vllm-ascend's releases by how they plan and allocate a hybrid model's KV cache."""


FIRST_HYBRID = "0.10.2rc1"
"""The first vllm-ascend release that can allocate a hybrid plan; before it the allocation asserts one
layer per KV-cache tensor."""
ERA_PRS = {"0.12.0rc1": "#3760 (vllm-ascend PR: halves the per-layer duplication)",
           "0.16.0rc1": "#6887 (vllm-ascend PR: one buffer per shared tensor)"}
"""The pull requests that start an era, where the release notes name none."""
FIXED_IN = ERAS[-2][0]
"""The first vllm-ascend release that allocates a hybrid model's plan exactly: v0.16.0rc1, with
vllm-ascend PR #6887 (one buffer per shared tensor). PR #3760 (v0.12.0rc1) halved the waste."""
FIX_PR = "PR #6887: one buffer per shared tensor"


def era_range(start: str | None, end: str | None) -> str:
    """Releases from ``start`` to before ``end`` in words, e.g. ``vllm-ascend 0.12.0rc1 to before 0.16.0rc1``."""
    if start is None:
        return f"vllm-ascend before {end}"
    if end is None:
        return f"vllm-ascend {start} or later"
    return f"vllm-ascend {start} to before {end}"


def eras() -> list[tuple[str | None, str | None, str, str]]:
    """Each era as ``(first release, first release after it, block-size rule, built-in strategy)``."""
    out, start = [], None
    for end, rule, strategy in ERAS:
        out.append((start, end, rule, strategy))
        start = end
    return out


def is_before_fix(version: str) -> bool:
    """Whether a vllm-ascend release predates ``FIXED_IN``."""
    return version_key(version) < version_key(FIXED_IN)


def _era(version: str) -> tuple[str | None, str, str]:
    key = version_key(version)
    return next(e for e in ERAS if e[0] is None or key < version_key(e[0]))


def platform_for(version: str) -> str:
    """The block-size rule a vllm-ascend release plans with."""
    return _era(version)[1]


def builtin_strategy_for(version: str) -> str:
    """The built-in strategy that restates a vllm-ascend release's allocation."""
    return _era(version)[2]


def fetch_sdist(version: str) -> Path:
    """The release's sdist, from the cache or fetched with ``pip download`` into it."""
    if not _VERSION.match(version):
        raise UsageError(f"{PACKAGE}=={version}: not a release version (e.g. vllm-ascend==0.13.0)")
    target = cache_dir() / "sdists" / f"{PACKAGE}-{version}"
    found = sorted(target.glob("*.tar.gz")) if target.is_dir() else []
    if found:
        return found[0]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        env = dict(os.environ, SOC_VERSION=os.environ.get("SOC_VERSION", SOC_VERSION))
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "--disable-pip-version-check", "--retries", "1",
               f"{PACKAGE}=={version}", "-d", tmp]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        got = sorted(Path(tmp).glob("*.tar.gz"))
        if p.returncode != 0 or not got:
            raise _fetch_error(version, p.stdout + p.stderr)
        target.mkdir(exist_ok=True)
        final = target / got[0].name
        os.replace(got[0], final)
    return final


def _fetch_error(version: str, output: str) -> Exception:
    """pip's failure as one line: not on the index (exit 2), or could not fetch (exit 3)."""
    m = re.search(r"\(from versions: ([^)]*)\)", output)
    if m and m.group(1).strip() == "none":
        return StrategyFailed(f"could not fetch {PACKAGE}=={version}: the package index lists no {PACKAGE} "
                              "release (no network, or an index without it)")
    if m:
        near = [v for v in m.group(1).split(", ") if v.startswith(version.rsplit(".", 1)[0])][-4:]
        hint = f"; nearby: {', '.join(near)}" if near else ""
        return UsageError(f"{PACKAGE} {version} is not on the package index{hint}")
    if "No module named 'setuptools_scm'" in output:
        return StrategyFailed(f"fetching {PACKAGE}=={version} needs setuptools_scm in this environment "
                              "(pip install setuptools_scm): its sdist's metadata build imports it")
    errors = [line.strip() for line in output.splitlines() if "error" in line.lower() and line.strip()]
    return StrategyFailed(f"could not fetch {PACKAGE}=={version} with pip: "
                          f"{errors[-1] if errors else 'pip download failed'}")


def stand_in_attributes(device: Any, kv_transfer: bool) -> dict[str, Any]:
    """What vllm-ascend's allocation code may read from its runner, for a non-MLA, non-sparse
    model without FA quantization: the values ``NPUModelRunner.__init__`` sets in that case."""
    return {
        "device": device,
        "vllm_config": {"kv_transfer_config": _KVTransfer() if kv_transfer else None, "quant_config": None},
        "model_config": {"use_mla": False},
        "runner_only_attn_layers": set(),
        "use_sparse": False,
        "use_sparse_c8_indexer": False,
        "is_kv_consumer": False,
        "use_compress": False,
        "hybrid_with_attn_and_mamba": False,
    }


class _KVTransfer:
    """A KV-transfer config stand-in: the allocation code only tests it against ``None``."""

    is_kv_consumer = False
    is_kv_producer = True


def allocate_extracted(code: Extracted, plan: KVPlan, device: Any, kv_transfer: bool) -> RawTensors:
    """Run extracted vllm-ascend (or vLLM <= 0.28) allocation code against ``plan``."""
    return code.call(plan.shared_by_config(), stand_in_attributes(device, kv_transfer))


def release_strategy(version: str) -> Strategy:
    """The strategy that runs vllm-ascend ``version``'s own allocation code."""
    tarball = fetch_sdist(version)
    label = f"{PACKAGE} {version}"
    code = extract_allocator(SourceTree(label, tarball=tarball), RUNNER_MODULE, RUNNER_CLASS)
    return _code_strategy(f"{PACKAGE}=={version}", f"{code.method} from the {version} sdist", label, version, code)


def checkout_strategy(path: str) -> Strategy:
    """``--strategy vllm-ascend=PATH``: the allocation code of a vllm-ascend source checkout (the code
    under test in its CI, or a patch being written), run like a release's."""
    root = Path(path).expanduser().resolve()
    if not (root / RUNNER_MODULE.replace(".", "/")).with_suffix(".py").is_file():
        raise UsageError(f"vllm-ascend={path}: not a vllm-ascend source checkout (no "
                         f"{RUNNER_MODULE.replace('.', '/')}.py under it)")
    version = checkout_version(root)
    code = extract_allocator(SourceTree(f"{PACKAGE} checkout {root}", root=root), RUNNER_MODULE, RUNNER_CLASS)
    return _code_strategy(f"{PACKAGE}={root.name}", f"{code.method} from {root}",
                          f"{PACKAGE} checkout ({version or 'no version found'})", version, code)


def checkout_version(root: Path) -> str | None:
    """A checkout's version: ``vllm_ascend/_version.py`` (written by setuptools_scm on install), else
    ``git describe --tags``, else ``None`` (it is then planned with the newest era's rule)."""
    written = root / "vllm_ascend" / "_version.py"
    if written.is_file() and (m := re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]v?([^'"]+)['"]""",
                                              written.read_text(errors="replace"))):
        return m.group(1)
    if (root / ".git").exists():
        p = subprocess.run(["git", "-C", str(root), "describe", "--tags", "--abbrev=0"], capture_output=True, text=True)
        if p.returncode == 0 and (m := re.match(r"v?([0-9][\w.]*)", p.stdout.strip())):
            return m.group(1)
    return None


def _code_strategy(name: str, title: str, label: str, version: str | None, code: Extracted) -> Strategy:
    """A strategy that runs extracted vllm-ascend allocation code, planned with the block-size rule of
    its era (the newest era's when the version is unknown)."""
    platform = platform_for(version) if version else ERAS[-1][1]
    return Strategy(name=name, title=title, platform=platform, releases=label,
                    allocate=lambda plan, device, kv_transfer=False: allocate_extracted(code, plan, device, kv_transfer))
