"""The step's straggler policy: quorum, wait after the quorum, hard deadline."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gagar.sandbox.k8s import StragglerPolicy
from gagar.sandbox.k8s.straggler import quorum_size


@given(st.integers(min_value=1, max_value=100_000), st.floats(min_value=0.001, max_value=1.0))
def test_quorum_is_the_smallest_count_reaching_the_share(total: int, share: float) -> None:
    q = quorum_size(total, share)
    assert 1 <= q <= total
    assert q >= share * total - 1e-6
    assert q - 1 < share * total + 1e-6


def test_quorum_of_nothing_is_nothing() -> None:
    assert quorum_size(0, 0.9) == 0


def test_stragglers_get_their_wait_after_the_quorum_then_are_cut() -> None:
    policy = StragglerPolicy(quorum=0.9, wait_s=30.0)
    assert policy.cut_reason(100, 89, 0.0, None, 10_000.0) is None  # no quorum, no deadline: wait
    assert policy.cut_reason(100, 90, 0.0, 100.0, 129.0) is None
    reason = policy.cut_reason(100, 95, 0.0, 100.0, 130.0)
    assert reason is not None
    assert "95 of 100" in reason
    assert policy.cut_reason(100, 100, 0.0, 100.0, 500.0) is None  # all back: nothing to cut


def test_the_step_deadline_cuts_even_without_a_quorum() -> None:
    policy = StragglerPolicy(quorum=1.0, deadline_s=60.0)
    assert policy.cut_reason(10, 0, 5.0, None, 64.0) is None
    reason = policy.cut_reason(10, 3, 5.0, None, 65.0)
    assert reason is not None
    assert "step deadline" in reason
