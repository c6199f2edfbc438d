"""One RL step's phases on real trajectories: sandbox (the stage command), then select, grade,
advantages and update as every runner calls them (:mod:`gagar.rl_step`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gagar import rl_step, stages
from gagar.advantage import Decay, Estimator
from gagar.policy.model import load_policy
from gagar.records import read_records
from gagar.schema.batch import BatchEntry
from gagar.schema.grade import Grade
from gagar.schema.result import TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import Trajectory
from gagar.train.checkpoint import CheckpointManager
from gagar.train.config import AdvantageSettings, TrainConfig

pytestmark = pytest.mark.slow  # a whole RL step on a real policy's trajectories


def _config(tasks_file: Path, tiny_policy: Path, **sections: object) -> TrainConfig:
    values = {"tasks": str(tasks_file), "policy": str(tiny_policy), "rollout": {"train_batch_groups": 8}}
    return TrainConfig.from_values(values | sections)


@pytest.fixture(scope="module")
def step(tmp_path_factory, tasks_file, trajectories_file, tiny_policy) -> SimpleNamespace:
    """The sandbox stage's results, the selection dynamic sampling makes and the grades of the
    heuristic grader (the gagar estimator's grade phase)."""
    out = tmp_path_factory.mktemp("step")
    metrics = stages.sandbox_stage(
        tasks=tasks_file,
        trajectories=trajectories_file,
        out=out / "results-0.jsonl",
        workers=2,
        progress=False,
    )
    assert metrics["sandbox/evaluations"] == 12
    config = _config(tasks_file, tiny_policy)
    generated = rl_step.generation_batch(
        read_records(trajectories_file, Trajectory), read_records(out / "results-0.jsonl", TestResult)
    )
    selection = rl_step.select([generated], config.rollout)
    assert selection.metrics["sampling/groups_kept"] == 3
    assert selection.metrics["sampling/batch_full"] == 0.0
    grades, grade_metrics = rl_step.grade(
        config, rl_step.make_grader(config), read_records(tasks_file, Task), selection.trajectories,
        selection.results, out / "workspace",
    )  # fmt: skip
    return SimpleNamespace(
        dir=out, config=config, selection=selection, grades=grades, grade_metrics=grade_metrics
    )


def test_sandbox_resolves_gold_and_noisy_answers_only(step):
    results = {r.trajectory_id: r for r in read_records(step.dir / "results-0.jsonl", TestResult)}
    resolved = sorted(tid.rsplit("/", 1)[1] for tid, r in results.items() if r.resolved)
    assert resolved == ["0", "0", "0", "1", "1", "1"]  # noisy (0) and gold (1) of each group


def test_grade_ranks_gold_above_noisy(step):
    grades: list[Grade] = step.grades
    assert len(grades) == 3
    assert step.grade_metrics.get("grader/fallbacks", 0) == 0
    for grade in grades:
        assert not grade.fallback
        best = grade.ranking[0]
        assert [tid.rsplit("/", 1)[1] for tid in best] == ["1"], grade.ranking


def _batch(step: SimpleNamespace, algo: str, **settings: object) -> tuple[list[BatchEntry], dict[str, float]]:
    advantage = AdvantageSettings.model_validate({"algo": algo, **settings})
    grades = step.grades if Estimator(algo).uses_grader else None
    return rl_step.advantages(advantage, step.selection.kept_batch, grades)


@pytest.mark.parametrize(
    ("algo", "decay"), [("grpo", "geometric"), ("gagar", "geometric"), ("gagar", "score")]
)
def test_redistribute_moves_credit_only_under_gagar(step, algo, decay):
    entries, metrics = _batch(step, algo, decay=Decay(decay))
    rows = [e.model_dump() for e in entries]
    assert len(rows) == 12
    by_member: dict[str, list[dict]] = {}
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


def test_train_stage_updates_the_policy_and_checkpoints(step, tasks_file, tiny_policy):
    before = {k: v.clone() for k, v in load_policy(tiny_policy)[0].state_dict().items()}
    batch, _ = _batch(step, "gagar")
    config = _config(tasks_file, tiny_policy, optim={"lr": 1e-3, "minibatch_size": 4})
    metrics = rl_step.update(
        config,
        policy=tiny_policy,
        trajectories=step.selection.trajectories,
        batch=batch,
        checkpoints=step.dir / "checkpoints",
        step=0,
        policy_version=None,
        reference=None,
    )
    assert metrics["policy/optimizer_steps"] == 3
    # Old log-probs came from the same weights: the first minibatch's ratio is exactly 1.
    assert metrics["policy/clip_frac"] < 1.0
    assert torch.isfinite(torch.tensor(metrics["loss/policy"]))
    ckpt = CheckpointManager(step.dir / "checkpoints").latest()
    assert ckpt is not None
    assert ckpt.step == 0
    after, tokenizer = load_policy(ckpt.path / "model")
    assert tokenizer.eos_token_id is not None
    changed = [k for k, v in after.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "the update changed no weight"


@pytest.mark.parametrize("algo", ["gagar-tiered", "gagar-no-restore"])
def test_redistribute_runs_the_paper_form_and_the_ablation(step, algo):
    entries, metrics = _batch(step, algo)
    assert metrics["credit/moved_ratio"] > 0.0
    rows = [e.model_dump() for e in entries]
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
