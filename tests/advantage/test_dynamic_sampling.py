"""Dynamic sampling: batch assembly across generation batches."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.advantage import RewardBatch, assemble_batch, filter_generation_batch


def _batch(groups: list[list[int]], start: int, infra: list[list[bool]] | None = None) -> RewardBatch:
    rewards = [r for g in groups for r in g]
    ids = [start + i for i, g in enumerate(groups) for _ in g]
    flags = [f for g in infra for f in g] if infra else [False] * len(rewards)
    return RewardBatch(np.array(rewards, float), np.array(ids), np.array(flags))


def test_filter_drops_uniform_groups_and_infra_errors():
    batch = _batch(
        [[1, 0, 1], [1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 0]],
        start=0,
        infra=[[False, False, True], [False] * 3, [False] * 3, [False, True, True], [False, False]],
    )
    keep, dropped = filter_generation_batch(batch)
    # group 0 keeps its two valid members; group 3 is left with one member (too small).
    np.testing.assert_array_equal(
        keep, [True, True, False, False, False, False, False, False, False, False, False, False, True, True]
    )
    assert dropped == {"all_pass": 1, "all_fail": 1, "too_small": 1, "surplus": 0}


def test_a_group_whose_only_failure_was_infra_becomes_all_pass():
    batch = _batch([[1, 1, 0]], start=0, infra=[[False, False, True]])
    keep, dropped = filter_generation_batch(batch)
    assert not keep.any()
    assert dropped["all_pass"] == 1


def test_assembly_refills_from_further_batches_and_stops_when_full():
    produced: list[int] = []

    def generation() -> Iterator[RewardBatch]:
        for b in range(10):
            produced.append(b)
            yield _batch([[1, 0], [1, 1], [0, 0], [0, 1]], start=4 * b)

    result = assemble_batch(generation(), train_batch_groups=5, max_gen_batches=10)
    assert result.full
    assert produced == [0, 1, 2]  # lazily: no batch generated beyond need
    c = result.counts
    assert (c.gen_batches, c.generated_trajectories, c.generated_groups) == (3, 24, 12)
    assert (c.kept_groups, c.kept_trajectories) == (5, 10)
    assert c.dropped_groups == {"all_pass": 3, "all_fail": 3, "too_small": 0, "surplus": 1}
    assert [int(k.sum()) for k in result.keep] == [4, 4, 2]


def test_assembly_stops_at_max_gen_batches():
    batches = (_batch([[1, 1], [0, 1]], start=2 * b) for b in range(100))
    result = assemble_batch(batches, train_batch_groups=10, max_gen_batches=3)
    assert not result.full
    assert result.counts.gen_batches == 3
    assert result.counts.kept_groups == 3
    assert result.counts.as_metrics()["sampling/dropped/all_pass"] == 3.0


def test_a_group_in_two_batches_is_refused():
    with pytest.raises(ValueError, match="more than one generation batch"):
        assemble_batch([_batch([[1, 0]], 0), _batch([[1, 0]], 0)], train_batch_groups=5, max_gen_batches=5)


@settings(max_examples=100, deadline=None)
@given(
    data=st.lists(
        st.lists(
            st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=6), min_size=1, max_size=6
        ),
        min_size=1,
        max_size=6,
    ),
    target=st.integers(1, 20),
)
def test_counts_always_add_up(data, target):
    batches, start = [], 0
    for groups in data:
        rewards = [[int(r) for r, _ in g] for g in groups]
        infra = [[f for _, f in g] for g in groups]
        batches.append(_batch(rewards, start, infra))
        start += len(groups)
    result = assemble_batch(batches, train_batch_groups=target, max_gen_batches=len(batches))
    c = result.counts
    assert c.kept_groups + sum(c.dropped_groups.values()) == c.generated_groups
    assert c.kept_groups <= target
    assert c.kept_trajectories == sum(int(k.sum()) for k in result.keep)
    for batch, keep in zip(batches, result.keep, strict=False):
        assert not (keep & batch.infra_error).any()
        for g in np.unique(batch.group_ids[keep]):
            kept_rewards = batch.rewards[keep & (batch.group_ids == g)]
            assert 0 < kept_rewards.sum() < len(kept_rewards)
