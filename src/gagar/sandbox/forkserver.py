"""Pre-started sandbox workers: one per worker slot, forking a fresh isolated pytest per evaluation.

Starting the interpreter and importing pytest costs most of an evaluation of a small suite (about
0.25 of 0.4 s here). A :class:`Worker` pays it once per slot: it is started exactly like an
evaluation's sandbox (prlimit, setpriv to the slot's leased uid, bubblewrap with every namespace
unshared; :func:`gagar.sandbox.isolation.worker_argv`), imports pytest, and then, per evaluation,
forks a process that enters new user, mount, PID, IPC, network and UTS namespaces of its own, sees
only that evaluation's repository (at ``/sandbox/repo``), judge folder (read-only) and a fresh
``/tmp``, drops every capability and runs ``python -m pytest`` in process
(:mod:`gagar.sandbox.forkserver_worker`). When its tests end, the kernel kills whatever they left
in their PID namespace, and the host checks that only the worker's own processes remain under the
uid before the next evaluation starts; the worker is not dumpable and lives outside the
evaluation's PID namespace, so tested code can neither trace nor signal it.

Only the judge's default command shape runs in a worker (``python -m pytest`` with plain
arguments, the sandbox's own interpreter: :func:`forkable`); anything else runs the classic way, a
sandbox per evaluation (:mod:`gagar.sandbox.local`). A deadline or output flood kills the whole
worker (a fresh one starts for the next evaluation), as it kills the classic sandbox.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from importlib import resources
from pathlib import Path

from gagar.sandbox.isolation import SANDBOX_WORK, sandbox_env, worker_argv
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.process import BoundedOutput, RunOutcome, kill_uid, live_pids_of
from gagar.sandbox.uids import UidsBusyError, lease_uid

__all__ = ["NONCE_FD", "REPORT_FD", "WORKER_SOURCE", "Worker", "WorkerError", "WorkerPool", "forkable"]

WORKER_SOURCE = resources.files("gagar.sandbox").joinpath("forkserver_worker.py").read_text(encoding="utf-8")
NONCE_FD, REPORT_FD = 3, 4
"""Descriptor numbers of the judge's nonce pipe and report stream (write end) in the test process."""
_START_TIMEOUT_S = 60.0
_SAFE_ARG = re.compile(r"^[\w./:=@,+\-\[\]]+$")


class WorkerError(RuntimeError):
    """The worker could not start or answer: an infrastructure failure, not the patch's."""


