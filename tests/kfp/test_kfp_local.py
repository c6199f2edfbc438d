"""The RL pipeline end to end through kfp.local: a tiny policy, two generated tasks, one step."""

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


def test_one_rl_step_publishes_a_checkpoint_metrics_and_reports(
    inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    policy, tasks = inputs
    storage = str(tmp_path / "store")
    arguments = {
        "model": str(policy),
        "tasks": str(tasks),
        "storage": storage,
        "group_size": 2,
        "train_batch_groups": 2,
        "gen_batch_groups": 2,
        "max_new_tokens": 16,
        "minibatch_size": 4,
        "sandbox_backend": "local",
        "sandbox_workers": 2,
    }
    result = run_local(arguments, out=tmp_path / "out", steps=1)

    assert [row["step"] for row in result.steps] == [0]
    row = result.steps[0]
    assert row["rollout/trajectories"] == 4.0
    assert row["sandbox/evaluations"] == 4.0
    assert all(key in row for key in STAGE_TIMERS)
    assert 0 < result.stage_s < result.wall_s
    assert 0 < result.overhead_share < 1

    # the next run resumes from the checkpoint this one published
    start = store.resolve_start(storage, str(policy))
    assert start == store.StepStart(step=1, policy=f"{storage}/checkpoints/step-000000")
    assert (Path(storage) / "checkpoints" / "step-000000" / "model" / "config.json").is_file()

    summaries = list(result.pipeline_root.rglob("summary"))
    assert len(summaries) == 1
    assert "## RL step 0" in summaries[0].read_text()
    assert "Credit redistribution" in next(result.pipeline_root.rglob("credit")).read_text()
    trajectories = next(result.pipeline_root.rglob("trajectories"))
    assert len(trajectories.read_text().splitlines()) == 4
