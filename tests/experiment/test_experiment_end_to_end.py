"""``gagar experiment run|report`` at tiny scale: 2 arms x 2 seeds x 1 step, then reruns that resume."""

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
                "steps": 1,
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
            }
        )
    )
    result = CliRunner().invoke(app, ["run", "--config", str(config), "--no-progress"])
    assert result.exit_code == 0, result.output
    return {"config": config, "out": root / "out", "output": result.output}


def test_every_run_is_trained_and_evaluated_once(experiment):
    out = experiment["out"]
    work = sorted((r["kind"], r.get("arm"), r.get("seed")) for r in _timing(out))
    assert work == sorted(
        [("grader_sft", None, None), ("eval", "sft", None)]
        + [
            (kind, arm, seed)
            for arm in ("grpo", "gagar-learned")
            for seed in (0, 1)
            for kind in ("train", "eval")
        ]
    )
    for arm in ("grpo", "gagar-learned"):
        for seed in (0, 1):
            rows = (out / "runs" / arm / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()
            assert [json.loads(r)["step"] for r in rows] == [0]
            judged = (out / "eval" / arm / f"seed-{seed}" / "eval.jsonl").read_text().splitlines()
            assert len(judged) == 2  # 2 held-out tasks x 1 sample
    learned = json.loads((out / "runs/gagar-learned/seed-0/metrics.jsonl").read_text())
    assert "grader/groups" in learned  # the GAGAR arm graded its groups
    grpo = json.loads((out / "runs/grpo/seed-0/metrics.jsonl").read_text())
    assert "grader/groups" not in grpo
    assert (out / "grader-learned" / "model.safetensors").exists()
    # Each run sampled its held-out answers from its own final checkpoint.
    summary = json.loads((out / "eval/grpo/seed-1/summary.json").read_text())
    assert summary["policy"].endswith("runs/grpo/seed-1/checkpoints/step-000000/model")
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
    for png in ("report-metrics.png", "report-training.png"):
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
    checkpoint = out / "runs/grpo/seed-1/checkpoints/step-000000"
    stamp = checkpoint.stat().st_mtime_ns

    run_experiment(config, command="rerun", progress=False)
    assert len(_timing(out)) == before  # nothing was redone

    # A run killed after its checkpoint and before its metrics line, and a lost evaluation.
    metrics = out / "runs/grpo/seed-1/metrics.jsonl"
    metrics.write_text("")
    (out / "eval/gagar-learned/seed-0/summary.json").unlink()
    run_experiment(config, command="resume", progress=False)
    redone = [(r["kind"], r.get("arm"), r.get("seed")) for r in _timing(out)[before:]]
    assert redone == [("eval", "gagar-learned", 0), ("train", "grpo", 1)]  # seed by seed
    assert [json.loads(r)["step"] for r in metrics.read_text().splitlines()] == [0]
    assert checkpoint.stat().st_mtime_ns == stamp  # resumed, not retrained
    sessions = (out / "sessions.jsonl").read_text().splitlines()
    assert [json.loads(s)["command"] for s in sessions][-2:] == ["rerun", "resume"]

    result = CliRunner().invoke(app, ["report", "--dir", str(out), "--out", str(out / "docs" / "r.md")])
    assert result.exit_code == 0, result.output
    assert (out / "docs" / "r-metrics.png").exists()


def test_a_rerun_with_other_run_settings_is_refused(experiment):
    config = load_experiment_config(experiment["config"], {"steps": 2})
    with pytest.raises(ValueError, match=r"other settings \(steps differ\)"):
        run_experiment(config, command="changed", progress=False)
