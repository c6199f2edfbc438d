"""Atomic, verified training checkpoints and an append-only metrics log that survives ``kill -9``.

Layout under ``root``::

    step-000012/
        model/              Hugging Face ``save_pretrained`` (full model or PEFT adapter), or
                            ``model.safetensors`` for a plain ``torch.nn.Module``
        optimizer.pt        ``optimizer.state_dict()`` (``torch.save``)
        scheduler.pt        ``scheduler.state_dict()``, when a scheduler is given
        rng.json            Python, NumPy and torch (CPU and CUDA) generator states, when saved
        state.json          step, model format and the caller's ``extra_state`` (JSON)
        MANIFEST.json       written last: sha256 and size of every other file

A checkpoint is written into ``.tmp-step-000012-*`` with every file and directory fsynced, the
manifest last, then renamed into place, so a directory named ``step-N`` is always complete unless the
disk corrupted it afterwards; :meth:`CheckpointManager.latest` verifies the manifest and skips (with a
warning naming it) any checkpoint that does not verify. Leftover temporary directories from a crash are
never read and are removed by the next :meth:`~CheckpointManager.save`. One process writes a root.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gagar.records import atomic_write_text
from gagar.schema.manifest import MANIFEST_NAME, FileEntry, Manifest

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointManager",
    "CorruptCheckpointError",
    "LoadedState",
    "MetricsLog",
    "read_extra_state",
    "verify",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = MANIFEST_NAME
_STEP_DIR = re.compile(r"^step-(\d{6,})$")
_PARTIAL_PREFIXES = (".tmp-step-", ".old-step-")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or loaded into the given objects."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files do not match its manifest (or it has none)."""


@dataclass(frozen=True, order=True)
class Checkpoint:
    """A complete checkpoint directory (its manifest may still fail to verify)."""

    step: int
    path: Path = field(compare=False)


@dataclass(frozen=True)
class LoadedState:
    """What :meth:`CheckpointManager.load` returns besides restoring the objects in place."""

    step: int
    extra_state: dict[str, Any]
    checkpoint: Checkpoint


