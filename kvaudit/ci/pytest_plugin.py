"""pytest plugin (pytest11): ``@pytest.mark.kv_cache_within`` and the ``kvaudit_plan`` fixture audit an allocator;
``kvaudit_live`` audits a running server against vLLM's plan."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from kvaudit.errors import KvauditError, MeterUnavailable, UsageError
from kvaudit.model.options import accepts, deployment_option_names, value_type
from kvaudit.results import DEFAULT_TOLERANCE

if TYPE_CHECKING:  # torch and vLLM are imported only when a test asks for a plan
    from kvaudit.measure.meters import Meter
    from kvaudit.model.deployment import Deployment
    from kvaudit.results import AuditResult, KVPlan

MARKER = "kv_cache_within"
DEFAULT_MODEL = "qwen3-next"
DEFAULT_PERCENT = DEFAULT_TOLERANCE * 100

_INT, _NUMBER, _BOOL, _STR, _SIZE, _DICT = "an integer", "a number", "True or False", "a string", \
    "a size (bytes, or text such as '80GiB')", "a dict (or its JSON)"
_KINDS = {int: _INT, float: _NUMBER, bool: _BOOL, str: _STR, (str, int): _SIZE, (str, dict): _DICT}
"""How a message names each type ``kvaudit.model.options.value_type`` gives."""
DEPLOYMENT_OPTIONS: dict[str, Any] = {name: value_type(name) for name in deployment_option_names()}
"""The deployment keywords (kvaudit's command-line options, ``--`` dropped and ``-`` as ``_``, declared in
``kvaudit.model.options``) and their types."""
OPTIONS: dict[str, Any] = {"percent": float, "model": None, "meter": str, "device_index": int, "platform": str,
                           **DEPLOYMENT_OPTIONS}
"""Every keyword of the marker and of ``kvaudit_audit``, and its type (``model``: a preset name or a path)."""

_SESSION = pytest.StashKey["_Session"]()
_HANDLE = pytest.StashKey["KVCachePlan"]()


@dataclass(frozen=True)
class Options:
    """The validated options of one ``kv_cache_within`` marker (or ``kvaudit_audit`` call)."""

    percent: float
    model: str
    """A preset name, or the resolved path of a config.json (or of a directory holding one)."""
    preset: str | None
    meter: str
    device_index: int
    platform: str
    """The block-size rule vLLM plans with (``kvaudit.plan.planner.PLATFORMS``)."""
    deployment: dict[str, Any]
    """The deployment keywords given, for ``kvaudit.plan.planner.deploy``."""
    call: str = ""
    """The marker (or call) as written, for messages."""

    @property
    def tolerance(self) -> float:
        """kvaudit's relative tolerance: ``percent`` / 100."""
        return self.percent / 100

    @property
    def plan_key(self) -> str:
        """Options with equal keys share one plan (built once per session)."""
        return json.dumps([self.model, self.platform, self.deployment], sort_keys=True, default=repr)


def _call_text(name: str, args: tuple, kwargs: dict) -> str:
    return f"{name}({', '.join([*(repr(a) for a in args), *(f'{k}={v!r}' for k, v in kwargs.items())])})"


def _kind(value: Any) -> str:
    return {bool: "a bool", int: "an int", float: "a float", str: "a string", dict: "a dict",
            list: "a list", tuple: "a tuple"}.get(type(value), type(value).__name__)


