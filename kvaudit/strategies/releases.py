"""``--strategy vllm-ascend==X`` and ``vllm-ascend=PATH``: a published vllm-ascend release's (or a source
checkout's) own allocation code, and the release eras kvaudit's built-in strategies restate.

kvaudit fetches the release's sdist with pip into its cache (never into the project), reads
``NPUModelRunner``'s allocation method from ``vllm_ascend/worker/model_runner_v1.py`` and runs it
unchanged (``kvaudit.strategies.runner_code``) on a stand-in runner made of vLLM's own objects, against vLLM's
plan in the format the code reads (vLLM's ``KVCacheConfig`` for 0.28+, the ``shared_by`` view
before), made with the block-size rule of that release. vllm_ascend itself is never imported.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvaudit.errors import KvauditError, NotAuditable, StrategyFailed, UsageError, first_line
from kvaudit.model.vllm_modules import module
from kvaudit.results import KVPlan
from kvaudit.strategies.runner_code import (Extracted, SourceTree, class_literals, extract_allocator, extract_method,
                                            installed_tree, run_extracted, stand_in)
from kvaudit.strategies.strategy import KVBudget, RawTensors, Strategy
from kvaudit.versions import version_key

PACKAGE = "vllm-ascend"
RUNNER_MODULE = "vllm_ascend.worker.model_runner_v1"
RUNNER_CLASS = "NPUModelRunner"
SOC_VERSION = "ascend910b1"
"""vllm-ascend's setup.py needs a target chip to prepare its metadata on a host without npu-smi."""
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")
HASH_LOCK = Path(__file__).with_name("release_hashes.json")
"""kvaudit's lock of vllm-ascend sdist hashes, from PyPI's JSON API (``scripts/lock_releases.py`` refreshes it)."""
PYPI_JSON = "https://pypi.org/pypi/vllm-ascend/json"


