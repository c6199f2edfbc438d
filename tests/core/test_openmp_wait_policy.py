"""gagar makes torch's OpenMP threads sleep while they wait, unless the user chose otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import gagar, torch, os; print(os.environ['OMP_WAIT_POLICY'])"


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_waiting_threads_sleep_unless_the_user_set_the_policy(given: str | None, seen: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == seen
