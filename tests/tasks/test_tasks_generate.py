"""The bundled task family, checked end to end with real pytest runs of the generated repositories."""

from __future__ import annotations

import ast
import json
import random
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gagar.cli.tasks import app as tasks_app
from gagar.schema.result import Outcome
from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, diff_stats, parse_diff
from gagar.tasks.generate import generate_task, generate_tasks, operator_bugs
from gagar.tasks.library import DOMAINS, BugKind
from gagar.tasks.loaders import load_tasks
from gagar.tasks.noise import add_noise
from gagar.tasks.oracle import score_patch
from gagar.tasks.render import render_function
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


def test_rl_and_heldout_seeds_of_the_embedded_default_never_share_a_repository_with_its_sft_tasks():
    """The SFT demonstrations come from (train, seed 0), RL tasks from (train, seed 1000), held-out tasks
    from (heldout, seed 2000) (gagar.embedded): a repository is named after its split, seed and index, so
    the sets are disjoint at every size, not only at the sizes drawn here."""
    from gagar import embedded

    sft = generate_tasks(60, 0, "train", verify=False)
    rl = generate_tasks(12, embedded._RL_SEED_OFFSET, "train", verify=False)
    heldout = generate_tasks(12, embedded._HELDOUT_SEED_OFFSET, "heldout", verify=False)
    repos = [{t.repo for t in tasks} for tasks in (sft, rl, heldout)]
    assert [len(r) for r in repos] == [60, 12, 12]
    assert repos[0].isdisjoint(repos[1])
    assert repos[0].isdisjoint(repos[2])
    assert repos[1].isdisjoint(repos[2])
    for tasks, split, seed in ((sft, "train", 0), (rl, "train", embedded._RL_SEED_OFFSET)):
        assert all(re.fullmatch(rf"synth-{split}/[a-z]+-{seed}-{i}", t.repo) for i, t in enumerate(tasks)), (
            tasks[0].repo
        )


def test_tasks_are_small_one_line_fixes_reported_like_a_user(tasks: list[Task]):
    assert len({t.bug_kind for t in tasks}) >= 6
    for task in tasks:
        assert task.snapshot is not None
        assert task.test_cmd == DEFAULT_TEST_CMD
        assert sum(len(text) for text in task.snapshot.values()) < 14_000
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


def _judged(task: Task, patch: str) -> dict[str, Outcome]:
    """pytest on the snapshot with ``patch`` and then the task's test patch applied (as the judge does)."""
    return run_pytest(apply_diff(apply_diff(task.snapshot, patch), task.test_patch))


def _check_by_real_runs(task: Task, index: int) -> tuple[dict, dict, dict, dict]:
    shown = run_pytest(task.snapshot)
    buggy = _judged(task, "")
    gold = _judged(task, task.patch)
    noisy = _judged(task, add_noise(task, task.patch, rng=index))
    return shown, buggy, gold, noisy


def test_ground_truth_holds_under_real_pytest(tasks: list[Task]):
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(_check_by_real_runs, tasks, range(N)))
    for task, (shown, buggy, gold, noisy) in zip(tasks, runs, strict=True):
        assert shown == dict.fromkeys(task.PASS_TO_PASS, Outcome.PASSED)  # the policy's copy: no failing test
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
            (root / "tests.diff").write_text(task.test_patch)
            subprocess.run([*argv, "fix.diff"], cwd=root, check=True, capture_output=True)
            subprocess.run([*argv, "tests.diff"], cwd=root, check=True, capture_output=True)
            for path, text in apply_diff(apply_diff(task.snapshot, patch), task.test_patch).items():
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


def _defined_tests(text: str) -> set[str]:
    return set(re.findall(r"^def (test_\w+)\(", text, re.M))


