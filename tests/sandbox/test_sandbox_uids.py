"""Sandbox uid leases: one evaluation per uid, across threads, processes and backends."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from gagar.sandbox.base import Prediction
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.sandbox.patch import file_diff
from gagar.sandbox.uids import UidsBusyError, lease_uid, uid_leased
from gagar.schema.result import Status, TestResult
from gagar.schema.task import Task

HOLD_LEASE = """
import sys
from pathlib import Path
from gagar.sandbox.uids import lease_uid
with lease_uid(Path(sys.argv[1]), 100, 2) as uid:
    print(uid, flush=True)
    sys.stdin.read()
"""


def test_leases_are_exclusive_and_returned(tmp_path: Path) -> None:
    with lease_uid(tmp_path, 100, 2, prefer=1) as first:
        assert first == 101
        assert uid_leased(tmp_path, 101)
        with lease_uid(tmp_path, 100, 2, prefer=1) as second:
            assert second == 100
            busy = pytest.raises(UidsBusyError, match=r"all 2 sandbox uids 100\.\.101 are in use")
            with busy, lease_uid(tmp_path, 100, 2):
                pass
    assert not uid_leased(tmp_path, 100)
    assert not uid_leased(tmp_path, 101)
    with lease_uid(tmp_path, 100, 2, prefer=3) as again:
        assert again == 101


def test_lease_is_returned_when_the_block_raises(tmp_path: Path) -> None:
    with pytest.raises(KeyError), lease_uid(tmp_path, 100, 1):
        raise KeyError("boom")
    assert not uid_leased(tmp_path, 100)


def test_empty_uid_range_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="count=0"), lease_uid(tmp_path, 100, 0):
        pass


def test_a_lease_held_by_another_process_is_skipped_and_freed_when_it_exits(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LEASE, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"100"
        with lease_uid(tmp_path, 100, 2) as uid:
            assert uid == 101
    finally:
        holder.kill()  # dies without releasing: the kernel drops its lock
        holder.wait()
    assert not uid_leased(tmp_path, 100)


SLEEPY_TEST = "import time\n\n\ndef test_slow():\n    time.sleep(4)\n"
QUICK_TEST = "def test_quick():\n    assert True\n"


def _task(name: str, text: str) -> Task:
    return Task.model_validate(
        {
            "instance_id": name,
            "repo": "gagar/uids",
            "snapshot": {f"tests/test_{name}.py": text},
            "problem_statement": "none",
            "patch": file_diff("x.py", None, "x = 1\n"),
            "FAIL_TO_PASS": [f"tests/test_{name}.py::test_{name}"],
        }
    )


def _wait_until_started(work_root: Path, timeout_s: float = 60.0) -> None:
    """Until some workspace's sandbox has reported ``started`` (see isolation.sandbox_argv)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for marker in work_root.glob("gagar-sbx-*/started"):
            try:
                if marker.read_text().strip() == "started":
                    return
            except FileNotFoundError:
                continue
        time.sleep(0.02)
    raise AssertionError("the slow sandbox never started")


def _wait_until_uid_runs(uid: int, timeout_s: float = 60.0) -> None:
    """Until a process runs as ``uid`` (the slow pool's forkserver worker, which evaluates at once)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                uids = next(line for line in status.read_text().splitlines() if line.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if int(uids.split()[1]) == uid:
                time.sleep(1.0)  # the 4 s test is running by now
                return
        time.sleep(0.02)
    raise AssertionError(f"no process ever ran as the slow pool's uid {uid}")


@pytest.mark.skipif(os.geteuid() != 0, reason="the local sandbox drops to a sandbox uid: needs root")
@pytest.mark.parametrize("forkserver", [True, False], ids=["forkserver", "sandbox-per-evaluation"])
def test_backends_sharing_a_uid_range_do_not_kill_each_other(forkserver: bool) -> None:
    # Two pools numbering their slots from one base_uid (as two processes on one machine do):
    # the quick run ends with "kill every process of my uid", which must not reach the slow one.
    work_root = Path(tempfile.mkdtemp(prefix="gagar-uids-"))  # the sandbox uid must traverse it
    work_root.chmod(0o755)
    settings = LocalSandboxSettings(work_root=work_root, base_uid=63000, forkserver=forkserver)
    limits = SandboxLimits(wall_time_s=60)
    slow, quick = _task("slow", SLEEPY_TEST), _task("quick", QUICK_TEST)
    slow_result: list[TestResult] = []
    worker = threading.Thread(
        target=lambda: slow_result.extend(
            LocalBackend(limits, settings, workers=1).evaluate([(slow, Prediction(instance_id="slow"))])
        )
    )
    worker.start()
    try:
        if forkserver:
            _wait_until_uid_runs(63000)
        else:
            _wait_until_started(work_root)
        quick_result = LocalBackend(limits, settings, workers=1).evaluate(
            [(quick, Prediction(instance_id="quick"))]
        )
    finally:
        worker.join()
        work_root.rmdir()
    assert quick_result[0].status == Status.PASSED, quick_result[0].reason
    assert slow_result[0].status == Status.PASSED, (slow_result[0].reason, slow_result[0].log)
