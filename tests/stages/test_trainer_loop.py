"""``gagar train`` end to end on a tiny policy: steps, metrics log, checkpoints, plot, resume."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from gagar.cli import app
from gagar.train.checkpoint import CheckpointManager, verify
from gagar.train.config import load_config
from gagar.train.trainer import Trainer

pytestmark = pytest.mark.slow  # gagar train end to end


@pytest.fixture
def config_file(tmp_path, tasks_file, tiny_policy):
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "run_dir": str(tmp_path / "run"),
                "tasks": str(tasks_file),
                "policy": str(tiny_policy),
                "steps": 2,
                "rollout": {
                    "group_size": 2,
                    "gen_batch_groups": 2,
                    "train_batch_groups": 2,
                    "max_gen_batches": 2,
                    "max_new_tokens": 24,
                },
                "sandbox": {"workers": 2},
                "optim": {"lr": 1e-3, "minibatch_size": 4},
            }
        )
    )
    return path


def test_two_steps_then_resume_adds_a_third(config_file, tmp_path):
    result = CliRunner().invoke(app, ["train", "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    assert "2 steps in" in result.output
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:
        # Every generation batch the step used was rolled out and evaluated.
        assert row["rollout/trajectories"] == row["sampling/trajectories_generated"]
        assert row["sampling/gen_batches"] in (1.0, 2.0)
        assert 0.0 <= row["rollout/resolved_rate"] <= 1.0
        assert row["perf/step_s"] > 0
    assert (run / "training.png").stat().st_size > 0
    manager = CheckpointManager(run / "checkpoints")
    assert [c.step for c in manager.checkpoints()] == [0, 1]
    for ckpt in manager.checkpoints():
        verify(ckpt)
    # Step 1 sampled from step 0's weights.
    assert rows[1]["policy"].endswith("step-000000/model")

    again = CliRunner().invoke(app, ["train", "--config", str(config_file)])
    assert again.exit_code != 0
    assert "pass --resume" in str(again.exception) + again.output

    more = CliRunner().invoke(app, ["train", "--config", str(config_file), "--steps", "3", "--resume"])
    assert more.exit_code == 0, more.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]


def test_an_interrupted_step_is_redone_from_its_start(config_file):
    config = load_config(config_file, {"steps": 1, "advantage": {"algo": "grpo"}})
    trainer = Trainer(config, progress=False)
    partial = config.run_dir / "steps" / "step-000000"
    partial.mkdir(parents=True)
    (partial / "trajectories-0.jsonl").write_text("left over from a killed attempt\n")
    rows = trainer.run(resume=True)
    assert [r["step"] for r in rows] == [0]
    assert "left over" not in (partial / "trajectories-0.jsonl").read_text()


def test_config_errors_name_the_setting(tmp_path, tasks_file, tiny_policy):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump({"tasks": str(tasks_file), "policy": str(tiny_policy), "rollout": {"group": 3}})
    )
    with pytest.raises(ValueError, match=r"bad.yaml: invalid training config.*rollout.group"):
        load_config(bad)


def test_sandbox_backend_settings_in_the_environment_do_not_break_the_config(config_file, monkeypatch):
    monkeypatch.setenv("GAGAR_LOCAL_SANDBOX__WORK_ROOT", "/tmp")
    monkeypatch.setenv("GAGAR_SANDBOX__WORKERS", "1")
    assert load_config(config_file).sandbox.workers == 1


def test_a_step_with_the_tool_loop_agent_records_every_turn(config_file, tmp_path):
    # The tool loop's RUN_TESTS use the sandbox while the batch is sampled, so the step evaluates
    # the batch after generation rather than beside it; a whole step must still go through.
    result = CliRunner().invoke(
        app,
        ["train", "--config", str(config_file), "--steps", "1", "--agent", "tool-loop", "--max-turns", "3"],
    )
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["rollout/trajectories"] == row["sampling/trajectories_generated"] > 0
    assert 1.0 <= row["rollout/turns_mean"] <= 3.0
    step_dir = run / "steps" / "step-000000"
    trajectories = [
        json.loads(line)
        for f in sorted(step_dir.glob("trajectories-*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert trajectories
    assert all(1 <= t["turns"] <= 3 for t in trajectories)