def parse_options(args: tuple, kwargs: dict, base: Path, what: str = MARKER) -> Options:
    """Validate the marker's (or ``kvaudit_audit``'s) arguments without importing torch or vLLM;
    ``UsageError`` with one line naming the call and the first thing wrong with it. A relative
    config path is read from ``base`` (the test file's folder)."""
    from kvaudit.measure.meters import METER_NAMES
    from kvaudit.model.deployment import PRESETS
    from kvaudit.plan.planner import PLATFORMS

    call = _call_text(what, args, kwargs)

    def bad(message: str) -> UsageError:
        return UsageError(f"{call}: {message}")

    if len(args) > 1:
        raise bad(f"takes one positional argument (percent), got {len(args)}")
    kw = dict(kwargs)
    if args:
        if "percent" in kw:
            raise bad("percent given twice")
        kw["percent"] = args[0]
    for key, value in kw.items():
        if key not in OPTIONS:
            near = difflib.get_close_matches(key, list(OPTIONS), n=1)
            raise bad(f"unknown keyword {key!r}" + (f" (did you mean {near[0]!r}?)" if near else
                                                    f" (known: {', '.join(OPTIONS)})"))
        if key != "model" and value is not None and not accepts(value, OPTIONS[key]):
            raise bad(f"{key} must be {_KINDS[OPTIONS[key]]}, got {_kind(value)} {value!r}")
    percent = kw.pop("percent", None)
    percent = DEFAULT_PERCENT if percent is None else percent
    if not (math.isfinite(percent) and 0 <= percent < 100):
        raise bad(f"percent must be in [0, 100) (the allowed deviation from vLLM's plan, in % of its bytes), "
                  f"got {percent!r}")
    model = kw.pop("model", None)
    model = DEFAULT_MODEL if model is None else model
    if not isinstance(model, (str, os.PathLike)):
        raise bad(f"model must be a preset name or a config path, got {_kind(model)} {model!r}")
    preset = model if isinstance(model, str) and model in PRESETS else None
    if preset is None:
        from kvaudit.model.hub import is_hub_id

        path = Path(model).expanduser()
        path = path if path.is_absolute() else base / path
        if path.is_file() or (path / "config.json").is_file():
            model = str(path.resolve())
        elif not is_hub_id(str(model)):  # a Hub id is fetched (or read from the cache) when the plan is built
            raise bad(f"unknown model {str(model)!r}: not a kvaudit preset ({', '.join(PRESETS)}), a Hub id "
                      f"(org/name) nor a config.json or a folder holding one (relative paths are read from {base})")
    meter = kw.pop("meter", None) or "meta"
    if meter != "auto" and meter not in METER_NAMES:
        raise bad(f"unknown meter {meter!r} (known: auto, {', '.join(METER_NAMES)})")
    platform = kw.pop("platform", None) or "cuda"
    if platform not in PLATFORMS:
        raise bad(f"unknown platform {platform!r} (known: {', '.join(PLATFORMS)})")
    device_index = kw.pop("device_index", None) or 0
    deployment = {k: v for k, v in kw.items() if v is not None}
    util = deployment.get("util")
    if util is not None and not 0 < util <= 1:
        raise bad(f"util must be in (0, 1] (vLLM's gpu_memory_utilization), got {util!r}")
    return Options(percent=float(percent), model=str(model), preset=preset, meter=meter, device_index=device_index,
                   platform=platform, deployment=deployment, call=call)


