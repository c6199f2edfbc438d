"""Polling helper of the cluster tests."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.5) -> None:
    """Poll ``check`` until it is true; fail the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval_s)
    pytest.fail(f"{what}: not after {timeout_s:.0f} s")