def cache_dir() -> Path:
    """Where fetched releases are kept: ``$KVAUDIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvaudit``."""
    env = os.environ.get("KVAUDIT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvaudit"


ERAS = (
    # (first release not in the era, block-size rule, built-in strategy): each release's
    # vllm_ascend/platform.py block-size rule and model_runner_v1.py allocation (kvaudit history shows them)
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
    """The release's sdist, from the cache or fetched with ``pip download`` into it. A cached sdist is used only
    while its SHA-256 is the one the package index published for it (recorded beside it when it was fetched,
    ``NAME.sha256.json``); a truncated, corrupt or unrecorded one is fetched again. Processes that want the same
    release at once take turns (a lock file beside its folder): the first fetches it, the others then find it."""
    if not _VERSION.fullmatch(version):
        raise UsageError(f"{PACKAGE}=={version!r}: not a release version (e.g. vllm-ascend==0.13.0)")
    if not (os.environ.get("KVAUDIT_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")) and not Path.home().is_dir():
        raise StrategyFailed(f"HOME ({Path.home()}) does not exist, so the release cache has no place: set "
                             "KVAUDIT_CACHE_DIR to a writable folder")
    target = cache_dir() / "sdists" / f"{PACKAGE}-{version}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _locked(target.with_name(f".{target.name}.lock")):
            return _cached_or_fetched(version, target)
    except OSError as e:  # a cache folder that cannot be written (read-only, full, not a folder)
        raise StrategyFailed(f"cannot use the release cache {cache_dir()}: {e.strerror or e} (set KVAUDIT_CACHE_DIR "
                             "to a writable folder)") from None


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (created), held while the block runs, for processes that share the cache. A
    cache that cannot be written is read without one (a fetch into it then fails as it would have)."""
    import fcntl

    try:
        f = path.open("a")
    except OSError:
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def locked_sha256(version: str) -> tuple[str, str] | None:
    """The sdist file name and SHA-256 kvaudit's lock holds for ``version`` (``HASH_LOCK``), or ``None``."""
    try:
        entry = json.loads(HASH_LOCK.read_text()).get("sdists", {}).get(version)
    except (OSError, ValueError, AttributeError):
        return None
    return (entry["filename"], entry["sha256"]) if isinstance(entry, dict) else None


VERIFIED: dict[Path, str] = {}
"""The sdists verified in this process, and against what (``kvaudit.strategies.releases.verified_by``)."""


def _cached_or_fetched(version: str, target: Path) -> Path:
    """``fetch_sdist`` under its lock. A cached sdist is used only while its SHA-256 is the one kvaudit's lock holds
    for the release, or, for a release newer than the lock, the one the index publishes now: the cache's own record
    is never trusted, since whoever can write the cache can write it too. Anything else is fetched again, and a
    fetched sdist is kept only when it passes the same check."""
    _sweep(target.parent)
    locked = locked_sha256(version)
    for found in sorted(target.glob("*.tar.gz")) if target.is_dir() else []:
        digest = _sha256(found)
        if locked is not None and (found.name, digest) == locked:
            VERIFIED[found] = f"kvaudit's lock of PyPI's hashes ({HASH_LOCK.name})"
            return found
        if locked is None:
            page = _recorded_index(found)
            published = _published_sha256(page, found.name) if page else None
            if published == digest:
                VERIFIED[found] = f"the hash {page} publishes"
                return found
            if published is None:
                raise StrategyFailed(f"cannot verify the cached {PACKAGE} {version} sdist: the release is not in "
                                     f"kvaudit's lock ({HASH_LOCK.name}; scripts/lock_releases.py adds it) and the "
                                     f"package index did not give its hash; nothing of it was run")
        found.unlink(missing_ok=True)  # not the published sdist (cut short, a disk error, replaced): fetched again
        _record(found).unlink(missing_ok=True)  # (another process repairing it at once may have removed both)
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        got, page = _download(version, Path(tmp))
        digest = _sha256(got)
        if locked is not None:
            published, source, verb = (locked[1] if locked[0] == got.name else None), \
                f"kvaudit's lock ({HASH_LOCK.name})", "holds"
        else:
            published, source, verb = (_published_sha256(page, got.name) if page else None), str(page), "publishes"
        if published != digest:
            why = (f"is not the one {source} {verb} (sha256 {published[:12]}…)" if published else
                   f"has no hash {source} publishes, so it cannot be verified")
            raise StrategyFailed(f"the {PACKAGE} {version} sdist pip fetched ({got.name}, sha256 {digest[:12]}…) "
                                 f"{why}; nothing was cached or run")
        final = target / got.name
        _record(final).write_text(json.dumps({"sha256": digest, "index": page, "published": True}) + "\n")
        os.replace(got, final)
    VERIFIED[final] = source if locked is not None else f"the hash {page} publishes"
    return final


STALE_S = 3600
"""A temporary folder in the cache older than this is a fetch that was killed (SIGKILL, a power cut): swept."""


def _sweep(sdists: Path) -> None:
    """Remove the temporary folders killed fetches left in the cache (a live fetch's is younger than ``STALE_S``)."""
    import shutil
    import time

    for tmp in sdists.glob("tmp*") if sdists.is_dir() else []:
        try:
            if tmp.is_dir() and time.time() - tmp.stat().st_mtime > STALE_S:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass


def _recorded_index(sdist: Path) -> str | None:
    """The index page the sdist was fetched from, as recorded beside it (where to ask for its hash again)."""
    try:
        page = json.loads(_record(sdist).read_text()).get("index")
    except (OSError, ValueError, AttributeError):
        return None
    return page if isinstance(page, str) and page.startswith(("https://", "http://", "file:")) else None


def _record(sdist: Path) -> Path:
    return sdist.with_name(sdist.name + ".sha256.json")


def _recorded_sha256(sdist: Path) -> str | None:
    try:
        digest = json.loads(_record(sdist).read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None
    return digest if isinstance(digest, str) else None


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(version: str, into: Path) -> tuple[Path, str | None]:
    """``pip download`` of the release's sdist into ``into``: the file, and the index page pip found it on (from
    pip's log: ``Found link URL (from PAGE)``), for its published hash."""
    env = dict(os.environ, SOC_VERSION=os.environ.get("SOC_VERSION", SOC_VERSION))
    log = into / "pip.log"
    from kvaudit import network

    network.started(f"fetching {PACKAGE} {version}'s sdist from the package index (pip download)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--no-build-isolation", "--disable-pip-version-check", *network.pip_options(), "--log", str(log),
           f"{PACKAGE}=={version}", "-d", str(into)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    got = sorted(into.glob("*.tar.gz"))
    if p.returncode != 0 or not got:
        raise _fetch_error(version, p.stdout + p.stderr)
    text = log.read_text(errors="replace") if log.is_file() else ""
    m = re.search(rf"Found link \S*/{re.escape(got[0].name)}\S* \(from (?P<page>\S+?)\)", text)
    return got[0], m["page"] if m else None


def _published_sha256(page: str, filename: str) -> str | None:
    """The SHA-256 the package index publishes for ``filename`` on its project page ``page``: the JSON form of the
    simple API (PEP 691), else the ``#sha256=`` fragment of the file's link (PEP 503); ``None`` where the page
    cannot be read or gives none (pip then checked nothing either)."""
    import urllib.request

    try:
        if page.startswith("file:"):
            folder = Path(urllib.request.url2pathname(page[5:].removeprefix("//")))
            body, ctype = (folder / "index.html").read_bytes(), "text/html"
        else:
            req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json, "
                                                                  "text/html;q=0.1"})
            from kvaudit import network

            with urllib.request.urlopen(req, timeout=network.timeout_s()) as r:  # noqa: S310 - pip's own index
                body, ctype = r.read(64 << 20), r.headers.get("Content-Type", "")
        if "json" in ctype:
            for f in json.loads(body).get("files", []):
                if f.get("filename") == filename:
                    digest = (f.get("hashes") or {}).get("sha256")
                    return digest.lower() if isinstance(digest, str) else None
            return None
        m = re.search(rf"/{re.escape(filename)}#sha256=(?P<h>[0-9a-fA-F]{{64}})", body.decode("utf-8", "replace"))
        return m["h"].lower() if m else None
    except (OSError, ValueError, AttributeError):
        return None


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


KV_CONNECTOR = "MooncakeConnectorV1"
"""The KV connector of a ``--kv-transfer`` deployment as release code sees it: the Mooncake connector
vllm-ascend's P/D guides deploy. From 0.28 the allocation depends on it (shared backing only for the
connectors a release lists); before, only ``kv_transfer_config is None`` is tested."""


def stand_in_runner(plan: KVPlan, device: Any, kv_transfer: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """What vllm-ascend's allocation code may read from its ``NPUModelRunner``: the attributes its
    ``__init__`` sets (from vLLM's real config objects of the plan, computed as ``__init__`` computes
    them) and the vLLM base-class methods it calls, bound to real vLLM objects: the attention groups
    are the built model's layers grouped by backend per KV-cache group, as vLLM's runner groups them.
    ``ascend_config`` carries vllm-ascend's defaults (no KV pooling, no xlite graph, no sparse KV
    offload). Anything else the code reads stops the audit, naming it."""
    from kvaudit.plan.planner import load_vllm

    load_vllm()
    vc = _with_kv_transfer(plan.vllm_config, kv_transfer)
    mc = vc.model_config
    offload = {"enabled": False, "keep_device_kv_cache": True}
    attributes = {
        "device": device, "vllm_config": vc, "model_config": mc, "compilation_config": vc.compilation_config,
        "cache_config": vc.cache_config, "kv_cache_config": plan.kv_cache_config,
        "ascend_config": {"kvpp_config": {"size": 1}, "xlite_graph_config": {"enabled": False},
                          "sparse_kv_offload_config": offload},
        "runner_only_attn_layers": set(), **_model_flags(vc),
        "use_sparse_c8_indexer": False, "is_kv_consumer": False, "hybrid_with_attn_and_mamba": False,
        "sparse_kv_offload_config": offload, "sparse_kv_offload_enabled": False, "tp_rank": 0, "dcp_size": 1,
        "attn_groups": _attention_groups(plan),
    }
    methods = {}
    iterator = _vllm_runner_method("_kv_cache_spec_attn_group_iterator")
    if iterator is not None:
        methods["_kv_cache_spec_attn_group_iterator"] = iterator  # vLLM's own, from its source
    return attributes, methods


def _with_kv_transfer(vllm_config: Any, kv_transfer: bool) -> Any:
    """A copy of the plan's vLLM config with the KV connector a ``--kv-transfer`` deployment sets (or none)."""
    vc = copy.copy(vllm_config)
    if kv_transfer:
        KVTransferConfig = module("vllm.config").KVTransferConfig
        object.__setattr__(vc, "kv_transfer_config", KVTransferConfig(kv_connector=KV_CONNECTOR,
                                                                      kv_role="kv_producer"))
    else:
        object.__setattr__(vc, "kv_transfer_config", None)
    return vc


def _model_flags(vllm_config: Any) -> dict[str, bool]:
    """``use_compress`` and ``use_sparse`` as ``NPUModelRunner.__init__`` computes them from the model's
    config (compressed KV: DeepSeek-V4's ``compress_ratios``; sparse attention: an ``index_topk``)."""
    mc = vllm_config.model_config
    text = getattr(mc, "hf_text_config", mc.hf_config)
    use_compress = hasattr(mc.hf_config, "compress_ratios")
    return {"use_compress": use_compress, "use_sparse": hasattr(text, "index_topk") and not use_compress}


WORKER_MODULE = "vllm_ascend.worker.worker"
WORKER_CLASS = "NPUWorker"
SCALE_BUDGET = "_scale_kv_cache_memory_for_multi_group"
_RUNNER_FLAGS = ("supports_standardized_shared_kv_backing", "supports_shared_backing_with_kv_transfer")
"""What the worker's budget code reads of its model runner class besides ``use_sparse``/``use_compress``:
a class-level flag (0.28+) and, in 0.29, a property of the KV connector."""


def kv_budget_rule(tree: SourceTree, label: str, built: dict[str, dict[str, Any]] | None = None) -> KVBudget | None:
    """The release's own ``NPUWorker._scale_kv_cache_memory_for_multi_group`` (vllm-ascend 0.28+, worker.py):
    where its model runner keeps a private buffer per layer for several KV-cache groups, it hands vLLM's
    planner the budget × (largest group's page bytes / all groups' page bytes), so that vLLM plans fewer
    blocks and those buffers fit. ``None`` for a tree whose worker has no such method (it plans with the
    whole budget). Run on a stand-in worker: ``get_kv_cache_spec()`` answers vLLM's specs of the plan,
    ``model_runner`` the runner class's own flags and the model's ``use_sparse``/``use_compress``."""
    fn = extract_method(tree, WORKER_MODULE, WORKER_CLASS, SCALE_BUDGET, built)
    if fn is None:
        return None
    literals = class_literals(tree, RUNNER_MODULE, RUNNER_CLASS)
    flags = {n: literals[n] for n in _RUNNER_FLAGS if n in literals}
    properties = {n: p for n in _RUNNER_FLAGS if n not in flags
                  and isinstance(p := extract_method(tree, RUNNER_MODULE, RUNNER_CLASS, n, built), property)}
    who = f"{label}'s {WORKER_CLASS}.{SCALE_BUDGET}"
    pinned = pinned_vllm(tree)

    def scale(available: int, vllm_config: Any, kv_cache_spec: dict, kv_transfer: bool) -> int:
        vc = _with_kv_transfer(vllm_config, kv_transfer)
        runner = stand_in(who, "self.model_runner", {"vllm_config": vc, **_model_flags(vc), **flags}, properties)
        # what vLLM's WorkerBase.__init__ sets from the config, and the runner
        worker = stand_in(who, "self", {"vllm_config": vc, "model_config": vc.model_config,
                                        "cache_config": vc.cache_config, "parallel_config": vc.parallel_config,
                                        "model_runner": runner},
                          {"get_kv_cache_spec": lambda self: dict(kv_cache_spec)})
        try:
            return int(run_extracted(fn, worker, available, label=label, known=built))
        except KvauditError:
            raise
        except Exception as e:  # the release's code, written for the vLLM it pins: this strategy is not audited
            from kvaudit.plan.planner import vllm_version

            raise StrategyFailed(f"{who} raised {type(e).__name__}: {first_line(e, 300)} (the release pins vLLM "
                                 f"{pinned or 'unknown'}; planned by vLLM {vllm_version() or 'unknown'})") from None

    return KVBudget(who, scale)


@functools.lru_cache(maxsize=None)
def _vllm_runner_method(name: str) -> Any:
    """A method of the installed vLLM's ``GPUModelRunner``, compiled from its source once per process."""
    tree = installed_tree("vllm", "vLLM")
    return tree and extract_method(tree, "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", name)


def _attention_groups(plan: KVPlan) -> list[list[Any]]:
    """vLLM's ``AttentionGroup`` objects for the plan: per KV-cache group, its layers (the built model's
    modules) grouped by the attention backend each chose."""
    AttentionGroup = module("vllm.v1.worker.utils").AttentionGroup
    layers = plan.vllm_config.compilation_config.static_forward_context
    out = []
    for i, g in enumerate(plan.kv_cache_config.kv_cache_groups):
        by_backend: dict[Any, list[str]] = {}
        for name in g.layer_names:
            if name in layers and hasattr(layers[name], "get_attn_backend"):
                by_backend.setdefault(layers[name].get_attn_backend(), []).append(name)
        out.append([AttentionGroup(backend=b, layer_names=names, kv_cache_spec=g.kv_cache_spec, kv_cache_group_id=i)
                    for b, names in by_backend.items()])
    return out


BUILD_INFO = "vllm_ascend._build_info"


def build_info(tree: SourceTree, soc_version: str | None = None) -> dict[str, dict[str, Any]]:
    """What the tree's own build writes as ``vllm_ascend/_build_info.py`` for the chip ``soc_version``
    (``$SOC_VERSION``, else ascend910b1: an Atlas A2), as the known contents of that module: its setup.py's
    code (``gen_build_info``, 0.12+; ``custom_build_info.run`` before) run against its own
    ``vllm_ascend/envs.py`` into a temporary folder. 0.13+ write ``__device_type__`` (``A2`` for the 910B
    chips), 0.11 ``__soc_version__``; allocation code that asks which chip it was built for (FA quantization
    is for A5 only) gets the answer a build for that chip gives. Empty where the tree has no such code or it
    does not run here (code that then reads the module stops, naming it)."""
    soc = soc_version or os.environ.get("SOC_VERSION") or SOC_VERSION
    setup = tree.read("setup.py")
    if setup is None:
        return {}
    import ast
    import builtins
    import logging
    import types

    mod = ast.parse(setup)
    loads: dict[str, str] = {}  # envs (and from 0.27 hardware) = load_module_from_path(NAME, os.path.join(ROOT_DIR, ...))
    for st in mod.body:
        call = st.value if isinstance(st, ast.Assign) and len(st.targets) == 1 else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "load_module_from_path" \
                and len(call.args) == 2 and isinstance(join := call.args[1], ast.Call) and join.args \
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in join.args[1:]):
            loads[st.targets[0].id] = "/".join(a.value for a in join.args[1:])  # type: ignore[attr-defined]
    fn = next((n for n in mod.body if isinstance(n, ast.FunctionDef) and n.name == "gen_build_info"), None)
    if fn is None:  # before 0.12: a build_py command's run(self), which ends by calling super().run()
        cls = next((n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == "custom_build_info"), None)
        fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "run"), None) if cls else None
        if fn is None:
            return {}
        fn.body = [st for st in fn.body if "super" not in {n.id for n in ast.walk(st) if isinstance(n, ast.Name)}]
    fn.decorator_list, fn.name = [], "kvaudit_build_info"
    saved = os.environ.get("SOC_VERSION")
    os.environ["SOC_VERSION"] = soc
    try:
        with tempfile.TemporaryDirectory() as root:
            namespace: dict[str, Any] = {"__builtins__": builtins, "os": os, "logging": logging, "ROOT_DIR": root}
            for name, rel in loads.items():
                module = namespace[name] = types.ModuleType(f"kvaudit_setup_{name}")
                exec(compile(tree.read(rel) or "", f"{tree.label}:{rel}", "exec"), module.__dict__)
            (Path(root) / "vllm_ascend").mkdir()
            exec(compile(ast.Module(body=[fn], type_ignores=[]), f"{tree.label}:setup.py", "exec"), namespace)
            namespace["kvaudit_build_info"](*([None] if fn.args.args else []))
            written: dict[str, Any] = {}
            exec((Path(root) / "vllm_ascend" / "_build_info.py").read_text(), {}, written)
    except Exception:  # its build refuses this chip, or needs what is not here: the module stays unknown
        return {}
    finally:
        if saved is None:
            os.environ.pop("SOC_VERSION", None)
        else:
            os.environ["SOC_VERSION"] = saved
    return {BUILD_INFO: {k: v for k, v in written.items() if k.startswith("__")}}


