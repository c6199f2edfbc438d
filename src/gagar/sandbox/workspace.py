"""A fresh, throw-away copy of a task's repository for one evaluation, removed afterwards.

Layout under a new temporary directory: ``repo/`` (the repository at the base commit),
handed to the sandbox uid, and ``judge/`` (the judge's pytest plugin and settings), which
stays the evaluator's and is bound read-only into the sandbox.
A bundled ``snapshot`` is written file by file; a ``base_commit`` is checked out from
a local clone ``<repos_dir>/<task.repo>`` (no network is used).

A workspace's name carries its creator's pid (``gagar-sbx-<pid>-…``): a process killed before its
``finally`` ran leaves its workspaces behind, and :func:`sweep_orphans` removes them later.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gagar.sandbox.patch import PatchError, check_path
from gagar.schema.task import Task

__all__ = ["Workspace", "WorkspaceError", "hand_over", "materialize", "sweep_orphans", "workspace"]

PREFIX = "gagar-sbx-"
_NAME = re.compile(rf"{PREFIX}(\d+)-")


class WorkspaceError(RuntimeError):
    """The workspace could not be created or filled: an infrastructure problem, not the patch's."""


@dataclass(frozen=True)
class Workspace:
    """Host paths of one evaluation's workspace."""

    root: Path
    repo: Path
    judge: Path


@contextmanager
def workspace(work_root: Path | None) -> Iterator[Workspace]:
    """Create an empty workspace under ``work_root`` (default: the system temp dir); always removed."""
    try:
        root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=work_root))
        (root / "repo").mkdir()
        (root / "judge").mkdir()
    except OSError as exc:
        where = work_root or tempfile.gettempdir()
        raise WorkspaceError(f"cannot create a workspace under {where}: {exc}") from exc
    try:
        yield Workspace(root, root / "repo", root / "judge")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another uid
        return True
    return True


def sweep_orphans(work_root: Path | None, min_age_s: float = 3600.0) -> list[Path]:
    """Remove workspaces under ``work_root`` whose creator is gone and that are older than ``min_age_s``.

    The age guard keeps workspaces of a live process in another pid namespace sharing the directory
    (a pid this one cannot see) safe for longer than any test run lasts. Returns what was removed.
    """
    removed = []
    now = time.time()
    for path in Path(work_root or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        match = _NAME.match(path.name)
        try:
            old = now - path.stat().st_mtime >= min_age_s
        except OSError:
            continue
        if match and old and path.is_dir() and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _write_snapshot(repo: Path, snapshot: dict[str, str]) -> None:
    for path, text in snapshot.items():
        try:
            check_path(path)
        except PatchError as exc:
            raise WorkspaceError(f"task snapshot: {exc}") from None
        target = repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def _checkout(repo: Path, source: Path, commit: str) -> None:
    if not (source / ".git").exists():
        raise WorkspaceError(f"no local clone of the task's repository at {source}")
    for cmd in (
        ["git", "clone", "-q", "--no-hardlinks", "--no-checkout", str(source), str(repo)],
        ["git", "-C", str(repo), "checkout", "-q", commit],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise WorkspaceError(f"{' '.join(cmd[:3])} failed: {proc.stderr.strip()[-500:]}")


def materialize(task: Task, repo: Path, repos_dir: Path | None) -> None:
    """Fill ``repo`` with the task's repository at its base commit."""
    if task.snapshot is not None:
        _write_snapshot(repo, task.snapshot)
        return
    if repos_dir is None:
        raise WorkspaceError(
            f"task {task.instance_id} needs a checkout of {task.repo} but no repos_dir is set"
        )
    repo.rmdir()
    _checkout(repo, repos_dir / check_path(task.repo), task.base_commit or "")


def hand_over(ws: Workspace, uid: int) -> None:
    """Give the repository copy to ``uid`` so the sandbox can write in it and nothing else."""
    os.chown(ws.root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(ws.repo):
        os.chown(dirpath, uid, uid)
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)
