"""The forkserver worker: evaluations run one after another in one slot's worker cannot see or change
each other, and only the judge's plain ``python -m pytest`` commands run there."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gagar.sandbox.base import Prediction
from gagar.sandbox.forkserver import forkable
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.sandbox.patch import file_diff
from gagar.sandbox.process import live_pids_of
from gagar.schema.result import Status
from gagar.schema.task import Task

CALC = "def add(a, b):\n    return a - b\n"
TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
BASE_UID = 62100
PORT = 47123

# Leaves a file in /tmp and /dev/shm, an environment variable, and a detached process that keeps a
# loopback port and keeps appending to the repository and /tmp; first it stops every process it sees.
LEAVER = f"""import os, signal, socket, time


def add(a, b):
    open('/tmp/left-by-a', 'w').write('a')
    if os.path.isdir('/dev/shm'):
        open('/dev/shm/left-by-a', 'w').write('a')
    os.environ['LEFT_BY_A'] = '1'
    for pid in (p for p in os.listdir('/proc') if p.isdigit()):  # the worker, were it visible
        if int(pid) not in (os.getpid(), os.getppid(), 1):
            try:
                os.kill(int(pid), signal.SIGSTOP)
            except OSError:
                pass
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(('127.0.0.1', {PORT}))
            s.listen()
            for _ in range(600):
                for path in ('/sandbox/repo/calc.py', '/tmp/late-by-a'):
                    try:
                        open(path, 'a').write('# a was here\\n')
                    except OSError:
                        pass
                time.sleep(0.05)
        os._exit(0)
    time.sleep(0.5)
    return a + b
"""

# Resolves only when nothing of the evaluation before it is visible.
CHECKER = f"""import os, socket


def add(a, b):
    seen = [p for p in ('/tmp/left-by-a', '/tmp/late-by-a', '/dev/shm/left-by-a') if os.path.exists(p)]
    if 'LEFT_BY_A' in os.environ:
        seen.append('environment')
    if '# a was ' + 'here' in open(__file__).read():
        seen.append('repository')
    try:
        socket.create_connection(('127.0.0.1', {PORT}), timeout=0.5).close()
        seen.append('socket')
    except OSError:
        pass
    others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) > 3]
    if others:
        seen.append(f'processes {{others}}')
    assert not seen, seen
    return a + b
"""

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local sandbox drops to a sandbox uid: needs root"
)


def _task(n: int) -> Task:
    return Task(
        instance_id=f"calc-{n}",
        repo="gagar/calc",
        snapshot={"calc.py": CALC, "tests/test_calc.py": TESTS},
        problem_statement="add subtracts",
        patch=file_diff("calc.py", CALC, CALC.replace("a - b", "a + b")),
        FAIL_TO_PASS=["tests/test_calc.py::test_add"],
    )


@pytest.fixture
def work_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gagar-forkserver-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_one_evaluation_cannot_see_or_change_the_next_in_the_same_worker(work_root: Path) -> None:
    started: list[int] = []
    backend = LocalBackend(
        SandboxLimits(wall_time_s=30, max_processes=64),
        LocalSandboxSettings(work_root=work_root, base_uid=BASE_UID, uid_count=4),
        workers=1,
    )
    start = backend._start_worker

    def counted(slot: int):
        started.append(slot)
        return start(slot)

    backend._start_worker = counted  # type: ignore[method-assign]
    patches = {"leaver": LEAVER, "checker": CHECKER, "leaver-2": LEAVER, "checker-2": CHECKER}
    jobs = [
        (
            _task(n),
            Prediction(
                instance_id=f"calc-{n}", model_patch=file_diff("calc.py", CALC, body), trajectory_id=k
            ),
        )
        for n, (k, body) in enumerate(patches.items())
    ]
    results = {r.trajectory_id: r for r in backend.evaluate(jobs)}
    assert started == [0], "all four evaluations ran in one worker"
    for key in ("leaver", "leaver-2"):  # it ran (the hack detector rightly objects to its os._exit)
        assert results[key].status in (Status.PASSED, Status.HACK), (key, results[key].reason)
        assert "1 passed" in results[key].log
    for key in ("checker", "checker-2"):
        assert results[key].status is Status.PASSED, (key, results[key].reason, results[key].log[-3000:])
    assert all(not live_pids_of(uid) for uid in range(BASE_UID, BASE_UID + 4)), "the worker's uid is idle"
    assert list(work_root.iterdir()) == []


def test_only_plain_pytest_commands_run_in_a_worker() -> None:
    assert forkable("python -m pytest -q") == ["-q"]
    assert forkable("python3 -m pytest -q tests/test_a.py::test_b[1-2] -k name") == [
        "-q",
        "tests/test_a.py::test_b[1-2]",
        "-k",
        "name",
    ]
    for command in (
        "pytest -q",
        "python -m pytest -q; rm -rf /",
        "python -m pytest $(echo x)",
        "make test",
        "'",
    ):
        assert forkable(command) is None, command
