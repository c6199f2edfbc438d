"""From a killed mutant to a verified Task: test lists, problem statement, gold patch, verification.

As in SWE-bench, the FAIL_TO_PASS tests travel in ``test_patch``: their definitions are taken out
of the snapshot's test files (whole test functions or methods, decorators included) and the test
patch puts them back after the model patch. Where a test cannot be taken out cleanly (it is not a
function or method defined in its own file, or the file would not parse without it) it stays in
the snapshot; such a task's ``test_patch`` holds the tests that could be moved.
"""

from __future__ import annotations

import ast
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gagar import pyast
from gagar.schema.result import Outcome
from gagar.schema.task import Environment, Task
from gagar.tasks.diffs import apply_diff, make_diff
from gagar.tasks.mutate import Mutation
from gagar.tasks.synth.runner import PytestRun, TestSuite
from gagar.tasks.testrun import write_snapshot

__all__ = [
    "MutantSource",
    "classify",
    "make_task",
    "problem_statement",
    "split_judge_tests",
    "stable_passing",
    "verify_task",
]

_FAILING = (Outcome.FAILED, Outcome.ERROR)


@dataclass(frozen=True)
class MutantSource:
    """A mutation of one file of the project."""

    path: str
    """File path relative to the project root."""
    original: str
    mutation: Mutation

    @property
    def mutant(self) -> str:
        return self.mutation.apply(self.original)


def stable_passing(runs: Sequence[PytestRun]) -> set[str]:
    """Tests that passed in every run, leaving out whole test functions whose parametrized ids
    changed between runs (ids built from unordered data cannot be matched across processes)."""

    def ids_by_function(run: PytestRun) -> dict[str, set[str]]:
        grouped: dict[str, set[str]] = {}
        for test in run.outcomes:
            grouped.setdefault(test.split("[", 1)[0], set()).add(test)
        return grouped

    grouped = [ids_by_function(run) for run in runs]
    unstable = {f for f in grouped[0] if any(g.get(f) != grouped[0][f] for g in grouped[1:])}
    passing = set.intersection(*(run.passed for run in runs))
    return {t for t in passing if t.split("[", 1)[0] not in unstable}


def classify(stable_passing: set[str], run: PytestRun) -> tuple[list[str], list[str]] | None:
    """(FAIL_TO_PASS, PASS_TO_PASS) of a mutant run, both sorted; None if the run is not usable.

    A run is usable when it finished, collected everything and reported every test that
    passes on the original. FAIL_TO_PASS are those that failed or errored; PASS_TO_PASS those
    that still pass. Tests the mutant turned into skips are in neither list.
    """
    if run.broken or not stable_passing <= run.outcomes.keys():
        return None
    fail = sorted(t for t in stable_passing if run.outcomes[t] in _FAILING)
    keep = sorted(t for t in stable_passing if run.outcomes[t] is Outcome.PASSED)
    return fail, keep


