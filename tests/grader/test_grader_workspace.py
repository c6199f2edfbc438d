"""The shared workspace layout and every inspection tool, on a hand-made group."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from grader_fixtures import CALC, CANDIDATES, FIXED, GOLD, PRINTY, group, task
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gagar.grader import tools
from gagar.grader.base import GraderMetrics, PositionGuard, Ranking, grade_group
from gagar.grader.heuristic import HeuristicGrader
from gagar.grader.workspace import CandidateInput, GroupWorkspace, build_group_workspace, safe_name
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import LocalBackend
from gagar.sandbox.patch import file_diff


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> GroupWorkspace:
    return group(tmp_path_factory.mktemp("ws"))


def test_layout_holds_base_trees_diffs_logs_and_manifest(ws: GroupWorkspace) -> None:
    root = ws.root
    assert root.name == safe_name("group/1")
    assert root.name != "group/1"
    manifest = json.loads((root / "manifest.json").read_text())
    assert [c["trajectory_id"] for c in manifest["candidates"]] == list(ws.candidate_ids)
    assert (root / "base/pkg/calc.py").read_text().count("a + b + 1") == 1
    gold = ws.folder("gold")
    assert (gold / "patch.diff").is_file()
    assert (gold / "test.log").is_file()
    assert "a + b + 1" not in (gold / "tree/pkg/calc.py").read_text()
    reopened = GroupWorkspace.load(root)
    assert reopened.manifest == ws.manifest
    assert reopened.task.instance_id == "pkg-1"


def test_hostile_patch_is_refused_and_never_passes(ws: GroupWorkspace) -> None:
    entry = ws.entry("hostile")
    assert not entry.applied
    assert not entry.passed
    assert ".." in (entry.apply_error or "")
    assert not (ws.root / "candidates/escape.py").exists()
    assert not (ws.root.parent / "escape.py").exists()
    assert ws.passing_ids == ["gold", "printy", "wide", "readme"]


def test_diff_stats_and_files_touched(ws: GroupWorkspace) -> None:
    assert tools.diff_stats(ws, "gold").model_dump() == {
        "files": 1, "added": 1, "removed": 1, "hunks": 1, "comment_lines": 0, "blank_lines": 0,
    }  # fmt: skip
    wide = tools.diff_stats(ws, "wide")
    assert (wide.files, wide.comment_lines) == (2, 1)
    kinds = {f.path: f.kind for f in tools.files_touched(ws, "readme")}
    assert kinds == {"pkg/calc.py": "source", "README.md": "other"}


def test_functions_touched_and_scope(ws: GroupWorkspace) -> None:
    assert tools.functions_touched(ws, "gold") == ["pkg/calc.py:add"]
    assert tools.functions_touched(ws, "wide") == ["pkg/calc.py:add", "pkg/fmt.py:show"]
    gold = tools.out_of_scope_edits(ws, "gold")
    assert gold.core == ["pkg/calc.py:add"]  # every passing candidate fixes add; only wide edits show
    assert (gold.lines_in_scope, gold.lines_out_of_scope) == (2, 0)
    assert gold.exercised_functions == 1  # add; scale is reached only by the passing test
    wide = tools.out_of_scope_edits(ws, "wide")
    assert wide.out_of_scope == ["pkg/fmt.py:show"]
    assert wide.lines_out_of_scope == 1
    assert tools.out_of_scope_edits(ws, "readme").out_of_scope == ["README.md:<file>"]


def test_lint_delta_counts_the_debug_print(ws: GroupWorkspace) -> None:
    printy = tools.lint_delta(ws, "printy")
    assert printy.available
    assert printy.by_code == {"T201": 1}
    assert printy.delta == 1
    assert tools.lint_delta(ws, "gold").delta == 0


def test_pairwise_diff_shows_only_the_difference(ws: GroupWorkspace) -> None:
    diff = tools.pairwise_diff(ws, "gold", "printy")
    assert '+    print("DEBUG", a, b)' in diff
    assert "a + b + 1" not in diff
    assert tools.pairwise_diff(ws, "gold", "gold") == ""
    assert tools.pairwise_diff(ws, "gold", "printy", max_chars=20).endswith("more chars)\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="the local sandbox drops to a sandbox uid: needs root")
def test_run_tests_in_the_sandbox(ws: GroupWorkspace) -> None:
    backend = LocalBackend(SandboxLimits(wall_time_s=60), workers=1)
    run = tools.run_tests(ws, "gold", ["tests/test_calc.py::test_add"], backend)
    assert run.status == "passed"
    assert run.tests["tests/test_calc.py::test_add"] == "passed"
    broken = tools.run_tests(ws, "failing", ["tests/test_calc.py::test_add"], backend)
    assert broken.status == "failed"


def test_heuristic_ranks_the_targeted_patch_first(tmp_path: Path) -> None:
    grade = grade_group(HeuristicGrader(), group(tmp_path))
    assert not grade.fallback
    assert grade.ranking[0] == ["gold"]
    assert grade.ranks["gold"] < min(grade.ranks[t] for t in ("printy", "wide", "readme"))
    assert set(grade.evidence) == {"gold", "printy", "wide", "readme"}


def test_group_with_one_passing_candidate_is_trivial(tmp_path: Path) -> None:
    grade = grade_group(HeuristicGrader(), group(tmp_path, passing=("gold",)))
    assert grade.grader == "trivial"
    assert grade.ranking == [["gold"]]
    assert not grade.fallback


def test_heuristic_ranks_a_fix_that_leaves_the_old_line_commented_out_below_a_clean_one(
    tmp_path: Path,
) -> None:
    """Same size, same scope: only the style findings tell them apart (ruff's default rules see no
    commented-out code)."""
    documented = FIXED.replace("def add(a, b):\n", 'def add(a, b):\n    """The sum."""\n')
    commented = FIXED.replace("    return a + b\n", "    # return a + b + 1\n    return a + b\n")
    candidates = [
        CandidateInput("documented", file_diff("pkg/calc.py", CALC, documented)),
        CandidateInput("commented", file_diff("pkg/calc.py", CALC, commented)),
    ]
    ws = build_group_workspace(tmp_path, "g", task(), candidates, {"documented": True, "commented": True})
    assert tools.diff_stats(ws, "documented").added == tools.diff_stats(ws, "commented").added
    grade = grade_group(HeuristicGrader(), ws)
    assert grade.ranking == [["documented"], ["commented"]]
    assert "1 style findings" in grade.evidence["commented"]


class _Recording:
    """The heuristic grader, noting every candidate order it is asked to rank."""

    def __init__(self) -> None:
        self.inner = HeuristicGrader()
        self.name, self.version = self.inner.name, self.inner.version
        self.concurrency, self.max_candidates = 1, None
        self.orders: list[list[str]] = []

    def rank(self, ws: GroupWorkspace, order: list[str]) -> Ranking:
        self.orders.append(list(order))
        return self.inner.rank(ws, order)


def _copies_group(root: Path, patches: dict[str, str]) -> GroupWorkspace:
    candidates = [CandidateInput(t, p) for t, p in patches.items()]
    return build_group_workspace(root, "g", task(), candidates, dict.fromkeys(patches, True))


def test_identical_candidates_reach_the_grader_once_and_share_its_rank(tmp_path: Path) -> None:
    """Two copies of the gold patch and one written without the git header (the same tree) are one
    candidate to the grader; the debug-print patch is another."""
    headerless = GOLD.split("\n", 1)[1]
    assert headerless != GOLD
    ws = _copies_group(tmp_path, {"p": PRINTY, "g1": GOLD, "g2": GOLD, "g3": headerless})
    grader, metrics = _Recording(), GraderMetrics()
    grade = grade_group(grader, ws, metrics=metrics)
    assert grader.orders == [["p", "g1"]]
    assert grade.ranking == [["g1", "g2", "g3"], ["p"]]
    assert set(grade.evidence) == {"p", "g1", "g2", "g3"}
    assert metrics.copies == 2
    assert metrics.as_dict()["grader/copies"] == 2


def test_a_group_of_copies_needs_no_grader(tmp_path: Path) -> None:
    grader = _Recording()
    grade = grade_group(grader, _copies_group(tmp_path, {"a": GOLD, "b": GOLD}))
    assert grader.orders == []
    assert grade.grader == "trivial"
    assert grade.ranking == [["a", "b"]]


def test_fingerprints_tell_apart_what_the_grader_could_tell_apart(ws: GroupWorkspace) -> None:
    prints = {t: ws.fingerprint(t) for t in ("gold", "printy", "wide", "readme")}
    assert len(set(prints.values())) == 4
    assert GroupWorkspace.load(ws.root).fingerprint("gold") == prints["gold"]  # from disk, not a cache


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choice=st.lists(st.sampled_from(["gold", "printy", "wide", "readme"]), min_size=2, max_size=7))
def test_copies_always_share_a_tier_and_each_distinct_patch_is_ranked_once_per_order(
    tmp_path_factory: pytest.TempPathFactory, choice: list[str]
) -> None:
    patches = {f"t{i}-{name}": CANDIDATES[name] for i, name in enumerate(choice)}
    grader = _Recording()
    grade = grade_group(grader, _copies_group(tmp_path_factory.mktemp("g"), patches), PositionGuard())
    tier_of = {t: i for i, tier in enumerate(grade.ranking) for t in tier}
    assert set(tier_of) == set(patches)
    for a in patches:
        for b in patches:
            if patches[a] == patches[b]:
                assert tier_of[a] == tier_of[b]
    distinct = len(set(choice))
    assert [len(order) for order in grader.orders] == ([distinct, distinct] if distinct > 1 else [])