def allocate_extracted(code: Extracted, plan: KVPlan, device: Any, kv_transfer: bool,
                       built: dict[str, dict[str, Any]] | None = None) -> RawTensors:
    """Run extracted vllm-ascend (or vLLM <= 0.28) allocation code against ``plan``, in the format it
    reads: vLLM's own ``KVCacheConfig`` for code that reads ``KVCacheTensor.layer_stride`` (vllm-ascend
    0.28+), else the ``shared_by`` view. ``built``: the modules its build writes (``build_info``), for code
    whose package is not installed here."""
    plan.require_live(code.label)
    attributes, methods = stand_in_runner(plan, device, kv_transfer)
    if code.reads_layer_strides:
        if plan.plan_format != "layers":
            raise StrategyFailed(f"{code.label}'s allocation code reads vLLM's KVCacheTensor.layers / layer_stride "
                                 f"(vLLM 0.29+); this plan was made by a vLLM that plans in the shared_by format")
        return code.call(plan.kv_cache_config, attributes, methods, built)
    return code.call(plan.shared_by_config(), attributes, methods, built)


_SAID: set[str] = set()


def _say_running(version: str, tarball: Path) -> None:
    """Once per run and release, on stderr: that its own code runs in this process, and what verified it."""
    if version not in _SAID:
        _SAID.add(version)
        print(f"kvaudit: running {PACKAGE} {version}'s own code in this process (its setup.py build info and "
              f"allocator, from {tarball.name}, sha256 verified against {VERIFIED.get(tarball, 'its record')})",
              file=sys.stderr, flush=True)


