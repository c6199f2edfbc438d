"""Which code the failing tests exercise, found statically: a name-based call graph with ``ast``.

Starting from each FAIL_TO_PASS test function, every name the code references (called,
loaded or looked up as an attribute, plus the test's fixture parameters) is resolved to the
functions of the repository with that name, transitively. A referenced class brings in its
dunder methods. The result over-approximates what runs (names, not types, are followed),
which is what a scope check wants: an edit outside it is not on any path the tests take.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable, Mapping

from gagar import pyast
from gagar.tasks.diffs import apply_diff

__all__ = ["exercised_scopes", "in_scope", "is_test_path", "parse_test_id", "with_test_patch"]


def is_test_path(path: str) -> bool:
    """Whether ``path`` is a test file (under a ``tests``/``test`` folder, or named ``test_*``/``*_test``)."""
    parts = path.split("/")
    name = parts[-1]
    in_test_dir = any(p in ("tests", "test") for p in parts[:-1])
    return in_test_dir or name.startswith("test_") or name.endswith("_test.py")


def parse_test_id(test_id: str) -> tuple[str | None, list[str]]:
    """(file path or None, qualified name parts) of a pytest node id or a ``name (module.Class)`` id."""
    test_id = re.sub(r"\[.*\]$", "", test_id.strip())
    if "::" in test_id:
        path, *names = test_id.split("::")
        return path, names
    match = re.fullmatch(r"(\w+) \(([\w.]+)\)", test_id)  # unittest style: test_x (pkg.module.Class)
    if match:
        return None, [match.group(2).rsplit(".", 1)[-1], match.group(1)]
    return None, [test_id]


@functools.lru_cache(maxsize=4096)
def _definitions(source: str) -> tuple[tuple[str, ast.AST], ...]:
    """(qualname, node) of every function and class of a module; empty if it does not parse."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return ()
    found: list[tuple[str, ast.AST]] = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.append((prefix + node.name, node))
                walk(node.body, f"{prefix}{node.name}.")

    walk(tree.body, "")
    return tuple(found)


def _referenced(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.arg):
            names.add(sub.arg)  # pytest fixtures are requested by parameter name
    return names


def _test_nodes(files: Mapping[str, str], test_ids: Iterable[str]) -> list[ast.AST]:
    nodes = []
    for test_id in test_ids:
        path, names = parse_test_id(test_id)
        wanted = ".".join(names)
        paths = [path] if path in files else [p for p in files if is_test_path(p)]
        for p in paths:
            for qualname, node in _definitions(files[p]):  # type: ignore[index]
                if qualname == wanted or (path is None and qualname.endswith("." + names[-1])):
                    nodes.append(node)
    return nodes


def with_test_patch(files: Mapping[str, str], test_patch: str) -> dict[str, str]:
    """The Python files of ``files`` (path -> text) with the task's own, trusted ``test_patch`` applied,
    which puts the FAIL_TO_PASS tests back.

    Raises:
        ValueError: if the test patch does not apply.
    """
    patched = apply_diff(files, test_patch) if test_patch else files
    return {p: t for p, t in patched.items() if p.endswith(".py")}


def exercised_scopes(files: Mapping[str, str], test_ids: Iterable[str]) -> set[str]:
    """``path:qualname`` of every non-test function or class the tests ``test_ids`` may reach.

    Args:
        files: the repository's Python files (path -> text), tests included.
        test_ids: pytest node ids (``tests/test_a.py::test_x``) or ``name (module.Class)`` ids.
    """
    by_name: dict[str, list[tuple[str, ast.AST]]] = {}
    for path, text in files.items():
        if is_test_path(path) and not path.endswith("conftest.py"):
            continue
        for qualname, node in _definitions(text):
            by_name.setdefault(qualname.rsplit(".", 1)[-1], []).append((f"{path}:{qualname}", node))
    reached: set[str] = set()
    frontier = [name for node in _test_nodes(files, test_ids) for name in _referenced(node)]
    seen_names: set[str] = set()
    while frontier:
        name = frontier.pop()
        if name in seen_names:
            continue
        seen_names.add(name)
        for scope, node in by_name.get(name, []):
            if scope in reached:
                continue
            reached.add(scope)
            frontier.extend(_referenced(node))
            if isinstance(node, ast.ClassDef):
                frontier.extend(
                    n.name for n in node.body if isinstance(n, ast.FunctionDef) and n.name.startswith("__")
                )
    return reached


def in_scope(scope: str, exercised: set[str]) -> bool:
    """Whether a line scope (``path:qualname``, see :func:`gagar.tasks.scopes.line_scopes`) is an
    exercised function or class; nested functions are reached by name like any other."""
    return scope in exercised
