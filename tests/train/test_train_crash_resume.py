"""The crash-resume script (SIGKILLs at random points, each then --resume) and the states a kill leaves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gagar.train import checkpoint as checkpoint_module
from gagar.train.checkpoint import CheckpointManager, MetricsLog, verify
from gagar.train.config import TrainConfig
from gagar.train.trainer import PENDING_STEP, Trainer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "crash_resume.py"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gagar_train_survives_three_kills_of_its_process_group(tmp_path: Path):
    """The real `gagar train` with the bubblewrap sandbox: 4 steps, 3 SIGKILLs, then --resume to the end."""
    summary_path = tmp_path / "summary.json"
    cmd = [sys.executable, str(SCRIPT), "--steps", "4", "--kills", "3", "--seed", "2"]
    result = subprocess.run(
        [*cmd, "--no-reference", "--work", str(tmp_path / "work"), "--summary", str(summary_path)],
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["problems"] == []
    assert len(summary["kill_points"]) == 3
    assert all(p["orphans"] == [] and p["phase"] for p in summary["kill_points"])
    assert summary["final_rc"] == 0
    assert summary["logged_steps"] == [0, 1, 2, 3]
    assert summary["checkpoint_steps"] == [1, 2, 3]  # keep_checkpoints = 3
    assert summary["corrupt"] == []
    assert summary["partial_left"] == []


def test_a_step_killed_between_its_checkpoint_and_its_metrics_line_keeps_its_line(tmp_path: Path):
    """The trainer checkpoints a step before logging it: resume rebuilds the line instead of losing it."""
    run = tmp_path / "run"
    config = TrainConfig(run_dir=run, tasks=tmp_path / "t.jsonl", policy=tmp_path / "p", steps=2)
    manager, model = CheckpointManager(run / "checkpoints"), torch.nn.Linear(2, 2)
    log = MetricsLog(run / "metrics.jsonl")
    log.append(0, {"policy": "initial", "rollout/resolved_rate": 0.5, "loss/policy": 0.1})
    manager.save(0, model, extra_state={"metrics": {"loss/policy": 0.1}})
    # Step 1 as the trainer leaves it when killed right after its checkpoint was installed.
    pending = {"step": 1, "policy": "step-0", "rollout/resolved_rate": 0.25, "perf/rollout_s": 1.5}
    (run / PENDING_STEP).write_text(json.dumps(pending))
    manager.save(1, model, extra_state={"metrics": {"loss/policy": -0.2, "loss/clip_frac": 0.0}})

    rows = Trainer(config, progress=False).run(resume=True)  # nothing left to run: steps = 2

    assert [r["step"] for r in rows] == [0, 1]
    assert rows[1] == pending | {"loss/policy": -0.2, "loss/clip_frac": 0.0}
    assert Trainer(config, progress=False).run(resume=True) == rows  # recovered once, not again
    assert (run / "training.png").stat().st_size > 0


def test_a_kill_while_pruning_leaves_no_corrupt_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Pruning renames a checkpoint before deleting it: a kill mid-deletion leaves a partial directory."""
    manager, model = CheckpointManager(tmp_path, keep_last=1), torch.nn.Linear(2, 2)
    manager.save(0, model)

    def killed_halfway(path: str | Path, *args: object, **kwargs: object) -> None:
        next(p for p in Path(path).rglob("*") if p.is_file()).unlink()  # one file gone, then the kill
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        manager.save(1, model)
    monkeypatch.undo()

    assert [c.step for c in manager.checkpoints()] == [1]
    verify(manager.checkpoints()[0])
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left[0].startswith(".old-step-000000-")
    assert left[1:] == ["step-000001"]
    manager.remove_partial()  # what the next save or resume does
    assert [p.name for p in tmp_path.iterdir()] == ["step-000001"]
