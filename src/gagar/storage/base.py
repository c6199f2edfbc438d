"""The artifact-store interface and the checkpoint logic shared by every backend.

A store maps POSIX keys (``runs/r1/step-000010/model.safetensors``) to bytes. A *published*
directory is a key prefix whose ``MANIFEST.json`` lists the sha256 and size of every file; the
manifest is written last, so a reader that finds it knows every file was stored. Readers
(:meth:`ArtifactStore.get_dir`, :meth:`ArtifactStore.latest_checkpoint`) trust only directories
whose manifest exists and whose files match it.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from pydantic import ValidationError

from gagar.schema.manifest import MANIFEST_NAME, Manifest, build_manifest, sha256_file
from gagar.storage.errors import (
    ChecksumMismatchError,
    IncompleteCheckpointError,
    ObjectNotFoundError,
    StoreError,
)

__all__ = ["MIN_PART_SIZE", "ArtifactStore", "FileCallback", "ObjectInfo", "check_key", "join_key"]

MIN_PART_SIZE = 5 * 1024 * 1024
"""S3's smallest multipart part (bytes): the least ``part_size`` an S3 store accepts."""

log = logging.getLogger(__name__)

FileCallback = Callable[[str], None]
"""Called with each relative path once that file is stored (progress, tests)."""


class ObjectInfo(NamedTuple):
    """What a store knows about one object without reading it."""

    key: str
    size: int
    sha256: str | None


def check_key(key: str, *, allow_empty: bool = False) -> str:
    """Return ``key`` if it is a clean relative POSIX key, else raise ValueError naming it."""
    if key == "" and allow_empty:
        return key
    parts = key.rstrip("/").split("/")
    if not key or key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid store key {key!r}: use a relative POSIX path without '.', '..' or '//'")
    return key.rstrip("/")


