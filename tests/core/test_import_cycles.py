"""No import cycles inside gagar: module-level and function-level imports alike.

A function-level import hides a cycle from Python but not from a reader: both modules still need
each other. The schema package, in particular, depends on nothing but :mod:`gagar.records`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gagar

SRC = Path(gagar.__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "gagar").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the gagar modules it imports (``from pkg import mod`` resolves to the module)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                found = resolve(target) if target.split(".")[0] == "gagar" else None
                if found and found != name and not (found == "gagar" and target != "gagar"):
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_the_detector_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_gagar_has_no_import_cycles() -> None:
    graph = import_graph()
    assert "gagar.schema.task" in graph
    assert graph["gagar.stages"]
    assert cycles(graph) == []


def test_the_schema_depends_only_on_records() -> None:
    graph = import_graph()
    for name, imported in graph.items():
        if name.startswith("gagar.schema"):
            assert imported <= {"gagar.records"} | {m for m in graph if m.startswith("gagar.schema")}, name
