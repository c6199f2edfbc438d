"""Render a generated package: module sources, example calls run for real, pytest files.

Everything here is a pure function of its arguments. Expected values in the tests come
from running the correct function (:func:`call_example`), never from hand-written numbers.
Tests compare results with ``_same`` (defined in each test file): the exact type first, then
the value, item by item, so an object whose ``__eq__`` always answers True cannot pass.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from string import Template
from typing import Any

from gagar.tasks.library import Case, Domain, FunctionTemplate, Mutation

__all__ = [
    "CallResult",
    "GenerationError",
    "RenderedFunction",
    "RenderedModule",
    "call_example",
    "module_source",
    "render_function",
    "tests_source",
]

_EVAL_GLOBALS: dict[str, Any] = {"__builtins__": __builtins__, "date": date}
_SAME = '''def _same(actual, expected):
    """Whether ``actual`` has exactly ``expected``'s type and value, item by item (no look-alikes)."""
    if type(actual) is not type(expected):
        return False
    if type(expected) in (list, tuple):
        return len(actual) == len(expected) and all(map(_same, actual, expected))
    if type(expected) is dict:
        return _same(sorted(actual.items()), sorted(expected.items()))
    return actual == expected
'''
"""The comparison every value test makes: ``type(x)`` and ``is`` cannot be overridden by the
tested code, and builtin types compare by value (a subclass, or an object claiming equality, fails)."""


class GenerationError(RuntimeError):
    """The generator produced something inconsistent (a template bug); never raised for valid seeds."""


@dataclass(frozen=True)
class RenderedFunction:
    """A function template with its name and constants chosen."""

    template: FunctionTemplate
    name: str
    values: dict[str, str]
    """Placeholder -> text, including ``X_BUG`` for every constant ``X``."""

    @property
    def source(self) -> str:
        return Template(self.template.source).substitute(name=self.name, **self.values)

    def case_args(self, case: Case) -> str:
        return Template(case.args).substitute(self.values)

    def call(self, case: Case) -> str:
        """The example call as a user would type it, e.g. ``apply_discount(100, 0.2)``."""
        return f"{self.name}({self.case_args(case)})"

    def test_name(self, case: Case) -> str:
        return f"test_{self.name}_{case.test}"

    def mutation_text(self, mutation: Mutation) -> tuple[str, str]:
        """(old, new) of ``mutation`` with this function's constants filled in."""
        return Template(mutation.old).substitute(self.values), Template(mutation.new).substitute(self.values)


@dataclass(frozen=True)
class RenderedModule:
    """One module of a generated package: ``<package>/<name>.py`` and ``tests/test_<name>.py``."""

    name: str
    domain: Domain
    functions: tuple[RenderedFunction, ...]

    @property
    def path(self) -> str:
        return f"{self.name}.py"

    @property
    def test_path(self) -> str:
        return f"tests/test_{self.name}.py"


@dataclass(frozen=True)
class CallResult:
    """What one example call did: returned ``value``, or raised ``error`` (type name, message)."""

    value: Any = None
    error: tuple[str, str] | None = None

    def describe(self) -> str:
        """``repr(value)``, or ``ExcType: message``."""
        if self.error is None:
            return repr(self.value)
        kind, message = self.error
        return f"{kind}: {message}" if message else kind


def render_function(template: FunctionTemplate, rng: random.Random) -> RenderedFunction:
    """Choose a name and constants for ``template``."""
    values: dict[str, str] = {}
    for key, pairs in sorted(template.constants.items()):
        good, bad = rng.choice(pairs)
        values[key], values[f"{key}_BUG"] = good, bad
    return RenderedFunction(template, rng.choice(template.names), values)


def module_source(package: str, module: RenderedModule) -> str:
    """The text of ``<package>/<module>.py``, in one consistent style."""
    imports = sorted({imp for f in module.functions for imp in f.template.imports})
    names = ", ".join(f'"{f.name}"' for f in module.functions)
    parts = [f'"""{module.domain.summary[:-1]} for {package}."""\n']
    if imports:
        parts.append("\n".join(imports) + "\n")
    parts.append(f"__all__ = [{names}]\n")
    head = "\n".join(parts)
    return head + "\n\n" + "\n\n".join(f.source for f in module.functions)


def call_example(source: str, function: str, args: str) -> CallResult:
    """Run ``function(args)`` from module ``source`` in a fresh namespace (trusted, generated code)."""
    namespace: dict[str, Any] = {"__name__": "generated"}
    exec(compile(source, "<generated>", "exec"), namespace)
    arguments = eval(f"({args},)", _EVAL_GLOBALS)
    try:
        return CallResult(value=namespace[function](*arguments))
    except Exception as exc:
        return CallResult(error=(type(exc).__name__, str(exc)))


def _test_function(fn: RenderedFunction, case: Case, expected: CallResult) -> str:
    call = fn.call(case)
    if case.raises is not None:
        if expected.error is None or expected.error[0] != case.raises:
            raise GenerationError(f"{call} should raise {case.raises}, got {expected.describe()}")
        return f"def {fn.test_name(case)}():\n    with pytest.raises({case.raises}):\n        {call}\n"
    if expected.error is not None:
        raise GenerationError(f"correct {call} raised {expected.describe()}")
    return f"def {fn.test_name(case)}():\n    assert _same({call}, {expected.value!r})\n"


def tests_source(
    package: str,
    module: RenderedModule,
    correct_source: str,
    cases: Mapping[str, Sequence[Case]],
) -> str:
    """The text of ``tests/test_<module>.py``: one test per case, expectations from the correct code.

    ``cases`` maps a function name to the cases rendered for it; a function it leaves out gets its
    template's visible cases. The header is the same whichever cases are rendered, so two
    renderings of one module differ only by test functions.
    """
    functions = [
        _test_function(fn, case, call_example(correct_source, fn.name, fn.case_args(case)))
        for fn in module.functions
        for case in cases.get(fn.name, fn.template.cases)
    ]
    std = sorted({imp for f in module.functions for imp in f.template.test_imports})
    every_case = [c for f in module.functions for c in (*f.template.cases, *f.template.held_out)]
    header = [f'"""Tests for {package}.{module.name}."""\n']
    if std:
        header.append("\n".join(std) + "\n")
    if any(case.raises for case in every_case):
        header.append("import pytest\n")
    names = ", ".join(f.name for f in module.functions)
    header.append(f"from {package}.{module.name} import {names}\n")
    return "\n".join(header) + "\n\n" + "\n\n".join([_SAME, *functions])
