"""The component bodies' helpers and the Markdown the Kubeflow UI shows, without KFP."""

from __future__ import annotations

import math
from pathlib import Path

from gagar.pipeline import store_stages
from gagar.pipeline.report import credit_table, merge_metrics, step_summary
from gagar.records import write_records
from gagar.schema.batch import BatchEntry


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


def test_grade_is_skipped_for_plain_grpo(tmp_path: Path) -> None:
    out = tmp_path / "grades.jsonl"
    metrics = store_stages.grade(
        algo="grpo",
        tasks="unused",
        trajectories="unused",
        results="unused",
        grades=str(out),
        grader="heuristic",
        grader_model="",
        endpoint="",
        train_batch_groups=2,
    )
    assert metrics == {"grader/skipped": 1.0, "perf/grade_s": 0.0}
    assert out.read_text() == ""


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
