"""``gagar experiment run|report`` at tiny scale: 2 arms x 2 seeds x 2 steps with a greedy evaluation
after each step, then reruns that resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gagar.cli.experiment import app
from gagar.experiment.config import load_experiment_config
from gagar.experiment.harness import run_experiment
from gagar.experiment.report import METRICS, load_results

pytestmark = pytest.mark.slow  # a whole experiment: SFT, RL runs and evaluations


def _timing(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "timing.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory, experiment_inputs: dict[str, Path]) -> dict:
    root = tmp_path_factory.mktemp("experiment")
    config = root / "experiment.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "policy": str(experiment_inputs["policy"]),
                "train_tasks": str(experiment_inputs["train"]),
                "heldout_tasks": str(experiment_inputs["heldout"]),
                "out_dir": "out",
                "seeds": [0, 1],
                "steps": 2,
                "arms": [
                    {"name": "grpo", "algo": "grpo"},
                    {"name": "gagar-learned", "algo": "gagar", "grader": "learned"},
                ],
                "train": {
                    "rollout": {
                        "group_size": 2,
                        "gen_batch_groups": 2,
                        "train_batch_groups": 2,
                        "max_gen_batches": 1,
                        "max_new_tokens": 24,
                    },
                    "sandbox": {"workers": 2},
                    "optim": {"lr": 1e-3, "minibatch_size": 4},
                },
                "grader_sft": {"groups_per_task": 1, "epochs": 20},
                "evaluation": {"samples_per_task": 1, "max_new_tokens": 24},
                "greedy_eval": {"every": 1, "tasks": 1},
            }
        )
    )
    result = CliRunner().invoke(app, ["run", "--config", str(config), "--no-progress"])
    assert result.exit_code == 0, result.output
    return {"config": config, "out": root / "out", "output": result.output}


def test_every_run_is_trained_and_evaluated_once(experiment):
    out = experiment["out"]
    work = sorted((r["kind"], r.get("arm"), r.get("seed"), r.get("updates")) for r in _timing(out))
    runs = [(arm, seed) for arm in ("grpo", "gagar-learned") for seed in (0, 1)]
    assert work == sorted(
        [("grader_sft", None, None, None), ("eval", "sft", None, None), ("greedy_eval", "sft", None, 0)]
        + [("train", arm, seed, None) for arm, seed in runs for _ in (1, 2)]  # trained to 1, then to 2
        + [("greedy_eval", arm, seed, n) for arm, seed in runs for n in (1, 2)]
        + [("eval", arm, seed, None) for arm, seed in runs]
    )
    for arm, seed in runs:
        rows = (out / "runs" / arm / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(r)["step"] for r in rows] == [0, 1]
        updated = [json.loads(r) for r in rows if json.loads(r).get("policy/tokens", 0) > 0]
        assert all(r["policy/entropy"] > 0 for r in updated)  # every update logs the policy's entropy
        judged = (out / "eval" / arm / f"seed-{seed}" / "eval.jsonl").read_text().splitlines()
        assert len(judged) == 2  # 2 held-out tasks x 1 sample
        first = json.loads(
            (out / "greedy" / arm / f"seed-{seed}" / "after-0001" / "summary.json").read_text()
        )
        assert first["policy"].endswith("checkpoints/step-000000/model")  # evaluated after its first update
        assert (first["updates"], first["quality"]["n"]) == (1, 1)  # greedy_eval.tasks: the first task
        assert 0.0 <= first["changed_from_start"] <= 1.0
    learned = json.loads((out / "runs/gagar-learned/seed-0/metrics.jsonl").read_text().splitlines()[0])
    assert "grader/groups" in learned  # the GAGAR arm graded its groups
    grpo = json.loads((out / "runs/grpo/seed-0/metrics.jsonl").read_text().splitlines()[0])
    assert "grader/groups" not in grpo
    assert (out / "grader-learned" / "model.safetensors").exists()
    # Each run sampled its held-out answers from its own final checkpoint.
    summary = json.loads((out / "eval/grpo/seed-1/summary.json").read_text())
    assert summary["policy"].endswith("runs/grpo/seed-1/checkpoints/step-000001/model")
    assert summary["sampling_seed"] == 10_001


def test_the_report_has_every_arm_metric_and_plot(experiment):
    out = experiment["out"]
    report = (out / "report.md").read_text()
    for arm in ("sft", "grpo", "gagar-learned"):
        assert f"| {arm} |" in report
    for metric in METRICS:
        assert metric.label in report
    assert "| gagar-learned | " in report.split("## Paired differences")[1]
    assert "Wall time over all sessions:" in report
    assert " cores, " in report.split("## How it was run")[1]
    assert "## Verdict" in report
    assert "## Greedy held-out answers after the last update" in report
    for png in ("report-metrics.png", "report-training.png", "report-heldout.png"):
        assert (out / png).stat().st_size > 1000
        assert f"]({png})" in report
    check = [line for line in experiment["output"].splitlines() if "gagar-learned vs grpo:" in line]
    assert len(check) == 1, experiment["output"]
    assert "clean-resolved" in check[0]
    assert "95% CI [" in check[0]
    assert "aim " in check[0]
    results = load_results(out)
    assert {(s.arm, s.seed) for s in results.summaries} == {
        ("sft", None),
        ("grpo", 0),
        ("grpo", 1),
        ("gagar-learned", 0),
        ("gagar-learned", 1),
    }
    assert set(results.curves["rollout/resolved_rate"]) == {"grpo", "gagar-learned"}


def test_a_rerun_skips_finished_work_and_resumes_what_is_missing(experiment):
    out, config = experiment["out"], load_experiment_config(experiment["config"])
    before = len(_timing(out))
    checkpoint = out / "runs/grpo/seed-1/checkpoints/step-000001"
    stamp = checkpoint.stat().st_mtime_ns

    run_experiment(config, command="rerun", progress=False)
    assert len(_timing(out)) == before  # nothing was redone

    # A run killed after its checkpoint and before its metrics line, and a lost evaluation.
    metrics = out / "runs/grpo/seed-1/metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines(keepends=True)[0])  # step 1's line lost
    (out / "eval/gagar-learned/seed-0/summary.json").unlink()
    run_experiment(config, command="resume", progress=False)
    redone = [(r["kind"], r.get("arm"), r.get("seed")) for r in _timing(out)[before:]]
    assert redone == [("eval", "gagar-learned", 0), ("train", "grpo", 1)]  # seed by seed
    assert [json.loads(r)["step"] for r in metrics.read_text().splitlines()] == [0, 1]
    assert checkpoint.stat().st_mtime_ns == stamp  # resumed, not retrained
    sessions = (out / "sessions.jsonl").read_text().splitlines()
    assert [json.loads(s)["command"] for s in sessions][-2:] == ["rerun", "resume"]

    result = CliRunner().invoke(app, ["report", "--dir", str(out), "--out", str(out / "docs" / "r.md")])
    assert result.exit_code == 0, result.output
    assert (out / "docs" / "r-metrics.png").exists()


def test_a_rerun_with_other_run_settings_is_refused(experiment):
    config = load_experiment_config(experiment["config"], {"steps": 3})
    with pytest.raises(ValueError, match=r"other settings \(steps differ\)"):
        run_experiment(config, command="changed", progress=False)


def test_a_rerun_may_add_an_arm_but_not_change_one_it_keeps(experiment):
    arms = [
        {"name": "grpo", "algo": "grpo"},
        {
            "name": "gagar-learned",
            "algo": "gagar",
            "grader": "learned",
            "train": {"advantage": {"gamma": 0.25}},
        },
    ]
    config = load_experiment_config(experiment["config"], {"arms": arms})
    with pytest.raises(ValueError, match=r"other settings \(arm 'gagar-learned' differ\)"):
        run_experiment(config, command="changed arm", progress=False)

    recorded = experiment["out"] / "config.json"
    written_before = json.loads(recorded.read_text())
    for arm in written_before["arms"]:
        arm.pop("train")  # as a version without per-arm settings wrote it
    recorded.write_text(json.dumps(written_before))
    kept = load_experiment_config(experiment["config"])
    before = len(_timing(experiment["out"]))
    run_experiment(kept, command="an older record", progress=False)
    assert len(_timing(experiment["out"])) == before  # the same arms, nothing redone