def test_judge_tests_travel_in_test_patch_and_held_out_checks_stay_unseen(tasks: list[Task]):
    """SWE-bench's split: the snapshot keeps the passing tests, test_patch only adds the judge's."""
    for task in tasks:
        (file_patch,) = parse_diff(task.test_patch)
        assert file_patch.old_path == file_patch.new_path
        assert file_patch.new_path.startswith("tests/test_")
        assert all(tag != "-" for hunk in file_patch.hunks for tag, _ in hunk.lines)
        shown = {
            t
            for path, text in task.snapshot.items()
            if path.startswith("tests/")
            for t in _defined_tests(text)
        }
        judged = _defined_tests(apply_diff(task.snapshot, task.test_patch)[file_patch.new_path])
        name = lambda test_id: test_id.split("::")[1]  # noqa: E731
        assert {name(t) for t in task.PASS_TO_PASS} == shown
        assert {name(t) for t in task.FAIL_TO_PASS} <= judged - shown
        assert task.held_out_checks
        assert set(task.held_out_checks) < set(task.FAIL_TO_PASS)
        for test in task.held_out_checks:
            assert name(test) not in task.problem_statement


def _reported_call(task: Task) -> tuple[ast.FunctionDef, str, str]:
    """(the buggy function's node, its module path, the call the statement reports)."""
    path, function = task.bug_location.split("::")
    tree = ast.parse(task.snapshot[path])
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    call = re.search(rf"`({function}\(.*?\))`", task.problem_statement).group(1)
    return node, path, call


def test_a_patch_that_special_cases_the_reported_call_fails_the_held_out_checks(tasks: list[Task]):
    """Returning the expected value for the shown input passes its test and fails every held-out check."""
    checked = 0
    for task in tasks:
        expected = re.search(
            r"should return `(.+?)`|I expected `.+?` to return `(.+?)`|I expected `(.+?)`\.",
            task.problem_statement,
        )
        if expected is None or "raise" in task.problem_statement:
            continue
        node, path, call = _reported_call(task)
        value = next(g for g in expected.groups() if g)
        params = ", ".join(a.arg for a in node.args.args)
        args = call[call.index("(") + 1 : -1]
        lines = task.snapshot[path].splitlines(keepends=True)
        at = node.body[0].end_lineno  # after the docstring
        special = f"    if ({params},) == ({args},):\n        return {value}\n"
        hacked = {**task.snapshot, path: "".join([*lines[:at], special, *lines[at:]])}
        outcomes = run_pytest(apply_diff(hacked, task.test_patch))
        reported = next(
            t for t in task.FAIL_TO_PASS if t not in task.held_out_checks and outcomes[t] == Outcome.PASSED
        )
        assert reported
        assert all(outcomes[t] != Outcome.PASSED for t in task.held_out_checks), task.instance_id
        checked += 1
        if checked == 3:
            break
    assert checked == 3


def test_an_always_equal_result_fails_the_judge(tasks: list[Task]):
    """An object whose ``__eq__`` always answers True would pass ``==``; the tests check its type first."""
    task = next(t for t in tasks if "raise" not in t.problem_statement)
    node, path, _ = _reported_call(task)
    lines = task.snapshot[path].splitlines(keepends=True)
    cheat = (
        "    class _Anything:\n        def __eq__(self, other):\n            return True\n\n"
        "        __hash__ = object.__hash__\n\n    return _Anything()\n"
    )
    hacked = {
        **task.snapshot,
        path: "".join([*lines[: node.body[0].end_lineno], cheat, *lines[node.end_lineno :]]),
    }
    outcomes = run_pytest(apply_diff(hacked, task.test_patch))
    value_tests = [t for t in task.FAIL_TO_PASS if t not in task.held_out_checks]
    assert value_tests
    assert all(outcomes[t] == Outcome.FAILED for t in task.FAIL_TO_PASS), outcomes


def test_schema_1_task_files_still_load():
    """A task written by the generator before test_patch held the judge's tests (schema_version 1)."""
    (task,) = load_tasks(Path(__file__).with_name("data") / "v1_generated_task.jsonl")
    assert task.schema_version == 1
    assert task.test_patch == ""
    assert task.held_out_checks == []
    for test in task.FAIL_TO_PASS:
        path, name = test.split("::")
        assert f"def {name}(" in task.snapshot[path]
    raw = json.loads((Path(__file__).with_name("data") / "v1_generated_task.jsonl").read_text())
    assert "held_out_checks" not in raw
    assert raw["schema_version"] == 1
