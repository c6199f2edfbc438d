"""The bundled task family, checked end to end with real pytest runs of the generated repositories."""

from __future__ import annotations

import random
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gagar.cli.tasks import app as tasks_app
from gagar.sandbox.results import Outcome
from gagar.tasks.diffs import apply_diff, diff_stats, parse_diff
from gagar.tasks.generate import generate_task, generate_tasks, operator_bugs
from gagar.tasks.library import DOMAINS, BugKind
from gagar.tasks.loaders import load_tasks
from gagar.tasks.noise import add_noise
from gagar.tasks.oracle import score_patch
from gagar.tasks.render import render_function
from gagar.tasks.schema import Task
from gagar.tasks.testrun import DEFAULT_TEST_CMD, run_pytest, write_snapshot

SEED = 11
N = 16


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return generate_tasks(N, SEED, "train", workers=2)


def test_generation_is_deterministic(tasks: list[Task]):
    for index in (0, N - 1):
        assert generate_task(index, SEED).model_dump() == tasks[index].model_dump()


def test_heldout_never_shares_a_repository_with_train(tasks: list[Task]):
    heldout = generate_tasks(2, SEED, "heldout")
    assert {t.repo for t in heldout}.isdisjoint({t.repo for t in tasks})
    assert all(t.repo.startswith("synth-heldout/") for t in heldout)
    assert heldout[0].snapshot != tasks[0].snapshot
    assert len({t.repo for t in tasks}) == N
    with pytest.raises(ValueError, match="split"):
        generate_tasks(1, SEED, "test")  # type: ignore[arg-type]


def test_tasks_are_small_one_line_fixes_reported_like_a_user(tasks: list[Task]):
    assert len({t.bug_kind for t in tasks}) >= 6
    for task in tasks:
        assert task.snapshot is not None
        assert task.test_cmd == DEFAULT_TEST_CMD
        assert sum(len(text) for text in task.snapshot.values()) < 12_000
        assert diff_stats(task.patch) == (1, 1)
        (file_patch,) = parse_diff(task.patch)
        fixed_line = next(text for tag, text in file_patch.hunks[0].lines if tag == "+").strip()
        function = task.bug_location.rsplit("::", 1)[1]
        assert f"`{function}(" in task.problem_statement
        assert fixed_line not in task.problem_statement
        assert all(
            re.fullmatch(r"tests/test_\w+\.py::test_\w+", t) for t in task.FAIL_TO_PASS + task.PASS_TO_PASS
        )
        assert len(task.PASS_TO_PASS) >= 5
        assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)


def _check_by_real_runs(task: Task, index: int) -> tuple[dict, dict, dict]:
    buggy = run_pytest(task.snapshot)
    gold = run_pytest(apply_diff(task.snapshot, task.patch))
    noisy = run_pytest(apply_diff(task.snapshot, add_noise(task, task.patch, rng=index)))
    return buggy, gold, noisy


def test_ground_truth_holds_under_real_pytest(tasks: list[Task]):
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(_check_by_real_runs, tasks, range(N)))
    for task, (buggy, gold, noisy) in zip(tasks, runs, strict=True):
        tests = set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS)
        assert set(buggy) == tests
        assert {t for t, o in buggy.items() if o != Outcome.PASSED} == set(task.FAIL_TO_PASS), (
            task.instance_id
        )
        assert all(gold[t] == Outcome.PASSED for t in tests), task.instance_id
        assert all(noisy[t] == Outcome.PASSED for t in tests), task.instance_id


def test_oracle_marks_gold_clean_and_noise_not(tasks: list[Task]):
    for index, task in enumerate(tasks):
        gold = score_patch(task, task.patch)
        noisy = score_patch(task, add_noise(task, task.patch, rng=index))
        assert gold.clean
        assert gold.quality == 1.0
        assert not noisy.clean
        assert noisy.lines_outside_gold > 0
        assert noisy.quality < gold.quality


@pytest.mark.parametrize("argv", [["git", "apply"], ["patch", "-p1", "-s", "-i"]])
def test_gold_and_noise_patches_apply_with_standard_tools(tasks: list[Task], tmp_path: Path, argv: list[str]):
    for index, task in enumerate(tasks[:5]):
        for name, patch in (("gold", task.patch), ("noise", add_noise(task, task.patch, rng=index))):
            root = tmp_path / f"{index}-{name}"
            write_snapshot(task.snapshot, root)
            (root / "fix.diff").write_text(patch)
            subprocess.run([*argv, "fix.diff"], cwd=root, check=True, capture_output=True)
            for path, text in apply_diff(task.snapshot, patch).items():
                assert (root / path).read_text() == text


def test_cli_generate_writes_tasks_and_a_summary(tmp_path: Path):
    cli = typer.Typer()
    cli.add_typer(tasks_app, name="tasks")
    out = tmp_path / "tasks.jsonl"
    result = CliRunner().invoke(cli, ["tasks", "generate", "--n", "1", "--seed", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (task,) = load_tasks(out)
    assert f"1 tasks: {task.bug_kind} 1 -> {out}" in result.output
    assert task.model_dump() == generate_task(0, 3).model_dump()
    bad = CliRunner().invoke(cli, ["tasks", "generate", "--n", "1", "--out", str(out), "--split", "dev"])
    assert bad.exit_code != 0
    assert "train" in bad.output
    bad = CliRunner().invoke(cli, ["tasks", "generate", "--n", "1", "--out", str(out), "--mutations", "ast"])
    assert bad.exit_code != 0
    assert "catalogue" in bad.output


def test_unverified_generation_predicts_what_pytest_finds():
    """SFT data skips the pytest runs; its test lists must equal the verified ones."""
    fast = generate_tasks(6, seed=3, verify=False)
    slow = generate_tasks(6, seed=3)
    assert [t.model_dump() for t in fast] == [t.model_dump() for t in slow]


def test_operator_bugs_replace_one_whole_line_of_the_function():
    fn = render_function(DOMAINS[0].functions[0], random.Random(0))
    lines = fn.source.splitlines()
    bugs = operator_bugs(fn.source)
    assert len(bugs) > 3 * len(fn.template.mutations)
    for bug in bugs:
        assert bug.old in lines
        assert "\n" not in bug.new
        assert bug.new != bug.old
    kinds = {bug.kind for bug in bugs}
    assert {BugKind.WRONG_COMPARISON, BugKind.WRONG_OPERATOR, BugKind.OFF_BY_ONE} <= kinds


def test_all_mutations_widen_the_family_and_still_verify_under_pytest():
    """Same packages as the catalogue family, bugs also from the AST operators; pytest agrees."""
    n = 24
    catalogue = generate_tasks(n, seed=5, verify=False)
    wide = generate_tasks(n, seed=5, verify=False, mutations="all")
    assert [t.repo for t in wide] == [t.repo for t in catalogue]
    assert sum(a.patch != b.patch for a, b in zip(wide, catalogue, strict=True)) >= n // 3
    verified = generate_tasks(6, seed=5, workers=2, mutations="all")  # raises if pytest disagrees
    assert [t.model_dump() for t in verified] == [t.model_dump() for t in wide[:6]]
    with pytest.raises(ValueError, match="mutations"):
        generate_tasks(1, seed=5, mutations="ast")  # type: ignore[arg-type]
