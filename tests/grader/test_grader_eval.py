"""gagar grader eval's measures: axes, position disagreement under reversal, hack recall."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from gagar.grader import tools
from gagar.grader.base import Ranking
from gagar.grader.heuristic import HeuristicGrader
from gagar.grader.kendall import kendall_tau_b
from gagar.grader.sft import (
    AXES,
    HELD_OUT_KINDS,
    KIND_SETS,
    TRAINING_KINDS,
    LabelledGroup,
    evaluate,
    load_labelled_groups,
    misleading_groups,
    noise_groups,
    reached_scopes,
    with_hacks,
)
from gagar.grader.workspace import CandidateInput, GroupWorkspace
from gagar.records import write_records
from gagar.schema.task import Task
from gagar.tasks.diffs import make_diff
from gagar.tasks.generate import generate_task
from gagar.tasks.noise import NOISE_KINDS, Elsewhere, NoiseKind, NoiseNotApplicable, add_noise
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


MISLEADING_TASKS = [generate_task(i, 43, "heldout", verify=False) for i in range(6)]


def _size_and_quality(group) -> tuple[list[int], list[float]]:  # type: ignore[no-untyped-def]
    sizes = [score_patch(group.task, c.patch).diff_size for c in group.candidates]
    return sizes, [group.labels[c.trajectory_id] for c in group.candidates]


def test_misleading_groups_are_ones_where_size_ranks_no_better_than_chance() -> None:
    groups = misleading_groups(MISLEADING_TASKS, groups_per_task=2, size=8, seed=3)
    assert len(groups) >= 6
    for group in groups:
        assert 2 <= len(group.candidates) <= 8
        assert len({c.patch for c in group.candidates}) == len(group.candidates)
        sizes, quality = _size_and_quality(group)
        assert len(set(quality)) == len(quality)  # one candidate per quality level: a strict order
        assert group.labels == {
            c.trajectory_id: score_patch(group.task, c.patch).quality for c in group.candidates
        }
        tau = kendall_tau_b([-s for s in sizes], quality)
        assert tau != tau or tau <= 0.0  # NaN: equal sizes that differ in scope or style
        # at least one pair where the smaller (or equal) patch is the worse one
        pairs = list(zip(sizes, quality, strict=True))
        assert any(sa <= sb and qa < qb for sa, qa in pairs for sb, qb in pairs)
    assert misleading_groups(MISLEADING_TASKS, 2, 8, seed=3) == groups  # a function of the seed


def test_misleading_groups_draw_from_the_kinds_given() -> None:
    kinds = (NoiseKind.UNRELATED_FILE, NoiseKind.WIDENED_FIX)
    groups = misleading_groups(MISLEADING_TASKS, groups_per_task=1, seed=5, kinds=kinds)
    assert groups
    for group in groups:
        for c in group.candidates:
            q = score_patch(group.task, c.patch)
            another_file = q.files_beyond_gold >= 1
            guard_in_the_fix = q.axes.out_of_scope == 0 and "is None:" in c.patch
            assert c.patch == group.task.patch or another_file or guard_in_the_fix


def test_the_held_out_kinds_are_named_and_kept_out_of_training() -> None:
    assert set(HELD_OUT_KINDS).isdisjoint(TRAINING_KINDS)
    assert set(HELD_OUT_KINDS) | set(TRAINING_KINDS) == set(NOISE_KINDS)
    assert KIND_SETS["held-out"] == HELD_OUT_KINDS
    assert KIND_SETS["training"] == TRAINING_KINDS


def test_the_heuristic_is_not_fooled_where_size_misleads() -> None:
    groups = misleading_groups(MISLEADING_TASKS, groups_per_task=2, seed=3)
    heuristic = evaluate(HeuristicGrader(), groups, reverse_check=False)
    assert heuristic.kendall_tau >= 0.9  # it weighs lines out of scope, extra files and lint, not size alone


_SHOP = {
    "shop/__init__.py": "",
    "shop/prices.py": (
        "def unit_price(price, qty):\n"
        "    return price - qty\n"
        "\n\n"
        "def total(items):\n"
        "    result = 0\n"
        "    for price, qty in items:\n"
        "        result += unit_price(price, qty)\n"
        "    return result\n"
        "\n\n"
        "def describe(name, price):\n"
        "    label = name.title()\n"
        '    return f"{label}: {price}"\n'
    ),
    "tests/test_prices.py": (
        "from shop.prices import total\n\n\ndef test_total():\n    assert total([(2, 3)]) == 6\n"
    ),
}
SHOP_TASK = Task(
    instance_id="demo__shop-1",
    repo="demo/shop",
    snapshot=_SHOP,
    problem_statement="total is wrong",
    patch=make_diff(
        _SHOP, {**_SHOP, "shop/prices.py": _SHOP["shop/prices.py"].replace("price - qty", "price * qty")}
    ),
    FAIL_TO_PASS=["tests/test_prices.py::test_total"],
)
"""A bug in a helper its failing test reaches through a caller: ``total`` is on the failing path, ``describe``
is not."""


def test_reached_scopes_follow_the_failing_test_through_its_callers() -> None:
    assert reached_scopes(SHOP_TASK) == {"shop/prices.py:total", "shop/prices.py:unit_price"}


def test_edits_elsewhere_can_be_kept_on_the_failing_path() -> None:
    off_path = set()
    for seed in range(6):
        groups = misleading_groups(
            [SHOP_TASK], 1, seed=seed, kinds=tuple(NOISE_KINDS), elsewhere=Elsewhere.REACHED
        )
        noise = noise_groups([SHOP_TASK], 1, seed=seed, elsewhere=Elsewhere.REACHED)
        for group in [*groups, *noise]:
            for c in group.candidates:
                q = score_patch(SHOP_TASK, c.patch)
                assert "shop/prices.py:describe" not in q.outside_scopes
                off_path |= set(q.outside_scopes)
    assert "shop/prices.py:total" in off_path  # the caller on the failing path took edits
    anywhere = {
        s
        for seed in range(6)
        for g in noise_groups([SHOP_TASK], 1, seed=seed)
        for c in g.candidates
        for s in score_patch(SHOP_TASK, c.patch).outside_scopes
    }
    assert "shop/prices.py:describe" in anywhere  # by default any function outside the fix


def test_the_group_core_shows_the_heuristic_edits_spread_along_the_failing_path(tmp_path: Path) -> None:
    spread = add_noise(
        SHOP_TASK, SHOP_TASK.patch, [NoiseKind.DEFENSIVE_CHECK], elsewhere={"shop/prices.py:total"}
    )
    aside = add_noise(
        SHOP_TASK, SHOP_TASK.patch, [NoiseKind.DEFENSIVE_CHECK], elsewhere={"shop/prices.py:describe"}
    )
    assert (
        score_patch(SHOP_TASK, spread).quality == score_patch(SHOP_TASK, aside).quality
    )  # both outside the fix
    candidates = {"gold": SHOP_TASK.patch, "spread": spread, "aside": aside}
    group = LabelledGroup(
        "g", SHOP_TASK, [CandidateInput(t, p) for t, p in candidates.items()], dict.fromkeys(candidates, 1.0)
    )
    ws = group.workspace(tmp_path)
    assert tools.group_core(ws) == ["shop/prices.py:unit_price"]
    reach = tools.out_of_scope_edits(ws, "spread")
    assert reach.exercised_functions == 2  # the failing test reaches total too
    assert reach.out_of_scope == ["shop/prices.py:total"]
    scores = HeuristicGrader().rank(ws, list(candidates)).scores
    assert scores["gold"] > scores["spread"] == scores["aside"]


def test_no_function_on_the_failing_path_outside_the_fix_is_named() -> None:
    with pytest.raises(NoiseNotApplicable, match="among those allowed"):
        add_noise(SHOP_TASK, SHOP_TASK.patch, [NoiseKind.COMMENT], elsewhere=set())