def release_strategy(version: str) -> Strategy:
    """The strategy that runs vllm-ascend ``version``'s own allocation code."""
    from kvaudit.plan.planner import load_vllm

    tarball = fetch_sdist(version)
    _say_running(version, tarball)
    load_vllm()  # vLLM's modules importable (and torchvision's ops declared) before the code's imports bind
    label = f"{PACKAGE} {version}"
    tree = SourceTree(label, tarball=tarball)
    built = build_info(tree)  # before extracting: module-level values the code reads are computed from it
    try:
        code = extract_allocator(tree, RUNNER_MODULE, RUNNER_CLASS, built)
    except StrategyFailed as e:
        if version_key(version) >= version_key(FIRST_HYBRID):
            raise
        why = (f"{label} cannot serve hybrid models: its allocation asserts one layer per KV-cache tensor (hybrid "
               f"support starts at {FIRST_HYBRID}); its runner also predates the method kvaudit runs ({e.message})")

        def refuse(plan: KVPlan, device: Any, kv_transfer: bool = False) -> RawTensors:
            raise NotAuditable(why)

        return Strategy(f"{PACKAGE}=={version}", "not runnable here", platform_for(version), label, refuse)
    return _code_strategy(f"{PACKAGE}=={version}", f"{code.method} from the {version} sdist", label, version, code,
                          pinned_vllm(tree), built, kv_budget_rule(tree, label, built))


