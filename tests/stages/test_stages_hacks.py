"""A hack fails within its group: reward 0, kept by dynamic sampling (unlike infra_error), counted."""

from __future__ import annotations

import numpy as np

from gagar import rl_step
from gagar.advantage import keep_mixed_groups
from gagar.schema.result import HackFlag, HackKind, Status, TestResult
from gagar.schema.trajectory import Trajectory
from gagar.train.config import RolloutSettings


def _result(tid: str, status: Status, *kinds: HackKind) -> TestResult:
    hacks = [HackFlag(kind=k, evidence=f"pkg/a.py:1: {k.value}") for k in kinds]
    return TestResult(
        trajectory_id=tid, instance_id="t", status=status, resolved=status is Status.PASSED, hacks=hacks
    )


RESULTS = [
    _result("g/0", Status.PASSED),
    _result("g/1", Status.HACK, HackKind.INTROSPECTION, HackKind.INTERPRETER_EXIT),
    _result("g/2", Status.HACK, HackKind.INTROSPECTION),
    _result("g/3", Status.INFRA_ERROR),
    _result("h/0", Status.HACK, HackKind.SPECIAL_CASING),
    _result("h/1", Status.PASSED),
]


def test_sandbox_metrics_count_hacks_by_kind_and_their_ratio() -> None:
    metrics = rl_step.sandbox_metrics(RESULTS)
    assert metrics["sandbox/hack"] == 3
    assert metrics["sandbox/hacks/introspection"] == 2
    assert metrics["sandbox/hacks/interpreter_exit"] == 1
    assert metrics["sandbox/hacks/special_casing"] == 1
    assert metrics["sandbox/hacks/report_forgery"] == 0
    assert metrics["sandbox/hack_ratio"] == 3 / 5  # the infra error is not the policy's
    assert metrics["rollout/resolved_rate"] == 2 / 5


def test_a_hack_stays_in_its_group_with_reward_zero() -> None:
    trajs = [
        Trajectory(trajectory_id=r.trajectory_id, instance_id="t", group_id=r.trajectory_id[0])
        for r in RESULTS
    ]
    generated = rl_step.generation_batch(trajs, RESULTS)
    selection = rl_step.select([generated], RolloutSettings(train_batch_groups=8, max_gen_batches=1))
    rewards = np.array([float(r.resolved) for r in generated.results])
    groups = np.array([t.group_id for t in generated.trajectories])
    assert rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert keep_mixed_groups(rewards, groups).all()  # a pass and a hack make a mixed group
    # the infra error leaves its group; the hack stays in with reward 0
    assert [t.trajectory_id for t in selection.trajectories] == [
        r.trajectory_id for r in RESULTS if r.status is not Status.INFRA_ERROR
    ]
