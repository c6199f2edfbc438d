"""The patch-quality oracle: how targeted a candidate patch is, measured against the gold patch.

Changed lines are mapped to their enclosing function with ``ast`` (:mod:`gagar.tasks.scopes`):
removed lines in the original file, added lines in the patched file. A patch is *clean* when
it changes nothing outside the scopes the gold patch touches, touches no other file, and is
at most ``tolerance`` lines larger than gold. ``quality`` ranks candidates: 1.0 for a patch
as targeted as gold, lower with every line outside gold's scopes, extra file and extra line.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, parse_diff
from gagar.tasks.scopes import line_scopes

__all__ = ["PatchQuality", "changed_scopes", "score_patch", "touched_function"]

DEFAULT_TOLERANCE = 2
"""Lines a clean patch may exceed the gold patch's size by."""


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
    clean: bool
    quality: float = Field(gt=0.0, le=1.0)
    """``1 / (1 + lines_outside_gold + 2 * files_beyond_gold + 0.5 * max(0, diff_size - gold_size))``;
    an empty patch is penalised ``gold_size`` instead (it cannot be the fix)."""


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
    gold_scopes = {scope for _, scope in gold}
    gold_files = {path for path, _ in gold}
    outside = [scope for _, scope in candidate if scope not in gold_scopes]
    touched = {path for path, _ in candidate}
    beyond = len(touched - gold_files)
    size = len(candidate)
    excess = max(0, size - len(gold))
    penalty = len(outside) + 2 * beyond + 0.5 * excess if size else len(gold)
    return PatchQuality(
        lines_outside_gold=len(outside),
        files_touched=len(touched),
        files_beyond_gold=beyond,
        diff_size=size,
        gold_size=len(gold),
        relative_size=size / len(gold),
        outside_scopes=sorted(set(outside)),
        clean=0 < size <= len(gold) + tolerance and not outside and beyond == 0,
        quality=1.0 / (1.0 + penalty),
    )
