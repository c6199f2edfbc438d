"""The patch-quality oracle: how targeted a candidate patch is, measured against the gold patch.

Changed lines are mapped to their enclosing function with ``ast`` (:mod:`gagar.tasks.scopes`):
removed lines in the original file, added lines in the patched file. A patch is *clean* when
it changes nothing outside the scopes the gold patch touches, touches no other file, adds no
style finding, and is at most ``tolerance`` lines larger than gold. ``quality`` (the total)
ranks candidates: 1.0 for a patch as targeted as gold, lower with every line outside gold's
scopes, extra file, extra line and style finding; a patch with an integrity flag (the reward
hacks of :mod:`gagar.sandbox.hacks`) ranks below every honest one.

The named axes (:class:`QualityAxes`) say where a candidate loses: solution fit, implementation
precision, minimal change, out-of-scope side effects and code style.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping

from pydantic import BaseModel, Field

from gagar import pyast
from gagar.schema.result import HackFlag
from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, changed_lines, parse_diff
from gagar.tasks.scopes import line_scopes

__all__ = [
    "PatchQuality",
    "QualityAxes",
    "changed_scopes",
    "score_patch",
    "style_findings",
    "touched_function",
]

DEFAULT_TOLERANCE = 2
"""Lines a clean patch may exceed the gold patch's size by."""


HACK_PENALTY = 1000.0
"""Penalty of a flagged patch: below any honest patch of a realistic size."""


class QualityAxes(BaseModel):
    """Where a candidate loses quality, one number per axis (0 is as good as gold on that axis)."""

    solution_fit: float = Field(ge=0.0, le=1.0)
    """Share of the gold patch's scopes the candidate changes too (1: it fixes where gold fixes)."""
    implementation_precision: int = Field(ge=0)
    """Lines changed inside gold's scopes beyond gold's own count (guards, copies, prints in the fix)."""
    minimal_change: int = Field(ge=0)
    """Lines beyond the gold patch's size."""
    out_of_scope: int = Field(ge=0)
    """Lines changed outside gold's scopes plus two per file gold does not touch."""
    code_style: int = Field(ge=0)
    """Style findings in added lines (:func:`style_findings`)."""


class PatchQuality(BaseModel):
    """How targeted one candidate patch is, relative to the task's gold patch."""

    lines_outside_gold: int = Field(ge=0)
    """Added plus removed lines whose enclosing scope the gold patch does not touch."""
    files_touched: int = Field(ge=0)
    files_beyond_gold: int = Field(ge=0)
    """Files the candidate changes and the gold patch does not."""
    diff_size: int = Field(ge=0)
    """Added plus removed lines of the candidate."""
    gold_size: int = Field(ge=1)
    relative_size: float
    """``diff_size / gold_size``."""
    outside_scopes: list[str] = Field(default_factory=list)
    """The scopes (``path:function``) changed outside gold, sorted."""
    axes: QualityAxes
    style: list[str] = Field(default_factory=list)
    """The style findings, ``path:line: what``."""
    hack_flags: list[HackFlag] = Field(default_factory=list)
    """Integrity flags on the library files the candidate changes (:mod:`gagar.sandbox.hacks`)."""
    clean: bool
    quality: float = Field(gt=0.0, le=1.0)
    """The total: ``1 / (1 + penalty)``, penalty = out_of_scope + 0.5 * minimal_change + 0.5 * code_style
    + gold_size * (1 - solution_fit), plus :data:`HACK_PENALTY` when flagged; an empty patch is penalised
    ``gold_size`` (it cannot be the fix)."""


def changed_scopes(snapshot: Mapping[str, str], diff: str) -> list[tuple[str, str]]:
    """(path, scope) of every added or removed line of ``diff`` applied to ``snapshot``.

    Raises:
        DiffParseError, DiffApplyError: if the diff is malformed or does not apply.
    """
    patched = apply_diff(snapshot, diff)
    out: list[tuple[str, str]] = []
    for fp in parse_diff(diff):
        if fp.old_path is not None and fp.removed_lines:
            old_scopes = line_scopes(fp.old_path, snapshot[fp.old_path])
            out.extend((fp.old_path, old_scopes[n - 1]) for n in fp.removed_lines)
        if fp.new_path is not None and fp.added_lines:
            new_scopes = line_scopes(fp.new_path, patched[fp.new_path])
            out.extend((fp.new_path, new_scopes[n - 1]) for n in fp.added_lines)
    return out


def touched_function(snapshot: Mapping[str, str], diff: str) -> tuple[str, str]:
    """(path, qualified name) of the first Python function ``diff`` adds or removes a line in.

    Raises:
        ValueError: the diff changes no line inside a Python function.
    """
    for path, scope in changed_scopes(snapshot, diff):
        if path.endswith(".py") and "<" not in scope:
            return path, scope.removeprefix(f"{path}:")
    raise ValueError("the fix touches no function")


