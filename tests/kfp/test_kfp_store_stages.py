"""The component bodies' helpers and the Markdown the Kubeflow UI shows, without KFP."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from fixtures.records import one_generation_batch
from gagar import rl_step
from gagar.advantage import Estimator
from gagar.pipeline import store_stages
from gagar.pipeline.graph import SETTINGS, stage
from gagar.pipeline.parameters import parameters_from_config
from gagar.pipeline.report import credit_table, merge_metrics, step_summary
from gagar.pipeline.store_stages import RL_STAGES
from gagar.records import read_records, write_records
from gagar.schema import Grade, TestResult, Trajectory
from gagar.schema.batch import BatchEntry
from gagar.train.config import TrainConfig


class Sink:
    """Collects what a component logs on its ``Output[Metrics]``."""

    def __init__(self) -> None:
        self.logged: dict[str, float] = {}

    def log_metric(self, metric: str, value: float) -> None:
        self.logged[metric] = value


def test_log_metrics_skips_values_json_cannot_hold() -> None:
    sink = Sink()
    store_stages.log_metrics(sink, {"a/b": 1, "nan": math.nan, "inf": math.inf, "c": 0.5})
    assert sink.logged == {"a/b": 1.0, "c": 0.5}


def test_unset_maps_kfp_empty_values_to_none() -> None:
    assert store_stages.unset("") is None
    assert store_stages.unset(0) is None
    assert store_stages.unset("http://x/v1") == "http://x/v1"
    assert store_stages.unset(4) == 4


def _counting_select(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls of dynamic sampling (``gagar.rl_step.select``) from now on."""
    calls: list[int] = []
    select = rl_step.select

    def counted(*args: Any, **kwargs: Any) -> rl_step.Selection:
        calls.append(1)
        return select(*args, **kwargs)

    monkeypatch.setattr(rl_step, "select", counted)
    return calls


def _call_stage(
    name: str,
    root: Path,
    produced: dict[tuple[str, str], Path],
    given: dict[str, Any],
    settings: dict[str, Any],
) -> Any:
    """Call stage ``name`` as both targets call it (the graph's names): the pipeline's parameters as
    its ``settings``, inputs from earlier stages' outputs (``produced``), else from ``given``; its
    output files under ``root/name``."""
    spec = stage(name)
    arguments: dict[str, Any] = {SETTINGS: settings}
    for arg, source, output in spec.inputs:
        found = produced.get((source, output))
        arguments[arg] = str(found) if found is not None else given.get(arg, str(given.get(output)))
    arguments |= {"gen_batch": given["gen_batch"]} if spec.takes_gen_batch else {}
    for artifact in spec.artifacts:
        if artifact != "metrics":
            produced[(name, artifact)] = root / name / artifact
            produced[(name, artifact)].parent.mkdir(exist_ok=True)
            arguments[artifact] = str(produced[(name, artifact)])
    return RL_STAGES[name](**arguments)


@pytest.mark.parametrize("algo", list(Estimator), ids=lambda a: a.value)
def test_a_pipeline_step_selects_in_select_and_trains_on_what_it_graded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algo: Estimator
) -> None:
    """Gather, select, grade and redistribute, called as both targets call them: grade and
    redistribute run no dynamic sampling of their own, every estimator that uses a grader is graded
    (gagar-tiered and gagar-no-restore too) with the run's every advantage setting, and the batch is
    the in-process step's."""
    given: dict[str, Any] = {**one_generation_batch(tmp_path), "step": 0, "gen_batch": 0}
    given |= {
        "rollout_metrics": {"rollout/trajectories": 6.0},
        "sandbox_metrics": {"sandbox/evaluations": 6.0},
    }
    produced: dict[tuple[str, str], Path] = {}
    metrics: dict[str, dict[str, float]] = {}
    config = TrainConfig.from_values(
        {
            "tasks": str(given["tasks"]),
            "policy": "policy",
            "rollout": {"train_batch_groups": 2},
            "advantage": {"algo": algo.value, "tiers": {"tier2_top": 0.6, "tier2_bottom": 0.3}},
        }
    )
    settings = {**parameters_from_config(config), "storage": str(tmp_path / "store")}
    gathered = _call_stage("gather", tmp_path, produced, given, settings)
    assert gathered.short  # one mixed group of the two wanted
    metrics["select"] = _call_stage("select", tmp_path, produced, given, settings)
    calls = _counting_select(monkeypatch)
    for name in ("grade", "redistribute"):
        metrics[name] = _call_stage(name, tmp_path, produced, given, settings)
    assert not calls

    selection = rl_step.select(
        [rl_step.generation_batch(read_records(given["trajectories"], Trajectory),
                                  read_records(given["results"], TestResult))],
        config.rollout,
    )  # fmt: skip
    grades = read_records(produced[("grade", "grades")], Grade) if algo.uses_grader else None
    expected, expected_metrics = rl_step.advantages(config.advantage, selection.kept_batch, grades)
    assert read_records(produced[("redistribute", "batch")], BatchEntry) == expected
    assert {k: v for k, v in metrics["redistribute"].items() if not k.startswith("perf/")} == {
        **selection.metrics,
        **expected_metrics,
    }
    assert {k: v for k, v in metrics["select"].items() if k.startswith("sampling/")} == selection.metrics
    if algo.uses_grader:
        assert metrics["grade"]["grader/groups"] == 1.0  # the mixed group only
        assert [g.group_id for g in grades or []] == ["a"]  # graded, not skipped as plain GRPO
    else:
        assert set(metrics["grade"]) == {"perf/grade_s"}  # no grader ran
        assert produced[("grade", "grades")].read_text() == ""
        assert metrics["redistribute"]["credit/moved_ratio"] == 0.0


