"""The invariants of DESIGN.md §4, pinned with hypothesis, and agreement with the loop references."""

from __future__ import annotations

import numpy as np
import pytest
from advantage_strategies import batches
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.advantage import grpo_advantages, keep_mixed_groups, redistribute
from gagar.advantage_reference import grpo_advantages_loop, keep_mixed_groups_loop, redistribute_loop

DECAYS = ["geometric", "linear", "score"]


def _gagar(batch, decay: str, **kw):
    rewards, groups, ranks, scores = batch
    base = grpo_advantages(rewards, groups)
    new = redistribute(base, rewards, groups, ranks, decay=decay, scores=scores, **kw)
    return rewards.astype(bool), groups, ranks, base, new


@settings(max_examples=200, deadline=None)
@given(batch=batches(), decay=st.sampled_from(DECAYS))
def test_passing_sum_is_preserved_per_group(batch, decay):
    passed, groups, _, base, new = _gagar(batch, decay)
    for g in np.unique(groups):
        members = (groups == g) & passed
        before, after = base[members].sum(), new[members].sum()
        assert after == pytest.approx(before, rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(batch=batches(), decay=st.sampled_from(DECAYS))
def test_failing_advantages_are_untouched(batch, decay):
    passed, _, _, base, new = _gagar(batch, decay)
    np.testing.assert_array_equal(new[~passed], base[~passed])


@settings(max_examples=200, deadline=None)
@given(batch=batches(), decay=st.sampled_from(DECAYS), gamma=st.floats(0.05, 1.0))
def test_passing_advantages_stay_positive_in_mixed_groups(batch, decay, gamma):
    rewards, groups, *_ = batch
    passed, _, _, _, new = _gagar(batch, decay, gamma=gamma)
    mixed = keep_mixed_groups(rewards, groups)
    assert (new[passed & mixed] > 0).all()


@settings(max_examples=200, deadline=None)
@given(batch=batches(), decay=st.sampled_from(DECAYS))
def test_advantage_is_non_increasing_in_rank(batch, decay):
    passed, groups, ranks, _, new = _gagar(batch, decay)
    for g in np.unique(groups):
        members = np.flatnonzero((groups == g) & passed)
        order = members[np.argsort(ranks[members], kind="stable")]
        assert (np.diff(new[order]) <= 1e-12).all()
        tied = ranks[order][1:] == ranks[order][:-1]
        np.testing.assert_array_equal(new[order][1:][tied], new[order][:-1][tied])


@settings(max_examples=200, deadline=None)
@given(batch=batches(), decay=st.sampled_from(DECAYS), tie_rank=st.integers(1, 5))
def test_all_ties_reproduce_grpo_exactly(batch, decay, tie_rank):
    rewards, groups, _, _ = batch
    tied_ranks = np.where(rewards > 0, float(tie_rank), np.nan)
    tied_scores = np.where(rewards > 0, 0.5, np.nan)
    base = grpo_advantages(rewards, groups)
    new = redistribute(base, rewards, groups, tied_ranks, decay=decay, scores=tied_scores)
    np.testing.assert_array_equal(new, base)


@settings(max_examples=200, deadline=None)
@given(batch=batches(), decay=st.sampled_from(DECAYS), rank=st.integers(1, 9))
def test_a_single_passing_member_changes_nothing(batch, decay, rank):
    rewards, groups, _, _ = batch
    # Keep only the first passing member of each group passing.
    single = np.zeros_like(rewards)
    for g in np.unique(groups):
        members = np.flatnonzero((groups == g) & (rewards > 0))
        if members.size:
            single[members[0]] = 1.0
    base = grpo_advantages(single, groups)
    ranks = np.where(single > 0, float(rank), np.nan)
    new = redistribute(base, single, groups, ranks, decay=decay, scores=np.where(single > 0, 3.0, np.nan))
    np.testing.assert_array_equal(new, base)


@settings(max_examples=150, deadline=None)
@given(batch=batches(), norm_std=st.booleans())
def test_grpo_agrees_with_loop(batch, norm_std):
    rewards, groups, _, _ = batch
    expected = grpo_advantages_loop(list(rewards), list(groups), norm_std=norm_std)
    np.testing.assert_allclose(
        grpo_advantages(rewards, groups, norm_std=norm_std), expected, rtol=1e-12, atol=1e-12
    )
    np.testing.assert_array_equal(keep_mixed_groups(rewards, groups), keep_mixed_groups_loop(rewards, groups))


@settings(max_examples=150, deadline=None)
@given(batch=batches(), decay=st.sampled_from(DECAYS), gamma=st.floats(0.1, 1.0), floor=st.floats(0.05, 1.0))
def test_redistribute_agrees_with_loop(batch, decay, gamma, floor):
    rewards, groups, ranks, scores = batch
    base = grpo_advantages(rewards, groups)
    got = redistribute(base, rewards, groups, ranks, decay=decay, gamma=gamma, floor=floor, scores=scores)
    want = redistribute_loop(
        list(base),
        list(rewards > 0),
        list(groups),
        list(ranks),
        decay=decay,
        gamma=gamma,
        floor=floor,
        scores=list(scores),
    )
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(batch=batches())
def test_string_group_ids_give_the_same_result(batch):
    rewards, groups, ranks, _ = batch
    names = np.array([f"task-{g}/group" for g in groups])
    base = grpo_advantages(rewards, groups)
    np.testing.assert_array_equal(grpo_advantages(rewards, names), base)
    np.testing.assert_array_equal(
        redistribute(base, rewards, names, ranks), redistribute(base, rewards, groups, ranks)
    )
