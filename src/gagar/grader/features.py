"""Numeric evidence per candidate, from the inspection tools: what the heuristic rules and the
learned grader read, and the short evidence line each grade carries."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gagar.grader.tools import diff_stats, files_touched, functions_touched, lint_delta, out_of_scope_edits
from gagar.grader.workspace import GroupWorkspace

__all__ = ["FEATURE_NAMES", "candidate_features", "evidence_line", "group_features", "model_inputs"]

FEATURE_NAMES = (
    "added",
    "removed",
    "files",
    "hunks",
    "comment_lines",
    "blank_lines",
    "lines_out_of_scope",
    "lines_in_scope",
    "test_file_lines",
    "out_of_scope_scopes",
    "scopes_touched",
    "non_python_files",
    "lint_added",
    "prints_added",
)
"""The columns of :func:`group_features`, in order."""


def candidate_features(ws: GroupWorkspace, tid: str) -> np.ndarray:
    """The raw features of one candidate ``(n_features,)``, all non-negative counts."""
    stats = diff_stats(ws, tid)
    scope = out_of_scope_edits(ws, tid)
    lint = lint_delta(ws, tid)
    files = files_touched(ws, tid)
    values = (
        stats.added,
        stats.removed,
        stats.files,
        stats.hunks,
        stats.comment_lines,
        stats.blank_lines,
        scope.lines_out_of_scope,
        scope.lines_in_scope,
        scope.test_file_lines,
        len(scope.out_of_scope),
        len(functions_touched(ws, tid)),
        sum(f.kind == "other" for f in files),
        sum(max(0, d) for d in lint.by_code.values()),
        max(0, lint.by_code.get("T201", 0)),
    )
    return np.asarray(values, dtype=np.float64)


def group_features(ws: GroupWorkspace, ids: Sequence[str]) -> np.ndarray:
    """Raw features of the candidates ``ids``, ``(n_candidates, n_features)``."""
    key = ("features", tuple(ids))
    if key not in ws.cache:
        rows = [candidate_features(ws, t) for t in ids]
        ws.cache[key] = np.stack(rows) if rows else np.zeros((0, len(FEATURE_NAMES)))
    return ws.cache[key]


def model_inputs(raw: np.ndarray) -> np.ndarray:
    """What the learned grader sees ``(n_candidates, 2 * n_features)``: ``log1p`` of each count and of
    its excess over the group's smallest value (the smallest passing patch stands in for gold)."""
    excess = raw - raw.min(axis=0, keepdims=True)
    return np.concatenate([np.log1p(raw), np.log1p(excess)], axis=1).astype(np.float32)


def evidence_line(raw: np.ndarray) -> str:
    """A one-line summary of a candidate's features ``(n_features,)`` for the grade's evidence."""
    f = dict(zip(FEATURE_NAMES, raw.astype(int).tolist(), strict=True))
    return (
        f"+{f['added']} -{f['removed']} in {f['files']} file(s); "
        f"{f['lines_out_of_scope']} line(s) out of scope ({f['out_of_scope_scopes']} scope(s)); "
        f"lint +{f['lint_added']}, prints +{f['prints_added']}"
    )
