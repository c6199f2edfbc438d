"""AST mutation operators: small, plausible bugs injected into real Python functions.

Every :class:`Mutation` is one contiguous edit of the source text (a character span
and its replacement), found by walking the AST of the file, so the rest of the file
keeps its exact formatting. :func:`find_mutations` returns only mutations whose result
parses and differs from the original AST, in a deterministic order; sampling with a
seed is the caller's business (``random.Random(seed).sample``).

Operators (``Mutation.operator``):

- ``compare``: ``<`` ↔ ``<=``, ``>`` ↔ ``>=``, ``==`` ↔ ``!=``, ``in`` ↔ ``not in``, ``is`` ↔ ``is not``
- ``arith``: ``+`` ↔ ``-``, ``*`` ↔ ``/``, ``//`` → ``/``, ``%`` → ``//``, also in augmented assignments
- ``off_by_one``: an integer constant (slice bounds, indices, counts) plus or minus one
- ``bool_flip``: ``True`` ↔ ``False``
- ``bool_op``: ``and`` ↔ ``or`` (two operands)
- ``return_value``: a returned condition negated, any other returned value replaced by ``None``
- ``drop_guard``: an ``if`` without ``else`` whose body ends in return/raise/continue/break is deleted
- ``drop_branch_stmt``: one statement of an ``if`` branch deleted (``pass`` when it was the only one)
- ``swap_args``: the first two positional arguments of a call swapped
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from gagar import pyast

__all__ = ["OPERATORS", "Mutation", "find_mutations"]

OPERATORS = (
    "compare",
    "arith",
    "off_by_one",
    "bool_flip",
    "bool_op",
    "return_value",
    "drop_guard",
    "drop_branch_stmt",
    "swap_args",
)

_COMPARE_SWAP = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.In: (r"in", "not in"),
    ast.NotIn: (r"not\s+in", "in"),
    ast.Is: (r"is", "is not"),
    ast.IsNot: (r"is\s+not", "is"),
}
_ARITH_SWAP = {
    ast.Add: (r"\+", "+", "-"),
    ast.Sub: (r"-", "-", "+"),
    ast.Mult: (r"\*", "*", "/"),
    ast.Div: (r"/", "/", "*"),
    ast.FloorDiv: (r"//", "//", "/"),
    ast.Mod: (r"%", "%", "//"),
}
_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


@dataclass(frozen=True)
class Mutation:
    """One edit: replace ``source[start:end]`` (character offsets) with ``replacement``."""

    operator: str
    line: int
    """1-based line of the mutated node in the original source."""
    start: int
    end: int
    replacement: str
    description: str
    """What changed, e.g. ``'<' -> '<='``."""
    function: str
    """Qualified name of the enclosing function, e.g. ``Duration.__add__``."""

    def apply(self, source: str) -> str:
        """The mutated source text."""
        return source[: self.start] + self.replacement + source[self.end :]


class _Offsets:
    """Converts AST (line, UTF-8 byte column) positions into character offsets of the source."""

    def __init__(self, source: str) -> None:
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, lineno: int, col_byte: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col_byte].decode("utf-8", "replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)

    def line_span(self, node: ast.stmt) -> tuple[int, int]:
        """Offsets of the whole lines ``node`` occupies, trailing newline included."""
        return self.starts[node.lineno - 1], self.starts[node.end_lineno]


def _own_lines(source: str, offsets: _Offsets, node: ast.stmt) -> bool:
    """Whether ``node`` fills its lines alone: nothing before it on its line, at most a comment after."""
    start, end = offsets.span(node)
    line_start, line_end = offsets.line_span(node)
    after = source[end:line_end].strip()
    return not source[line_start:start].strip() and (not after or after.startswith("#"))


class _Finder:
    """Collects candidate edits of one file, walking only function bodies (not annotations, not f-strings)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.offsets = _Offsets(source)
        self.found: list[Mutation] = []

    def text(self, node: ast.AST) -> str:
        start, end = self.offsets.span(node)
        return self.source[start:end]

    def add(self, op: str, node: ast.AST, span: tuple[int, int], new: str, desc: str, fn: str) -> None:
        self.found.append(Mutation(op, node.lineno, span[0], span[1], new, desc, fn))

    def between(self, op: str, node: ast.AST, left: ast.AST, right: ast.AST, pattern: str, new: str, fn: str):
        """Replace the operator token matched by ``pattern`` between two operands."""
        lo, hi = self.offsets.span(left)[1], self.offsets.span(right)[0]
        gap = self.source[lo:hi]
        match = re.search(rf"(?<![\w=<>!*/%+-])(?:{pattern})(?![\w=<>*/])", gap)
        if match is None or "#" in gap:
            return
        old = match.group(0)
        self.add(op, node, (lo + match.start(), lo + match.end()), new, f"{old!r} -> {new!r}", fn)

    # -- walking -------------------------------------------------------------------------------------

    def module(self, tree: ast.Module) -> None:
        self.scope(tree.body, prefix="")

    def scope(self, body: list[ast.stmt], prefix: str) -> None:
        for stmt in body:
            if isinstance(stmt, ast.ClassDef):
                self.scope(stmt.body, prefix + stmt.name + ".")
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                self.function(stmt, prefix + stmt.name)

    def function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> None:
        body = fn.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        for stmt in body:
            self.statement(stmt, name)

    def statement(self, stmt: ast.stmt, fn: str) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            self.function(stmt, f"{fn}.{stmt.name}")
            return
        if isinstance(stmt, ast.ClassDef):
            for inner in stmt.body:
                self.statement(inner, f"{fn}.{stmt.name}")
            return
        if isinstance(stmt, ast.If):
            self.if_statement(stmt, fn)
        if isinstance(stmt, ast.Return) and stmt.value is not None:
            self.return_value(stmt, fn)
        if isinstance(stmt, ast.AugAssign) and type(stmt.op) in _ARITH_SWAP:
            pattern, _, new = _ARITH_SWAP[type(stmt.op)]
            self.between("arith", stmt, stmt.target, stmt.value, pattern + "=", new + "=", fn)
        for field, value in ast.iter_fields(stmt):
            if field in ("annotation", "returns", "type_comment", "decorator_list"):
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.stmt):
                    self.statement(child, fn)
                elif isinstance(child, ast.expr):
                    self.expression(child, fn)
                elif isinstance(child, ast.excepthandler | ast.match_case | ast.withitem | ast.comprehension):
                    for sub in ast.iter_child_nodes(child):
                        (self.statement if isinstance(sub, ast.stmt) else self.expression)(sub, fn)

    def expression(self, node: ast.AST, fn: str) -> None:
        if not isinstance(node, ast.expr) or isinstance(node, ast.JoinedStr | ast.Lambda):
            return  # f-string positions are unreliable before 3.12; lambdas are rarely the point
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE_SWAP:
            pattern, new = _COMPARE_SWAP[type(node.ops[0])]
            self.between("compare", node, node.left, node.comparators[0], pattern, new, fn)
        elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH_SWAP:
            pattern, _, new = _ARITH_SWAP[type(node.op)]
            if not (_is_str(node.left) or _is_str(node.right)):  # '%' formatting, string concatenation
                self.between("arith", node, node.left, node.right, pattern, new, fn)
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            self.between("bool_op", node, node.values[0], node.values[1], old, new, fn)
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            self.add(
                "bool_flip",
                node,
                self.offsets.span(node),
                str(not node.value),
                f"{node.value} -> {not node.value}",
                fn,
            )
        elif isinstance(node, ast.Constant) and type(node.value) is int and self.text(node).isdigit():
            for new in (node.value + 1, node.value - 1):
                if new >= 0:
                    self.add(
                        "off_by_one", node, self.offsets.span(node), str(new), f"{node.value} -> {new}", fn
                    )
        elif isinstance(node, ast.Call):
            self.swap_args(node, fn)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expression(child, fn)
            elif isinstance(child, ast.comprehension | ast.keyword):
                for sub in ast.iter_child_nodes(child):
                    self.expression(sub, fn)

    # -- statement-level operators -------------------------------------------------------------------

    def if_statement(self, node: ast.If, fn: str) -> None:
        if (
            not node.orelse
            and isinstance(node.body[-1], _EXITS)
            and _own_lines(self.source, self.offsets, node)
        ):
            self.add(
                "drop_guard",
                node,
                self.offsets.line_span(node),
                "",
                f"guard at line {node.lineno} removed",
                fn,
            )
        for branch in (node.body, node.orelse):
            if branch and isinstance(branch[0], ast.If) and len(branch) == 1 and branch is node.orelse:
                continue  # an elif: its own If node is visited on its own
            for stmt in branch:
                if not _own_lines(self.source, self.offsets, stmt):
                    continue
                lo, hi = self.offsets.line_span(stmt)
                if len(branch) > 1:
                    self.add(
                        "drop_branch_stmt", stmt, (lo, hi), "", f"statement at line {stmt.lineno} removed", fn
                    )
                elif not isinstance(stmt, ast.Pass):
                    indent = self.source[lo : self.offsets.span(stmt)[0]]
                    self.add(
                        "drop_branch_stmt",
                        stmt,
                        (lo, hi),
                        indent + "pass\n",
                        f"line {stmt.lineno} -> pass",
                        fn,
                    )

    def return_value(self, node: ast.Return, fn: str) -> None:
        value = node.value
        span = self.offsets.span(value)
        if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not):
            self.add("return_value", node, span, self.text(value.operand), "'not' dropped from return", fn)
        elif isinstance(value, ast.Compare | ast.BoolOp):
            self.add("return_value", node, span, f"not ({self.text(value)})", "return value negated", fn)
        elif not (isinstance(value, ast.Constant) and value.value is None):
            self.add("return_value", node, span, "None", "return value -> None", fn)

    def swap_args(self, node: ast.Call, fn: str) -> None:
        args = node.args
        if len(args) < 2 or any(isinstance(a, ast.Starred) for a in args[:2]):
            return
        first, second = self.text(args[0]), self.text(args[1])
        if first == second:
            return
        lo, mid_lo = self.offsets.span(args[0])
        mid_hi, hi = self.offsets.span(args[1])
        new = second + self.source[mid_lo:mid_hi] + first
        self.add("swap_args", node, (lo, hi), new, "first two arguments swapped", fn)


def _is_str(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)) or isinstance(
        node, ast.JoinedStr
    )


def _valid(source: str, original_dump: str, mutation: Mutation) -> bool:
    try:
        tree = pyast.parse(mutation.apply(source))
    except SyntaxError:
        return False
    return ast.dump(tree) != original_dump


def find_mutations(source: str, lines: set[int] | None = None) -> list[Mutation]:
    """Every valid mutation of the functions in ``source``, in source order.

    Args:
        source: Python module text.
        lines: if given, keep only mutations whose node starts on one of these 1-based lines
            (e.g. the lines the test suite executed).

    Returns:
        Mutations that each parse and change the AST; empty if ``source`` does not parse.
    """
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return []
    finder = _Finder(source)
    finder.module(tree)
    original = ast.dump(tree)
    picked = [m for m in finder.found if lines is None or m.line in lines]
    unique = {(m.start, m.end, m.replacement): m for m in picked}
    return sorted(
        (m for m in unique.values() if _valid(source, original, m)),
        key=lambda m: (m.start, m.end, m.operator),
    )
