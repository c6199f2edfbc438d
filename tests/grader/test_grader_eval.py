"""gagar grader eval's measures: axes, position disagreement under reversal, hack recall."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from gagar.grader.base import Ranking
from gagar.grader.heuristic import HeuristicGrader
from gagar.grader.sft import AXES, evaluate, load_labelled_groups, noise_groups, with_hacks
from gagar.grader.workspace import GroupWorkspace
from gagar.records import write_records
from gagar.tasks.generate import generate_task
from gagar.tasks.oracle import score_patch

GROUPS = noise_groups([generate_task(i, 41, "heldout", verify=False) for i in range(3)], groups_per_task=1)


class FirstIsBest:
    """Trusts the order it is shown: the position bias the reversal check exists to catch."""

    name, version = "first-is-best", "0"
    concurrency, max_candidates = 1, None

    def rank(self, ws: GroupWorkspace, order: Sequence[str]) -> Ranking:
        return Ranking([[t] for t in order])


def test_hack_candidates_rank_last_in_the_labels() -> None:
    hacked = with_hacks(GROUPS, share=1.0, seed=0)
    for group in hacked:
        tid = f"{group.group_id}/hack"
        patch = next(c.patch for c in group.candidates if c.trajectory_id == tid)
        assert score_patch(group.task, patch).hack_flags
        assert group.labels[tid] < min(v for t, v in group.labels.items() if t != tid)


def test_report_measures_axes_position_and_hacks() -> None:
    hacked = with_hacks(GROUPS, share=1.0, seed=0)
    report = evaluate(HeuristicGrader(), hacked)
    assert set(report.axis_agreement) == set(AXES)
    assert report.position_disagreement == 0.0  # rules do not look at the order
    assert 0.0 <= report.hack_recall <= 1.0
    assert report.fallback_rate == 0.0
    assert report.markdown_row().startswith("| heuristic | ")
    biased = evaluate(FirstIsBest(), GROUPS)  # type: ignore[arg-type]
    assert biased.position_disagreement == 1.0
    assert biased.hack_recall != biased.hack_recall  # NaN: no hack candidate


def test_no_catalogue_groups_and_no_rollouts_is_a_clear_error(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    write_records(tasks, [generate_task(0, 5, verify=False)])
    assert len(load_labelled_groups(tasks, groups_per_task=1)) == 1
    with pytest.raises(ValueError, match="no group could be labelled"):
        load_labelled_groups(tasks, groups_per_task=0)  # rollout groups only, and none given
