"""One RL step through the stage functions on real trajectories: sandbox, grade, redistribute, train."""

from __future__ import annotations

import json

import pytest
import torch

from gagar import stages
from gagar.policy.model import load_policy
from gagar.records import read_records
from gagar.train.checkpoint import CheckpointManager
from gagar.train.update import OptimConfig

pytestmark = pytest.mark.slow  # a whole RL step through the stage functions


@pytest.fixture(scope="module")
def step_dir(tmp_path_factory, tasks_file, trajectories_file):
    out = tmp_path_factory.mktemp("step")
    metrics = stages.sandbox_stage(
        tasks=tasks_file,
        trajectories=trajectories_file,
        out=out / "results-0.jsonl",
        workers=2,
        progress=False,
    )
    assert metrics["sandbox/evaluations"] == 12
    selected = stages.select_stage(
        trajectories=[trajectories_file],
        results=[out / "results-0.jsonl"],
        out=out / "selection.jsonl",
        train_batch_groups=8,
    )
    assert selected["sampling/groups_kept"] == 3
    return out


def test_sandbox_resolves_gold_and_noisy_answers_only(step_dir, trajectories_file):
    from gagar.schema.result import TestResult

    results = {r.trajectory_id: r for r in read_records(step_dir / "results-0.jsonl", TestResult)}
    resolved = sorted(tid.rsplit("/", 1)[1] for tid, r in results.items() if r.resolved)
    assert resolved == ["0", "0", "0", "1", "1", "1"]  # noisy (0) and gold (1) of each group


def test_grade_ranks_gold_above_noisy(step_dir, tasks_file, trajectories_file):
    from gagar.schema.grade import Grade

    metrics = stages.grade_stage(
        tasks=tasks_file,
        trajectories=[trajectories_file],
        results=[step_dir / "results-0.jsonl"],
        selection=step_dir / "selection.jsonl",
        out=step_dir / "grades.jsonl",
        workspace=step_dir / "workspace",
        progress=False,
    )
    grades = read_records(step_dir / "grades.jsonl", Grade)
    assert len(grades) == 3
    assert metrics.get("grader/fallbacks", 0) == 0
    for grade in grades:
        assert not grade.fallback
        best = grade.ranking[0]
        assert [tid.rsplit("/", 1)[1] for tid in best] == ["1"], grade.ranking


@pytest.mark.parametrize(
    ("algo", "decay"), [("grpo", "geometric"), ("gagar", "geometric"), ("gagar", "score")]
)
def test_redistribute_moves_credit_only_under_gagar(step_dir, algo, decay):
    out = step_dir / ("batch-gagar-score.jsonl" if decay == "score" else f"batch-{algo}.jsonl")
    metrics = stages.redistribute_stage(
        selection=step_dir / "selection.jsonl",
        grades=step_dir / "grades.jsonl",
        out=out,
        algo=algo,
        decay=decay,
    )
    assert metrics["sampling/groups_kept"] == 3
    assert metrics["sampling/batch_full"] == 0.0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12
    by_member = {}
    for row in rows:
        by_member.setdefault(row["trajectory_id"].rsplit("/", 1)[1], []).append(row)
    gold, noisy = by_member["1"], by_member["0"]
    if algo == "grpo":
        assert metrics["credit/moved_ratio"] == 0.0
        assert all(g["advantage"] == n["advantage"] for g, n in zip(gold, noisy, strict=True))
    else:
        assert metrics["credit/moved_ratio"] > 0.1
        for g, n in zip(gold, noisy, strict=True):
            assert g["advantage"] > n["advantage"] > 0
            assert g["advantage"] + n["advantage"] == pytest.approx(g["grpo_advantage"] + n["grpo_advantage"])
    for wrong in by_member["2"] + by_member["3"]:
        assert wrong["advantage"] == wrong["grpo_advantage"] < 0


def test_train_stage_updates_the_policy_and_checkpoints(step_dir, trajectories_file, tiny_policy):
    before = {k: v.clone() for k, v in load_policy(tiny_policy)[0].state_dict().items()}
    metrics = stages.train_stage(
        policy=tiny_policy,
        trajectories=[trajectories_file],
        batch=step_dir / "batch-gagar.jsonl",
        checkpoints=step_dir / "checkpoints",
        step=0,
        optim=OptimConfig(lr=1e-3, minibatch_size=4),
    )
    assert metrics["policy/optimizer_steps"] == 3
    # Old log-probs came from the same weights: the first minibatch's ratio is exactly 1.
    assert metrics["policy/clip_frac"] < 1.0
    assert torch.isfinite(torch.tensor(metrics["loss/policy"]))
    ckpt = CheckpointManager(step_dir / "checkpoints").latest()
    assert ckpt is not None
    assert ckpt.step == 0
    after, tokenizer = load_policy(ckpt.path / "model")
    assert tokenizer.eos_token_id is not None
    changed = [k for k, v in after.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "the update changed no weight"


@pytest.mark.parametrize("algo", ["gagar-tiered", "gagar-no-restore"])
def test_redistribute_runs_the_paper_form_and_the_ablation(step_dir, algo):
    out = step_dir / f"batch-{algo}.jsonl"
    metrics = stages.redistribute_stage(
        selection=step_dir / "selection.jsonl", grades=step_dir / "grades.jsonl", out=out, algo=algo
    )
    assert metrics["credit/moved_ratio"] > 0.0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["group_id"], []).append(row)
    for members in groups.values():
        by_member = {row["trajectory_id"].rsplit("/", 1)[1]: row for row in members}
        gold, noisy = by_member["1"], by_member["0"]
        assert gold["advantage"] > noisy["advantage"] > 0
        if algo == "gagar-tiered":  # re-centred: every group still sums to zero
            assert sum(row["advantage"] for row in members) == pytest.approx(0.0, abs=1e-9)
        else:  # down-weighted, never paid back: the best keeps GRPO's advantage, the rest lose
            assert gold["advantage"] == pytest.approx(gold["grpo_advantage"])
            assert noisy["advantage"] < noisy["grpo_advantage"]