def _first_line(message: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def problem_statement(project: str, test_cmd: str, failing: list[str], messages: Mapping[str, str]) -> str:
    """A CI report of the failing tests: their names and error messages, never the fix (nor the tests'
    bodies, which travel in ``test_patch`` and may be missing from the snapshot)."""
    shown = failing[:5]
    lines = [
        f"Some of {project}'s own tests fail.",
        "",
        f"In the maintainers' run of their full suite (`{test_cmd}` from the repository root), "
        f"{len(failing)} test(s) fail:",
        "",
    ]
    for test in shown:
        lines.append(f"- `{test}`")
        if messages.get(test):
            lines.append(f"  {_first_line(messages[test])}")
    if len(failing) > len(shown):
        lines.append(f"- ... and {len(failing) - len(shown)} more")
    lines += [
        "",
        "The tests describe the intended behaviour. Please fix the library code so that they pass",
        "again, without changing the tests and without breaking the tests that pass now.",
    ]
    return "\n".join(lines)


def _parse(text: str | None) -> ast.Module | None:
    if text is None:
        return None
    try:
        return pyast.parse(text)
    except SyntaxError:
        return None


def _function_span(node: ast.stmt) -> tuple[int, int] | None:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.end_lineno is None:
        return None
    return min([node.lineno, *(d.lineno for d in node.decorator_list)]), node.end_lineno


def _imported_module_file(snapshot: Mapping[str, str], path: str, node: ast.ImportFrom) -> str | None:
    """The snapshot file a ``from X import ...`` in ``path`` reads: relative, or from the root or src/."""
    parts = (node.module or "").split(".") if node.module else []
    if node.level:
        folder = PurePosixPath(path).parent
        for _ in range(node.level - 1):
            folder = folder.parent
        bases = [folder]
    else:
        bases = [PurePosixPath("."), PurePosixPath("src")]
    for base in bases:
        for candidate in (
            base.joinpath(*parts).with_suffix(".py") if parts else None,
            base.joinpath(*parts, "__init__.py"),
        ):
            if candidate is not None and str(candidate) in snapshot:
                return str(candidate)
    return None


def _method_definition(
    snapshot: Mapping[str, str], path: str, classes: Sequence[str], method: str, depth: int = 0
) -> tuple[str, tuple[int, int]] | None:
    """(file, line span) defining ``method`` for the class ``classes`` (nested) of ``path``: in the
    class itself, else in its bases, searched left to right, depth first (as the MRO would for
    mixins), in the same file or in the module a ``from ... import`` names."""
    tree = _parse(snapshot.get(path))
    if tree is None or depth > 8:
        return None
    body: list[ast.stmt] = tree.body
    cls: ast.ClassDef | None = None
    for name in classes:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == name), None)
        if cls is None:
            return None
        body = cls.body
    if cls is None:  # a module-level test function
        found = next(
            (n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == method),
            None,
        )
        span = _function_span(found) if found is not None else None
        return (path, span) if span is not None else None
    own = next(
        (n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == method),
        None,
    )
    if own is not None:
        span = _function_span(own)
        return (path, span) if span is not None else None
    for base in cls.bases:
        if not isinstance(base, ast.Name):
            continue
        if any(isinstance(n, ast.ClassDef) and n.name == base.id for n in tree.body):
            found_in = _method_definition(snapshot, path, [base.id], method, depth + 1)
        else:
            source = next(
                (
                    (n, alias.name)
                    for n in tree.body
                    if isinstance(n, ast.ImportFrom)
                    for alias in n.names
                    if (alias.asname or alias.name) == base.id
                ),
                None,
            )
            module = _imported_module_file(snapshot, path, source[0]) if source is not None else None
            found_in = (
                _method_definition(snapshot, module, [source[1]], method, depth + 1) if module else None
            )
        if found_in is not None:
            return found_in
    return None


def split_judge_tests(
    snapshot: Mapping[str, str], tests: Sequence[str]
) -> tuple[dict[str, str], str, list[str]]:
    """Take the definitions of ``tests`` (pytest node ids) out of the files that define them
    (a test method inherited from a mixin is taken out of the mixin, for every class using it).

    Returns the snapshot without them, the test patch that puts them back, and the tests that
    stayed in the snapshot because they could not be taken out (module docstring).
    """
    spans: dict[str, dict[tuple[int, int], list[str]]] = {}
    kept: list[str] = []
    for test in tests:
        path, *names = test.split("[", 1)[0].split("::")
        found = _method_definition(snapshot, path, names[:-1], names[-1]) if names else None
        if found is None:
            kept.append(test)
        else:
            spans.setdefault(found[0], {}).setdefault(found[1], []).append(test)
    visible = dict(snapshot)
    for path, tests_at in sorted(spans.items()):
        lines = snapshot[path].splitlines(keepends=True)
        for first, last in sorted(tests_at, reverse=True):
            del lines[first - 1 : last]
        stripped = "".join(lines)
        if _parse(stripped) is None:  # e.g. a class left with no statement
            kept += [test for group in tests_at.values() for test in group]
        else:
            visible[path] = stripped
    return visible, make_diff(visible, dict(snapshot)), sorted(kept)


