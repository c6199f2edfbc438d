"""The update's micro-batches: a minibatch split by ``optim.micro_batch_tokens`` updates the policy as
the whole minibatch in one pass does, and the split bounds every pass's padded size."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fixtures.policy import tiny_lm
from gagar.schema.trajectory import SamplingParams, Trajectory
from gagar.train.loss import micro_batches
from gagar.train.update import OptimConfig, make_optimizer, update_policy


@given(st.lists(st.integers(1, 50), max_size=12), st.integers(1, 120))
def test_micro_batches_keep_order_and_bound_the_padded_size(lengths: list[int], budget: int) -> None:
    runs = micro_batches(lengths, budget)
    assert [i for run in runs for i in run] == list(range(len(lengths)))
    assert all(runs) or (runs == [[]] and lengths == [])
    for run in filter(None, runs):
        assert len(run) == 1 or len(run) * max(lengths[i] for i in run) <= budget


def test_without_a_budget_the_rows_are_one_pass() -> None:
    assert micro_batches([5, 900, 3], None) == [[0, 1, 2]]


def _trajectories(n: int) -> list[Trajectory]:
    """``n`` trajectories of different lengths, tool output masked out in some, and log-probs of
    another policy (so ratios differ from 1 and clipping happens)."""
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        prompt = [int(t) for t in rng.integers(1, 64, size=2 + i % 3)]
        response = [int(t) for t in rng.integers(1, 64, size=3 + (5 * i) % 11)]
        mask = [0 if (j + i) % 4 == 3 else 1 for j in range(len(response))]
        old = [-4.0 + 0.1 * j for j in range(len(response))]
        out.append(
            Trajectory(
                trajectory_id=f"t{i}", instance_id="x", group_id="g", prompt_token_ids=prompt,
                response_token_ids=response, old_logprobs=old,
                loss_mask=mask, n_prompt_tokens=len(prompt), n_response_tokens=len(response),
                sampling=SamplingParams(temperature=0.7),
            )
        )  # fmt: skip
    return out


@pytest.mark.parametrize("budget", [1, 24, 40])  # 1: a pass a row
def test_micro_batches_update_the_parameters_one_pass_does(budget: int) -> None:
    trajectories = _trajectories(7)
    advantages = np.linspace(-1.0, 1.2, num=7)
    results = {}
    for tokens in (None, budget):
        model = copy.deepcopy(tiny_lm())
        config = OptimConfig(lr=1e-2, minibatch_size=4, epochs=2, micro_batch_tokens=tokens)
        metrics = update_policy(
            model, make_optimizer(model, config), trajectories, advantages, config, pad_id=0,
            rng=np.random.default_rng(0),
        )  # fmt: skip
        results[tokens] = ({k: v.detach().clone() for k, v in model.state_dict().items()}, metrics)
    (whole, whole_metrics), (split, split_metrics) = results[None], results[budget]
    initial = tiny_lm().state_dict()
    assert max(float((whole[k] - initial[k]).abs().max()) for k in whole) > 1e-3  # the update moved them
    assert max(float((whole[k] - split[k]).abs().max()) for k in whole) < 1e-5
    assert split_metrics.keys() == whole_metrics.keys()
    for key, value in whole_metrics.items():
        if not key.startswith("perf/"):
            assert split_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
