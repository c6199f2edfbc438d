"""Problem statements written as a user reports a bug: the call, what came back, what was expected.

A statement names the function and shows one failing call; it never describes the fix.
"""

from __future__ import annotations

import random

from gagar.tasks.render import CallResult

__all__ = ["problem_statement"]

_TITLES = (
    "`{fn}` returns the wrong result",
    "Wrong result from `{fn}`",
    "`{fn}` gives an unexpected answer",
    "Bug in `{module}.{fn}`",
    "`{fn}` misbehaves for some inputs",
)
_VALUE_VS_VALUE = (
    "Calling `{call}` returns `{actual}`, but it should return `{expected}`.",
    "`{call}` gives `{actual}`; I expected `{expected}`.",
    "I expected `{call}` to return `{expected}`, but I get `{actual}`.",
)
_RAISES_INSTEAD = (
    "Calling `{call}` raises `{actual}` instead of returning `{expected}`.",
    "`{call}` crashes with `{actual}`; it should return `{expected}`.",
)
_SHOULD_RAISE = (
    "`{call}` should raise `{expected}`, but it returns `{actual}`.",
    "Calling `{call}` returns `{actual}` instead of raising `{expected}`.",
)
_WRONG_ERROR = (
    "`{call}` should raise `{expected}`, but it raises `{actual}`.",
    "Calling `{call}` fails with `{actual}` instead of `{expected}`.",
)


def _sentence(rng: random.Random, call: str, actual: CallResult, expected: CallResult | str) -> str:
    fields = {"call": call, "actual": actual.describe()}
    if isinstance(expected, str):
        choices = _SHOULD_RAISE if actual.error is None else _WRONG_ERROR
        return rng.choice(choices).format(expected=expected, **fields)
    choices = _VALUE_VS_VALUE if actual.error is None else _RAISES_INSTEAD
    return rng.choice(choices).format(expected=expected.describe(), **fields)


def _session(import_line: str, call: str, actual: CallResult) -> str:
    if actual.error is None:
        shown = actual.describe()
    else:
        shown = f"Traceback (most recent call last):\n  ...\n{actual.describe()}"
    return f"```python\n>>> {import_line}\n>>> {call}\n{shown}\n```"


def problem_statement(
    rng: random.Random,
    package: str,
    module: str,
    function: str,
    call: str,
    actual: CallResult,
    expected: CallResult | str,
) -> str:
    """A bug report for ``call`` that returned or raised ``actual``.

    Args:
        expected: the correct result, or the name of the exception the call should raise.
    """
    title = rng.choice(_TITLES).format(fn=function, module=f"{package}.{module}")
    import_line = f"from {package}.{module} import {function}"
    return f"{title}\n\n{_sentence(rng, call, actual, expected)}\n\n{_session(import_line, call, actual)}\n"