def make_task(
    *,
    instance_id: str,
    project: str,
    snapshot: Mapping[str, str],
    mutant: MutantSource,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    messages: Mapping[str, str],
    suite: TestSuite,
    requirements: list[str],
) -> Task:
    """The task whose repository is ``snapshot`` with the mutant applied, minus the FAIL_TO_PASS
    tests (in ``test_patch``), and whose gold patch undoes the mutant.

    ``environment`` names the interpreter of the library's venv and the exact distributions installed
    in it (``requirements``). ``synthesis`` (an extra field) records how the bug was made and which
    FAIL_TO_PASS tests had to stay in the snapshot; it is metadata for analysis and must not be
    shown to the policy.
    """
    buggy = {**snapshot, mutant.path: mutant.mutant}
    visible, test_patch, kept = split_judge_tests(buggy, fail_to_pass)
    patch = make_diff({mutant.path: mutant.mutant}, {mutant.path: mutant.original})
    m = mutant.mutation
    return Task(
        instance_id=instance_id,
        repo=f"pypi/{project.split('==')[0]}",
        snapshot=visible,
        problem_statement=problem_statement(project, suite.test_cmd, fail_to_pass, messages),
        patch=patch,
        test_patch=test_patch,
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        environment=Environment(python=str(suite.python), requirements=requirements),
        test_cmd=suite.test_cmd,
        synthesis={
            "source": project,
            "operator": m.operator,
            "path": mutant.path,
            "function": m.function,
            "line": m.line,
            "description": m.description,
            "fail_to_pass_in_snapshot": kept,
        },
    )


def _run_snapshot(suite: TestSuite, files: Mapping[str, str], timeout_s: float) -> PytestRun:
    with tempfile.TemporaryDirectory(prefix="gagar-synth-verify-") as tmp:
        write_snapshot(files, Path(tmp))
        return suite.run(Path(tmp), timeout_s)


def verify_task(task: Task, suite: TestSuite, original: Mapping[str, str], timeout_s: float) -> list[str]:
    """Re-run the task from its own record; returns what is wrong with it (empty: verified).

    Checks that the snapshot the policy reads runs cleanly, that with ``test_patch`` applied it
    fails every FAIL_TO_PASS test and passes every PASS_TO_PASS test, that the gold patch and the
    test patch together restore ``original``, and that with both applied every test passes.
    """
    if task.snapshot is None:
        raise ValueError(f"{task.instance_id}: a synthesized task must bundle its snapshot")
    problems: list[str] = []
    judged = apply_diff(task.snapshot, task.test_patch)
    fixed = apply_diff(judged, task.patch)
    if fixed != dict(original):
        problems.append("the gold patch and the test patch do not restore the original sources")
    shown_run = _run_snapshot(suite, task.snapshot, timeout_s)
    if shown_run.broken:
        return [*problems, f"the snapshot's own test run broke:\n{shown_run.log_tail[-800:]}"]
    buggy_run = _run_snapshot(suite, judged, timeout_s)
    if buggy_run.broken:
        return [*problems, f"the buggy snapshot's test run broke:\n{buggy_run.log_tail[-800:]}"]
    still_passing = [t for t in task.FAIL_TO_PASS if buggy_run.outcomes.get(t) not in _FAILING]
    if still_passing:
        problems.append(f"FAIL_TO_PASS tests do not fail on the buggy snapshot: {still_passing[:5]}")
    if any(buggy_run.outcomes.get(t) is not Outcome.PASSED for t in task.PASS_TO_PASS):
        problems.append("some PASS_TO_PASS tests do not pass on the buggy snapshot")
    fixed_run = _run_snapshot(suite, fixed, timeout_s)
    not_fixed = [
        t for t in task.FAIL_TO_PASS + task.PASS_TO_PASS if fixed_run.outcomes.get(t) is not Outcome.PASSED
    ]
    if not_fixed:
        problems.append(f"tests that do not pass with the gold patch: {not_fixed[:5]}")
    return problems
