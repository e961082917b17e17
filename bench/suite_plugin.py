"""A pytest plugin for ``bench/suite.py``: where one pytest process spends its time, per test, per fixture and
per kind (vLLM's import, torch's import, a model built on ``meta``, a plan, waiting on a subprocess, the rest).

Loaded with ``-p suite_plugin`` (``bench/`` on ``PYTHONPATH``); writes ``$KVAUDIT_SUITE_PROFILE`` (one file per
pytest-xdist worker: ``.gw0``, ``.gw1``, ... appended) at the end of the session. Times are wall seconds and
exclusive: a model build's time excludes the vLLM modules it imports, a test's "rest" excludes all of them.
"""

from __future__ import annotations

import collections
import contextlib
import importlib._bootstrap as bootstrap
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

KINDS = ("vllm import", "torch import", "model build", "plan", "subprocess", "rest")
"""The kinds, in the order they are printed; "rest" is what is none of the others (the test itself, pytest)."""

_stack: list[str] = []
_where = "session"  # a test's node id, "collection", or "session" (pytest between tests, start-up, teardown)
_last = time.perf_counter()
_by_where: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_tests: dict[str, dict[str, Any]] = {}
_fixtures: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
_collection = [0.0, 0.0]  # wall, CPU


def _charge() -> None:
    """Charge the time since the last switch to the kind on top of the stack, at the current place."""
    global _last
    now = time.perf_counter()
    _by_where[_where][_stack[-1] if _stack else "rest"] += now - _last
    _last = now


@contextlib.contextmanager
def _kind(kind: str) -> Iterator[None]:
    _charge()
    _stack.append(kind)
    try:
        yield
    finally:
        _charge()
        _stack.pop()


def _at(where: str) -> None:
    global _where
    _charge()
    _where = where


def _timed(fn: Any, kind: str) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _kind(kind):
            return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


# what each kind wraps: a module's function, wrapped as soon as that module is loaded
_WRAP = {"kvaudit.model.vllm_model": ("build_model", "model build"), "kvaudit.plan.planner": ("build_plan", "plan")}
_find_and_load = bootstrap._find_and_load


def _import_kind(name: str) -> str | None:
    top = name.partition(".")[0]
    return {"vllm": "vllm import", "torch": "torch import", "torch_npu": "torch import"}.get(top)


def _timed_find_and_load(name: str, import_: Any) -> Any:
    """``importlib._bootstrap._find_and_load``, which the interpreter looks up on every import it has not
    done yet: the outermost import of a vLLM or torch module is timed as that kind."""
    kind = _import_kind(name)
    if kind is None or (_stack and _stack[-1] == kind):
        module = _find_and_load(name, import_)
    else:
        with _kind(kind):
            module = _find_and_load(name, import_)
    if name in _WRAP:
        attr, wrapped_kind = _WRAP[name]
        setattr(module, attr, _timed(getattr(module, attr), wrapped_kind))
    return module


bootstrap._find_and_load = _timed_find_and_load
for _name in list(_WRAP):
    if _name in sys.modules:  # (loaded before this plugin: wrap it now)
        _module = sys.modules[_name]
        setattr(_module, _WRAP[_name][0], _timed(getattr(_module, _WRAP[_name][0]), _WRAP[_name][1]))
subprocess.Popen.wait = _timed(subprocess.Popen.wait, "subprocess")  # type: ignore[method-assign]
subprocess.Popen.communicate = _timed(subprocess.Popen.communicate, "subprocess")  # type: ignore[method-assign]
subprocess.Popen.__init__ = _timed(subprocess.Popen.__init__, "subprocess")  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    _at("collection")
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    _collection[0] += time.perf_counter() - wall
    _collection[1] += time.process_time() - cpu
    _at("session")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    _at(item.nodeid)
    cpu = time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    yield
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    test = _tests.setdefault(item.nodeid, {"phases": {}, "outcome": "passed"})
    test["cpu"] = time.process_time() - cpu
    test["children_cpu"] = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    _at("session")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    test = _tests.setdefault(report.nodeid, {"phases": {}, "outcome": "passed"})
    test["phases"][report.when] = report.duration
    if report.outcome != "passed" and test["outcome"] == "passed":  # the first phase that did not pass
        test["outcome"] = "xfailed" if hasattr(report, "wasxfail") else report.outcome


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    _fixtures[(fixturedef.argname, fixturedef.scope)].append(time.perf_counter() - t0)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _at("session")
    path = os.environ.get("KVAUDIT_SUITE_PROFILE")
    if not path:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        path = f"{path}.{worker}"
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    doc = {
        "python": sys.executable,
        "worker": worker,
        "collection": {"wall": _collection[0], "cpu": _collection[1]},
        "cpu": usage.ru_utime + usage.ru_stime,
        "children_cpu": children.ru_utime + children.ru_stime,
        "kinds": {where: dict(c) for where, c in _by_where.items()},
        "tests": _tests,
        "fixtures": [{"name": n, "scope": s, "times": t} for (n, s), t in _fixtures.items()],
    }
    with open(path, "w") as f:
        json.dump(doc, f)
