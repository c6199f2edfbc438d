"""The shared workspace: every trajectory of one group laid out side by side for the grader.

One directory per group, the same locally and on a cluster volume::

    <root>/<group>/manifest.json          what is here (written last: its presence means complete)
    <root>/<group>/task.json              the Task record
    <root>/<group>/base/                  the repository at the base commit
    <root>/<group>/candidates/<traj>/patch.diff   the trajectory's model_patch
    <root>/<group>/candidates/<traj>/tree/        the repository with the patch applied
    <root>/<group>/candidates/<traj>/test.log     the test output from the sandbox
    <root>/<group>/candidates/<traj>/conversation.md   the agent's turns (multi-turn trajectories)

Patches are applied with the sandbox's hardened applier (:func:`gagar.sandbox.patch.apply_patch`),
so a hostile path never escapes the candidate's tree. Directory names are ids made filesystem-safe.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from gagar.policy.agent import RAN_TESTS_KINDS
from gagar.records import SCHEMA_VERSION, atomic_write_text
from gagar.sandbox.patch import PatchError, apply_patch
from gagar.sandbox.workspace import WorkspaceError, materialize
from gagar.schema.result import TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import Message, Trajectory

__all__ = [
    "CandidateEntry",
    "CandidateInput",
    "GroupManifest",
    "GroupWorkspace",
    "build_group_workspace",
    "safe_name",
]

MANIFEST = "manifest.json"
CONVERSATION = "conversation.md"
MAX_PATCH_BYTES = 1 << 22


def safe_name(identifier: str, max_len: int = 80) -> str:
    """A directory name for ``identifier``: itself when already safe, else a slug plus a short hash."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", identifier)[:max_len].strip(".") or "_"
    if slug == identifier:
        return slug
    return f"{slug}-{hashlib.sha1(identifier.encode()).hexdigest()[:8]}"


class CandidateEntry(BaseModel):
    """One trajectory of the group, as the manifest lists it."""

    trajectory_id: str
    dir: str
    """Path of the candidate's folder, relative to the group folder."""
    passed: bool
    """Whether the sandbox resolved the task with this patch."""
    status: str | None = None
    applied: bool
    """Whether the patch applied to the base repository."""
    apply_error: str | None = None
    changed_files: list[str] = Field(default_factory=list)
    turns: int = 1
    """Assistant turns of the trajectory (1: a single-shot answer)."""
    tests_run: int = 0
    """How often the agent ran the visible tests (RUN_TESTS, or a bash call running them)."""
    edits_reverted: int = 0
    """Edit blocks the agent applied and took out again before submitting."""


class GroupManifest(BaseModel):
    """The index of one group's workspace."""

    schema_version: int = SCHEMA_VERSION
    group_id: str
    instance_id: str
    candidates: list[CandidateEntry]


@dataclass(frozen=True)
class CandidateInput:
    """What the workspace needs of one trajectory."""

    trajectory_id: str
    patch: str
    result: TestResult | None = None
    conversation: Sequence[Message] = ()
    """The multi-turn agent's messages; empty for a single-shot answer."""
    tests_run: int = 0
    edits_reverted: int = 0

    @classmethod
    def of(cls, trajectory: Trajectory, result: TestResult | None) -> CandidateInput:
        """What the workspace shows of ``trajectory``: its patch, result and, if multi-turn, its turns."""
        multi_turn = bool(trajectory.tool_calls)
        return cls(
            trajectory.trajectory_id,
            trajectory.model_patch,
            result,
            conversation=tuple(trajectory.messages) if multi_turn else (),
            tests_run=sum(trajectory.tool_calls.get(kind, 0) for kind in RAN_TESTS_KINDS),
            edits_reverted=trajectory.edits_reverted,
        )


