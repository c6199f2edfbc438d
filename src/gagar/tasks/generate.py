"""The bundled task family: small generated Python packages, each with one injected bug.

Each task is a package of two to four modules drawn from :data:`gagar.tasks.library.DOMAINS`
with a pytest suite, one one-line bug, the minimal gold diff that fixes it and a user-style
bug report. As in SWE-bench, the tests that judge the fix travel in ``test_patch``, applied after
the model patch: the snapshot the policy reads keeps the suite minus the tests the bug breaks
(those are PASS_TO_PASS), and ``test_patch`` adds back the broken ones plus held-out checks of
the same function on inputs the problem statement never shows (the template's ``held_out``
cases the bug changes), so a patch that special-cases the reported call fails. FAIL_TO_PASS and
PASS_TO_PASS come from real pytest runs of the buggy and the fixed repository, both with
``test_patch`` applied. Generation is deterministic: task ``i`` depends only on ``(split, seed, i)``,
and the split is part of every repository name, so train and held-out never share one.

Bugs come from the catalogue's hand-written mutations (two to four per function), or with
``mutations="all"`` also from the AST operators of :mod:`gagar.tasks.mutate` applied to every
line of the function: 243 bugs over the catalogue's 26 functions instead of 59, a harder family
for RL or evaluation. (As SFT data for the tiny embedded policy it was meant to make recalling a
likely bug useless; it halved the parse rate instead: docs/policy.md.)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Literal, get_args

from gagar.schema.result import Outcome
from gagar.schema.task import Task
from gagar.tasks.diffs import make_diff
from gagar.tasks.library import DOMAINS, BugKind, Case, Mutation
from gagar.tasks.mutate import find_mutations
from gagar.tasks.render import (
    CallResult,
    GenerationError,
    RenderedFunction,
    RenderedModule,
    call_example,
    module_source,
    render_function,
    tests_source,
)
from gagar.tasks.statements import problem_statement
from gagar.tasks.testrun import DEFAULT_TEST_CMD, run_pytest

__all__ = [
    "Mutations",
    "Split",
    "generate_task",
    "generate_tasks",
    "iter_generated_tasks",
    "operator_bugs",
    "summary_line",
]

Split = Literal["train", "heldout"]
Mutations = Literal["catalogue", "all"]
"""Where bugs come from: the catalogue only, or the catalogue and the AST operators."""

_OPERATOR_KINDS = {
    "compare": BugKind.WRONG_COMPARISON,
    "arith": BugKind.WRONG_OPERATOR,
    "off_by_one": BugKind.OFF_BY_ONE,
    "bool_flip": BugKind.WRONG_BOOLEAN,
    "bool_op": BugKind.WRONG_BOOLEAN,
    "return_value": BugKind.WRONG_VARIABLE,
    "drop_branch_stmt": BugKind.MISSED_EDGE_CASE,
    "swap_args": BugKind.SWAPPED_ARGUMENTS,
}
"""Bug kind of each one-line AST operator. ``return_value`` (a returned value negated or replaced
by ``None``) counts as a wrong value; ``drop_guard`` deletes lines and is left out."""

_STEMS = (
    "ledger", "tally", "quill", "harbor", "pebble", "atlas", "orbit", "bramble", "cinder", "delta",
    "ember", "fable", "grove", "hollow", "juniper", "kestrel", "lumen", "meadow", "nimbus", "otter",
    "prism", "quartz", "raven", "sable", "thistle", "umber", "vesper", "willow", "yarrow", "zephyr",
)  # fmt: skip
_SUFFIXES = ("kit", "lib", "utils", "tools", "ops", "py", "core", "box")


@dataclass(frozen=True)
class _Bug:
    module: RenderedModule
    function: RenderedFunction
    mutation: Mutation
    old: str
    new: str


def _package(rng: random.Random) -> tuple[str, list[RenderedModule]]:
    name = rng.choice(_STEMS) + rng.choice(_SUFFIXES)
    domains = rng.sample(DOMAINS, rng.randint(2, 4))
    modules = []
    for domain in domains:
        templates = rng.sample(domain.functions, rng.randint(3, min(4, len(domain.functions))))
        functions = tuple(render_function(t, rng) for t in templates)
        modules.append(RenderedModule(rng.choice(domain.modules), domain, functions))
    return name, modules


def _files(package: str, modules: list[RenderedModule], sources: dict[str, str]) -> dict[str, str]:
    titles = ", ".join(f"`{m.name}`" for m in modules)
    files = {
        "README.md": f"# {package}\n\nSmall utilities: {titles}.\n\nRun the tests with `python -m pytest`.\n",
        "pyproject.toml": f'[project]\nname = "{package}"\nversion = "0.1.0"\nrequires-python = ">=3.9"\n',
        f"{package}/__init__.py": f'"""{package}: small utilities."""\n\n__version__ = "0.1.0"\n',
    }
    for module in modules:
        files[f"{package}/{module.path}"] = sources[module.name]
    return files


def operator_bugs(source: str) -> list[Mutation]:
    """One-line bugs from the AST operators: each replaces one whole line of ``source``.

    ``old`` is the line as written and ``new`` the mutated line, both without the newline.
    """
    lines = source.splitlines()
    bugs = []
    for m in find_mutations(source):
        if m.operator not in _OPERATOR_KINDS or "\n" in m.replacement or "\n" in source[m.start : m.end]:
            continue  # a multi-line edit; a one-line one keeps every other line where it was
        new = m.apply(source).splitlines()[m.line - 1]
        if new.strip():
            bugs.append(Mutation(_OPERATOR_KINDS[m.operator], lines[m.line - 1], new))
    return bugs


def _function_bugs(fn: RenderedFunction, mutations: Mutations) -> list[tuple[Mutation, str, str]]:
    """(mutation, old, new) of each bug of ``fn``: the catalogue's, then any new operator bugs."""
    bugs = [(m, *fn.mutation_text(m)) for m in fn.template.mutations]
    if mutations == "all":
        seen = {(old, new) for _, old, new in bugs}
        for m in operator_bugs(fn.source):
            if (m.old, m.new) not in seen:
                seen.add((m.old, m.new))
                bugs.append((m, m.old, m.new))
    return bugs


