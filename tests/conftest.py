"""Shared fixtures: deployments and vLLM plans built once per session, a scripted meter, and the
fake ``torch.npu`` / ``torch.cuda`` memory API."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the suite never reaches the Hub: Hub models come from test caches
for _width in ("COLUMNS", "LINES"):  # tables are 120 wide unless a test sets a width (xdist's workers export
    os.environ.pop(_width, None)  # COLUMNS=80, and so may a shell)

from kvaudit.model.deployment import PRESETS, load_preset_spec  # noqa: E402
from kvaudit.plan.planner import make_deployment  # noqa: E402
from kvaudit.results import MemoryReading  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
try:
    VLLM_VERSION: str | None = importlib.metadata.version("vllm")
except importlib.metadata.PackageNotFoundError:  # a device host: only tests/test_device.py runs there
    VLLM_VERSION = None
GOLDEN = ROOT / "fixtures" / "golden" / f"vllm-{VLLM_VERSION}"
"""Golden tables per vLLM version: the plans (and so every figure) come from that vLLM."""


PRIMARY_VLLM = "0.33.0"
"""Family coverage is tested against the vLLM of ``.venv``. Under vLLM 0.23.0 (tested for the
``shared_by`` plan format) only these families build with kvaudit's stand-ins so far; the others
stop with a one-line error (FP8 / Mamba2 kernels and the multimodal wrappers differ there)."""
BUILDS_UNDER_0_23 = {"qwen3-next", "llama-3.1-8b", "qwen2.5-7b", "qwen3-8b", "qwen3-30b-a3b", "mixtral-8x7b",
                     "glm-4.5", "gpt-oss-120b", "jamba-mini"}


def skip_unless_planned(preset: str | None = None) -> None:
    """Skip under another vLLM than the primary one unless ``preset`` builds there."""
    if VLLM_VERSION != PRIMARY_VLLM and (preset is None or preset not in BUILDS_UNDER_0_23):
        pytest.skip(f"family coverage is tested against vLLM {PRIMARY_VLLM}; vLLM {VLLM_VERSION} is tested for the "
                    "shared_by plan format")


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite fixtures/golden from this run")


each_vllm = pytest.mark.each_vllm
"""Marks behaviour that differs between vLLM releases (planner layouts, ``KVCacheTensor`` forms, the release eras,
the strategies run on each, vLLM's model and config code): such a test runs under every tested vLLM. Every other
test (rendering, docs, schemas, triage reading, CLI errors, processes) runs under the primary vLLM only."""


def pytest_ignore_collect(collection_path, config):
    """Under a vLLM other than the primary one, a test file that marks nothing ``each_vllm`` is not even imported
    (collecting every file there took 18 s of a 75 s suite)."""
    if VLLM_VERSION in (PRIMARY_VLLM, None) or collection_path.suffix != ".py" or collection_path.name == "conftest.py":
        return None
    if collection_path.name.startswith("test_") and "each_vllm" not in collection_path.read_text():
        return True
    return None


LONGEST_FIRST = ("test_properties.py", "test_releases.py", "test_cli.py", "test_wheel.py", "test_pytest_plugin.py",
                 "test_readme.py", "test_vllm_model_standins.py", "test_triage_threads.py", "test_triage_golden.py",
                 "test_planfile.py",
                 "test_model_files.py", "test_check.py", "test_device_check.py", "test_widths.py", "test_families.py",
                 "test_page.py", "test_devices.py", "test_triage.py", "test_loglines.py", "test_strategies.py")
"""The test files that take longest on a worker (``bench/suite.py`` prints them; each 5 s or more), run first:
``scripts/test`` hands its workers whole files in this order (``--no-loadscope-reorder``), so that no long file
starts last and the two workers end together (a model-building file that started last kept one worker 16 s
after the other had ended)."""


def pytest_collection_modifyitems(config, items):
    """The longest files first (``LONGEST_FIRST``). Under a vLLM other than the primary one, only the tests marked
    ``each_vllm`` are run; the others are deselected (their behaviour does not depend on the vLLM, and the primary
    suite runs them)."""
    if _mutant_under_test():
        _quickest_first(config, items)
    else:
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: the rest keep their order)
    if VLLM_VERSION in (PRIMARY_VLLM, None):
        return
    keep = [item for item in items if item.get_closest_marker("each_vllm")]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not item.get_closest_marker("each_vllm")])
        items[:] = keep


def _mutant_under_test() -> str:
    """The mutant this process runs the tests of under mutmut (it names it in ``MUTANT_UNDER_TEST``, which also holds
    its own phase names outside a mutant's run); else ``""``."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    return mutant if "__mutmut_" in mutant else ""


def _quickest_first(config, items) -> None:
    """Under mutmut, a mutant's tests quickest first, a file at a time (its module fixtures are built once): mutmut
    stops at the first failure, so a mutant that a quick test kills no longer waits for the slow ones. The durations
    are those mutmut measured in its clean run (``mutmut-stats.json`` beside the mutated tree)."""
    stats = config.rootpath / "mutmut-stats.json"
    if not stats.is_file():
        return
    took = json.loads(stats.read_text()).get("duration_by_test", {})
    seconds = {item: took.get(item.nodeid.removeprefix("mutants/"), 0.0) for item in items}
    by_file: dict = {}
    for item in items:
        by_file[item.path] = by_file.get(item.path, 0.0) + seconds[item]
    items.sort(key=lambda item: (by_file[item.path], str(item.path), seconds[item]))


def pytest_sessionstart(session):
    """Under mutmut (``bench/mutation.py``) each mutant's run is forked from a process that ran every test first, so
    what this suite keeps for its session (``plan_for``'s plans) was made there by the unmutated code: a mutant's run
    plans afresh, with the mutant. A mutant of the code that builds vLLM's models (``_MUTANTS_REBUILD``) builds them
    afresh too: the process keeps its builds and their model folders. (mutmut names the mutant in
    ``MUTANT_UNDER_TEST``.)"""
    mutant = _mutant_under_test()
    if not mutant:
        return
    _PLANS.clear()
    function = mutant.rsplit(".", 1)[-1].split("__mutmut_")[0].removeprefix("x_")
    if mutant.startswith("kvaudit.plan.planner.") and function in _MUTANTS_REBUILD:
        from kvaudit.model import vllm_model
        from kvaudit.plan import planner

        vllm_model._BUILT.clear()
        planner._MODEL_DIRS.clear()


_MUTANTS_REBUILD = {"model_for", "engine_config", "_engine_args", "_model_dir", "_hybrid_prefix_caching",
                    "mxfp4_backend", "_as_device"}
"""The planner's functions that run only where a model is built (``planner.model_for``): their mutants rebuild."""


def pytest_runtest_setup(item):
    """Tests marked ``cuda`` or ``npu`` skip themselves where that meter's probe refuses."""
    from kvaudit.measure.meters import make_meter

    for name in ("cuda", "npu"):
        if item.get_closest_marker(name):
            reason = make_meter(name).probe()
            if reason is not None:
                pytest.skip(f"no {name} device: {reason}")


@pytest.fixture
def update_golden(request) -> bool:
    return bool(request.config.getoption("--update-golden"))


def deployment(preset: str = "qwen3-next", **kw):
    """A preset's deployment. Tests of allocators and plans take a fixed 2 GiB of non-KV memory (``--overhead``), so
    their figures do not move with the non-KV model's calibration; ``overhead_bytes=None`` takes the model."""
    p = PRESETS[preset]
    args = dict(tp=p.tp, max_model_len=p.max_model_len, gpu_memory_utilization=0.7, device=p.device,
                overhead_bytes=2 << 30)
    args.update(kw)
    return make_deployment(load_preset_spec(p), **args)


_PLANS: dict = {}


def plan_for(d, platform: str):
    """vLLM's plan for a deployment, cached for the session (planning is deterministic)."""
    from kvaudit.plan.planner import build_plan

    key = (d.model.name, d.tp, d.pp, d.pp_rank, d.max_model_len, d.kv_budget_bytes, d.num_blocks_override,
           d.max_num_seqs, d.max_num_batched_tokens, d.device, d.vllm_version, d.enable_prefix_caching,
           str(d.hf_overrides), platform)
    if key not in _PLANS:
        _PLANS[key] = build_plan(d, platform)
    return _PLANS[key]


@functools.cache
def release(version: str):
    """``vllm-ascend==version``'s strategy, resolved once per session: resolving reads the sdist, runs its build
    code and compiles its allocation code (1-2 s), and what it makes is not changed by an audit. A test that
    changes what resolving reads (``$SOC_VERSION``, the cache, the index) calls ``resolve_strategy`` itself."""
    from kvaudit.strategies.resolve import resolve_strategy

    return resolve_strategy(f"vllm-ascend=={version}")


@functools.cache
def release_tree(version: str):
    """The source tree of ``version``'s sdist, read once per session (its archive is decompressed on first read)."""
    from kvaudit.strategies import releases

    return releases.SourceTree(version, tarball=releases.fetch_sdist(version))


RELEASES_READ = ("0.9.1", "0.11.0rc1", "0.11.0", "0.13.0", "0.18.0", "0.20.2rc1", "0.24.0rc1", "0.26.0rc1",
                 "0.27.1rc1", "0.28.0rc1", "0.29.0rc1", "0.30.0rc2")
"""The vllm-ascend releases whose sdists the suite reads. ``scripts/test`` fetches them all at once into the release
cache as the suites start (``fetch_releases``), instead of one after the other in whichever test wants one first,
under each tested vLLM (a fresh clone's run spent about a minute there)."""


def fetch_releases() -> None:
    """Every release of ``RELEASES_READ`` into the release cache, at once; what cannot be fetched is left to the
    tests that read it (they say why)."""
    from concurrent.futures import ThreadPoolExecutor

    from kvaudit.errors import KvauditError
    from kvaudit.strategies import releases

    def fetch(version):
        with contextlib.suppress(KvauditError):
            releases.fetch_sdist(version)

    with ThreadPoolExecutor(len(RELEASES_READ)) as pool:
        list(pool.map(fetch, RELEASES_READ))


class FakeMeter:
    """A real ``Meter`` whose readings are scripted: audit logic without any device."""

    kind = "accounting"

    def __init__(self, allocated: int, peak: int | None = None, name: str = "fake"):
        self.name = name
        self._reading = MemoryReading(allocated=allocated, peak=peak if peak is not None else allocated)
        self.calls: list[str] = []

    def probe(self):
        return None

    def device(self):
        import torch

        return torch.device("meta")

    def describe(self):
        return "fake: scripted readings"

    def free_bytes(self):
        return None

    def start(self):
        self.calls.append("start")

    def stop(self):
        self.calls.append("stop")
        return self._reading

    def release(self):
        self.calls.append("release")


def ending(err: str) -> list[str]:
    """A command's stderr without the notes of the slow steps it began (``kvaudit.cli.output.STEPS``): what it ended
    with, one line for an error."""
    from kvaudit.cli.output import STEPS

    notes = {f"kvaudit: {s}" for s in STEPS}
    return [line for line in err.strip().splitlines() if line not in notes]
