"""Grader SFT on generated tasks, evaluation on held-out tasks, and ``gagar grade`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from grader_fixtures import CANDIDATES, task
from typer.testing import CliRunner

from gagar.cli.grader import app, grade
from gagar.records import read_records, write_records
from gagar.schema.grade import Grade
from gagar.schema.result import Status, TestResult
from gagar.schema.trajectory import Trajectory
from gagar.tasks.generate import generate_tasks

cli = typer.Typer()
cli.add_typer(app, name="grader")
cli.command("grade")(grade)


@pytest.fixture(scope="module")
def task_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tasks")
    write_records(root / "train.jsonl", generate_tasks(5, 3, "train", workers=2))
    write_records(root / "heldout.jsonl", generate_tasks(3, 3, "heldout", workers=2))
    return root / "train.jsonl", root / "heldout.jsonl"


def _run(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def _tau(line: str) -> float:
    return float(line.split("Kendall tau ")[1].split()[0])


@pytest.mark.slow  # SFT of the learned grader, then an evaluation
def test_sft_then_eval_on_held_out_tasks(task_files: tuple[Path, Path], tmp_path: Path) -> None:
    train, heldout = task_files
    model = tmp_path / "model"
    _run(["grader", "sft", "--tasks", str(train), "--out", str(model), "--groups-per-task", "3"])
    assert (model / "model.safetensors").is_file()
    assert json.loads((model / "config.json").read_text())["kind"] == "gagar-learned-grader"
    learned = _run(["grader", "eval", "--tasks", str(heldout), "--grader-model", str(model)])
    heuristic = _run(["grader", "eval", "--tasks", str(heldout), "--grader", "heuristic"])
    print(learned, heuristic)
    assert _tau(learned) >= 0.7
    assert _tau(heuristic) >= 0.7


def test_eval_on_held_out_groups_where_size_misleads(task_files: tuple[Path, Path]) -> None:
    _, heldout = task_files
    args = ["grader", "eval", "--tasks", str(heldout), "--grader", "heuristic", "--groups-per-task", "0"]
    line = _run(
        [
            *args,
            "--misleading-per-task",
            "2",
            "--kinds",
            "held-out",
            "--max-candidates",
            "8",
            "--hack-share",
            "0",
        ]
    )
    groups = int(line.split(" on ")[1].split()[0])
    assert groups >= 3  # every held-out task gives its groups from the three held-out kinds
    assert _tau(line) >= 0.9  # the heuristic weighs scope, files and lint: size does not fool it
    bad = CliRunner().invoke(cli, [*args, "--misleading-per-task", "1", "--kinds", "some"])
    assert bad.exit_code != 0
    assert "--kinds" in bad.output


def test_eval_refuses_learned_grader_without_model(task_files: tuple[Path, Path]) -> None:
    result = CliRunner().invoke(cli, ["grader", "eval", "--tasks", str(task_files[1]), "--grader", "learned"])
    assert result.exit_code != 0
    assert "--grader-model" in result.output


def test_grade_command_writes_one_grade_per_group(tmp_path: Path) -> None:
    fixture = task()
    remote = fixture.model_copy(update={"instance_id": "remote-1", "snapshot": None, "base_commit": "abc123"})
    write_records(tmp_path / "tasks.jsonl", [fixture, remote])
    trajectories, results = [], []
    for tid, patch in CANDIDATES.items():
        traj = Trajectory(trajectory_id=tid, instance_id="pkg-1", group_id="g1", model_patch=patch)
        trajectories.append(traj)
        ok = tid not in ("failing", "hostile")
        status = Status.PASSED if ok else Status.FAILED
        results.append(TestResult(trajectory_id=tid, instance_id="pkg-1", status=status, resolved=ok))
    for tid in ("r1", "r2"):
        trajectories.append(Trajectory(trajectory_id=tid, instance_id="remote-1", group_id="g2"))
        results.append(TestResult(trajectory_id=tid, instance_id="remote-1", status="passed", resolved=True))
    write_records(tmp_path / "traj.jsonl", trajectories)
    write_records(tmp_path / "results.jsonl", results)
    args = ["grade", "--tasks", str(tmp_path / "tasks.jsonl"), "--trajectories", str(tmp_path / "traj.jsonl")]
    args += ["--results", str(tmp_path / "results.jsonl"), "--out", str(tmp_path / "grades.jsonl")]
    args += ["--workspace", str(tmp_path / "ws"), "--grader", "heuristic"]
    output = _run(args)
    assert "2 groups graded (0 trivial, 0 candidates graded through an identical one)" in output
    assert "1 fallbacks: workspace_error 1" in output
    g1, g2 = read_records(tmp_path / "grades.jsonl", Grade)
    assert g1.group_id == "g1"
    assert not g1.fallback
    assert g1.ranking[0] == ["gold"]
    assert sorted(g1.candidates) == ["gold", "printy", "readme", "wide"]
    assert g2.fallback
    assert g2.fallback_reason == "workspace_error"
    assert g2.ranking == [["r1", "r2"]]
