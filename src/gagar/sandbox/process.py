"""Run one command with a wall-clock deadline and a cap on its output, keeping a head-and-tail log.

The child's stdout and stderr share a pipe that a reader thread drains in chunks; only
the first and last ``log_chars / 2`` bytes are kept, and once ``max_output_bytes`` have
arrived the whole process group is killed. A 1 GB flood therefore costs neither memory
nor disk, and a run past its deadline is killed the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "BoundedOutput",
    "RunOutcome",
    "become_subreaper",
    "kill_uid",
    "live_pids_of",
    "run_bounded",
    "wait_reaped",
]

_CHUNK = 1 << 16


class BoundedOutput:
    """Keeps the head and tail of a byte stream and counts all of it."""

    def __init__(self, keep_bytes: int) -> None:
        self.half = max(keep_bytes // 2, 1)
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        """Account for ``chunk``: fill the head first, then keep a rolling tail."""
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(chunk)
            self.tail_len += len(chunk)
            while self.tail and self.tail_len - len(self.tail[0]) >= self.half:
                self.tail_len -= len(self.tail.popleft())

    def text(self) -> str:
        """Head, an omission marker when bytes were dropped, and tail, decoded leniently."""
        tail = b"".join(self.tail)[-self.half :]
        dropped = self.total - len(self.head) - len(tail)
        marker = f"\n[... {dropped} bytes omitted ...]\n".encode() if dropped > 0 else b""
        return bytes(self.head + marker + tail).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class RunOutcome:
    """How a bounded run ended."""

    returncode: int | None
    """Exit status (negative: killed by that signal); None if it could not be waited for."""
    timed_out: bool
    output_exceeded: bool
    duration_s: float
    output_bytes: int
    log: str


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _drain(proc: subprocess.Popen[bytes], out: BoundedOutput, limit: int, exceeded: threading.Event) -> None:
    assert proc.stdout is not None
    while chunk := proc.stdout.read1(_CHUNK):
        if not exceeded.is_set():
            out.add(chunk)
            if out.total > limit:
                exceeded.set()
                _kill_group(proc)


def run_bounded(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    wall_time_s: float,
    max_output_bytes: int,
    log_chars: int,
    pass_fds: Sequence[int] = (),
) -> RunOutcome:
    """Run ``argv`` in its own session; kill its process group at the deadline or the output cap."""
    out = BoundedOutput(log_chars)
    exceeded = threading.Event()
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd=cwd,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
    )
    reader = threading.Thread(target=_drain, args=(proc, out, max_output_bytes, exceeded), daemon=True)
    reader.start()
    deadline = threading.Event()

    def expire() -> None:
        deadline.set()
        _kill_group(proc)

    # a timer rather than wait(timeout=...), which polls with sleeps of up to 50 ms per run
    timer = threading.Timer(wall_time_s, expire)
    timer.daemon = True
    timer.start()
    try:
        proc.wait()
    finally:
        timer.cancel()
    timed_out = deadline.is_set()
    reader.join(timeout=10)  # a descendant outside the group could hold the pipe: do not wait forever
    return RunOutcome(
        returncode=proc.returncode,
        timed_out=timed_out and not exceeded.is_set(),
        output_exceeded=exceeded.is_set(),
        duration_s=time.monotonic() - start,
        output_bytes=out.total,
        log=out.text(),
    )


def pids_of(uid: int, *, zombies: bool = False) -> list[int]:
    """Processes of ``uid``; zombies (which hold nothing and cannot be killed) only if asked."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0]
                if zombies or state not in (b"Z", b"X"):
                    pids.append(int(name))
    return pids


def live_pids_of(uid: int) -> list[int]:
    """Processes of ``uid`` that are not zombies."""
    return pids_of(uid)


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``).

    A killed sandbox leaves its PID namespace's init orphaned; without this it goes to the host's PID 1,
    which may reap slowly (1.8 s a session on a firecracker VM) or never (a container whose PID 1 is
    this program), and :func:`wait_reaped` waits for it. Idempotent; a no-op where prctl is missing."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_own(pids: Sequence[int]) -> None:
    """Reap those of ``pids`` that are zombie children of this process (orphans it adopted as the
    subreaper); the kernel refuses the others (``ECHILD``) and a live child is left running."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def wait_reaped(uid: int, timeout_s: float = 10.0) -> int:
    """Wait until no process of ``uid`` is left, zombies included (or ``timeout_s``), reaping those
    this process adopted (:func:`become_subreaper`); returns how many remain. Killed processes count
    against the uid's ``RLIMIT_NPROC`` until they are reaped: a shell started before then cannot fork."""
    deadline = time.monotonic() + timeout_s
    while pids := pids_of(uid, zombies=True):
        _reap_own(pids)
        if time.monotonic() >= deadline:
            return len(pids_of(uid, zombies=True))
        time.sleep(0.01)
    return 0


def kill_uid(uid: int, timeout_s: float = 5.0, spare: frozenset[int] = frozenset()) -> int:
    """SIGKILL every live process of ``uid`` but ``spare`` until none is left (or ``timeout_s``);
    returns how many remain.

    The sandbox's PID namespace dies with its init, but the kernel reaps it asynchronously:
    this makes sure a worker slot's uid is idle before its next evaluation counts processes.
    """
    deadline = time.monotonic() + timeout_s
    while pids := [p for p in live_pids_of(uid) if p not in spare]:
        if time.monotonic() > deadline:
            return len(pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return 0
