"""Hypothesis strategies shared by the advantage tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


@st.composite
def batches(draw, max_groups: int = 12, max_size: int = 10, shuffle: bool = True):
    """A flat batch: rewards, group ids, ranks (NaN for failing) and rank-consistent scores."""
    n_groups = draw(st.integers(1, max_groups))
    rewards, groups, ranks, scores = [], [], [], []
    for g in range(n_groups):
        size = draw(st.integers(1, max_size))
        r = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=size, max_size=size))
        k = int(sum(r))
        raw_ranks = draw(st.lists(st.integers(1, max(k, 1)), min_size=k, max_size=k))
        it = iter(raw_ranks)
        for reward in r:
            rewards.append(reward)
            groups.append(g * 7 + 3)  # sparse ids
            if reward:
                rank = float(next(it))
                ranks.append(rank)
                scores.append(10.0 - rank)  # consistent with the ranks
            else:
                ranks.append(np.nan)
                scores.append(np.nan)
    order = np.arange(len(rewards))
    if shuffle:
        order = np.array(draw(st.permutations(list(order))), dtype=int)
    pick = lambda xs: np.asarray(xs, dtype=float)[order]  # noqa: E731
    return pick(rewards), np.asarray(groups)[order], pick(ranks), pick(scores)
