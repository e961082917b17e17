"""The package's shape: folders by the pipeline's stages, imports pointing down them (model → plan → strategies →
measure → report → triage / ci → cli), no import cycle between modules or folders (counting imports inside
functions), each folder naming what the others may use from it, and a docstring on every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.fast

PACKAGE = ROOT / "kvaudit"
STAGES = ("model", "plan", "strategies", "measure", "server", "report", "triage ci", "cli")
"""The folders, lowest first; folders on one line (``triage ci``) stand side by side and import neither."""
RANK = {folder: i for i, line in enumerate(STAGES) for folder in line.split()}
ENTRY_POINTS = {"kvaudit", "kvaudit.__main__"}
"""The package's own ``__init__`` (lazy re-exports for library users) and ``python -m kvaudit``: above every stage."""


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> set[str]:
    """The kvaudit modules ``path`` imports, anywhere in it (``from kvaudit.x import y`` names module
    ``kvaudit.x.y`` where that is one, else ``kvaudit.x``)."""
    found = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "kvaudit":
            found |= {f"{n.module}.{a.name}" if f"{n.module}.{a.name}" in MODULES else n.module for a in n.names}
        elif isinstance(n, ast.Import):
            found |= {a.name for a in n.names if a.name.split(".")[0] == "kvaudit"}
    return found - {_name(path)}


def folder(module: str) -> str | None:
    """A module's stage folder; None for kvaudit's shared modules (``errors``, ``results``, ...) at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else None


GRAPH = {m: imports(p) & set(MODULES) for m, p in MODULES.items()}


def test_every_folder_is_a_stage():
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} == set(RANK)


def test_imports_point_down_the_stages():
    upward = []
    for m, deps in GRAPH.items():
        if m in ENTRY_POINTS:
            continue
        for d in deps:
            here, there = folder(m), folder(d)
            if there is None or here == there:
                continue
            if here is None or RANK[there] >= RANK[here]:
                upward.append(f"{m} imports {d}")
    assert upward == []


def test_no_import_cycle_between_modules_or_folders():
    def cycles(graph: dict[str, set[str]]) -> list[str]:
        def reaches(start: str, node: str, seen: set[str]) -> bool:
            return any(d == start or (d not in seen and reaches(start, d, seen | {d})) for d in graph.get(node, ()))

        return [n for n in graph if reaches(n, n, {n})]

    assert cycles(GRAPH) == []
    folders: dict[str, set[str]] = {}
    for m, deps in GRAPH.items():
        if folder(m) is not None:
            folders.setdefault(folder(m), set()).update(folder(d) for d in deps if folder(d) not in (None, folder(m)))
    assert cycles(folders) == []
    builtin = GRAPH["kvaudit.strategies.builtin"]
    assert "kvaudit.strategies.releases" not in builtin and "kvaudit.strategies.resolve" not in builtin


def _public(folder_name: str) -> set[str]:
    tree = ast.parse((PACKAGE / folder_name / "__init__.py").read_text())
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets):
            return set(ast.literal_eval(n.value))
    return set()


def test_other_folders_use_only_what_a_folder_names():
    private = [f"{m} imports {d}" for m, deps in GRAPH.items() for d in deps
               if folder(d) is not None and folder(d) != folder(m) and d != f"kvaudit.{folder(d)}"
               and d.split(".")[2] not in _public(folder(d))]
    assert private == []
    for f in set(RANK) - {"cli"}:  # a folder names its modules (and, for plugin authors, a few types: Strategy)
        modules = {n for n in _public(f) if n.islower()}
        assert modules and all(f"kvaudit.{f}.{n}" in MODULES for n in modules), f
    assert _public("cli") == {"main", "run"}  # the command's entry points; nothing imports the cli's modules


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_says_what_it_is(module):
    doc = ast.get_docstring(ast.parse(MODULES[module].read_text()))
    assert doc and doc.strip(), module


def test_the_layout_in_the_development_page_is_the_package():
    text = (ROOT / "docs" / "development.md").read_text()
    assert all(f"{f}/" in text for f in RANK), "docs/development.md names each folder"


def test_vllm_is_imported_through_one_module():
    """``kvaudit.model.vllm_modules`` owns the import of vLLM (and what it quiets): no other module imports vLLM by
    name, by ``importlib.import_module("vllm...")`` or by ``__import__``."""
    others = []
    for m, path in MODULES.items():
        if m == "kvaudit.model.vllm_modules":
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
                     if isinstance(n, ast.ImportFrom) else [n.args[0].value] if isinstance(n, ast.Call)
                     and getattr(n.func, "attr", getattr(n.func, "id", "")) in ("import_module", "__import__")
                     and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str) else [])
            others += [f"{m}:{n.lineno} {name}" for name in names if name.split(".")[0] == "vllm"]
    assert others == []
