"""Augmentations of SFT demonstrations that make copying from the prompt the only way to be right.

Generated tasks draw from a catalogue of a few hundred package names and a few dozen functions, so
a model trained from scratch learns to write a likely path, or a remembered variant of a function's
buggy line, instead of the text its prompt shows. Both augmentations give a task names it cannot
have seen, consistently in code, patch, statement and test ids, so the renamed task is still the
same task and its gold patch still fixes it:

- :func:`rename_package` moves the task to a package with a fresh random name;
- :func:`rename_locals` gives the parameters and local variables of the function the fix touches
  fresh random names.
"""

from __future__ import annotations

import ast
import keyword
import random
import re

from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, make_diff
from gagar.tasks.oracle import touched_function
from gagar.tasks.scopes import FunctionSpan, function_named

__all__ = ["package_of", "random_identifier", "random_package_name", "rename_locals", "rename_package"]

_CONSONANTS, _VOWELS = "bcdfghjklmnprstvwz", "aeiou"
_SUFFIXES = ("", "py", "kit", "lib", "ops", "core", "tools", "utils", "box")


def _syllables(rng: random.Random, fewest: int, most: int) -> str:
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(fewest, most)))


def random_package_name(rng: random.Random) -> str:
    """A pronounceable lower-case identifier of 2-4 random syllables and a common suffix."""
    while True:
        name = _syllables(rng, 2, 4) + rng.choice(_SUFFIXES)
        if not keyword.iskeyword(name):
            return name


def package_of(task: Task) -> str | None:
    """The task's one top-level source package (a directory with ``__init__.py``, not tests), or None."""
    packages = {
        path.split("/", 1)[0]
        for path in task.snapshot or {}
        if path.count("/") == 1 and path.endswith("/__init__.py") and not path.startswith("test")
    }
    return packages.pop() if len(packages) == 1 else None


def rename_package(task: Task, new: str) -> Task:
    """``task`` with its package renamed to ``new`` in file paths, code, patches, statement and test ids.

    The rename replaces the old name as a whole word, so imports, paths and the statement's examples
    stay consistent and the gold patch still fixes the renamed task.

    Raises:
        ValueError: the task has no single top-level package, or ``new`` is not a fresh identifier.
    """
    old = package_of(task)
    if old is None:
        raise ValueError(f"{task.instance_id}: no single top-level package to rename")
    if not new.isidentifier() or keyword.iskeyword(new):
        raise ValueError(f"{new!r} is not a valid package name")
    word = re.compile(rf"\b{re.escape(old)}\b")
    if any(re.search(rf"\b{re.escape(new)}\b", text) for text in (task.snapshot or {}).values()):
        raise ValueError(f"{task.instance_id}: {new!r} already occurs in the repository")

    def sub(text: str) -> str:
        return word.sub(new, text)

    snapshot = {sub(path): sub(text) for path, text in (task.snapshot or {}).items()}
    return task.model_copy(
        update={
            "snapshot": snapshot,
            "patch": sub(task.patch),
            "test_patch": sub(task.test_patch),
            "problem_statement": sub(task.problem_statement),
            "FAIL_TO_PASS": [sub(t) for t in task.FAIL_TO_PASS],
            "PASS_TO_PASS": [sub(t) for t in task.PASS_TO_PASS],
        }
    )


def random_identifier(rng: random.Random) -> str:
    """A pronounceable snake_case identifier of one or two random words of 2-3 syllables."""
    while True:
        name = "_".join(_syllables(rng, 2, 3) for _ in range(rng.randint(1, 2)))
        if not keyword.iskeyword(name):
            return name


def _local_names(span: FunctionSpan) -> set[str]:
    """Parameters and names the function assigns, minus those it declares global or nonlocal."""
    args = span.node.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    names = {a.arg for a in params if a is not None}
    declared: set[str] = set()
    for node in ast.walk(span.node):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            declared.update(node.names)
    return names - declared - {"self", "cls"}


def _unsafe_names(span: FunctionSpan) -> set[str]:
    """Names a rename inside the function must not touch: keyword arguments, attributes, nested defs."""
    unsafe: set[str] = set()
    for node in ast.walk(span.node):
        if isinstance(node, ast.keyword) and node.arg:
            unsafe.add(node.arg)
        elif isinstance(node, ast.Attribute):
            unsafe.add(node.attr)
        elif node is not span.node and isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
        ):
            unsafe.add(node.name)
    return unsafe


def _rename_in_span(text: str, span: FunctionSpan, mapping: dict[str, str]) -> str:
    """``text`` with each whole-word ``mapping`` key inside ``span`` replaced, except after a dot."""
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(mapping))) + r")\b")
    lines = text.splitlines(keepends=True)
    body = pattern.sub(lambda m: mapping[m.group(1)], "".join(lines[span.start - 1 : span.end]))
    return "".join([*lines[: span.start - 1], body, *lines[span.end :]])


def rename_locals(task: Task, rng: random.Random) -> Task:
    """``task`` with the parameters and locals of the function its fix touches renamed at random.

    The rename applies to the function before and after the gold patch, docstring included. Names
    that occur in any other file (the tests may pass them as keywords), in the problem statement, or
    as keyword arguments or attributes inside the function keep their names.

    Raises:
        ValueError: the fix touches no function, or nothing in it can be renamed.
    """
    if task.snapshot is None:
        raise ValueError(f"{task.instance_id}: no bundled snapshot")
    path, qualname = touched_function(task.snapshot, task.patch)
    before, after = task.snapshot[path], apply_diff(task.snapshot, task.patch)[path]
    spans = [function_named(text, qualname) for text in (before, after)]
    if spans[0] is None or spans[1] is None:
        raise ValueError(f"{task.instance_id}: {path}:{qualname} is not a function")
    elsewhere = "\n".join([task.problem_statement, *(t for p, t in task.snapshot.items() if p != path)])
    candidates = (
        (_local_names(spans[0]) | _local_names(spans[1])) - _unsafe_names(spans[0]) - _unsafe_names(spans[1])
    )
    names = sorted(n for n in candidates if not re.search(rf"\b{re.escape(n)}\b", elsewhere))
    if not names:
        raise ValueError(f"{task.instance_id}: {path}:{qualname} has no local name to rename")
    taken = set(re.findall(r"\w+", before + after))
    mapping: dict[str, str] = {}
    for name in names:
        new = random_identifier(rng)
        while new in taken:
            new = random_identifier(rng)
        taken.add(new)
        mapping[name] = new
    renamed_before = _rename_in_span(before, spans[0], mapping)
    renamed_after = _rename_in_span(after, spans[1], mapping)
    snapshot = {**task.snapshot, path: renamed_before}
    return task.model_copy(
        update={"snapshot": snapshot, "patch": make_diff(snapshot, {**snapshot, path: renamed_after})}
    )
