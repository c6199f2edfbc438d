"""The heuristic grader: fixed rules over the inspection tools' outputs.

Each passing candidate gets a penalty, measured against the group's smallest change (which
stands in for the unknown gold patch)::

    penalty = lines out of scope + 2 * (files - fewest files) + 0.5 * (size - smallest size)
              + 0.5 * lint findings added

and the score ``1 / (1 + penalty)``; equal scores are tied. The final patch is what is ranked; a
multi-turn candidate's evidence also says how it got there (turns, test runs, edits reverted).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gagar.grader.base import Ranking
from gagar.grader.features import FEATURE_NAMES, evidence_line, group_features
from gagar.grader.workspace import GroupWorkspace
from gagar.schema.grade import ranking_from_scores

__all__ = ["HeuristicGrader", "heuristic_scores"]

_COL = {name: i for i, name in enumerate(FEATURE_NAMES)}


def heuristic_scores(raw: np.ndarray) -> np.ndarray:
    """Scores ``(n_candidates,)`` in (0, 1] from raw features ``(n_candidates, n_features)``."""
    size = raw[:, _COL["added"]] + raw[:, _COL["removed"]]
    files = raw[:, _COL["files"]]
    penalty = (
        raw[:, _COL["lines_out_of_scope"]]
        + 2.0 * (files - files.min())
        + 0.5 * (size - size.min())
        + 0.5 * raw[:, _COL["lint_added"]]
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
    version = "1"
    concurrency = 1
    max_candidates = None

    def rank(self, ws: GroupWorkspace, order: Sequence[str]) -> Ranking:
        raw = group_features(ws, sorted(order))
        scores = dict(zip(sorted(order), heuristic_scores(raw).round(6).tolist(), strict=True))
        evidence = {
            t: _with_agent(evidence_line(row), ws, t) for t, row in zip(sorted(order), raw, strict=True)
        }
        return Ranking(ranking_from_scores(scores), scores, evidence)