def join_key(*parts: str) -> str:
    """Join key segments with '/', ignoring empty ones."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


class ArtifactStore(ABC):
    """A local directory or an S3 bucket prefix holding artifacts and checkpoints."""

    @property
    @abstractmethod
    def uri(self) -> str:
        """Where the store lives (``file:///...`` or ``s3://bucket/prefix``), for messages."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any object there; readers never see a part."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Return the object's bytes. Raises ObjectNotFoundError."""

    @abstractmethod
    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload a local file (multipart for large files on S3)."""

    @abstractmethod
    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Download an object to ``path`` atomically. Raises ObjectNotFoundError."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys of every object under ``prefix`` (recursive)."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size and recorded sha256 of an object. Raises ObjectNotFoundError."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; a missing object is not an error."""

    @abstractmethod
    def _commit(self, local_dir: Path, key: str, manifest: Manifest, on_file: FileCallback | None) -> None:
        """Store every file of ``manifest`` under ``key``, then the manifest, in that order."""

    def exists(self, key: str) -> bool:
        """Whether an object exists under ``key``."""
        try:
            self.stat(key)
        except ObjectNotFoundError:
            return False
        return True

    def put_dir(self, local_dir: str | os.PathLike[str], key: str) -> list[str]:
        """Upload every file under ``local_dir`` to ``key/<relative path>``, with no completion marker.

        Returns the keys written. Use :meth:`publish_dir` for checkpoints.
        """
        root = Path(local_dir)
        written = []
        for rel in build_manifest(root).files:
            self.put_file(join_key(key, rel), root / rel)
            written.append(join_key(key, rel))
        return written

    def publish_dir(
        self,
        local_dir: str | os.PathLike[str],
        key: str,
        *,
        step: int | None = None,
        on_file: FileCallback | None = None,
    ) -> Manifest:
        """Publish a checkpoint directory atomically: all files first, verified, then ``MANIFEST.json``.

        A failure at any point leaves no manifest under ``key``, so readers keep seeing the
        previous complete checkpoint. Publishing over a complete checkpoint is refused.

        Raises:
            StoreError: ``key`` already holds a complete checkpoint, or a stored file does not verify.
            StoreUnavailableError: the store went away (nothing under ``key`` becomes visible).
        """
        key = check_key(key)
        if self.read_manifest(key) is not None:
            raise StoreError(
                f"{self.uri}: {key!r} already holds a published checkpoint; publish under a new key"
            )
        manifest = build_manifest(local_dir, step=step)
        self._commit(Path(local_dir), key, manifest, on_file)
        log.info("published %d files to %s/%s", len(manifest.files), self.uri, key)
        return manifest

    def read_manifest(self, key: str) -> Manifest | None:
        """The manifest of a published directory, or None if it was never (completely) published."""
        marker = join_key(check_key(key), MANIFEST_NAME)
        try:
            raw = self.get_bytes(marker)
        except ObjectNotFoundError:
            return None
        try:
            return Manifest.model_validate_json(raw)
        except ValidationError as exc:
            raise StoreError(
                f"{self.uri}/{marker} is not a valid manifest: {exc.errors()[0]['msg']}"
            ) from None

    def verify(self, key: str, manifest: Manifest | None = None) -> list[str]:
        """Problems with a published directory (missing files, wrong size or sha256); empty if sound.

        Uses object metadata only (no download): sizes and the sha256 recorded at upload.
        """
        manifest = manifest or self.read_manifest(key)
        if manifest is None:
            return [f"{key}: no {MANIFEST_NAME}"]
        problems = []
        for rel, entry in manifest.files.items():
            try:
                info = self.stat(join_key(key, rel))
            except ObjectNotFoundError:
                problems.append(f"{key}/{rel}: missing")
                continue
            if info.size != entry.size:
                problems.append(f"{key}/{rel}: size {info.size}, manifest says {entry.size}")
            elif info.sha256 != entry.sha256:
                problems.append(f"{key}/{rel}: sha256 {info.sha256}, manifest says {entry.sha256}")
        return problems

    def get_dir(self, key: str, dest: str | os.PathLike[str]) -> Manifest:
        """Download a published directory to ``dest`` (which must not exist), checking every sha256.

        Files land in a sibling temporary directory renamed to ``dest`` once all verify.

        Raises:
            IncompleteCheckpointError: ``key`` has no manifest.
            ChecksumMismatchError: a downloaded file does not match its manifest entry.
            FileExistsError: ``dest`` exists.
        """
        key, target = check_key(key), Path(dest)
        manifest = self.read_manifest(key)
        if manifest is None:
            raise IncompleteCheckpointError(
                f"{self.uri}/{key} has no {MANIFEST_NAME}: not a published directory"
            )
        if target.exists():
            raise FileExistsError(f"cannot download {key!r} to {target}: it exists")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.partial"
        try:
            for rel, entry in manifest.files.items():
                self.get_file(join_key(key, rel), partial / rel)
                actual = sha256_file(partial / rel)
                if actual != entry.sha256:
                    raise ChecksumMismatchError(join_key(key, rel), entry.sha256, actual)
            os.rename(partial, target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return manifest

    def checkpoints(self, prefix: str = "") -> list[tuple[str, Manifest]]:
        """Published directories under ``prefix`` with their manifests, latest first (not verified)."""
        found = []
        for obj in self.list(prefix):
            if PurePosixPath(obj).name == MANIFEST_NAME and obj != MANIFEST_NAME:
                key = str(PurePosixPath(obj).parent)
                manifest = self.read_manifest(key)
                if manifest is not None:
                    found.append((key, manifest))
        return sorted(found, key=lambda item: item[1].order_key, reverse=True)

    def latest_checkpoint(self, prefix: str = "") -> str | None:
        """Key of the latest published directory under ``prefix`` whose files match its manifest.

        Directories that fail :meth:`verify` are skipped with a warning.
        """
        for key, manifest in self.checkpoints(prefix):
            problems = self.verify(key, manifest)
            if not problems:
                return key
            log.warning("skipping checkpoint %s/%s: %s", self.uri, key, "; ".join(problems))
        return None

    def delete_dir(self, key: str) -> int:
        """Remove every object under ``key/``, the manifest first. Returns how many were removed."""
        key = check_key(key)
        keys = self.list(key + "/")
        marker = join_key(key, MANIFEST_NAME)
        ordered = [k for k in keys if k == marker] + [k for k in keys if k != marker]
        for k in ordered:
            self.delete(k)
        return len(ordered)
