"""Hostile patches in one batch: each is contained and not resolved, the rest of the batch is unaffected.

The batch runs once (module fixture) on two worker slots under tight limits, with a
good patch and an empty patch beside the hostile ones.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gagar.sandbox.base import Prediction
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.sandbox.patch import file_diff
from gagar.sandbox.uids import uid_leased
from gagar.schema.result import Outcome, Status, TestResult
from gagar.schema.task import Task

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local sandbox drops to a sandbox uid: needs root"
)

CALC = "def add(a, b):\n    return a - b\n"
TESTS = (
    "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
    "def test_zero():\n    assert add(0, 0) == 0\n"
)
LIMITS = SandboxLimits(
    wall_time_s=8,
    cpu_time_s=2,
    memory_bytes=512 << 20,
    max_processes=32,
    max_file_bytes=8 << 20,
    tmp_bytes=16 << 20,
    max_output_bytes=1 << 20,
    log_chars=4000,
)
BASE_UID = 62000


def _task() -> Task:
    return Task(
        instance_id="calc-1",
        repo="gagar/calc",
        snapshot={"calc.py": CALC, "tests/test_calc.py": TESTS},
        problem_statement="add subtracts",
        patch=file_diff("calc.py", CALC, CALC.replace("a - b", "a + b")),
        FAIL_TO_PASS=["tests/test_calc.py::test_add"],
        PASS_TO_PASS=["tests/test_calc.py::test_zero"],
    )


def _calc(body: str) -> str:
    """A patch replacing calc.py with ``body`` (which must define add)."""
    return file_diff("calc.py", CALC, body)


def _hostile(port: int, host_dir: Path) -> dict[str, str]:
    """Model patches by case name; each misbehaves when the tests call add()."""
    fork_bomb = (
        "import os, time\n\ndef add(a, b):\n    n = 0\n    while True:\n        try:\n"
        "            if os.fork() == 0:\n                time.sleep(60)\n                os._exit(0)\n"
        "        except OSError:\n"
        "            raise RuntimeError(f'fork refused after {n}')\n        n += 1\n"
    )
    memory_bomb = "def add(a, b):\n    hog = []\n    while True:\n        hog.append(bytearray(1 << 26))\n"
    flood = (  # after the session, when pytest no longer captures the output
        "import atexit, os\n\n\ndef _flood():\n    block = b'x' * (1 << 20)\n    for _ in range(1024):\n"
        "        os.write(1, block)\n\n\natexit.register(_flood)\n\n\ndef add(a, b):\n    return a + b\n"
    )
    symlink = (
        "diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n+/etc\n"
    )
    return {
        "good": _calc("def add(a, b):\n    return a + b\n"),
        "empty": "",
        "fork_bomb": _calc(fork_bomb),
        "memory_bomb": _calc(memory_bomb),
        "busy_loop": _calc("def add(a, b):\n    while True:\n        pass\n"),
        "sleeper": _calc("import time\n\ndef add(a, b):\n    time.sleep(3600)\n    return a + b\n"),
        "network": _calc(
            "import socket\n\ndef add(a, b):\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n    return a + b\n"
        ),
        "write_outside": _calc(
            "def add(a, b):\n    open('../escaped.txt', 'w').write('x')\n"
            f"    open({str(host_dir / 'escaped.txt')!r}, 'w').write('x')\n    return a + b\n"
        ),
        "flood": _calc(flood),
        "kill_parent": _calc(
            "import os, signal\n\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n"
            "    os.kill(-1, signal.SIGKILL)\n    return a + b\n"
        ),
        "dotdot": file_diff("../escaped.py", None, "x = 1\n"),
        "absolute": file_diff(str(host_dir / "abs.py").lstrip("/"), None, "x = 1\n").replace(" b/", " /"),
        "symlink": symlink,
        "dot_git": file_diff(".git/hooks/pre-commit", None, "#!/bin/sh\n"),
        "no_apply": file_diff("calc.py", "def add(a, b):\n    return a * b\n", CALC),
    }  # fmt: skip


class Listener:
    """A TCP listener on loopback that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory, listener: Listener) -> dict[str, TestResult]:
    host_dir = tmp_path_factory.mktemp("host")
    work_root = Path(tempfile.mkdtemp(prefix="gagar-hostile-"))  # the sandbox uid must traverse it
    work_root.chmod(0o755)
    patches = _hostile(listener.port, host_dir)
    settings = LocalSandboxSettings(work_root=work_root, base_uid=BASE_UID)
    backend = LocalBackend(LIMITS, settings, workers=2)
    task = _task()
    jobs = [
        (task, Prediction(instance_id=task.instance_id, model_patch=p, trajectory_id=k))
        for k, p in patches.items()
    ]
    results = backend.evaluate(jobs)
    assert [r.trajectory_id for r in results] == list(patches)
    leftovers = list(work_root.iterdir())
    shutil.rmtree(work_root)
    assert leftovers == [], "workspaces must be removed"
    assert not (host_dir / "escaped.txt").exists()
    assert not (host_dir / "abs.py").exists()
    return {r.trajectory_id: r for r in results}


