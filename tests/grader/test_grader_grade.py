"""The Grade record, ranking validation, rank arrays for redistribution, and rank agreement."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gagar.advantage import grpo_advantages, redistribute
from gagar.grader.kendall import kendall_distance, kendall_tau_b, scores_from_ranking, top1_correct
from gagar.schema.grade import (
    Grade,
    RankingError,
    ranking_from_scores,
    ranks_for,
    tie_grade,
    validate_ranking,
)


def test_ranks_view_gives_tied_ids_a_shared_competition_rank() -> None:
    grade = Grade(group_id="g", ranking=[["a"], ["b", "c"], ["d"]], grader="heuristic")
    assert grade.ranks == {"a": 1, "b": 2, "c": 2, "d": 4}
    assert grade.candidates == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("ranking", "kind", "ids"),
    [
        ([["a"], ["b"]], "omitted_candidate", ["c"]),
        ([["a", "b"], ["c", "x"]], "invented_candidate", ["x"]),
        ([["a", "b"], ["b", "c"]], "duplicated_candidate", ["b"]),
        ([["a", "b", "c"], []], "empty_tier", []),
    ],
)
def test_validate_ranking_names_what_is_wrong(ranking: list[list[str]], kind: str, ids: list[str]) -> None:
    with pytest.raises(RankingError) as info:
        validate_ranking(["a", "b", "c"], ranking)
    assert info.value.kind == kind
    assert info.value.ids == ids


def test_grade_refuses_inconsistent_fields() -> None:
    with pytest.raises(ValueError, match="twice"):
        Grade(group_id="g", ranking=[["a"], ["a"]], grader="x")
    with pytest.raises(ValueError, match="scores"):
        Grade(group_id="g", ranking=[["a"], ["b"]], scores={"a": 1.0}, grader="x")
    with pytest.raises(ValueError, match="fallback_reason"):
        Grade(group_id="g", ranking=[["a", "b"]], grader="x", fallback=True)


def test_tie_grade_reproduces_grpo_through_redistribute() -> None:
    ids = ["p1", "p2", "f1", "p3"]
    passed = np.array([1, 1, 0, 1])
    groups = np.zeros(4, dtype=int)
    grade = tie_grade("g", ["p1", "p2", "p3"], "timeout", detail="slow")
    assert grade.fallback
    assert grade.ranking == [["p1", "p2", "p3"]]
    ranks = ranks_for(ids, [grade])
    assert np.isnan(ranks[2])
    assert list(ranks[[0, 1, 3]]) == [1, 1, 1]
    base = grpo_advantages(passed, groups)
    np.testing.assert_allclose(redistribute(base, passed, groups, ranks), base)


def test_ranks_for_moves_credit_to_the_better_ranked_trajectory() -> None:
    ids = ["p1", "p2", "f1"]
    passed = np.array([1, 1, 0])
    groups = np.zeros(3, dtype=int)
    ranks = ranks_for(ids, [Grade(group_id="g", ranking=[["p2"], ["p1"]], grader="h")])
    assert list(ranks[:2]) == [2, 1]
    base = grpo_advantages(passed, groups)
    after = redistribute(base, passed, groups, ranks)
    assert after[1] > after[0] > 0
    assert after[2] == base[2]
    assert math.isclose(after[:2].sum(), base[:2].sum())


def test_ranks_for_refuses_a_trajectory_in_two_grades() -> None:
    grades = [Grade(group_id=g, ranking=[["x"]], grader="h") for g in ("g1", "g2")]
    with pytest.raises(ValueError, match="'x'"):
        ranks_for(["x"], grades)


def test_ranking_from_scores_ties_equal_scores() -> None:
    assert ranking_from_scores({"a": 0.5, "b": 1.0, "c": 0.5}) == [["b"], ["a", "c"]]


def test_kendall_tau_b_matches_known_values() -> None:
    # scipy.stats.kendalltau documentation example (tau-b with ties on both sides)
    assert math.isclose(kendall_tau_b([12, 2, 1, 12, 2], [1, 4, 7, 1, 0]), -0.47140452079103173)
    assert kendall_tau_b([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == -1.0
    assert math.isclose(kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]), 2 / 3)
    assert math.isnan(kendall_tau_b([1, 1, 1], [1, 2, 3]))


def test_kendall_distance_and_top1() -> None:
    a = scores_from_ranking([["x"], ["y"], ["z"]])
    assert kendall_distance(a, a) == 0.0
    assert kendall_distance(a, scores_from_ranking([["z"], ["y"], ["x"]])) == 1.0
    assert math.isclose(kendall_distance(a, scores_from_ranking([["x", "y"], ["z"]])), 0.5 / 3)
    truth = {"x": 1.0, "y": 0.5, "z": 0.5}
    assert top1_correct(a, truth)
    assert not top1_correct(scores_from_ranking([["x", "y", "z"]]), truth)