def _option_names(message: str) -> str:
    """kvaudit's messages name command-line flags (``--num-blocks``); the marker's keywords are ``num_blocks``."""
    return re.sub(r"(?<![\w-])--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), message)


class _Session:
    """Per pytest session: vLLM's plans, built once per deployment, and every audit for the summary."""

    def __init__(self) -> None:
        self.plans: dict[str, tuple[Deployment, KVPlan] | KvauditError] = {}
        self.builds = 0
        """Plans built (a plan is built once per deployment and session)."""
        self.audits: list[tuple[str, float, AuditResult]] = []

    def plan(self, o: Options) -> tuple[Deployment, KVPlan]:
        """vLLM's plan for the options' deployment (an error is remembered, and raised again, as well)."""
        hit = self.plans.get(o.plan_key)
        if hit is None:
            from kvaudit.model.deployment import load_model
            from kvaudit.model.options import DeploymentOptions
            from kvaudit.plan.planner import build_plan, deploy

            try:
                spec, preset = load_model(o.preset, None if o.preset else o.model)
                options = DeploymentOptions.of(o.deployment)
                d = deploy(spec, preset, options, options.pp_rank or 0)
                hit = (d, build_plan(d, o.platform))
                self.builds += 1
            except KvauditError as e:
                hit = e
            self.plans[o.plan_key] = hit
        if isinstance(hit, KvauditError):
            raise type(hit)(hit.message)
        return hit


class KVCachePlan:
    """vLLM's KV-cache plan for one deployment, and kvaudit's audit of allocators against it.

    ``kv_cache_config`` is the installed vLLM's ``KVCacheConfig`` (what a model runner is handed),
    ``device`` the torch device to allocate on (the meter's: ``meta`` by default), ``kv_transfer``
    the deployment's P/D flag. ``audit(allocate)`` runs ``allocate`` under the meter and returns
    kvaudit's ``AuditResult``; under ``kv_cache_within`` the test fails when any audit's verdict does."""

    def __init__(self, options: Options, deployment: Deployment, plan: KVPlan, meter: Meter, session: _Session,
                 nodeid: str) -> None:
        self.options = options
        self.deployment = deployment
        self.plan = plan
        self._meter = meter
        self._session = session
        self._nodeid = nodeid
        self.results: list[AuditResult] = []
        """Every audit of this test, in order."""

    @property
    def kv_cache_config(self) -> Any:
        """vLLM's ``KVCacheConfig`` for the deployment."""
        return self.plan.kv_cache_config

    @property
    def device(self) -> Any:
        """The torch device the allocator must allocate on (the meter's)."""
        return self._meter.device()

    @property
    def kv_transfer(self) -> bool:
        """Whether the deployment has KV transfer (vllm-ascend's 2 MiB-aligned buffers are then allowed)."""
        return self.deployment.kv_transfer

    @property
    def percent(self) -> float:
        """The allowed deviation from the plan (over or under), in % of the planned bytes."""
        return self.options.percent

    @property
    def meter(self) -> str:
        """The meter's name."""
        return self._meter.name

    @property
    def planned_bytes(self) -> int:
        """The bytes vLLM plans (each shared tensor once)."""
        return self.plan.planned_bytes

    @property
    def vllm_version(self) -> str:
        """The vLLM that planned."""
        return self.plan.vllm_version

    def audit(self, allocate: Callable[..., Any], name: str | None = None) -> AuditResult:
        """Run ``allocate`` under the meter against the plan and judge it (``kvaudit.measure.audit.run_audit``).

        ``allocate`` is ``fn(kv_cache_config, device[, kv_transfer])`` or ``fn(plan, device, kv_transfer)``
        (kvaudit's plugin signatures), or a ``kvaudit.strategies.strategy.Strategy``, and returns layer name ->
        tensor (or a tuple of tensors). An error the allocator raises is raised again with its traceback."""
        from kvaudit.measure.audit import run_audit
        from kvaudit.measure.oom import is_out_of_memory
        from kvaudit.strategies.plugins import adapt

        __tracebackhide__ = True
        label = name or _name_of(allocate)
        try:
            strategy = adapt(allocate, label, "kvaudit_plan.audit")
        except KvauditError as e:
            error = e.message
        else:
            error = None
        if error is not None:
            pytest.fail(f"kvaudit: {error}", pytrace=False)
        raised: list[tuple[BaseException, Any]] = []
        inner = strategy.allocate

        def allocate_keeping_its_error(plan: KVPlan, device: Any, kv_transfer: bool = False) -> Any:
            try:
                return inner(plan, device, kv_transfer)
            except Exception as e:  # kvaudit reports it in one line; the test author wants the traceback
                if not is_out_of_memory(e):  # an out-of-memory error is a finding: kvaudit frees and reports it
                    raised.append((e, _own_frames(e.__traceback__)))
                raise

        strategy = dataclasses.replace(strategy, allocate=allocate_keeping_its_error)
        skipped = None
        try:
            result = run_audit(self.deployment, self.plan, strategy, self._meter, self.options.tolerance)
        except MeterUnavailable as e:
            skipped = f"kvaudit: {e.message}"
        except KvauditError as e:
            error = f"kvaudit: {e.message}"
        if raised:
            exc, tb = raised[0]
            raise exc.with_traceback(tb)
        if skipped is not None:
            pytest.skip(skipped)
        if error is not None:
            pytest.fail(error, pytrace=False)
        self.results.append(result)
        self._session.audits.append((self._nodeid, self.options.percent, result))
        return result


def _own_frames(tb: Any) -> Any:
    """The traceback from the allocator's first frame on (kvaudit's and this plugin's frames dropped)."""
    while tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith("kvaudit."):
        tb = tb.tb_next
    return tb


def _name_of(fn: Any) -> str:
    if isinstance(getattr(fn, "name", None), str):  # a Strategy
        return fn.name
    target = getattr(fn, "func", fn)  # functools.partial
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None) or type(target).__name__
    return f"{module}.{qualname}" if module else qualname


