"""The experiment config: defaults, relative paths, the TrainConfig of each run, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gagar.advantage import Estimator
from gagar.experiment.config import greedy_points, load_experiment_config

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, **values) -> Path:
    path = tmp_path / "exp.yaml"
    base = {"policy": "policy", "train_tasks": "train.jsonl", "heldout_tasks": "held.jsonl"}
    path.write_text(yaml.safe_dump(base | values))
    return path


def test_defaults_are_three_arms_three_seeds_and_paths_relative_to_the_file(tmp_path):
    config = load_experiment_config(_write(tmp_path))
    assert [a.name for a in config.arms] == ["grpo", "gagar-heuristic", "gagar-learned"]
    assert config.seeds == [0, 1, 2]
    assert config.policy == tmp_path / "policy"
    assert config.heldout_tasks == tmp_path / "held.jsonl"
    assert config.baseline is not None
    assert config.baseline.name == "grpo"


def test_each_run_gets_the_shared_train_settings_and_its_arms_estimator(tmp_path):
    config = load_experiment_config(
        _write(tmp_path, steps=3, train={"rollout": {"group_size": 4}, "advantage": {"gamma": 0.7}})
    )
    learned = config.arms[2]
    run = config.train_config(learned, 2, grader_model=tmp_path / "g")
    assert (run.steps, run.seed, run.rollout.group_size, run.advantage.gamma) == (3, 2, 4, 0.7)
    assert run.advantage.algo is Estimator.GAGAR
    assert run.grader.kind == "learned"
    assert run.run_dir == config.out_dir / "runs" / "gagar-learned" / "seed-2"
    grpo = config.train_config(config.arms[0], 2, grader_model=None)
    assert grpo.advantage.algo is Estimator.GRPO
    assert grpo.rollout.group_size == 4


def test_an_arms_own_train_settings_are_merged_over_the_shared_ones_for_its_runs_only(tmp_path):
    shared = {"advantage": {"decay": "linear", "gamma": 0.7}, "rollout": {"group_size": 4}}
    arms = [
        {"name": "grpo", "algo": "grpo"},
        {"name": "sharp", "algo": "gagar", "grader": "heuristic", "train": {"advantage": {"gamma": 0.25}}},
    ]
    config = load_experiment_config(_write(tmp_path, train=shared, arms=arms))
    sharp = config.train_config(config.arms[1], 0, grader_model=None)
    assert (sharp.advantage.decay, sharp.advantage.gamma, sharp.rollout.group_size) == ("linear", 0.25, 4)
    assert sharp.advantage.algo is Estimator.GAGAR
    grpo = config.train_config(config.arms[0], 0, grader_model=None)
    assert (grpo.advantage.decay, grpo.advantage.gamma) == ("linear", 0.7)
    assert config.train == shared  # the shared settings are not changed by the merge


def test_an_llm_grader_arm_passes_its_endpoint_to_the_trainer(tmp_path):
    arm = {"name": "gagar-llm", "algo": "gagar", "grader": "llm", "grader_endpoint": "http://127.0.0.1:9/v1"}
    config = load_experiment_config(_write(tmp_path, arms=[{"name": "grpo", "algo": "grpo"}, arm]))
    run = config.train_config(config.arms[1], 0, grader_model=None)
    assert (run.grader.kind, run.grader.endpoint) == ("llm", "http://127.0.0.1:9/v1")


def test_greedy_points_are_the_start_every_few_steps_and_the_end(tmp_path):
    assert greedy_points(30, 10) == [0, 10, 20, 30]
    assert greedy_points(32, 10) == [0, 10, 20, 30, 32]
    assert greedy_points(5, 8) == [0, 5]
    assert greedy_points(30, None) == []
    config = load_experiment_config(_write(tmp_path, steps=4, greedy_eval={"every": 2, "tasks": 5}))
    assert config.greedy_points == [0, 2, 4]
    assert config.train_config(config.arms[0], 0, None, steps=2).steps == 2  # a run stopped early
    assert config.greedy_dir("grpo", 1, 2) == config.out_dir / "greedy" / "grpo" / "seed-1" / "after-0002"


def test_the_repository_config_loads():
    config = load_experiment_config(REPO / "configs" / "experiment.yaml")
    assert config.out_dir == REPO / "runs" / "experiment"
    assert len(config.seeds) >= 3


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"train": {"steps": 3}}, r"train: steps are set by the experiment"),
        ({"train": {"advantage": {"algo": "grpo"}}}, r"advantage.algo are set by the experiment"),
        ({"train": {"rollout": {"group": 3}}}, r"arm 'grpo': invalid train settings: rollout.group"),
        ({"arms": [{"name": "g", "algo": "gagar"}]}, r"algo gagar needs a grader"),
        ({"arms": [{"name": "t", "algo": "gagar-tiered"}]}, r"algo gagar-tiered needs a grader"),
        ({"arms": [{"name": "g", "algo": "grpo", "grader": "heuristic"}]}, r"algo grpo uses no grader"),
        (
            {"arms": [{"name": "a", "algo": "grpo"}, {"name": "a", "algo": "grpo"}]},
            r"arm names must be distinct",
        ),
        ({"seeds": [1, 1]}, r"seeds must be distinct"),
        ({"arms": [{"name": "l", "algo": "gagar", "grader": "llm"}]}, r"llm grader needs grader_endpoint"),
        (
            {"arms": [{"name": "h", "algo": "gagar", "grader": "heuristic", "grader_endpoint": "http://x"}]},
            r"grader_endpoint is only for the llm grader",
        ),
        (
            {"arms": [{"name": "a", "algo": "grpo", "train": {"advantage": {"algo": "gagar"}}}]},
            r"arm 'a': train: advantage.algo are set by the experiment",
        ),
        ({"arms": [{"name": "a", "algo": "grpo", "train": {"seed": 3}}]}, r"arm 'a': train: seed are set"),
        (
            {"arms": [{"name": "a", "algo": "grpo", "train": {"advantage": {"gama": 0.2}}}]},
            r"arm 'a': invalid train settings: advantage.gama",
        ),
        ({"greedy_eval": {"every": 0}}, r"greedy_eval.every"),
        ({"surprise": 1}, r"surprise"),
    ],
)
def test_bad_settings_are_refused_naming_the_file_and_the_setting(tmp_path, values, message):
    with pytest.raises(ValueError, match=r"exp.yaml: invalid experiment config") as err:
        load_experiment_config(_write(tmp_path, **values))
    assert err.match(message)
