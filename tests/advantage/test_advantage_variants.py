"""The registered variants beside GAGAR: the paper's tiered form and the no-restore ablation."""

from __future__ import annotations

import numpy as np
import pytest
from advantage_strategies import batches
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.advantage import (
    AdvantageConfig,
    AdvantageInputs,
    Estimator,
    TierFactors,
    compute_advantages,
    grpo_advantages,
    redistribute,
    tiered_redistribute,
)
from gagar.advantage_reference import tiered_redistribute_loop


def _tiered(batch, factors: TierFactors | None = None):
    rewards, groups, ranks, _ = batch
    return tiered_redistribute(rewards, groups, ranks, factors)


@settings(max_examples=200, deadline=None)
@given(batch=batches(), lambda_max=st.floats(1.0, 5.0))
def test_tiered_agrees_with_the_loop_reference(batch, lambda_max):
    rewards, groups, ranks, _ = batch
    new = _tiered(batch, TierFactors(lambda_max=lambda_max))
    ref = tiered_redistribute_loop(list(rewards), list(groups), list(ranks), lambda_max=lambda_max)
    np.testing.assert_allclose(new, ref, rtol=1e-9, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(batch=batches(), lambda_max=st.floats(1.0, 5.0))
def test_tiered_groups_stay_centred(batch, lambda_max):
    _, groups, *_ = batch
    new = _tiered(batch, TierFactors(lambda_max=lambda_max))
    for g in np.unique(groups):
        assert new[groups == g].sum() == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(batch=batches())
def test_tiered_with_an_uncapped_restore_keeps_failing_advantages_and_the_passing_sum(batch):
    rewards, groups, *_ = batch
    centred = grpo_advantages(rewards, groups, norm_std=False)
    new = _tiered(batch, TierFactors(lambda_max=1e9))
    failed = rewards == 0
    np.testing.assert_allclose(new[failed], centred[failed], atol=1e-12)
    for g in np.unique(groups):
        members = (groups == g) & ~failed
        assert new[members].sum() == pytest.approx(centred[members].sum(), rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(batch=batches())
def test_tiered_advantage_is_non_increasing_in_rank(batch):
    rewards, groups, ranks, _ = batch
    new = _tiered(batch)
    for g in np.unique(groups):
        members = np.flatnonzero((groups == g) & (rewards == 1))
        order = members[np.argsort(ranks[members], kind="stable")]
        assert (np.diff(new[order]) <= 1e-12).all()


def test_tiered_factors_by_hand():
    """Five passing of eight: tiers 1, 1, 2, 2, 3 give factors 1.0, 0.9, 0.85, 0.4, 0.2."""
    rewards = np.array([1, 1, 1, 1, 1, 0, 0, 0], dtype=float)
    ranks = np.array([1, 2, 3, 4, 5, np.nan, np.nan, np.nan])
    new = tiered_redistribute(rewards, np.zeros(8), ranks)
    factors = np.array([1.0, 0.9, 0.85, 0.4, 0.2])
    lam = 5 / factors.sum()  # 1.49, under the cap of 2: the passing sum comes back whole
    np.testing.assert_allclose(new[:5], 0.375 * factors * lam)
    np.testing.assert_allclose(new[5:], -0.625)


def test_tiered_cap_bites_and_the_group_is_recentred():
    """With lambda_max 1 nothing is restored: the lost passing credit is spread over the whole group."""
    rewards = np.array([1, 1, 1, 0], dtype=float)
    ranks = np.array([1, 2, 3, np.nan])
    new = tiered_redistribute(rewards, np.zeros(4), ranks, TierFactors(lambda_max=1.0))
    scaled = 0.25 * np.array([1.0, 0.85, 0.2])  # tiers 1, 2, 3 of three candidates
    shift = (scaled.sum() - 0.75) / 4
    np.testing.assert_allclose(new, np.r_[scaled, -0.75] - shift)
    assert new.sum() == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("rewards", "ranks"),
    [
        ([1, 1, 1, 0], [1, 1, 1, np.nan]),  # an all-way tie (what a fallback grade is)
        ([1, 0, 0, 0], [1, np.nan, np.nan, np.nan]),  # one passing member
        ([1, 1, 0, 0], [np.nan] * 4),  # the grader failed: no ranks at all
        ([1, 1, 1, 1], [1, 2, 3, 4]),  # not mixed
    ],
)
def test_tiered_tie_single_failed_or_unmixed_group_keeps_grpo_centred(rewards, ranks):
    rewards = np.array(rewards, dtype=float)
    new = tiered_redistribute(rewards, np.zeros(4), np.array(ranks, dtype=float))
    np.testing.assert_allclose(new, grpo_advantages(rewards, np.zeros(4), norm_std=False))


@settings(max_examples=200, deadline=None)
@given(batch=batches())
def test_no_restore_only_down_weights(batch):
    rewards, groups, ranks, _ = batch
    base = grpo_advantages(rewards, groups)
    full = redistribute(base, rewards, groups, ranks)
    cut = redistribute(base, rewards, groups, ranks, restore_sum=False)
    passed = rewards == 1
    np.testing.assert_array_equal(cut[~passed], base[~passed])
    assert (cut[passed] <= base[passed] + 1e-12).all()  # weights are at most 1: nothing is paid back
    for g in np.unique(groups):
        members = (groups == g) & passed
        if members.any() and (base[members] > 0).all():
            # the two differ only by the per-group restoring factor
            ratio = full[members] / cut[members]
            np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)


def test_estimators_are_registered_and_use_a_grader():
    rewards = np.array([1, 1, 0, 0], dtype=float)
    inputs = AdvantageInputs(rewards=rewards, group_ids=np.zeros(4), ranks=np.array([1, 2, np.nan, np.nan]))
    config = AdvantageConfig()
    for name in ("gagar", "gagar-tiered", "gagar-no-restore"):
        assert Estimator(name).uses_grader
        adv, metrics = compute_advantages(name, inputs, config)
        assert adv[0] > adv[1] > 0 > adv[2]
        assert metrics["credit/moved_ratio"] > 0
        with pytest.raises(ValueError, match=f"the {name} estimator needs ranks"):
            compute_advantages(name, AdvantageInputs(rewards=rewards, group_ids=np.zeros(4)), config)
    assert not Estimator.GRPO.uses_grader
    assert not Estimator.DR_GRPO.uses_grader


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tier3": 0.0}, "in \\(0, 1\\]"),
        ({"tier2_bottom": 0.1, "tier3": 0.2}, "must not increase"),
        ({"cutoffs": (0.7, 0.3)}, "cutoffs"),
        ({"lambda_max": 0.5}, "lambda_max"),
    ],
)
def test_bad_tier_constants_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TierFactors(**kwargs)