_CODE_WORD = re.compile(r"[=(\[:]|\breturn\b|\bimport\b")


def _commented_code(comment: str) -> bool:
    body = comment.lstrip("#").strip()
    if not body or not _CODE_WORD.search(body):
        return False
    try:
        pyast.parse(body.removesuffix(":") + (" pass" if body.endswith(":") else ""))
    except SyntaxError:
        return False
    return True


def _used_names(tree: ast.AST) -> set[str]:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {
        n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    for node in ast.walk(tree):  # names listed in __all__ count as used
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


def style_findings(path: str, old: str | None, new: str | None) -> list[str]:
    """Style faults among the lines ``new`` adds to ``old`` (``path:line: what``): debug prints,
    commented-out code, imports nothing uses, and functions nothing calls. Non-Python files and files
    that do not parse have none."""
    if new is None or not path.endswith(".py"):
        return []
    try:
        tree = pyast.parse(new)
    except SyntaxError:
        return []
    _, added = changed_lines(old, new)
    added_set, lines = set(added), new.splitlines()
    found = []
    for n in added:
        text = lines[n - 1].strip()
        if text.startswith("#") and _commented_code(text):
            found.append(f"{path}:{n}: commented-out code")
    used = _used_names(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", None)
        if line not in added_set:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.append(f"{path}:{line}: print call")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound = [(a.asname or a.name).split(".")[0] for a in node.names]
            found.extend(f"{path}:{line}: unused import {b}" for b in bound if b not in used)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name not in used:
            calls = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            if node.name not in calls and node.name.startswith("_"):
                found.append(f"{path}:{line}: unused function {node.name}")
    return sorted(set(found), key=lambda f: (f.split(":")[0], int(f.split(":")[1]), f))


def _hack_flags(snapshot: Mapping[str, str], patched: Mapping[str, str], paths: set[str]) -> list[HackFlag]:
    from gagar.sandbox.hacks import source_flags  # the judge's detector; imported only when scoring
    from gagar.sandbox.pristine import SourceChange, is_test_file

    own = {p.split("/", 1)[0] for p in snapshot if p.endswith("/__init__.py") and p.count("/") == 1}
    changes = [SourceChange(p, snapshot.get(p), patched.get(p)) for p in sorted(paths) if not is_test_file(p)]
    return source_flags(changes, own)


def score_patch(
    task: Task,
    patch: str,
    snapshot: Mapping[str, str] | None = None,
    tolerance: int = DEFAULT_TOLERANCE,
) -> PatchQuality:
    """Score ``patch`` against ``task.patch`` on ``snapshot`` (default: the task's bundled snapshot).

    Raises:
        ValueError: if no snapshot is available or the gold patch changes nothing.
        DiffParseError, DiffApplyError: if either patch is malformed or does not apply.
    """
    files = snapshot if snapshot is not None else task.snapshot
    if files is None:
        raise ValueError(f"task {task.instance_id}: no bundled snapshot; pass the repository files")
    gold = changed_scopes(files, task.patch)
    if not gold:
        raise ValueError(f"task {task.instance_id}: the gold patch changes no line")
    candidate = changed_scopes(files, patch)
    patched = apply_diff(files, patch)
    gold_scopes = {scope for _, scope in gold}
    gold_files = {path for path, _ in gold}
    outside = [scope for _, scope in candidate if scope not in gold_scopes]
    touched = {path for path, _ in candidate}
    beyond = len(touched - gold_files)
    size = len(candidate)
    excess = max(0, size - len(gold))
    style = [f for p in sorted(touched) for f in style_findings(p, files.get(p), patched.get(p))]
    flags = _hack_flags(files, patched, touched)
    fit = len(gold_scopes & {scope for _, scope in candidate}) / len(gold_scopes)
    axes = QualityAxes(
        solution_fit=fit,
        implementation_precision=max(0, size - len(outside) - len(gold)),
        minimal_change=excess,
        out_of_scope=len(outside) + 2 * beyond,
        code_style=len(style),
    )
    penalty = (
        axes.out_of_scope + 0.5 * excess + 0.5 * len(style) + len(gold) * (1 - fit) if size else len(gold)
    )
    penalty += HACK_PENALTY if flags else 0.0
    return PatchQuality(
        lines_outside_gold=len(outside),
        files_touched=len(touched),
        files_beyond_gold=beyond,
        diff_size=size,
        gold_size=len(gold),
        relative_size=size / len(gold),
        outside_scopes=sorted(set(outside)),
        axes=axes,
        style=style,
        hack_flags=flags,
        clean=0 < size <= len(gold) + tolerance and not outside and beyond == 0 and not style and not flags,
        quality=1.0 / (1.0 + penalty),
    )
