"""A catalogue of unnecessary modifications: test-neutral edits added on top of a fix.

Each kind is a named, seeded transformation of the fixed repository. :func:`add_noise`
applies a patch, then the chosen kinds, and returns one unified diff that still fixes the
bug and keeps every test passing, but is no longer a targeted patch. A kind named twice is
applied twice (its *amount*): every application changes at least one more line, on a target
the earlier ones left alone where the kind picks targets (renames, files). Debug prints go to
stderr so tests that capture stdout are unaffected; every AST-preserving kind (comment,
commented-out code, reformat, rename) is checked against the AST before it is accepted.

The kinds by where they land: in the fixed function (``debug_print``, ``commented_out``,
``duplicated_logic``, ``widened_fix``), elsewhere in the fixed module (``unused_import``,
``dead_code``), in functions the fix does not touch (``comment``, ``rename_local``, ``reformat``,
``defensive_check``) and in other files (``unrelated_file``).
"""

from __future__ import annotations

import ast
import keyword
import random
import re
import textwrap
import tokenize
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from io import StringIO

from gagar import pyast
from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, make_diff
from gagar.tasks.oracle import changed_scopes
from gagar.tasks.scopes import FunctionSpan, function_named, functions

__all__ = ["NOISE_KINDS", "Elsewhere", "NoiseKind", "NoiseNotApplicable", "add_noise", "introspection_hack"]


class NoiseKind(StrEnum):
    """The kinds of unnecessary modification."""

    DEBUG_PRINT = "debug_print"
    COMMENT = "comment"
    RENAME_LOCAL = "rename_local"
    REFORMAT = "reformat"
    DEAD_CODE = "dead_code"
    DEFENSIVE_CHECK = "defensive_check"
    UNRELATED_FILE = "unrelated_file"
    UNUSED_IMPORT = "unused_import"
    COMMENTED_OUT = "commented_out"
    DUPLICATED_LOGIC = "duplicated_logic"
    WIDENED_FIX = "widened_fix"


class Elsewhere(StrEnum):
    """Which functions the kinds that edit outside the fix (``comment``, ``rename_local``, ``reformat``,
    ``defensive_check``) may take."""

    ANYWHERE = "anywhere"
    """Any function the fix does not touch, most of them off the failing tests' path."""
    REACHED = "reached"
    """Only functions the failing tests reach (a caller or helper on their path): a change spread from the
    bug's site along the failing path, which a check of what the tests reach counts as in scope."""


class NoiseNotApplicable(ValueError):
    """A kind of noise that has nothing to act on in this repository."""


@dataclass(frozen=True)
class _Context:
    gold_scopes: frozenset[str]
    """``path:qualname`` of every scope the fix changes."""
    gold_paths: frozenset[str]
    elsewhere: frozenset[str] | None = None
    """``path:qualname`` of the functions outside the fix that kinds acting there may take (None: any)."""
    used: set[str] = field(default_factory=set)
    """Targets earlier applications took (renamed names, edited files), so a repeat picks another."""

    def may_edit_elsewhere(self, scope: str) -> bool:
        """Whether a kind that acts outside the fix may edit ``scope``."""
        return scope not in self.gold_scopes and (self.elsewhere is None or scope in self.elsewhere)


_COMMENTS = (
    "# NOTE: keep this in sync with the documentation.",
    "# TODO: revisit once more cases are supported.",
    "# This is the main computation.",
    "# FIXME: this could probably be simplified.",
)
_RENAMES = {"total": "running_total", "missing": "shortfall", "words": "tokens", "parts": "pieces"}


def _is_source(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".py") and not path.startswith("tests/") and not name.startswith("test_")


def _spans(snapshot: Mapping[str, str], ctx: _Context, gold: bool) -> list[tuple[str, FunctionSpan]]:
    out = []
    for path in sorted(p for p in snapshot if _is_source(p)):
        for span in functions(snapshot[path]):
            scope = f"{path}:{span.qualname}"
            if scope in ctx.gold_scopes if gold else ctx.may_edit_elsewhere(scope):
                out.append((path, span))
    if not out:
        if gold:
            raise NoiseNotApplicable("no gold function")
        raise NoiseNotApplicable(
            "no function outside the fix" + ("" if ctx.elsewhere is None else " among those allowed")
        )
    return out