@dataclass(eq=False)
class GroupWorkspace:
    """A group's workspace on disk, with cached file reads for the inspection tools."""

    root: Path
    manifest: GroupManifest
    task: Task
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, root: str | Path) -> GroupWorkspace:
        """Open a complete workspace folder (one with a manifest)."""
        root = Path(root)
        if not (root / MANIFEST).is_file():
            raise WorkspaceError(f"{root}: no {MANIFEST}; not a complete group workspace")
        manifest = GroupManifest.model_validate_json((root / MANIFEST).read_text(encoding="utf-8"))
        task = Task.model_validate_json((root / "task.json").read_text(encoding="utf-8"))
        return cls(root, manifest, task)

    @property
    def group_id(self) -> str:
        return self.manifest.group_id

    @property
    def base(self) -> Path:
        return self.root / "base"

    @property
    def candidate_ids(self) -> list[str]:
        """Every trajectory of the group, in manifest order."""
        return [c.trajectory_id for c in self.manifest.candidates]

    @property
    def passing_ids(self) -> list[str]:
        """The trajectories that resolved the task: the ones the grader ranks."""
        return [c.trajectory_id for c in self.manifest.candidates if c.passed]

    def entry(self, trajectory_id: str) -> CandidateEntry:
        """The manifest entry of ``trajectory_id``; KeyError naming it if it is not in the group."""
        for c in self.manifest.candidates:
            if c.trajectory_id == trajectory_id:
                return c
        raise KeyError(f"trajectory {trajectory_id!r} is not in group {self.group_id!r}")

    def folder(self, trajectory_id: str) -> Path:
        return self.root / self.entry(trajectory_id).dir

    def tree(self, trajectory_id: str) -> Path:
        """The candidate's patched repository."""
        return self.folder(trajectory_id) / "tree"

    def patch(self, trajectory_id: str) -> str:
        return (self.folder(trajectory_id) / "patch.diff").read_text(encoding="utf-8")

    def log(self, trajectory_id: str) -> str:
        return (self.folder(trajectory_id) / "test.log").read_text(encoding="utf-8")

    def conversation(self, trajectory_id: str) -> str:
        """The agent's conversation (``conversation.md``); empty for a single-shot answer."""
        path = self.folder(trajectory_id) / CONVERSATION
        return path.read_text(encoding="utf-8") if path.is_file() else ""

    def fingerprint(self, trajectory_id: str) -> str:
        """What the candidate is, hashed: the bytes of every file its patch changed (or that the file is
        gone), its conversation and its agent counts. Candidates with equal fingerprints are the same
        candidate to a grader, however their patches were written."""
        key = ("fingerprint", trajectory_id)
        if key not in self.cache:
            entry, tree = self.entry(trajectory_id), self.tree(trajectory_id)
            digest = hashlib.sha256()

            def add(part: bytes) -> None:
                digest.update(len(part).to_bytes(8, "big") + part)

            for path in sorted(entry.changed_files):
                target = tree / path
                add(path.encode())
                if target.is_symlink():
                    add(b"link:" + str(target.readlink()).encode())
                elif target.is_file():
                    add(b"file:" + target.read_bytes())
                else:
                    add(b"absent")
            add(self.conversation(trajectory_id).encode())
            add(f"{entry.turns}/{entry.tests_run}/{entry.edits_reverted}".encode())
            self.cache[key] = digest.hexdigest()
        return self.cache[key]

    def base_text(self, path: str) -> str | None:
        """A file of the base repository, None if absent or not UTF-8."""
        return self._read(self.base, path)

    def tree_text(self, trajectory_id: str, path: str) -> str | None:
        """A file of the candidate's tree, None if absent or not UTF-8."""
        return self._read(self.tree(trajectory_id), path)

    def python_files(self, trajectory_id: str | None = None) -> dict[str, str]:
        """Every ``.py`` file (path -> text) of the base, or of a candidate's tree."""
        key = ("python_files", trajectory_id)
        if key not in self.cache:
            files = self.cache.get(("python_files", None))
            if files is None:
                files = {
                    p.relative_to(self.base).as_posix(): text
                    for p in sorted(self.base.rglob("*.py"))
                    if ".git" not in p.relative_to(self.base).parts
                    and (text := self._read(self.base, p.relative_to(self.base).as_posix())) is not None
                }
                self.cache[("python_files", None)] = files
            if trajectory_id is not None:
                files = dict(files)
                for path in self.entry(trajectory_id).changed_files:
                    text = self.tree_text(trajectory_id, path)
                    if text is None:
                        files.pop(path, None)
                    elif path.endswith(".py"):
                        files[path] = text
            self.cache[key] = files
        return self.cache[key]

    @staticmethod
    def _read(root: Path, path: str) -> str | None:
        target = root / path
        if target.is_symlink() or not target.is_file():
            return None
        try:
            return target.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            return None


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns(".git"))


def build_group_workspace(
    root: str | Path,
    group_id: str,
    task: Task,
    candidates: Sequence[CandidateInput],
    passed: Mapping[str, bool],
    repos_dir: Path | None = None,
) -> GroupWorkspace:
    """Lay out one group under ``root/<safe group id>`` (replacing an old copy) and open it.

    Args:
        candidates: every trajectory of the group, passing or not.
        passed: whether each trajectory resolved the task (missing means no).
        repos_dir: local clones for tasks with a ``base_commit`` instead of a snapshot.

    Raises:
        WorkspaceError: if the base repository cannot be materialised.
        ValueError: if two candidates share a trajectory id.
    """
    ids = [c.trajectory_id for c in candidates]
    if len(set(ids)) != len(ids):
        dups = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"group {group_id!r}: duplicate trajectory ids {dups}")
    group_dir = Path(root) / safe_name(group_id)
    if group_dir.exists():
        shutil.rmtree(group_dir)
    (group_dir / "base").mkdir(parents=True)
    materialize(task, group_dir / "base", repos_dir)
    atomic_write_text(group_dir / "task.json", task.model_dump_json())
    entries = [_lay_out_candidate(group_dir, c, passed.get(c.trajectory_id, False)) for c in candidates]
    manifest = GroupManifest(group_id=group_id, instance_id=task.instance_id, candidates=entries)
    atomic_write_text(group_dir / MANIFEST, manifest.model_dump_json(indent=1))
    return GroupWorkspace(group_dir, manifest, task)


def _lay_out_candidate(group_dir: Path, candidate: CandidateInput, passed: bool) -> CandidateEntry:
    rel = f"candidates/{safe_name(candidate.trajectory_id)}"
    folder = group_dir / rel
    folder.mkdir(parents=True)
    (folder / "patch.diff").write_text(candidate.patch, encoding="utf-8")
    result = candidate.result
    (folder / "test.log").write_text(result.log if result is not None else "", encoding="utf-8")
    if candidate.conversation:
        turns = "".join(f"## {m.role}\n\n{m.content}\n\n" for m in candidate.conversation)
        (folder / CONVERSATION).write_text(turns, encoding="utf-8")
    _copy_tree(group_dir / "base", folder / "tree")
    changed: list[str] = []
    error = None
    try:
        changed = sorted(apply_patch(folder / "tree", candidate.patch, MAX_PATCH_BYTES))
    except PatchError as exc:
        error = str(exc)
    return CandidateEntry(
        trajectory_id=candidate.trajectory_id,
        dir=rel,
        passed=passed and error is None,
        status=str(result.status) if result is not None else None,
        applied=error is None,
        apply_error=error,
        changed_files=changed,
        turns=max(1, sum(m.role == "assistant" for m in candidate.conversation)),
        tests_run=candidate.tests_run,
        edits_reverted=candidate.edits_reverted,
    )