def forkable(command: str) -> list[str] | None:
    """pytest's arguments when ``command`` is ``python -m pytest ARGS`` with plain arguments, else None."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if argv[:3] not in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]):
        return None
    args = argv[3:]
    return args if all(_SAFE_ARG.match(a) for a in args) else None


class Worker:
    """One slot's worker process, holding its leased uid until :meth:`close`."""

    def __init__(
        self,
        *,
        tools: tuple[str, str, str],
        limits: SandboxLimits,
        python: str,
        uid_lease: tuple[Path, int, int, int],
        work_root: Path | None,
    ) -> None:
        self.limits, self.python = limits, python
        self._stack = ExitStack()
        try:
            lock_dir, base, count, prefer = uid_lease
            self.uid = self._stack.enter_context(lease_uid(lock_dir, base, count, prefer=prefer))
            kill_uid(self.uid)  # a holder that died may have left processes behind
            self.root = Path(tempfile.mkdtemp(prefix="gagar-slot-", dir=work_root))
            self._stack.callback(shutil.rmtree, self.root, True)
            os.chmod(self.root, 0o755)
            self.work = self.root / "work"
            script_dir = self.root / "worker"
            for folder in (self.work, script_dir):
                folder.mkdir()
                os.chmod(folder, 0o755)
            (script_dir / "gagar_forkserver.py").write_text(WORKER_SOURCE, encoding="utf-8")
            os.chmod(script_dir / "gagar_forkserver.py", 0o644)
            self._start(tools, script_dir)
        except BaseException:
            self._stack.close()
            raise

    def _start(self, tools: tuple[str, str, str], script_dir: Path) -> None:
        self.control, inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = worker_argv(
            tools=tools, uid=self.uid, limits=self.limits, work=self.work, worker=script_dir,
            python=self.python, control_fd=inner.fileno(),
        )  # fmt: skip
        env = {**sandbox_env(self.python), "PYTHONSAFEPATH": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        self._log = open(self.root / "worker.log", "w+b")  # noqa: SIM115 (closed in close)
        self._stack.callback(self._log.close)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env,
            pass_fds=(inner.fileno(),), start_new_session=True,
        )  # fmt: skip
        inner.close()
        self._stack.callback(self._stop)
        self.control.settimeout(_START_TIMEOUT_S)
        try:
            ready = self.control.recv(64)
        except OSError as exc:
            raise WorkerError(f"the sandbox worker did not start: {exc}; {self._output()}") from exc
        if ready != b"ready":
            raise WorkerError(f"the sandbox worker did not start: {self._output()}")
        self.control.settimeout(None)
        self.spare = frozenset(live_pids_of(self.uid))
        """The worker's own processes (bubblewrap's and the worker): all the uid may run between jobs."""

    def _output(self) -> str:
        self._log.seek(0)
        return self._log.read()[-1000:].decode(errors="replace").strip() or "no output"

    @property
    def alive(self) -> bool:
        """Whether the worker still runs (a deadline or an output flood kills it)."""
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the worker and everything under it (bubblewrap's namespaces die with it)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _stop(self) -> None:
        with contextlib.suppress(OSError):
            self.control.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        kill_uid(self.uid)

    def close(self) -> None:
        """Stop the worker, clear its uid, remove its folder and give the uid back."""
        self._stack.close()

    def run(
        self, workspace_root: Path, env: Mapping[str, str], args: list[str], fds: tuple[int, int]
    ) -> RunOutcome:
        """Run pytest with ``args`` on the repository of the workspace at ``workspace_root`` (a folder
        of :attr:`work`), the judge's channel descriptors ``fds`` (nonce pipe, report stream) at
        :data:`NONCE_FD` and :data:`REPORT_FD`; bounded like :func:`gagar.sandbox.process.run_bounded`.

        Raises:
            WorkerError: the worker failed or is gone (the caller starts a fresh one).
        """
        lim = self.limits
        inside = f"{SANDBOX_WORK}/{workspace_root.name}"
        job = {
            "repo": f"{inside}/repo", "judge": f"{inside}/judge", "env": dict(env), "args": args,
            "tmp_bytes": lim.tmp_bytes,
        }  # fmt: skip
        out = BoundedOutput(lim.log_chars)
        exceeded, expired = threading.Event(), threading.Event()
        read_fd, write_fd = os.pipe()
        start = time.monotonic()
        try:
            socket.send_fds(self.control, [json.dumps(job).encode()], [write_fd, *fds])
        except OSError as exc:
            os.close(read_fd)
            raise WorkerError(f"the sandbox worker is gone: {exc}") from exc
        finally:
            os.close(write_fd)

        def drain() -> None:
            with open(read_fd, "rb", buffering=0) as pipe:
                while chunk := pipe.read(1 << 16):
                    if not exceeded.is_set():
                        out.add(chunk)
                        if out.total > lim.max_output_bytes:
                            exceeded.set()
                            self.kill()

        def expire() -> None:
            expired.set()
            self.kill()

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        timer = threading.Timer(lim.wall_time_s, expire)
        timer.daemon = True
        timer.start()
        try:
            reply = self.control.recv(1 << 16)
        except OSError:
            reply = b""
        finally:
            timer.cancel()
        reader.join(timeout=10)
        if exceeded.is_set() or expired.is_set():
            returncode: int | None = -signal.SIGKILL
        elif not reply:
            raise WorkerError(f"the sandbox worker died during the run: {self._output()}")
        else:
            answer = json.loads(reply)
            if "error" in answer:
                raise WorkerError(f"the sandbox worker could not run the evaluation: {answer['error']}")
            returncode = int(answer["returncode"])
            if kill_uid(self.uid, spare=self.spare) > 0:  # the kernel reaps the evaluation's namespace
                raise WorkerError(f"processes of sandbox uid {self.uid} survived the evaluation")
        return RunOutcome(
            returncode=returncode,
            timed_out=expired.is_set() and not exceeded.is_set(),
            output_exceeded=exceeded.is_set(),
            duration_s=time.monotonic() - start,
            output_bytes=out.total,
            log=out.text(),
        )


class WorkerPool:
    """The workers of one :meth:`gagar.sandbox.local.LocalBackend.evaluate` call, one per slot, started
    on first use and restarted after a kill; closed (uids given back) with the call."""

    def __init__(self, start: Callable[[int], Worker]) -> None:
        self._start = start
        self._workers: dict[int, Worker] = {}
        self._lock = threading.Lock()
        self.unavailable: str | None = None
        """Why no worker could be started (the pool then hands out none)."""

    def for_slot(self, slot: int) -> Worker | None:
        """Slot ``slot``'s live worker, started if needed; None when workers cannot start here."""
        worker = self._workers.get(slot)
        if worker is not None and worker.alive:
            return worker
        if worker is not None:
            worker.close()
            del self._workers[slot]
        if self.unavailable is not None:
            return None
        try:
            worker = self._start(slot)
        except (WorkerError, UidsBusyError, OSError) as exc:
            with self._lock:
                self.unavailable = str(exc)
            return None
        self._workers[slot] = worker
        return worker

    def discard(self, slot: int) -> None:
        """Stop slot ``slot``'s worker (after it failed); the next job of the slot starts a fresh one."""
        worker = self._workers.pop(slot, None)
        if worker is not None:
            worker.close()

    def close(self) -> None:
        """Stop every worker."""
        for slot in list(self._workers):
            self.discard(slot)

    def __iter__(self) -> Iterator[Worker]:
        return iter(self._workers.values())
