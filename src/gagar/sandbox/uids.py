"""Exclusive leases of sandbox uids, across threads and processes of one machine.

A sandbox uid must belong to one evaluation at a time: after a run the backend
SIGKILLs every process of its uid, and RLIMIT_NPROC counts all of them. Worker slots
alone do not guarantee that: two pools (a pipeline stage and a test run, or two
backends in one process) both number their slots from the same ``base_uid``, and each
one's clean-up would kill the other's tests mid-run or before the sandbox even started.

A lease is an exclusive ``flock`` on ``<lock_dir>/<uid>.lock``. Locks belong to open
file descriptions, so two threads of one process exclude each other like two processes
do, and the kernel drops the lock when its holder closes the file or dies: a crashed
evaluator never keeps a uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["UidsBusyError", "lease_uid", "uid_leased"]


class UidsBusyError(RuntimeError):
    """Every uid of the range is leased by another evaluation."""


def _lock_path(lock_dir: Path, uid: int) -> Path:
    return lock_dir / f"{uid}.lock"


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding the exclusive lock on ``path``, or None when another holder has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def lease_uid(lock_dir: Path, first: int, count: int, prefer: int = 0) -> Iterator[int]:
    """Hold one uid of ``first .. first + count - 1`` exclusively for the ``with`` block.

    The search starts at ``first + prefer % count`` (a worker slot's own uid, so that one
    pool's slots do not contend with each other) and wraps around.

    Raises:
        ValueError: ``count`` is not positive.
        UidsBusyError: all ``count`` uids are leased.
        OSError: ``lock_dir`` cannot be created or written.
    """
    if count < 1:
        raise ValueError(f"the uid range must hold at least one uid, got count={count}")
    lock_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    for step in range(count):
        uid = first + (prefer + step) % count
        fd = _try_lock(_lock_path(lock_dir, uid))
        if fd is not None:
            try:
                yield uid
            finally:
                os.close(fd)  # releases the lock
            return
    last = first + count - 1
    raise UidsBusyError(f"all {count} sandbox uids {first}..{last} are in use (locks in {lock_dir})")


def uid_leased(lock_dir: Path, uid: int) -> bool:
    """Whether some evaluation holds ``uid`` right now (checked by briefly taking the lock)."""
    path = _lock_path(lock_dir, uid)
    if not path.exists():
        return False
    fd = _try_lock(path)
    if fd is None:
        return True
    os.close(fd)
    return False