def test_the_redistribute_stage_takes_the_users_tier_constants(tmp_path: Path) -> None:
    """gagar-tiered in the pipeline weighs ranks with the run's tier constants, not the defaults."""
    paths = one_generation_batch(tmp_path)  # its grade ranks a/1 above a/0: tier 1 and tier 2
    selection = rl_step.select(
        [rl_step.generation_batch(read_records(paths["trajectories"], Trajectory),
                                  read_records(paths["results"], TestResult))],
        TrainConfig.from_values({"tasks": "t", "policy": "p"}).rollout,
    )  # fmt: skip
    write_records(tmp_path / "selection.jsonl", [selection.kept_batch])
    advantages = []
    for tiers in ({}, {"tier2_top": 0.5, "tier2_bottom": 0.3}):
        config = TrainConfig.from_values(
            {"tasks": "t", "policy": "p", "advantage": {"algo": "gagar-tiered", "tiers": tiers}}
        )
        batch = tmp_path / f"batch-{len(advantages)}.jsonl"
        store_stages.redistribute(
            settings={**parameters_from_config(config), "storage": str(tmp_path / "store")},
            selection=str(tmp_path / "selection.jsonl"), grades=str(paths["grades"]), batch=str(batch),
            credit=str(tmp_path / "credit.md"),
        )  # fmt: skip
        expected, _ = rl_step.advantages(
            config.advantage, selection.kept_batch, read_records(paths["grades"], Grade)
        )
        assert read_records(batch, BatchEntry) == expected
        advantages.append([e.advantage for e in expected])
    assert advantages[0] != pytest.approx(advantages[1])


def test_step_summary_leads_with_the_headline_numbers() -> None:
    text = step_summary(
        3,
        {
            "perf/train_s": 2.0,
            "rollout/resolved_rate": 0.25,
            "sampling/dropped/all_fail": 2.0,
            "credit/moved_ratio": 0.125,
        },
    )
    lines = text.splitlines()
    assert lines[0] == "## RL step 3"
    assert lines[4] == "| resolved rate | 0.25 |"
    assert "| credit moved | 0.125 |" in lines
    assert lines.index("| groups dropped: all_fail | 2 |") < lines.index("| perf/train_s | 2 |")


def test_step_summary_shows_the_hack_ratio_and_the_kinds_seen() -> None:
    text = step_summary(
        1,
        {
            "sandbox/hack_ratio": 0.125,
            "sandbox/hacks/introspection": 2.0,
            "sandbox/hacks/report_forgery": 0.0,
        },
    )
    assert "| hack ratio | 0.125 |" in text
    assert "| hacks: introspection | 2 |" in text
    assert "report_forgery" not in text


def test_credit_table_lists_passing_trajectories_largest_change_first(tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    entries = [
        BatchEntry(
            trajectory_id="g/0",
            group_id="g",
            gen_batch=0,
            reward=1.0,
            advantage=1.2,
            grpo_advantage=0.8,
            rank=1,
        ),
        BatchEntry(
            trajectory_id="g/1",
            group_id="g",
            gen_batch=0,
            reward=1.0,
            advantage=0.7,
            grpo_advantage=0.8,
            rank=2,
        ),
        BatchEntry(
            trajectory_id="g/2", group_id="g", gen_batch=0, reward=0.0, advantage=-1.0, grpo_advantage=-1.0
        ),
    ]
    write_records(batch, entries)
    lines = credit_table(batch).splitlines()
    assert lines[0] == "## Credit redistribution (2 passing trajectories)"
    assert lines[4].startswith("| g | g/0 | 1 | 0.8 | 1.2 | +0.4")
    assert lines[5].startswith("| g | g/1 | 2 | 0.8 | 0.7 | -0.1")
    assert len(lines) == 6  # the failing trajectory keeps its advantage and is not listed


def test_merge_metrics_later_parts_win() -> None:
    assert merge_metrics([{"a": 1, "b": 2}, {"b": 3.5}]) == {"a": 1.0, "b": 3.5}