def checkout_strategy(path: str) -> Strategy:
    """``--strategy vllm-ascend=PATH``: the allocation code of a vllm-ascend source checkout (the code
    under test in its CI, or a patch being written), run like a release's."""
    root = Path(path).expanduser().resolve()
    if not (root / RUNNER_MODULE.replace(".", "/")).with_suffix(".py").is_file():
        raise UsageError(f"vllm-ascend={path}: not a vllm-ascend source checkout (no "
                         f"{RUNNER_MODULE.replace('.', '/')}.py under it)")
    version = checkout_version(root)
    from kvaudit.plan.planner import load_vllm

    load_vllm()
    tree = SourceTree(f"{PACKAGE} checkout {root}", root=root)
    built = build_info(tree)
    code = extract_allocator(tree, RUNNER_MODULE, RUNNER_CLASS, built)
    return _code_strategy(f"{PACKAGE}={root.name}", f"{code.method} from {root}",
                          f"{PACKAGE} checkout ({version or 'no version found'})", version, code, pinned_vllm(tree),
                          built, kv_budget_rule(tree, tree.label, built))


def pinned_vllm(tree: SourceTree) -> str | None:
    """The vLLM a vllm-ascend tree is built against: its Dockerfile's ``ARG VLLM_TAG=vX`` (the releases
    pin vLLM there, not in their requirements)."""
    m = re.search(r"^ARG VLLM_TAG=v?(\S+)", tree.read("Dockerfile") or "", re.M)
    return m.group(1) if m else None


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