def _candidates(modules: list[RenderedModule], sources: dict[str, str], mutations: Mutations) -> list[_Bug]:
    bugs = []
    for module in modules:
        for fn in module.functions:
            for mutation, old, new in _function_bugs(fn, mutations):
                if sources[module.name].count(old) == 1 and fn.source.count(old) == 1:
                    bugs.append(_Bug(module, fn, mutation, old, new))
    return bugs


def _predicted_failures(
    bug: _Bug, buggy_source: str, correct_source: str, cases: Sequence[Case]
) -> list[tuple[str, CallResult]]:
    """(case test, buggy result) of each of ``cases`` of the mutated function whose outcome changes."""
    failures = []
    for case in cases:
        args = bug.function.case_args(case)
        good = call_example(correct_source, bug.function.name, args)
        bad = call_example(buggy_source, bug.function.name, args)
        if case.raises is not None:
            changed = bad.error is None or bad.error[0] != case.raises
        else:
            changed = (
                bad.error is not None or bad.value != good.value or type(bad.value) is not type(good.value)
            )
        if changed:
            failures.append((case.test, bad))
    return failures


def _choose_bug(
    rng: random.Random, modules: list[RenderedModule], sources: dict[str, str], mutations: Mutations
) -> tuple[_Bug, str, list[tuple[str, CallResult]], list[str]]:
    """A bug both the visible tests and the held-out checks catch: (bug, buggy module source,
    (case test, buggy result) of each failing visible case, the case tests of the failing held-out ones)."""
    candidates = _candidates(modules, sources, mutations)
    while candidates:
        kind = rng.choice(sorted({b.mutation.kind for b in candidates}))
        bug = rng.choice([b for b in candidates if b.mutation.kind == kind])
        correct = sources[bug.module.name]
        buggy = correct.replace(bug.old, bug.new)
        failures = _predicted_failures(bug, buggy, correct, bug.function.template.cases)
        held_out = _predicted_failures(bug, buggy, correct, bug.function.template.held_out)
        if failures and held_out:
            return bug, buggy, failures, [test for test, _ in held_out]
        candidates.remove(bug)
    raise GenerationError("no injectable bug is caught by the tests")


def _outcomes_split(buggy: dict[str, Outcome], fixed: dict[str, Outcome]) -> tuple[list[str], list[str]]:
    if set(buggy) != set(fixed) or any(o != Outcome.PASSED for o in fixed.values()):
        raise GenerationError(f"fixed repository does not pass all its tests: {fixed}")
    fail = sorted(t for t, o in buggy.items() if o != Outcome.PASSED)
    return fail, sorted(t for t in buggy if t not in fail)