def test_good_patch_in_the_batch_is_resolved(batch: dict[str, TestResult]) -> None:
    good = batch["good"]
    assert good.status == Status.PASSED, good.log
    assert good.resolved
    assert good.tests == {
        "tests/test_calc.py::test_add": Outcome.PASSED,
        "tests/test_calc.py::test_zero": Outcome.PASSED,
    }
    empty = batch["empty"]
    assert empty.status == Status.FAILED
    assert not empty.resolved
    assert empty.tests["tests/test_calc.py::test_add"] == Outcome.FAILED


def test_every_hostile_case_is_not_resolved(batch: dict[str, TestResult]) -> None:
    hostile = {k: r for k, r in batch.items() if k not in ("good", "empty")}
    assert all(not r.resolved for r in hostile.values())
    assert all(r.status not in (Status.PASSED, Status.INFRA_ERROR) for r in hostile.values())


def test_fork_bomb_hits_the_process_limit(batch: dict[str, TestResult]) -> None:
    result = batch["fork_bomb"]
    assert result.status in (Status.FAILED, Status.HACK)  # its children leave through os._exit
    assert "fork refused after" in result.log


def test_memory_bomb_hits_the_memory_limit(batch: dict[str, TestResult]) -> None:
    result = batch["memory_bomb"]
    assert result.status == Status.FAILED
    assert "MemoryError" in result.log


def test_busy_loop_hits_the_cpu_limit(batch: dict[str, TestResult]) -> None:
    result = batch["busy_loop"]
    assert result.status == Status.TIMEOUT
    assert "CPU" in (result.reason or "")


def test_sleeper_hits_the_wall_deadline(batch: dict[str, TestResult]) -> None:
    result = batch["sleeper"]
    assert result.status == Status.TIMEOUT
    assert "wall-clock" in (result.reason or "")


def test_network_is_unreachable(batch: dict[str, TestResult], listener: Listener) -> None:
    assert batch["network"].status == Status.FAILED
    assert "ConnectionRefusedError" in batch["network"].log or "OSError" in batch["network"].log
    assert listener.accepted == 0


def test_writes_outside_the_workspace_fail(batch: dict[str, TestResult]) -> None:
    assert batch["write_outside"].status == Status.FAILED
    assert "escaped.txt" in batch["write_outside"].log


def test_output_flood_is_cut_off(batch: dict[str, TestResult]) -> None:
    result = batch["flood"]
    assert result.status == Status.ERROR
    assert "output exceeded" in (result.reason or "")
    assert len(result.log) < LIMITS.log_chars + 100
    assert result.duration_s < LIMITS.wall_time_s


def test_killing_the_parent_only_kills_the_sandbox(batch: dict[str, TestResult]) -> None:
    result = batch["kill_parent"]
    assert result.status == Status.ERROR
    assert "SIGKILL" in (result.reason or "")


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("dotdot", "'..'"),
        ("absolute", "absolute path"),
        ("symlink", "symlink"),
        ("dot_git", ".git"),
        ("no_apply", "does not apply"),
    ],
)
def test_refused_patches_fail_with_a_reason(batch: dict[str, TestResult], case: str, why: str) -> None:
    result = batch[case]
    assert result.status == Status.FAILED
    assert not result.tests
    assert result.reason is not None
    assert why in result.reason


def test_no_sandbox_process_outlives_the_batch(batch: dict[str, TestResult]) -> None:
    # the batch leased uids of this range (usually the first two); a uid no one holds now must be idle
    settings = LocalSandboxSettings(base_uid=BASE_UID)
    span = range(BASE_UID, BASE_UID + settings.uid_count)
    uids = {uid for uid in span if not uid_leased(settings.uid_lock_dir, uid)}
    leftover = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
            if os.stat(f"/proc/{pid}").st_uid in uids and state != b"Z":  # zombies hold nothing
                leftover.append(pid)
        except FileNotFoundError:
            continue
    assert leftover == []