def _code_strategy(name: str, title: str, label: str, version: str | None, code: Extracted,
                   pins: str | None = None, built: dict[str, dict[str, Any]] | None = None,
                   kv_budget: KVBudget | None = None) -> Strategy:
    """A strategy that runs extracted vllm-ascend allocation code, planned with the block-size rule of
    its era (the newest era's when the version is unknown); a release older than ``FIRST_HYBRID``
    cannot allocate a plan whose tensors several layers share, and is not audited on one."""
    from kvaudit.plan.planner import vllm_version

    platform = platform_for(version) if version else ERAS[-1][1]
    planner = vllm_version()
    note = (f"{label} is built against vLLM {pins}; the plans here are made by vLLM {planner}"
            if pins and planner and pins != planner else "")
    pre_hybrid = version is not None and version_key(version) < version_key(FIRST_HYBRID)

    def allocate(plan: KVPlan, device: Any, kv_transfer: bool = False) -> RawTensors:
        if pre_hybrid and any(len(t.shared_by) > 1 for t in plan.tensors):
            raise NotAuditable(f"{label} cannot serve hybrid models: its allocation asserts one layer per "
                               f"KV-cache tensor (hybrid support starts at {FIRST_HYBRID})")
        return allocate_extracted(code, plan, device, kv_transfer, built)

    return Strategy(name=name, title=title, platform=platform,
                    releases=label + (f" (pins vLLM {pins})" if pins else ""), allocate=allocate, note=note,
                    kv_budget=kv_budget)