# ---------------------------------------------------------------------------------------------------------
# Files


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_path(path: Path) -> None:
    """fsync a file or a directory (so that the names it holds are durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            _fsync_path(Path(dirpath) / name)
        _fsync_path(Path(dirpath))


def _write_json(path: Path, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())


def verify(ckpt: Checkpoint) -> None:
    """Check every file of ``ckpt`` against its manifest.

    Raises:
        CorruptCheckpointError: naming the checkpoint and the first file that is missing or differs.
    """
    try:
        manifest = Manifest.model_validate_json((ckpt.path / MANIFEST).read_bytes())
    except (OSError, ValueError) as exc:
        raise CorruptCheckpointError(f"{ckpt.path}: unreadable {MANIFEST} ({exc})") from None
    if manifest.step != ckpt.step:
        raise CorruptCheckpointError(
            f"{ckpt.path}: manifest says step {manifest.step}, directory says {ckpt.step}"
        )
    for rel, expected in sorted(manifest.files.items()):
        path = ckpt.path / rel
        if not path.is_file():
            raise CorruptCheckpointError(f"{ckpt.path}: {rel} is missing")
        if path.stat().st_size != expected.size or _sha256(path) != expected.sha256:
            raise CorruptCheckpointError(f"{ckpt.path}: {rel} does not match its sha256 in {MANIFEST}")


def read_extra_state(ckpt: Checkpoint) -> dict[str, Any]:
    """The ``extra_state`` that :meth:`CheckpointManager.save` stored in ``ckpt`` (not verified)."""
    return json.loads((ckpt.path / "state.json").read_text(encoding="utf-8"))["extra"]


# ---------------------------------------------------------------------------------------------------------
# Model weights


def _model_format(model: torch.nn.Module) -> str:
    if type(model).__module__.startswith("peft."):
        return "peft"
    if hasattr(model, "save_pretrained") and hasattr(model, "config"):
        return "hf"
    return "state_dict"


def _save_model(model: torch.nn.Module, directory: Path, state: dict[str, torch.Tensor] | None = None) -> str:
    fmt = _model_format(model)
    if fmt == "state_dict":
        from safetensors.torch import save_file, save_model

        directory.mkdir()
        if state is None:
            save_model(model, str(directory / "model.safetensors"))
        else:
            save_file(state, str(directory / "model.safetensors"))
    elif state is None:
        model.save_pretrained(directory, safe_serialization=True)
    else:
        model.save_pretrained(directory, safe_serialization=True, state_dict=state)
    return fmt


def _load_model(model: torch.nn.Module, directory: Path, fmt: str, where: Path) -> None:
    from safetensors.torch import load_file

    if _model_format(model) != fmt:
        raise CheckpointError(f"{where}: saved a {fmt} model, cannot load it into a {type(model).__name__}")
    if fmt == "peft":
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(str(directory / "adapter_model.safetensors")))
        if result.unexpected_keys:
            raise CheckpointError(f"{where}: adapter keys not in the model: {result.unexpected_keys[:5]}")
        return
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a shape mismatch
        raise CheckpointError(f"{where}: weights do not fit the model: {exc}") from None
    current = model.state_dict()
    loaded = {t.data_ptr() for name, t in current.items() if name in state}
    untied = [name for name in missing if current[name].data_ptr() not in loaded]  # tied weights are fine
    if unexpected or untied:
        raise CheckpointError(f"{where}: weights do not fit the model: missing {untied}, extra {unexpected}")


# ---------------------------------------------------------------------------------------------------------
# RNG


def _rng_state() -> dict[str, Any]:
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002 (the global generator is what we save)
    state: dict[str, Any] = {
        "python": [version, list(mt), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


# ---------------------------------------------------------------------------------------------------------
# Manager


class CheckpointManager:
    """Writes, finds, verifies, loads and prunes the checkpoints under ``root``.

    Args:
        root: directory of the run's checkpoints (created if missing).
        keep_last: how many checkpoints to keep, counting the newest; None keeps all.
    """

    def __init__(self, root: str | os.PathLike[str], keep_last: int | None = 3) -> None:
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, step: int) -> Path:
        """Directory of the checkpoint of ``step``."""
        return self.root / f"step-{step:06d}"

    def checkpoints(self) -> list[Checkpoint]:
        """Every ``step-N`` directory, oldest first, unverified; temporary directories are not listed."""
        found = []
        for entry in self.root.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and entry.is_dir():
                found.append(Checkpoint(int(match.group(1)), entry))
        return sorted(found)

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies; corrupt ones are skipped with a warning naming them."""
        for ckpt in reversed(self.checkpoints()):
            try:
                verify(ckpt)
            except CorruptCheckpointError as exc:
                log.warning("skipping corrupt checkpoint: %s", exc)
                continue
            return ckpt
        return None

    def remove_partial(self) -> list[Path]:
        """Delete temporary directories left by a crash during :meth:`save`; returns them."""
        partial = [p for p in self.root.iterdir() if p.name.startswith(_PARTIAL_PREFIXES)]
        for path in partial:
            shutil.rmtree(path, ignore_errors=True)
        return partial

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any | None = None,
        extra_state: dict[str, Any] | None = None,
        rng: bool = True,
        tokenizer: Any | None = None,
        full_state: tuple[dict[str, Any], dict[str, Any]] | None = None,
    ) -> Checkpoint:
        """Write the checkpoint of ``step`` atomically, then prune to ``keep_last``.

        An existing checkpoint of the same step is replaced. ``extra_state`` must be JSON-serialisable.
        A ``tokenizer`` is saved beside the weights, so ``model/`` loads as a Hugging Face policy.
        ``full_state`` (model weights, optimizer state) is written instead of ``model``'s and
        ``optimizer``'s own: a sharded model's state gathered on one rank.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        state_json = json.dumps({"extra": extra_state or {}})  # fail before writing anything
        self.remove_partial()
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step:06d}-", dir=self.root))
        try:
            fmt = _save_model(model, tmp / "model", full_state[0] if full_state else None)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp / "model")
            if optimizer is not None:
                torch.save(full_state[1] if full_state else optimizer.state_dict(), tmp / "optimizer.pt")
            if scheduler is not None:
                torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            if rng:
                _write_json(tmp / "rng.json", _rng_state())
            state = {"format_version": FORMAT_VERSION, "step": step, "model_format": fmt}
            _write_json(tmp / "state.json", state | json.loads(state_json))
            _fsync_tree(tmp)
            files = sorted(p for p in tmp.rglob("*") if p.is_file())
            manifest = Manifest(
                step=step,
                files={
                    p.relative_to(tmp).as_posix(): FileEntry(sha256=_sha256(p), size=p.stat().st_size)
                    for p in files
                },
            )
            _write_json(tmp / MANIFEST, manifest.model_dump(mode="json"))
            _fsync_path(tmp)
            self._install(tmp, self.path_for(step))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        ckpt = Checkpoint(step, self.path_for(step))
        self._prune(ckpt)
        return ckpt

    def _install(self, tmp: Path, target: Path) -> None:
        """Rename ``tmp`` to ``target``; an existing ``target`` is moved aside first, then deleted."""
        old = None
        if target.exists():
            old = target.with_name(f".old-{target.name}-{os.getpid()}")
            os.replace(target, old)
        os.replace(tmp, target)
        _fsync_path(self.root)
        if old is not None:
            shutil.rmtree(old)

    def _prune(self, newest: Checkpoint) -> None:
        """Keep ``newest`` and the ``keep_last − 1`` checkpoints below it; later steps are left alone."""
        if self.keep_last is None:
            return
        older = [c for c in self.checkpoints() if c.step < newest.step]
        for ckpt in older[: max(0, len(older) - (self.keep_last - 1))]:
            # renamed first: a kill during the deletion leaves a partial directory, never a corrupt step-N
            doomed = ckpt.path.with_name(f".old-{ckpt.path.name}-{os.getpid()}")
            os.replace(ckpt.path, doomed)
            shutil.rmtree(doomed)
        _fsync_path(self.root)

    def load(
        self,
        ckpt: Checkpoint,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any | None = None,
        rng: bool = True,
        verify_files: bool = True,
    ) -> LoadedState:
        """Restore ``model`` (and optimizer, scheduler, RNG state) in place from ``ckpt``.

        Raises:
            CorruptCheckpointError: if ``verify_files`` and the manifest does not verify.
            CheckpointError: if a requested part was not saved or does not fit the given objects.
        """
        if verify_files:
            verify(ckpt)
        state = json.loads((ckpt.path / "state.json").read_text(encoding="utf-8"))
        _load_model(model, ckpt.path / "model", state["model_format"], ckpt.path)
        for obj, name in ((optimizer, "optimizer.pt"), (scheduler, "scheduler.pt")):
            if obj is None:
                continue
            if not (ckpt.path / name).is_file():
                raise CheckpointError(f"{ckpt.path}: has no {name}; it was saved without one")
            obj.load_state_dict(torch.load(ckpt.path / name, map_location="cpu", weights_only=True))
        if rng:
            if not (ckpt.path / "rng.json").is_file():
                raise CheckpointError(f"{ckpt.path}: saved without RNG state; load it with rng=False")
            _set_rng_state(json.loads((ckpt.path / "rng.json").read_text(encoding="utf-8")))
        return LoadedState(step=state["step"], extra_state=state["extra"], checkpoint=ckpt)

    def load_optimizer(self, ckpt: Checkpoint, optimizer: torch.optim.Optimizer) -> None:
        """Restore only the optimizer state of ``ckpt`` (the weights come from elsewhere)."""
        path = ckpt.path / "optimizer.pt"
        if not path.is_file():
            raise CheckpointError(f"{ckpt.path}: has no optimizer.pt; it was saved without one")
        optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))


# ---------------------------------------------------------------------------------------------------------
# Metrics log and resume


class MetricsLog:
    """Append-only JSONL of one ``{"step": n, ...}`` record per completed step, fsynced on every append.

    Write a step's line before its checkpoint: after a crash, :meth:`truncate` to the step of the
    checkpoint resumed from drops the lines of steps that will be redone and any duplicate, so every
    checkpointed step keeps exactly one line.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def append(self, step: int, metrics: dict[str, Any]) -> None:
        """Append the record of ``step`` durably."""
        line = json.dumps({"step": step, **metrics}, sort_keys=True) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def read(self) -> list[dict[str, Any]]:
        """All records in file order; a torn last line (no newline: killed mid-write) is dropped.

        Raises:
            ValueError: naming the file and line of any other line that is not a JSON record with a step.
        """
        if not self.path.exists():
            return []
        text = self.path.read_text(encoding="utf-8")
        lines = text.split("\n")[:-1]  # the part after the last newline is empty or torn
        records = []
        for lineno, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
                int(record["step"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{self.path}:{lineno}: not a metrics record ({exc})") from None
            records.append(record)
        return records

    def truncate(self, last_step: int) -> list[dict[str, Any]]:
        """Keep one record per step up to ``last_step`` (the last written wins), atomically; returns them."""
        by_step = {int(r["step"]): r for r in self.read() if int(r["step"]) <= last_step}
        kept = [by_step[s] for s in sorted(by_step)]
        atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        return kept
