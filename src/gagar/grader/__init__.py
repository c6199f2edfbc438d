"""The grader: shared group workspaces, inspection tools, graders (heuristic, learned, LLM), grader SFT.

Start with :func:`gagar.stages.grade_stage` (what ``gagar grade`` and the grade stage run) and
:func:`gagar.grader.base.grade_group` (one group, never raising for a bad grader).
"""

from gagar.grader.base import Grader, GraderFailure, GraderMetrics, PositionGuard, Ranking, grade_group
from gagar.grader.heuristic import HeuristicGrader
from gagar.grader.kendall import kendall_distance, kendall_tau_b
from gagar.grader.workspace import GroupWorkspace, build_group_workspace
from gagar.schema.grade import Grade, RankingError, ranks_for, tie_grade, validate_ranking

__all__ = [
    "Grade",
    "Grader",
    "GraderFailure",
    "GraderMetrics",
    "GroupWorkspace",
    "HeuristicGrader",
    "PositionGuard",
    "Ranking",
    "RankingError",
    "build_group_workspace",
    "grade_group",
    "kendall_distance",
    "kendall_tau_b",
    "ranks_for",
    "tie_grade",
    "validate_ranking",
]
