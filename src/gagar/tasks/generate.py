"""The bundled task family: small generated Python packages, each with one injected bug.

Each task is a package of two to four modules drawn from :data:`gagar.tasks.library.DOMAINS`
with a pytest suite, one one-line bug, the minimal gold diff that fixes it and a user-style
bug report. FAIL_TO_PASS and PASS_TO_PASS come from real pytest runs of the buggy and the
fixed repository. Generation is deterministic: task ``i`` depends only on ``(split, seed, i)``,
and the split is part of every repository name, so train and held-out never share one.

Bugs come from the catalogue's hand-written mutations (two to four per function), or with
``mutations="all"`` also from the AST operators of :mod:`gagar.tasks.mutate` applied to every
line of the function: 243 bugs over the catalogue's 26 functions instead of 59, a harder family
for RL or evaluation. (As SFT data for the tiny embedded policy it was meant to make recalling a
likely bug useless; it halved the parse rate instead: docs/policy.md.)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Literal, get_args

from gagar.sandbox.results import Outcome
from gagar.tasks.diffs import make_diff
from gagar.tasks.library import DOMAINS, BugKind, Mutation
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
from gagar.tasks.schema import Task
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


def _predicted_failures(bug: _Bug, buggy_source: str, correct_source: str) -> list[tuple[str, CallResult]]:
    """(test name, buggy result) of each case of the mutated function whose outcome changes."""
    failures = []
    for case in bug.function.template.cases:
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
) -> tuple[_Bug, str, list[tuple[str, CallResult]]]:
    """A bug the tests catch: (bug, buggy module source, (test, buggy result) of each failing case)."""
    candidates = _candidates(modules, sources, mutations)
    while candidates:
        kind = rng.choice(sorted({b.mutation.kind for b in candidates}))
        bug = rng.choice([b for b in candidates if b.mutation.kind == kind])
        buggy = sources[bug.module.name].replace(bug.old, bug.new)
        failures = _predicted_failures(bug, buggy, sources[bug.module.name])
        if failures:
            return bug, buggy, failures
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

    With ``verify`` (the default) pytest runs on the buggy and the fixed repository and FAIL_TO_PASS
    comes from those runs, checked against the example calls' prediction. ``verify=False`` trusts the
    prediction and runs no test: the same task, about 30 times faster, for SFT demonstrations only
    (their test lists are never used); tasks the sandbox evaluates are generated verified.
    ``mutations`` picks the bug source (module docstring); the package is the same either way.
    """
    rng = random.Random(f"gagar-tasks:{split}:{seed}:{index}")
    package, modules = _package(rng)
    sources = {m.name: module_source(package, m) for m in modules}
    files = _files(package, modules, sources)
    for m in modules:
        files[m.test_path] = tests_source(package, m, sources[m.name])
    bug, buggy_source, failures = _choose_bug(rng, modules, sources, mutations)
    module_path = f"{package}/{bug.module.path}"
    snapshot = {**files, module_path: buggy_source}
    predicted = sorted(f"{bug.module.test_path}::test_{bug.function.name}_{t}" for t, _ in failures)
    if verify:
        fail, passing = _outcomes_split(run_pytest(snapshot, python=python), run_pytest(files, python=python))
        if fail != predicted:
            raise GenerationError(f"pytest failed {fail}, the example calls predicted {predicted}")
    else:
        every = [
            f"{m.test_path}::test_{fn.name}_{c.test}"
            for m in modules
            for fn in m.functions
            for c in fn.template.cases
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
        patch=make_diff(snapshot, files),
        FAIL_TO_PASS=fail,
        PASS_TO_PASS=passing,
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
