"""Directory manifests: the sha256 and size of every file, written last as the completion marker.

One format for both a trainer checkpoint (:mod:`gagar.train.checkpoint`) and a directory published to
the artifact store, so a checkpoint travels to the store and back with its ``MANIFEST.json`` as is.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import BinaryIO

from pydantic import AliasChoices, BaseModel, Field, ValidationError

__all__ = [
    "MANIFEST_NAME",
    "FileEntry",
    "Manifest",
    "build_manifest",
    "sha256_bytes",
    "sha256_file",
    "sha256_stream",
]

MANIFEST_NAME = "MANIFEST.json"
"""Object name of the completion marker inside a published directory."""

_CHUNK = 1 << 20


class FileEntry(BaseModel):
    """One file of a published directory."""

    sha256: str = Field(description="Hex sha256 of the file's bytes.")
    size: int = Field(
        ge=0, description="Size in bytes.", validation_alias=AliasChoices("size", "bytes")
    )  # checkpoints written before one format called it ``bytes``


class Manifest(BaseModel):
    """The completion marker of a published directory: present only once every file is stored."""

    schema_version: int = 1
    step: int | None = Field(default=None, description="Training step of a checkpoint; orders checkpoints.")
    created_at: float = Field(default_factory=time.time, description="Unix time of publication.")
    files: dict[str, FileEntry] = Field(description="Relative POSIX path -> checksum and size.")

    @property
    def order_key(self) -> tuple[int, float]:
        """Sort key for 'latest': the step first (unset counts as -1), then the publication time."""
        return (self.step if self.step is not None else -1, self.created_at)


def sha256_stream(fh: BinaryIO) -> str:
    """Hex sha256 of everything left in a binary stream."""
    digest = hashlib.sha256()
    while chunk := fh.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    with open(path, "rb") as fh:
        return sha256_stream(fh)


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of a byte string."""
    return hashlib.sha256(data).hexdigest()


def build_manifest(local_dir: str | os.PathLike[str], step: int | None = None) -> Manifest:
    """Hash every regular file under ``local_dir`` (recursively; symlinks are refused).

    A directory that already carries its ``MANIFEST.json`` (a trainer checkpoint) keeps it, once it
    lists exactly the other files with their sizes and hashes and names the same ``step``.

    Raises:
        NotADirectoryError: ``local_dir`` is not a directory.
        ValueError: the directory is empty, contains a symlink, or holds a ``MANIFEST.json`` that is
            not a manifest of its files.
    """
    root = Path(local_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"cannot publish {root}: not a directory")
    files: dict[str, FileEntry] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            raise ValueError(f"cannot publish {root}: {rel} is a symlink")
        if not path.is_file():
            continue
        if rel != MANIFEST_NAME:
            files[rel] = FileEntry(sha256=sha256_file(path), size=path.stat().st_size)
    if not files:
        raise ValueError(f"cannot publish {root}: it contains no files")
    if not (root / MANIFEST_NAME).is_file():
        return Manifest(step=step, files=files)
    try:
        own = Manifest.model_validate_json((root / MANIFEST_NAME).read_bytes())
    except ValidationError as exc:
        raise ValueError(f"cannot publish {root}: its {MANIFEST_NAME} is not a manifest ({exc})") from None
    if own.files != files:
        wrong = sorted(set(own.files) ^ set(files)) or [r for r in files if own.files[r] != files[r]]
        raise ValueError(f"cannot publish {root}: its {MANIFEST_NAME} does not match {wrong[0]}")
    if step is not None and own.step != step:
        raise ValueError(f"cannot publish {root} as step {step}: its {MANIFEST_NAME} says step {own.step}")
    return own
