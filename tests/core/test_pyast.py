"""gagar.pyast: syntax trees built from many threads at once (CPython gh-106905)."""

from __future__ import annotations

import gc
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gagar import pyast

SOURCE = "\n".join(f"def f{i}(x):\n    return [(a, {{b: c for b in x}}) for a in x if a]" for i in range(200))
SRC = Path(pyast.__file__).resolve().parent


@pytest.fixture
def busy_collector() -> Iterator[None]:
    """Python code run by every collection and frequent thread switches: what lets another
    thread start a parse while one is half built."""
    switch = sys.getswitchinterval()
    callback = lambda *_: sum(range(50))  # noqa: E731
    sys.setswitchinterval(1e-6)
    gc.callbacks.append(callback)
    yield
    gc.callbacks.remove(callback)
    sys.setswitchinterval(switch)


def errors_parsing_in_threads(parse: Callable[[str], object], threads: int = 4, rounds: int = 40) -> list:
    errors: list[BaseException] = []

    def work() -> None:
        for _ in range(rounds):
            try:
                parse(SOURCE)
            except SystemError as exc:
                errors.append(exc)
                return

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return errors


@pytest.mark.usefixtures("busy_collector")
def test_parsing_from_many_threads_never_fails() -> None:
    assert errors_parsing_in_threads(pyast.parse) == []  # ast.parse fails here on CPython 3.11.7


def test_gagar_parses_only_through_pyast() -> None:
    direct = re.compile(r"\bast\.parse\(|PyCF_ONLY_AST")
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.name != "pyast.py" and direct.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