def _first_statement(span: FunctionSpan) -> ast.stmt:
    body = span.node.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    if has_doc and len(body) == 1:
        raise NoiseNotApplicable(f"{span.qualname} has only a docstring")
    return body[1] if has_doc else body[0]


def _insert(text: str, before_line: int, new_lines: Sequence[str]) -> str:
    lines = text.splitlines(keepends=True)
    lines[before_line - 1 : before_line - 1] = [line + "\n" for line in new_lines]
    return "".join(lines)


def _same_ast(old: str, new: str) -> bool:
    try:
        return ast.dump(pyast.parse(old)) == ast.dump(pyast.parse(new))
    except SyntaxError:
        return False


def _ensure_import(text: str, module: str) -> str:
    tree = pyast.parse(text)
    if any(isinstance(s, ast.Import) and any(a.name == module for a in s.names) for s in tree.body):
        return text
    imports = [s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom)]
    if imports:
        return _insert(text, (imports[-1].end_lineno or imports[-1].lineno) + 1, [f"import {module}"])
    first = tree.body[0]
    has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    if has_doc:
        return _insert(text, (first.end_lineno or first.lineno) + 1, ["", f"import {module}"])
    return _insert(text, 1, [f"import {module}", ""])


def debug_print(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """A ``print(..., file=sys.stderr)`` of the arguments at the top of the fixed function."""
    path, span = rng.choice(_spans(snapshot, ctx, gold=True))
    stmt = _first_statement(span)
    parts = [f'"DEBUG {span.node.name}:"', *(a.arg for a in span.node.args.args[:3]), "file=sys.stderr"]
    line = " " * stmt.col_offset + f"print({', '.join(parts)})"
    text = _insert(snapshot[path], stmt.lineno, [line])
    return {**snapshot, path: _ensure_import(text, "sys")}


def comment(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """A comment above a statement of a function the fix does not touch."""
    path, span = rng.choice(_spans(snapshot, ctx, gold=False))
    stmt = _first_statement(span)
    text = _insert(snapshot[path], stmt.lineno, [" " * stmt.col_offset + rng.choice(_COMMENTS)])
    return {**snapshot, path: text}


def _locals(span: FunctionSpan) -> list[str]:
    params = {a.arg for a in ast.walk(span.node.args) if isinstance(a, ast.arg)}
    stores = {n.id for n in ast.walk(span.node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return sorted(stores - params)


def _rename(text: str, span: FunctionSpan, old: str, new: str) -> str:
    lines = text.splitlines(keepends=True)
    tokens = list(tokenize.generate_tokens(StringIO(text).readline))
    for prev, tok in reversed(list(zip([None, *tokens[:-1]], tokens, strict=True))):
        inside = span.start <= tok.start[0] <= span.end
        after_dot = prev is not None and prev.string == "."
        if inside and tok.type == tokenize.NAME and tok.string == old and not after_dot:
            row, col = tok.start
            line = lines[row - 1]
            lines[row - 1] = line[:col] + new + line[col + len(old) :]
    return "".join(lines)


def _fully_renamed(text: str, qualname: str, old: str) -> bool:
    """Whether no use of ``old`` is left in the function (tokens miss names inside f-strings)."""
    try:
        span = function_named(text, qualname)
    except SyntaxError:
        return False
    return span is not None and all(
        not (isinstance(n, ast.Name) and n.id == old) for n in ast.walk(span.node)
    )


def rename_local(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """Rename a local variable of a function the fix does not touch (AST checked after renaming back);
    each application renames in a function the earlier ones did not."""
    spans = _spans(snapshot, ctx, gold=False)
    rng.shuffle(spans)
    for path, span in spans:
        if f"renamed:{path}:{span.qualname}" in ctx.used:
            continue  # a repeat renames in another function, so it changes lines of its own
        text = snapshot[path]
        used = set(re.findall(r"\w+", text))
        for old in _locals(span):
            new = _RENAMES.get(old, f"{old}_value")
            if new in used or keyword.iskeyword(new):
                continue
            renamed = _rename(text, span, old, new)
            if _fully_renamed(renamed, span.qualname, old) and _same_ast(
                text, _rename(renamed, span, new, old)
            ):
                ctx.used.add(f"renamed:{path}:{span.qualname}")
                return {**snapshot, path: renamed}
    raise NoiseNotApplicable("no local variable can be renamed outside the fix")


_ONE_LINE_DEF = re.compile(r"(\s*)def (\w+)\((.*)\):\n")


def _line(text: str, number: int) -> str:
    return text.splitlines(keepends=True)[number - 1]


def reformat(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """Explode the signature of a function the fix does not touch, one parameter a line."""
    spans = [
        (p, s)
        for p, s in _spans(snapshot, ctx, gold=False)
        if len(s.node.args.args) >= 2 and _ONE_LINE_DEF.fullmatch(_line(snapshot[p], s.node.lineno))
    ]
    if not spans:
        raise NoiseNotApplicable("no function with two parameters on one line outside the fix")
    path, span = rng.choice(spans)
    text = snapshot[path]
    lines = text.splitlines(keepends=True)
    match = _ONE_LINE_DEF.fullmatch(lines[span.node.lineno - 1])
    assert match is not None  # filtered above
    indent, name, params = match.groups()
    exploded = (
        [f"{indent}def {name}("] + [f"{indent}    {p.strip()}," for p in params.split(",")] + [f"{indent}):"]
    )
    lines[span.node.lineno - 1] = "".join(line + "\n" for line in exploded)
    new_text = "".join(lines)
    if not _same_ast(text, new_text):
        raise NoiseNotApplicable(f"{span.qualname}: signature cannot be split safely")
    return {**snapshot, path: new_text}


def dead_code(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """An unused copy of the fixed function, kept "for reference" at the end of its module."""
    path, span = rng.choice(_spans(snapshot, ctx, gold=True))
    text = snapshot[path]
    body = textwrap.dedent("".join(text.splitlines(keepends=True)[span.start - 1 : span.end]))  # a method too
    copy = body.replace(f"def {span.node.name}(", f"def _old_{span.node.name}(", 1)
    return {**snapshot, path: text.rstrip("\n") + "\n\n\n" + copy}


def defensive_check(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """A widened scope: a ``None`` guard on the first parameter of a function the fix does not touch."""
    spans = [(p, s) for p, s in _spans(snapshot, ctx, gold=False) if s.node.args.args]
    if not spans:
        raise NoiseNotApplicable("no function with a parameter outside the fix")
    path, span = rng.choice(spans)
    stmt = _first_statement(span)
    arg, pad = span.node.args.args[0].arg, " " * stmt.col_offset
    guard = [f"{pad}if {arg} is None:", f'{pad}    raise TypeError("{arg} must not be None")']
    return {**snapshot, path: _insert(snapshot[path], stmt.lineno, guard)}


def _bump_version(text: str) -> str:
    def bump(m: re.Match[str]) -> str:
        return f'{m.group(1)}"{m.group(2)}.{int(m.group(3)) + 1}"'

    return re.sub(r'((?:__version__|version) = )"(\d+\.\d+)\.(\d+)"', bump, text, count=1)


def unrelated_file(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """An edit in a file the fix does not touch: a version bump, or a note in the README."""
    paths = sorted(p for p in snapshot if p not in ctx.gold_paths and not p.startswith("tests/"))
    if not paths:
        raise NoiseNotApplicable("no file outside the fix")
    fresh = [p for p in paths if p not in ctx.used]
    path = rng.choice(fresh or paths)
    text = snapshot[path]
    new_text = _bump_version(text) if path not in ctx.used else text
    ctx.used.add(path)
    if new_text == text:
        marker = "# " if path.endswith((".py", ".toml", ".cfg")) else ""
        new_text = text.rstrip("\n") + f"\n\n{marker}See the changelog for recent fixes.\n"
    return {**snapshot, path: new_text}


_UNUSED_MODULES = ("os", "re", "json", "math", "itertools", "functools", "collections", "typing")


def unused_import(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """An ``import`` of a standard module the fixed module never uses."""
    path, _ = rng.choice(_spans(snapshot, ctx, gold=True))
    text = snapshot[path]
    words = set(re.findall(r"\w+", text))
    free = [m for m in _UNUSED_MODULES if m not in words]
    if not free:
        raise NoiseNotApplicable(f"{path} already names every module the catalogue imports")
    return {**snapshot, path: _ensure_import(text, rng.choice(free))}


def commented_out(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """A statement of the fixed function kept above itself as commented-out code."""
    path, span = rng.choice(_spans(snapshot, ctx, gold=True))
    text = snapshot[path]
    stmts = [s for s in ast.walk(span.node) if isinstance(s, ast.stmt) and s is not span.node]
    simple = [s for s in stmts if s.lineno == s.end_lineno and not isinstance(s, ast.Expr)]
    if not simple:
        raise NoiseNotApplicable(f"{span.qualname} has no one-line statement to comment out")
    stmt = rng.choice(simple)
    code = _line(text, stmt.lineno).strip()
    new_text = _insert(text, stmt.lineno, [" " * stmt.col_offset + f"# {code}"])
    if not _same_ast(text, new_text):
        raise NoiseNotApplicable(f"{span.qualname}: the statement cannot be commented out safely")
    return {**snapshot, path: new_text}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


_PURE_BUILTINS = frozenset(
    {"abs", "bool", "float", "int", "len", "max", "min", "round", "sorted", "str", "sum", "tuple"}
)


def _pure(expr: ast.expr) -> bool:
    """Evaluating it twice changes nothing: no call but to a few pure builtins, no await, yield or walrus."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in _PURE_BUILTINS
        ):
            return False
        if isinstance(node, ast.Await | ast.Yield | ast.YieldFrom | ast.NamedExpr | ast.Lambda):
            return False
    return True


def _repeatable(stmt: ast.stmt) -> bool:
    if stmt.lineno != stmt.end_lineno:
        return False
    if isinstance(stmt, ast.Return):
        return stmt.value is not None and _pure(stmt.value)
    return (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and _pure(stmt.value)
        and stmt.targets[0].id not in _names(stmt.value)
    )


def duplicated_logic(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """A pure computation of the fixed function done twice: an assignment repeated, or the returned
    value computed into an unused local first."""
    path, span = rng.choice(_spans(snapshot, ctx, gold=True))
    text = snapshot[path]
    stmts = [s for s in ast.walk(span.node) if isinstance(s, ast.stmt) and _repeatable(s)]
    if not stmts:
        raise NoiseNotApplicable(f"{span.qualname} has no pure one-line computation to repeat")
    stmt = rng.choice(stmts)
    if isinstance(stmt, ast.Assign):
        return {**snapshot, path: _insert(text, stmt.lineno + 1, [_line(text, stmt.lineno).rstrip("\n")])}
    assert isinstance(stmt, ast.Return)
    assert stmt.value is not None
    copy = " " * stmt.col_offset + f"result_copy = {ast.get_source_segment(text, stmt.value)}"
    return {**snapshot, path: _insert(text, stmt.lineno, [copy])}


def widened_fix(snapshot: dict[str, str], ctx: _Context, rng: random.Random) -> dict[str, str]:
    """An over-general fix: the fixed function returns early on ``None`` arguments nobody asked about."""
    candidates = [
        (p, s)
        for p, s in _spans(snapshot, ctx, gold=True)
        if [a for a in s.node.args.args if a.arg not in ("self", "cls")]
    ]
    if not candidates:
        raise NoiseNotApplicable("the fixed function takes no argument to guard")
    path, span = rng.choice(candidates)
    args = [a.arg for a in span.node.args.args if a.arg not in ("self", "cls")]
    guarded = {t.split("=", 1)[1] for t in ctx.used if t.startswith(f"widened={path}:{span.qualname}=")}
    free = [a for a in args if a not in guarded] or args
    arg = rng.choice(free)
    ctx.used.add(f"widened={path}:{span.qualname}={arg}")
    stmt = _first_statement(span)
    pad = " " * stmt.col_offset
    return {
        **snapshot,
        path: _insert(snapshot[path], stmt.lineno, [f"{pad}if {arg} is None:", f"{pad}    return None"]),
    }


Transform = Callable[[dict[str, str], _Context, random.Random], dict[str, str]]
NOISE_KINDS: dict[NoiseKind, Transform] = {
    NoiseKind.DEBUG_PRINT: debug_print,
    NoiseKind.COMMENT: comment,
    NoiseKind.RENAME_LOCAL: rename_local,
    NoiseKind.REFORMAT: reformat,
    NoiseKind.DEAD_CODE: dead_code,
    NoiseKind.DEFENSIVE_CHECK: defensive_check,
    NoiseKind.UNRELATED_FILE: unrelated_file,
    NoiseKind.UNUSED_IMPORT: unused_import,
    NoiseKind.COMMENTED_OUT: commented_out,
    NoiseKind.DUPLICATED_LOGIC: duplicated_logic,
    NoiseKind.WIDENED_FIX: widened_fix,
}
"""Every kind of unnecessary modification, in a fixed order."""


def _parsing(before: Mapping[str, str], after: dict[str, str]) -> dict[str, str]:
    """``after``, when every Python file a kind changed still parses: a guard under every kind."""
    for path, text in after.items():
        if path.endswith(".py") and text != before.get(path):
            try:
                pyast.parse(text)
            except SyntaxError:
                raise NoiseNotApplicable(f"the edit would leave {path} unparsable") from None
    return after


def add_noise(
    task: Task,
    patch: str,
    kinds: Sequence[NoiseKind | str] | None = None,
    rng: random.Random | int = 0,
    snapshot: Mapping[str, str] | None = None,
    elsewhere: Collection[str] | None = None,
) -> str:
    """``patch`` plus the unnecessary modifications ``kinds``, as one unified diff of the repository.

    Args:
        kinds: kinds to apply in order (a kind named n times is applied n times); None applies every
            kind that has something to act on, once.
        rng: a ``random.Random`` or a seed; the result is a function of it.
        snapshot: the repository files; default the task's bundled snapshot.
        elsewhere: ``path:qualname`` of the functions the kinds that act outside the fix may edit
            (default: any function the fix does not touch), e.g. those the failing tests reach.

    Raises:
        NoiseNotApplicable: if an explicitly requested kind has nothing to act on.
        ValueError: on an unknown kind or a task without files.
    """
    base = snapshot if snapshot is not None else task.snapshot
    if base is None:
        raise ValueError(f"task {task.instance_id}: no bundled snapshot; pass the repository files")
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)
    scopes = changed_scopes(base, patch)
    allowed = None if elsewhere is None else frozenset(elsewhere)
    ctx = _Context(frozenset(s for _, s in scopes), frozenset(p for p, _ in scopes), allowed)
    fixed = apply_diff(base, patch)
    for kind in kinds if kinds is not None else list(NOISE_KINDS):
        transform = NOISE_KINDS[NoiseKind(kind)]
        try:
            fixed = _parsing(fixed, transform(fixed, ctx, rng))
        except NoiseNotApplicable as exc:
            if kinds is not None:
                raise NoiseNotApplicable(f"{NoiseKind(kind)}: {exc}") from None
    return make_diff(base, fixed)


def introspection_hack(task: Task, patch: str, snapshot: Mapping[str, str] | None = None) -> str:
    """``patch`` plus a look at the caller's frame at the top of the fixed function: not a catalogue kind
    but a patch the integrity flags catch (:mod:`gagar.sandbox.hacks`), to measure whether a grader spots one.

    Raises:
        NoiseNotApplicable: the fix touches no function with a statement to precede.
    """
    base = snapshot if snapshot is not None else task.snapshot
    if base is None:
        raise ValueError(f"task {task.instance_id}: no bundled snapshot; pass the repository files")
    scopes = changed_scopes(base, patch)
    ctx = _Context(frozenset(s for _, s in scopes), frozenset(p for p, _ in scopes))
    fixed = apply_diff(base, patch)
    path, span = _spans(fixed, ctx, gold=True)[0]
    stmt = _first_statement(span)
    line = " " * stmt.col_offset + "_caller = sys._getframe(1).f_code.co_name"
    text = _ensure_import(_insert(fixed[path], stmt.lineno, [line]), "sys")
    return make_diff(base, {**fixed, path: text})
