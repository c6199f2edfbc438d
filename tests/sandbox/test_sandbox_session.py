"""The agent's persistent session: a shell and an editor inside the judge's isolation.

Hostile commands are contained (fork bomb, network, writes outside the tree, the judge's files,
killing the parent), the hidden tests never enter the session, and a session's processes die with
the process that started it, ``kill -9`` included.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.sandbox.process import become_subreaper, live_pids_of, pids_of, wait_reaped
from gagar.sandbox.session import LocalSession, open_session, read_tree
from gagar.sandbox.workspace import PREFIX, sweep_orphans
from gagar.schema.task import Task
from gagar.scratch import scratch_root

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local sandbox drops to a sandbox uid: needs root"
)

CALC = "def add(a, b):\n    return a - b\n"
VISIBLE = "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
HIDDEN = "HIDDEN-TEST-9f3c"
LIMITS = SandboxLimits(
    wall_time_s=8, cpu_time_s=5, memory_bytes=512 << 20, max_processes=32, max_file_bytes=8 << 20,
    tmp_bytes=16 << 20, max_output_bytes=1 << 20, log_chars=4000,
)  # fmt: skip


def _task() -> Task:
    hidden = (
        "diff --git a/tests/test_hidden.py b/tests/test_hidden.py\nnew file mode 100644\n"
        f"--- /dev/null\n+++ b/tests/test_hidden.py\n@@ -0,0 +1 @@\n+# {HIDDEN}\n"
    )
    return Task(
        instance_id="calc-1", repo="gagar/calc", snapshot={"calc.py": CALC, "tests/test_calc.py": VISIBLE},
        problem_statement="add subtracts", patch="", test_patch=hidden,
        FAIL_TO_PASS=["tests/test_hidden.py::test_add"], PASS_TO_PASS=["tests/test_calc.py::test_zero"],
    )  # fmt: skip


@pytest.fixture
def work_root() -> Iterator[Path]:
    """A folder the sandbox uid can traverse (pytest's tmp_path is private to root)."""
    root = Path(tempfile.mkdtemp(prefix="gagar-session-test-", dir=scratch_root()))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def backend(tmp_path: Path, work_root: Path) -> LocalBackend:
    settings = LocalSandboxSettings(
        base_uid=63000, uid_count=8, uid_lock_dir=tmp_path / "locks", work_root=work_root
    )
    return LocalBackend(LIMITS, settings, workers=1)


@pytest.fixture
def session(backend: LocalBackend) -> Iterator[LocalSession]:
    with open_session(backend, _task(), 2000) as s:
        yield s


def test_shell_persists_and_edits_make_the_patch(session: LocalSession) -> None:
    assert session.run("cd tests && export MARK=7", 5) == ""
    assert session.run("pwd; echo $MARK", 5) == "/sandbox/repo/tests\n7\n"
    assert (
        session.edit({"command": "view", "path": "calc.py", "view_range": [2, 2]}, 5)
        == "     2\t    return a - b\n"
    )
    assert session.edit({"command": "view", "path": "pkg/calc.py"}, 5) == (
        "error: /sandbox/repo/pkg/calc.py does not exist or is not a file; files of that name: calc.py\n"
    )
    refused = session.edit(
        {"command": "str_replace", "path": "calc.py", "old_str": "return a-b", "new_str": "x"}, 5
    )
    assert refused.startswith("error: old_str was not found verbatim")
    done = session.edit(
        {"command": "str_replace", "path": "calc.py", "old_str": "a - b", "new_str": "a + b"}, 5
    )
    assert "     2\t    return a + b" in done
    session.edit({"command": "insert", "path": "calc.py", "insert_line": 0, "new_str": "# top\n"}, 5)
    assert session.edit({"command": "undo_edit", "path": "calc.py"}, 5) == "undid the last edit of calc.py\n"
    session.edit({"command": "create", "path": "notes.txt", "file_text": "n\n"}, 5)
    assert session.edit({"command": "create", "path": "notes.txt", "file_text": "n\n"}, 5).startswith(
        "error:"
    )
    assert "1 passed" in session.run(
        "cd /sandbox/repo && python -m pytest -q -p no:cacheprovider", 20
    )  # the visible tests run
    assert session.run("echo $MARK", 5) == "7\n"
    patch = session.patch()
    assert "+    return a + b" in patch
    assert "+n" in patch
    assert "# top" not in patch


def test_hidden_tests_and_judge_files_never_enter(session: LocalSession, backend: LocalBackend) -> None:
    judge = backend.work_root / f"{PREFIX}judge-like"
    judge.mkdir()
    (judge / "secret.txt").write_text(HIDDEN)
    search = f"grep -rs {HIDDEN} / --exclude-dir=proc --exclude-dir=sys | head; ls {judge} 2>&1"
    out = session.run(search, 180)
    assert "timed out" not in out, "the search of the whole file system did not finish"
    assert HIDDEN not in out.replace(f"grep -rs {HIDDEN}", "")
    assert "No such file" in out
    assert not (session.repo / "tests" / "test_hidden.py").exists()


def test_hostile_commands_are_contained(session: LocalSession, tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    net = session.run(
        f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED; ip link 2>/dev/null | grep -c UP", 5
    )
    assert "CONNECTED" not in net
    listener.close()
    outside = tmp_path / "outside.txt"
    targets = f"/usr/x /etc/x /x /sandbox/x /sandbox/tools/x {outside}"
    writes = session.run(f"for f in {targets}; do touch $f 2>/dev/null && echo WROTE $f; done", 5)
    assert writes == ""
    assert not outside.exists()
    session.run(":(){ :|:& };:", 3)
    time.sleep(1)
    assert len(live_pids_of(session.uid)) <= LIMITS.max_processes  # RLIMIT_NPROC of the session's uid
    answers = []
    while len(answers) < 4 and answers[-1:] != ["alive\n"]:  # a flooded shell times out and restarts
        answers.append(session.run("echo alive", 3))
    assert answers[-1] == "alive\n"
    host = os.getpid()
    killer = session.run(f"kill -9 {host}; kill -9 $PPID; kill -9 -1; echo survived", 5)
    assert "No such process" in killer
    assert os.getpid() == host
    assert "new shell" in session.run("kill -9 $$", 5)  # the shell itself can die: a new one starts
    assert session.run("cat calc.py", 5) == CALC


def test_links_out_of_the_tree_are_not_followed(session: LocalSession) -> None:
    session.run("ln -s /etc/passwd leak.txt; ln -s /proc/1/environ env.txt", 5)
    assert read_tree(session.repo, 1 << 20).keys() == {"calc.py", "tests/test_calc.py"}
    assert "root:" not in session.patch()


def test_sessions_die_with_a_killed_rollout(work_root: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from gagar.sandbox.limits import SandboxLimits
        from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
        from gagar.sandbox.session import open_session
        from gagar.schema.task import Task
        settings = LocalSandboxSettings(
            base_uid=63100, uid_count=4, uid_lock_dir=Path({str(tmp_path / "locks2")!r}),
            work_root=Path({str(work_root)!r}),
        )
        task = Task(
            instance_id="t", repo="a/b", snapshot={{"a.py": "x = 1\\n"}}, problem_statement="p", patch="",
            FAIL_TO_PASS=["a.py::t"],
        )
        s = open_session(LocalBackend(SandboxLimits(), settings, workers=1), task, 500)
        s.run("sleep 1000 & sleep 1000 &", 5)
        print(s.uid, s.repo, flush=True)
        time.sleep(1000)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    uid_text, repo = child.stdout.readline().split()
    uid = int(uid_text)
    assert len(live_pids_of(uid)) >= 3  # the shell and both sleeps
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 10
    while live_pids_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_pids_of(uid) == []
    root = Path(repo).parent
    assert root.exists()  # its workspace stays until swept, as a killed judge's does
    assert root in sweep_orphans(work_root, min_age_s=0)


def test_calls_of_many_sessions_run_together(backend: LocalBackend) -> None:
    with open_session(backend, _task(), 500) as a, open_session(backend, _task(), 500) as b:
        start = time.monotonic()
        a.begin("sleep 1; echo a", 5)
        b.begin("sleep 1; echo b", 5)
        assert (a.finish(), b.finish()) == ("a\n", "b\n")
        assert time.monotonic() - start < 1.9
        assert a.uid != b.uid


def test_orphans_of_a_sandbox_uid_are_reaped_here() -> None:
    """A killed sandbox's PID-namespace init is orphaned; the process that ran it adopts and reaps it,
    instead of waiting for the host's PID 1 (slow on some VMs, absent where this program is PID 1)."""
    uid = 63990
    become_subreaper()
    subprocess.run(  # the shell exits at once; its background child becomes an orphan, adopted here
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sh", "-c", "sleep 0.2 & exit 0"],
        check=True,
    )
    deadline = time.monotonic() + 10
    while not set(pids_of(uid, zombies=True)) - set(live_pids_of(uid)):
        assert time.monotonic() < deadline, "the orphan never became a zombie"
        time.sleep(0.05)
    assert wait_reaped(uid, timeout_s=5) == 0  # nobody else would reap it: only this process can
    assert pids_of(uid, zombies=True) == []
