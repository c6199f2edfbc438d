"""The RL pipeline end to end through kfp.local: a tiny policy, two generated tasks, two steps with refill."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.policy import untrained_policy_and_tasks
from gagar.pipeline import store
from gagar.pipeline.local import STAGE_TIMERS, run_local

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tiny untrained policy directory, tasks JSONL with two generated tasks)."""
    return untrained_policy_and_tasks(tmp_path_factory.mktemp("inputs"))


def test_two_rl_steps_refill_publish_checkpoints_metrics_and_reports(
    inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    policy, tasks = inputs
    storage = str(tmp_path / "store")
    arguments = {
        "policy": str(policy),
        "tasks": str(tasks),
        "storage": storage,
        "rollout_group_size": 2,
        "rollout_train_batch_groups": 2,
        "rollout_gen_batch_groups": 2,
        "rollout_max_gen_batches": 2,
        "rollout_max_new_tokens": 16,
        "optim_minibatch_size": 4,
        "sandbox_backend": "local",
        "sandbox_workers": "2",
    }
    result = run_local(arguments, out=tmp_path / "out", steps=2, max_gen_batches=2)

    assert [row["step"] for row in result.steps] == [0, 1]
    for row in result.steps:
        # the untrained policy solves nothing: batch 0 keeps no mixed group, so gather-0 asks for
        # a refill and the step draws its second batch
        assert row["sampling/gen_batches"] == 2.0
        assert row["sampling/groups_generated"] == 4.0
        assert row["rollout/trajectories"] == row["sandbox/evaluations"] == 8.0
        assert row["sampling/batch_full"] == 0.0
        assert all(key in row for key in STAGE_TIMERS)
    assert 0 < result.stage_s < result.wall_s
    assert 0 < result.overhead_share < 1

    # the next run resumes from the checkpoint this one published
    start = store.resolve_start(storage, str(policy))
    assert start == store.StepStart(step=2, policy=f"{storage}/checkpoints/step-000001")
    assert (Path(storage) / "checkpoints" / "step-000001" / "model" / "config.json").is_file()

    summaries = list(result.pipeline_root.rglob("summary"))
    assert len(summaries) == 2
    assert "## RL step 0" in "".join(s.read_text() for s in summaries)
    assert "Credit redistribution" in next(result.pipeline_root.rglob("credit")).read_text()
    rollouts = [p for p in result.pipeline_root.rglob("trajectories") if "rollout" in str(p)]
    assert len(rollouts) == 4  # two generation batches in each of two steps
    selected = [p for p in result.pipeline_root.rglob("trajectories") if "select" in str(p)]
    assert sorted(len(p.read_text().splitlines()) for p in selected) == [8, 8]


def test_warm_and_cold_stages_run_the_same_step(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    """Warm stages (each stage function in a fork of one pre-imported interpreter, the default) and
    cold ones (each in its task's own process, as in a cluster) sample and train the same step."""
    policy, tasks = inputs
    runs = {}
    for warm in (True, False):
        arguments = {
            "policy": str(policy),
            "tasks": str(tasks),
            "storage": str(tmp_path / f"store-{warm}"),
            "rollout_group_size": 2,
            "rollout_train_batch_groups": 1,
            "rollout_gen_batch_groups": 2,
            "rollout_max_new_tokens": 16,
            "optim_minibatch_size": 4,
            "sandbox_backend": "local",
            "sandbox_workers": "2",
        }
        runs[warm] = run_local(arguments, out=tmp_path / f"out-{warm}", steps=1, max_gen_batches=1, warm=warm)
    warm_row, cold_row = (
        {k: v for k, v in runs[w].steps[0].items() if not k.startswith("perf/")} for w in (True, False)
    )
    assert warm_row.keys() == cold_row.keys()
    assert warm_row["rollout/trajectories"] == cold_row["rollout/trajectories"] == 4.0

    def sampled(run) -> list[str]:
        [path] = [p for p in run.pipeline_root.rglob("trajectories") if "rollout" in str(p)]
        return [line.split('"response_token_ids"')[1].split("]")[0] for line in path.read_text().splitlines()]

    assert sampled(runs[True]) == sampled(runs[False])
