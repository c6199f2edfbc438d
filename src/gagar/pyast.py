"""``ast.parse`` that many threads may call at once.

CPython 3.11 keeps the depth counter of its AST constructor in interpreter-wide state. When two
threads build syntax trees at the same time (a garbage collection inside one lets the other run),
the counters mix and one of them fails with ``SystemError: AST constructor recursion depth
mismatch`` (CPython gh-106905). The local sandbox evaluates in threads and every one of them parses
the pristine tests, so one parse at a time: every caller in GAGAR parses through :func:`parse`.
"""

from __future__ import annotations

import ast
import threading

__all__ = ["parse"]

_LOCK = threading.RLock()  # a parse nested in a parse fails as CPython fails it, never hangs


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename)
