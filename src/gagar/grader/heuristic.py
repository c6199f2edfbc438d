"""The heuristic grader: fixed rules over the inspection tools' outputs.

Each passing candidate gets a penalty, measured against the group's smallest change (which
stands in for the unknown gold patch)::

    penalty = lines out of scope + 2 * (files - fewest files) + 0.5 * (size - smallest size)
              + 0.5 * lint findings added + 0.5 * style findings added

and the score ``1 / (1 + penalty)``; equal scores are tied. A line is out of scope when the failing tests
do not reach its function, or when most of the group's passing candidates leave its function alone
(``out_of_scope_edits``): on a real library the tests reach far more code than the fix needs. Style
findings are the ``style_findings`` tool's (commented-out code, debug prints, unused imports, uncalled
private functions): ruff's default rules see no commented-out code, the commonest of them in policy
rollouts, so a patch that leaves the old line commented out above its fix would otherwise tie with the
clean fix. The final patch is what is ranked; a multi-turn candidate's evidence also says how it got
there (turns, test runs, edits reverted).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gagar.grader.base import Ranking
from gagar.grader.features import FEATURE_NAMES, evidence_line, group_features
from gagar.grader.tools import style_findings
from gagar.grader.workspace import GroupWorkspace
from gagar.schema.grade import ranking_from_scores

__all__ = ["HeuristicGrader", "heuristic_scores"]

_COL = {name: i for i, name in enumerate(FEATURE_NAMES)}


def heuristic_scores(raw: np.ndarray, style: np.ndarray | None = None) -> np.ndarray:
    """Scores ``(n_candidates,)`` in (0, 1] from raw features ``(n_candidates, n_features)`` and the
    style findings each candidate adds ``(n_candidates,)`` (none when not given)."""
    size = raw[:, _COL["added"]] + raw[:, _COL["removed"]]
    files = raw[:, _COL["files"]]
    penalty = (
        raw[:, _COL["lines_out_of_scope"]]
        + 2.0 * (files - files.min())
        + 0.5 * (size - size.min())
        + 0.5 * raw[:, _COL["lint_added"]]
        + 0.5 * (np.zeros(len(raw)) if style is None else style)
    )
    return 1.0 / (1.0 + penalty)


def _with_agent(line: str, ws: GroupWorkspace, tid: str) -> str:
    entry = ws.entry(tid)
    if entry.turns <= 1:
        return line
    return f"{line}; {entry.turns} turns, {entry.tests_run} test runs, {entry.edits_reverted} edits reverted"


class HeuristicGrader:
    """Rules over the tool outputs; deterministic and independent of the candidates' order."""

    name = "heuristic"
    version = "3"
    """3: lines off the group's core count as out of scope; 2: style findings count (1 saw lint only)."""
    concurrency = 1
    max_candidates = None

    def rank(self, ws: GroupWorkspace, order: Sequence[str]) -> Ranking:
        ids = sorted(order)
        raw = group_features(ws, ids)
        style = np.array([len(style_findings(ws, t).findings) for t in ids], dtype=float)
        scores = dict(zip(ids, heuristic_scores(raw, style).round(6).tolist(), strict=True))
        evidence = {
            t: _with_agent(evidence_line(row) + (f"; {int(n)} style findings" if n else ""), ws, t)
            for t, row, n in zip(ids, raw, style, strict=True)
        }
        return Ranking(ranking_from_scores(scores), scores, evidence)