def generate_task(
    index: int,
    seed: int,
    split: Split = "train",
    python: str | None = None,
    verify: bool = True,
    mutations: Mutations = "catalogue",
) -> Task:
    """Task ``index`` of the family ``(split, seed)``.

    With ``verify`` (the default) pytest runs on the buggy and the fixed repository, each with
    ``test_patch`` applied, and FAIL_TO_PASS (held-out checks included) comes from those runs,
    checked against the example calls' prediction. ``verify=False`` trusts the
    prediction and runs no test: the same task, about 30 times faster, for SFT demonstrations only
    (their test lists are never used); tasks the sandbox evaluates are generated verified.
    ``mutations`` picks the bug source (module docstring); the package is the same either way.
    """
    rng = random.Random(f"gagar-tasks:{split}:{seed}:{index}")
    package, modules = _package(rng)
    sources = {m.name: module_source(package, m) for m in modules}
    files = _files(package, modules, sources)
    for m in modules:
        files[m.test_path] = tests_source(package, m, sources[m.name], {})
    bug, buggy_source, failures, held_out = _choose_bug(rng, modules, sources, mutations)
    module_path, test_path, fn = f"{package}/{bug.module.path}", bug.module.test_path, bug.function
    broken = {test for test, _ in failures}
    visible_tests, judge_tests = (
        tests_source(package, bug.module, sources[bug.module.name], {fn.name: cases})
        for cases in (
            [c for c in fn.template.cases if c.test not in broken],
            [*fn.template.cases, *(c for c in fn.template.held_out if c.test in held_out)],
        )
    )
    snapshot = {**files, module_path: buggy_source, test_path: visible_tests}
    test_patch = make_diff({test_path: visible_tests}, {test_path: judge_tests})
    held_out_ids = {f"{test_path}::test_{fn.name}_{t}" for t in held_out}
    predicted = sorted({f"{test_path}::test_{fn.name}_{t}" for t in broken} | held_out_ids)
    if verify:
        buggy_run = run_pytest({**snapshot, test_path: judge_tests}, python=python)
        fixed_run = run_pytest({**files, test_path: judge_tests}, python=python)
        fail, passing = _outcomes_split(buggy_run, fixed_run)
        if fail != predicted:
            raise GenerationError(f"pytest failed {fail}, the example calls predicted {predicted}")
    else:
        every = [
            f"{m.test_path}::{f.test_name(c)}" for m in modules for f in m.functions for c in f.template.cases
        ]
        fail, passing = predicted, sorted(t for t in every if t not in predicted)
    test, actual = rng.choice(failures)
    case = next(c for c in bug.function.template.cases if c.test == test)
    expected = case.raises or call_example(
        sources[bug.module.name], bug.function.name, bug.function.case_args(case)
    )
    statement = problem_statement(
        rng, package, bug.module.name, bug.function.name, bug.function.call(case), actual, expected
    )
    repo = f"synth-{split}/{package}-{seed}-{index}"
    return Task(
        instance_id=f"{repo.replace('/', '__')}-{rng.randint(1, 999)}",
        repo=repo,
        snapshot=snapshot,
        problem_statement=statement,
        patch=make_diff({module_path: buggy_source}, {module_path: sources[bug.module.name]}),
        test_patch=test_patch,
        FAIL_TO_PASS=fail,
        PASS_TO_PASS=passing,
        held_out_checks=sorted(held_out_ids & set(fail)),
        test_cmd=DEFAULT_TEST_CMD,
        bug_kind=str(bug.mutation.kind),
        bug_location=f"{module_path}::{bug.function.name}",
        split=split,
    )


def _generate_star(args: tuple[int, int, Split, str | None, bool, Mutations]) -> Task:
    return generate_task(*args)


def iter_generated_tasks(
    n: int,
    seed: int,
    split: Split = "train",
    workers: int = 1,
    python: str | None = None,
    verify: bool = True,
    mutations: Mutations = "catalogue",
) -> Iterator[Task]:
    """Yield tasks ``0..n-1`` of ``(split, seed)`` in order, generated by ``workers`` processes."""
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if mutations not in get_args(Mutations):
        raise ValueError(f"mutations must be one of {get_args(Mutations)}, got {mutations!r}")
    jobs = [(i, seed, split, python, verify, mutations) for i in range(n)]
    if workers <= 1:
        yield from map(_generate_star, jobs)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(_generate_star, jobs)


def generate_tasks(
    n: int,
    seed: int,
    split: Split = "train",
    workers: int = 1,
    python: str | None = None,
    progress: Callable[[Task], None] | None = None,
    verify: bool = True,
    mutations: Mutations = "catalogue",
) -> list[Task]:
    """``n`` tasks of the family ``(split, seed)``; the same arguments give the same tasks.

    Args:
        workers: processes that generate in parallel (each task runs pytest twice).
        python: interpreter with pytest that runs the suites; default this one.
        progress: called with each task as it is finished.
        verify: run pytest to establish FAIL_TO_PASS (see :func:`generate_task`).
        mutations: ``"catalogue"`` or ``"all"`` (see the module docstring).
    """
    tasks = []
    for task in iter_generated_tasks(n, seed, split, workers, python, verify, mutations):
        tasks.append(task)
        if progress is not None:
            progress(task)
    return tasks


def summary_line(tasks: list[Task]) -> str:
    """One line: the task count and the count per bug kind, e.g. ``12 tasks: off_by_one 3, ...``."""
    counts: dict[str, int] = {}
    for task in tasks:
        kind = str(getattr(task, "bug_kind", "unknown"))
        counts[kind] = counts.get(kind, 0) + 1
    kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items()))
    return f"{len(tasks)} tasks: {kinds}"
