"""Map source lines to the scope that encloses them, with ``ast``.

A line's scope is the qualified name of the innermost function (or class) around it,
e.g. ``Cart.total``; a line of a module-level statement outside any function gets
``<module>:<key>`` where the key names the statement (the assigned names, ``import``,
``docstring``, or the statement's kind and first line), and a blank line between statements
gets ``<module>``. Files that are not Python, or do not parse, get one scope per file.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from gagar import pyast

__all__ = ["FunctionSpan", "function_named", "functions", "line_scopes"]

MODULE = "<module>"


@dataclass(frozen=True)
class FunctionSpan:
    """A function (or method) of a module: its qualified name and 1-based line range."""

    qualname: str
    start: int
    end: int
    node: ast.FunctionDef | ast.AsyncFunctionDef


def _walk(body: list[ast.stmt], prefix: str) -> list[tuple[str, ast.AST]]:
    found: list[tuple[str, ast.AST]] = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{node.name}"
            found.append((name, node))
            found.extend(_walk(node.body, f"{name}."))
    return found


def _start(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])  # type: ignore[attr-defined]


def _module_key(stmt: ast.stmt, index: int) -> str:
    if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        names = sorted(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        if names:
            return ",".join(names)
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return "import"
    if index == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return "docstring"
    return f"{type(stmt).__name__}:{stmt.lineno}"


def functions(source: str) -> list[FunctionSpan]:
    """Every function and method of ``source``, outermost first."""
    tree = pyast.parse(source)
    return [
        FunctionSpan(name, _start(node), node.end_lineno or node.lineno, node)  # type: ignore[attr-defined]
        for name, node in _walk(tree.body, "")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def function_named(source: str, qualname: str) -> FunctionSpan | None:
    """The function or method ``qualname`` (``Cart.total``) of ``source``; None if it has none."""
    return next((f for f in functions(source) if f.qualname == qualname), None)


def line_scopes(path: str, source: str) -> list[str]:
    """The scope of each line of ``source``: element ``i`` is line ``i + 1``'s scope."""
    n = len(source.splitlines())
    if not path.endswith(".py"):
        return [f"{path}:<file>"] * n
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return [f"{path}:<file>"] * n
    scopes = [f"{path}:{MODULE}"] * n
    for index, stmt in enumerate(tree.body):
        for line in range(_start(stmt), (stmt.end_lineno or stmt.lineno) + 1):
            scopes[line - 1] = f"{path}:{MODULE}:{_module_key(stmt, index)}"
    for name, node in _walk(tree.body, ""):  # outer before inner, so the innermost wins
        for line in range(_start(node), (node.end_lineno or node.lineno) + 1):  # type: ignore[attr-defined]
            scopes[line - 1] = f"{path}:{name}"
    return scopes
