"""The package's shape: no import cycle between kvaudit's modules (counting imports inside
functions), and a one-line docstring on each module."""

from __future__ import annotations

import ast

from conftest import ROOT

MODULES = sorted((ROOT / "kvaudit").glob("*.py"))


def _imports(path) -> set[str]:
    found = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "kvaudit":
            found |= {a.name for a in n.names} if n.module == "kvaudit" else {n.module.split(".")[1]}
        elif isinstance(n, ast.Import):
            found |= {a.name.split(".")[1] for a in n.names if a.name.startswith("kvaudit.")}
    return found - {path.stem}


def test_no_import_cycle():
    graph = {p.stem: _imports(p) & {q.stem for q in MODULES} for p in MODULES}

    def reaches(start: str, node: str, seen: set[str]) -> bool:
        return any(d == start or (d not in seen and reaches(start, d, seen | {d})) for d in graph[node])

    assert [m for m in graph if reaches(m, m, {m})] == []
    assert "releases" not in graph["strategies"] and "resolve" not in graph["strategies"]


def test_every_module_says_what_it_is():
    for p in MODULES:
        doc = ast.get_docstring(ast.parse(p.read_text()))
        assert doc and doc.strip(), p.name