def _session(config: pytest.Config) -> _Session:
    if _SESSION not in config.stash:
        config.stash[_SESSION] = _Session()
    return config.stash[_SESSION]


def _open(config: pytest.Config, options: Options, nodeid: str) -> KVCachePlan:
    """The plan and meter for ``options``; ``KvauditError`` (one line, naming the marker or call) when
    they cannot be had, ``MeterUnavailable`` when the meter cannot measure here."""
    from kvaudit.measure.meters import select_meter

    try:
        meter = select_meter(options.meter, options.device_index)
        session = _session(config)
        deployment, plan = session.plan(options)
    except KvauditError as e:
        raise type(e)(f"{options.call}: {_option_names(e.message)}") from None
    return KVCachePlan(options, deployment, plan, meter, session, nodeid)


def _test_dir(node: pytest.Item) -> Path:
    return Path(node.path).parent if getattr(node, "path", None) else Path.cwd()


@pytest.fixture
def kvaudit_plan(request: pytest.FixtureRequest) -> KVCachePlan:
    """vLLM's plan for the deployment of the test's ``kv_cache_within`` marker (``KVCachePlan``):
    hand the allocator under test to ``kvaudit_plan.audit``; the marker fails the test when kvaudit's
    verdict does."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        pytest.fail(f"kvaudit: the kvaudit_plan fixture needs a @pytest.mark.{MARKER}(percent, model=..., ...) "
                    "marker naming the deployment; or call kvaudit_audit(allocate, percent, model=...)", pytrace=False)
    skipped = error = None
    try:
        options = parse_options(marker.args, marker.kwargs, _test_dir(request.node))
        handle = _open(request.config, options, request.node.nodeid)
    except MeterUnavailable as e:
        skipped = f"kvaudit: {e.message}"
    except KvauditError as e:
        error = f"kvaudit: {e.message}"
    if skipped is not None:  # raised outside the handlers: the report shows one line, not a chain
        pytest.skip(skipped)
    if error is not None:
        pytest.fail(error, pytrace=False)
    request.node.stash[_HANDLE] = handle
    return handle


@pytest.fixture
def kvaudit_audit(request: pytest.FixtureRequest) -> Callable[..., AuditResult]:
    """``kvaudit_audit(allocate, percent=0.5, *, model="qwen3-next", **deployment)`` -> kvaudit's
    ``AuditResult`` (``verdict``, ``ratio``, ``reasons``, rows per group, tensor and layer); the test
    asserts what it wants. Bad options raise ``kvaudit.errors.UsageError``."""

    def audit(allocate: Callable[..., Any], *args: Any, name: str | None = None, **kwargs: Any) -> AuditResult:
        __tracebackhide__ = True
        try:
            options = parse_options(args, kwargs, _test_dir(request.node), what="kvaudit_audit")
        except UsageError as e:
            message = e.message
        else:
            message = None
        if message is not None:  # raised here, not in parse_options: the test's line and this one line
            raise UsageError(message)
        try:
            handle = _open(request.config, options, request.node.nodeid)
        except MeterUnavailable as e:
            skipped = f"kvaudit: {e.message}"
        else:
            return handle.audit(allocate, name)
        pytest.skip(skipped)

    return audit


def live_check(url: str, base: Path, *, smi: str | Path | None = None, model: str | None = None,
               api_key: str | None = None, percent: float = DEFAULT_PERCENT, **options: Any) -> Any:
    """``kvaudit live`` for a test: the server at ``url`` judged against vLLM's plan (``smi``: a file of its
    nvidia-smi / npu-smi output, relative to the test's folder; else the tool run here where ``url`` is this machine:
    ``kvaudit.server.live.smi_output``). The test fails, in one message, on a finding (the device over or below the
    plan, settings other than ``options`` say) and skips where no device memory was read; it returns
    ``kvaudit.server.live.LiveReport``."""
    from types import SimpleNamespace

    from kvaudit.errors import EXIT_FAIL, EXIT_NOT_MEASURED
    from kvaudit.report.live import summary_line
    from kvaudit.server.live import audit_served, read_live, smi_output

    __tracebackhide__ = True
    unknown = sorted(set(options) - set(DEPLOYMENT_OPTIONS))
    wrong = [k for k, v in options.items() if k in DEPLOYMENT_OPTIONS and not accepts(v, DEPLOYMENT_OPTIONS[k])]
    if unknown or wrong:
        raise UsageError(f"kvaudit_live({url!r}, ...): " + (f"unknown option {unknown[0]!r} (the deployment options: "
                         f"{', '.join(DEPLOYMENT_OPTIONS)})" if unknown else
                         f"{wrong[0]}={options[wrong[0]]!r} is not {_KINDS[DEPLOYMENT_OPTIONS[wrong[0]]]}"))
    text, source = smi_output(url, None if smi is None else Path(smi) if Path(smi).is_absolute() else base / smi)
    asked = SimpleNamespace(**{name: options.get(name) for name in DEPLOYMENT_OPTIONS})
    try:
        served, read = read_live(url, api_key or os.environ.get("VLLM_API_KEY") or None, text, source)
        report = audit_served(served, read, model=model, asked=asked, tolerance=percent / 100)
    except KvauditError as e:
        failed = f"kvaudit live: {e.message}"
    else:
        failed = None
    if failed is not None:  # raised outside the handler: one line, not a chain
        pytest.fail(failed, pytrace=False)
    if report.exit_code == EXIT_FAIL:
        pytest.fail("\n".join([summary_line(report), *report.findings]), pytrace=False)
    if report.exit_code == EXIT_NOT_MEASURED:
        pytest.skip(f"{summary_line(report)} ({source})")
    return report


@pytest.fixture
def kvaudit_live(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``kvaudit_live(url, *, smi=None, model=None, api_key=None, **deployment)`` -> ``LiveReport``: a running server
    audited against vLLM's plan after a deployment (``live_check``)."""

    def live(url: str, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        return live_check(url, _test_dir(request.node), **kwargs)

    return live


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(percent={DEFAULT_PERCENT:g}, *, model='{DEFAULT_MODEL}', util=None (vLLM's default), tp=None, "
        "meter='meta', kv_transfer=False, ...): fail the test unless every allocator it hands to kvaudit_plan.audit() allocates "
        "vLLM's KV-cache plan for that deployment within percent % (kvaudit's verdict)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(MARKER) is not None and "kvaudit_plan" not in getattr(item, "fixturenames", ()):
        pytest.fail(f"kvaudit: @pytest.mark.{MARKER} needs the test to take the kvaudit_plan fixture and hand its "
                    "allocator to kvaudit_plan.audit(allocate)", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    outcome = yield  # raises when the test itself failed: then there is nothing to judge
    if item.get_closest_marker(MARKER) is None:
        return outcome
    handle = item.stash.get(_HANDLE, None)
    if handle is None or not handle.results:
        pytest.fail(f"kvaudit: the test is marked {MARKER} but audited nothing: hand the allocator to "
                    "kvaudit_plan.audit(allocate)", pytrace=False)
    failed = [r for r in handle.results if r.verdict.value != "PASS"]
    if failed:
        pytest.fail("\n\n".join(failure_message(r, handle) for r in failed), pytrace=False)
    return outcome


_ROWS_SHOWN = 5


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def failure_message(r: AuditResult, handle: KVCachePlan) -> str:
    """What failed, in pytest's failure report: kvaudit's reasons, the deployment, meter and vLLM, and
    the groups, tensors and layers whose allocation is off their plan."""
    from kvaudit.report.render import meter_label
    from kvaudit.results import tolerance_bytes
    from kvaudit.units import fmt_bytes

    d, plan, pct = handle.deployment, handle.plan, handle.percent
    tol = handle.options.tolerance
    lines = [f"kvaudit: {r.strategy} does not allocate vLLM's plan within {pct:g} %: {r.reasons[0]}"]
    for reason in r.reasons[1:]:
        lines.append(f"  also: {reason}")
    lines.append(f"  expected {fmt_bytes(r.expected_bytes)} ({r.expected_bytes:,} B), allocated "
                 f"{fmt_bytes(r.allocated_bytes)} ({r.allocated_bytes:,} B), ratio {r.ratio:.2f}×, tolerance "
                 f"{fmt_bytes(r.tolerance_bytes)} ({r.tolerance_bytes:,} B: {pct:g} % of the plan"
                 + (" + 2 MiB per planned tensor for KV transfer" if r.alignment_allowance_bytes else "") + ")")
    stage = f", PP {d.pp} rank {d.pp_rank}" if d.pp > 1 else ""
    lines.append(f"  deployment: {d.model.name}, TP {d.tp}{stage}, util {d.gpu_memory_utilization:g} of {d.device} "
                 f"({fmt_bytes(d.device_memory_bytes)}), {plan.num_blocks:,} blocks of {plan.block_size} tokens "
                 f"({plan.platform} rule)" + (", KV transfer" if d.kv_transfer else ""))
    lines.append(f"  meter: {meter_label(r.meter)}; planned by vLLM {plan.vllm_version}")

    def off(expected: int, allocated: int) -> bool:  # a row's share of the tolerance, for the listing only
        return abs(allocated - expected) > tolerance_bytes(expected, tol)

    def ratio(expected: int, allocated: int) -> str:
        return f"{allocated / expected:.2f}×" if expected else "—"

    if r.groups:
        lines.append("  groups (expected -> allocated):")
        for g in r.groups:
            lines.append(f"    group {g.group} ({g.spec}, {_n(g.layers, 'layer')}): {fmt_bytes(g.expected)} -> "
                         f"{fmt_bytes(g.allocated)} ({ratio(g.expected, g.allocated)})"
                         + ("  <- off plan" if off(g.expected, g.allocated) else ""))
    tensors = [t for t in r.tensors if off(t.expected, t.allocated) or t.storages > 1]
    if tensors:
        lines.append(f"  tensors off their plan or split: {len(tensors)} of {len(r.tensors)}")
        for t in tensors[:_ROWS_SHOWN]:
            lines.append(f"    tensor {t.tensor} ({_n(len(t.shared_by), 'layer')}, {_n(t.storages, 'storage')}): "
                         f"{fmt_bytes(t.expected)} -> {fmt_bytes(t.allocated)} ({ratio(t.expected, t.allocated)})")
        if len(tensors) > _ROWS_SHOWN:
            lines.append(f"    ... {len(tensors) - _ROWS_SHOWN} more")
    layers = [row for row in r.layers if off(row.expected, row.allocated)]
    if layers:
        lines.append(f"  layers off their plan: {len(layers)} of {len(r.layers)}")
        for row in layers[:_ROWS_SHOWN]:
            lines.append(f"    {row.layer} (group {row.group}, tensor {row.tensor}, {_n(row.storages, 'storage')}): "
                         f"{fmt_bytes(row.expected)} -> {fmt_bytes(row.allocated)} "
                         f"({ratio(row.expected, row.allocated)})")
        if len(layers) > _ROWS_SHOWN:
            lines.append(f"    ... {len(layers) - _ROWS_SHOWN} more")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is None or not session.audits:
        return
    from kvaudit.units import fmt_bytes

    tr = terminalreporter
    tr.write_sep("=", "kvaudit")
    for nodeid, pct, r in session.audits:
        tr.write_line(f"{r.verdict.value:4}  {r.ratio:5.2f}×  {fmt_bytes(r.allocated_bytes):>10} of "
                      f"{fmt_bytes(r.expected_bytes):>10} within {pct:g} %  {r.meter:4}  {r.strategy}  {nodeid}")
    versions = ", ".join(sorted({r.plan.vllm_version for _, _, r in session.audits}))
    meta = any(r.meter == "meta" for _, _, r in session.audits)
    tr.write_line(f"kvaudit: {_n(len(session.audits), 'audit')} against {_n(session.builds, 'deployment')} planned "
                  f"by vLLM {versions} (each planned once per session)"
                  + ("; the meta meter is accounting, not a device measurement" if meta else ""))
