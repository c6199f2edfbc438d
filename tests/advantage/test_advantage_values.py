"""Hand-computed values and bad input for gagar.advantage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gagar.advantage import (
    AdvantageInputs,
    Estimator,
    compute_advantages,
    credit_moved_ratio,
    get_estimator,
    grpo_advantages,
    keep_mixed_groups,
    redistribute,
    register_estimator,
)


def test_grpo_by_hand():
    # Group a: rewards 1,0,0,1 -> mean 0.5, unbiased std sqrt(1/3).
    adv = grpo_advantages([1, 0, 0, 1, 1], ["a", "a", "a", "a", "b"])
    s = math.sqrt(1 / 3)
    np.testing.assert_allclose(
        adv, [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6), 0.0]
    )


def test_dr_grpo_only_centres():
    np.testing.assert_allclose(
        grpo_advantages([1, 0, 0, 0], [0, 0, 0, 0], norm_std=False), [0.75, -0.25, -0.25, -0.25]
    )


def test_group_of_one_gets_zero_and_uniform_group_gets_zero():
    np.testing.assert_array_equal(grpo_advantages([1, 0, 0], [1, 2, 2]), [0.0, 0.0, 0.0])


def test_keep_mixed_groups():
    mask = keep_mixed_groups([1, 0, 1, 1, 0, 0, 1], [0, 0, 1, 1, 2, 2, 3])
    np.testing.assert_array_equal(mask, [True, True, False, False, False, False, False])


def test_geometric_redistribution_by_hand():
    # Three passing (ranks 1, 2, 3) and one failing member; GRPO gives each passer A.
    rewards = np.array([1, 1, 1, 0.0])
    base = grpo_advantages(rewards, [0] * 4)
    a = base[0]
    new = redistribute(base, rewards, [0] * 4, [1, 2, 3, np.nan], gamma=0.5)
    # weights 1, 0.5, 0.25; sum of A preserved: 3A * w / 1.75
    np.testing.assert_allclose(new[:3], [3 * a / 1.75, 1.5 * a / 1.75, 0.75 * a / 1.75])
    assert new[3] == base[3]
    assert credit_moved_ratio(base, new, rewards) == pytest.approx((3 / 1.75 - 1) * a / (3 * a), rel=1e-12)


def test_linear_redistribution_reaches_the_floor_at_the_worst_rank():
    rewards = np.array([1, 1, 1, 0, 0.0])
    base = grpo_advantages(rewards, [0] * 5)
    new = redistribute(base, rewards, [0] * 5, [1, 2, 3, np.nan, np.nan], decay="linear", floor=0.2)
    weights = np.array([1.0, 0.6, 0.2])
    np.testing.assert_allclose(new[:3], base[:3] * weights * 3 / weights.sum())


def test_score_decay_uses_scores():
    rewards = np.array([1, 1, 0.0])
    base = grpo_advantages(rewards, [0] * 3)
    new = redistribute(base, rewards, [0] * 3, [1, 2, np.nan], decay="score", floor=0.5, scores=[0.9, 0.1, 0])
    np.testing.assert_allclose(new[:2], base[:2] * np.array([1.0, 0.5]) * 2 / 1.5)


def test_non_mixed_groups_pass_through():
    rewards = np.array([1, 1, 1.0])
    base = grpo_advantages(rewards, [0] * 3)
    np.testing.assert_array_equal(redistribute(base, rewards, [0] * 3, [1, 2, 3]), base)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: grpo_advantages([1, 0], [0]), "group_ids has 1 entries"),
        (lambda: grpo_advantages([1, np.nan], [0, 0]), "rewards contains NaN"),
        (lambda: grpo_advantages([[1, 0]], [0, 0]), "one-dimensional"),
        (lambda: keep_mixed_groups([1, 0.5], [0, 0]), "rewards must be binary"),
        (lambda: redistribute([1.0, -1.0], [1, 0], [0, 0], [np.nan, np.nan]), "index 0 has no rank"),
        (lambda: redistribute([1.0, -1.0], [1, 0], [0, 0], [1, 1], decay="cubic"), "unknown decay 'cubic'"),
        (lambda: redistribute([1.0, -1.0], [2, 0], [0, 0], [1, 1]), "passed must be binary"),
        (lambda: redistribute([1.0, -1.0], [1, 0], [0, 0], [0, 1]), "ranks start at 1"),
        (lambda: redistribute([1.0, -1.0], [1, 0], [0, 0], [1, 1], decay="score"), "needs grader scores"),
        (lambda: redistribute([1.0, -1.0], [1, 0], [0, 0], [1, 1], gamma=1.5), "gamma must be in"),
        (
            lambda: redistribute(
                [1.0, 1.0, -2.0], [1, 1, 0], [0] * 3, [1, 2, 9], decay="score", scores=[0.1, 0.9, 0]
            ),
            "scores disagree with ranks",
        ),
    ],
)
def test_bad_input_names_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_registry_refuses_duplicates_and_unknown_names():
    with pytest.raises(ValueError, match="already registered"):
        register_estimator(Estimator.GRPO)(lambda inputs, config: (inputs.rewards, {}))
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        get_estimator("ppo")


def test_estimators_through_the_registry():
    inputs = AdvantageInputs(
        rewards=np.array([1, 1, 0, 0.0]),
        group_ids=np.array([0, 0, 0, 0]),
        ranks=np.array([1, 2, np.nan, np.nan]),
    )
    grpo, _ = compute_advantages("grpo", inputs)
    dr, _ = compute_advantages("dr_grpo", inputs)
    gagar, metrics = compute_advantages("gagar", inputs)
    np.testing.assert_allclose(dr, [0.5, 0.5, -0.5, -0.5])
    assert gagar[0] > grpo[0] > gagar[1] > 0
    assert gagar[:2].sum() == pytest.approx(grpo[:2].sum())
    assert 0 < metrics["credit/moved_ratio"] < 1
