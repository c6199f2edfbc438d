"""Artifact store on a local directory: atomic writes by temporary name + rename."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from gagar.records import atomic_write_bytes
from gagar.schema.manifest import MANIFEST_NAME, Manifest, sha256_file
from gagar.storage.base import ArtifactStore, FileCallback, ObjectInfo, check_key
from gagar.storage.errors import ChecksumMismatchError, ObjectNotFoundError, StoreError

__all__ = ["STAGING_DIR", "LocalStore"]

STAGING_DIR = ".gagar-staging"
"""Directory under the root where publications are assembled before their rename."""


def _is_hidden_temp(rel: Path) -> bool:
    return rel.parts[0] == STAGING_DIR or any(
        p.startswith(".") and p.endswith((".tmp", ".partial")) for p in rel.parts
    )


def _copy_atomic(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through a temporary file in ``dst``'s directory."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class LocalStore(ArtifactStore):
    """Objects are files under ``root``; a published directory appears by a single rename."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"local store root {self.root} exists and is not a directory")

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _existing(self, key: str) -> Path:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFoundError(f"no object {key!r} in {self.uri}")
        return path

    def put_bytes(self, key: str, data: bytes) -> None:
        atomic_write_bytes(self._path(key), data)

    def get_bytes(self, key: str) -> bytes:
        return self._existing(key).read_bytes()

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        _copy_atomic(Path(path), self._path(key))

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        _copy_atomic(self._existing(key), Path(path))

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        keys = []
        for path in self.root.rglob("*"):
            rel = path.relative_to(self.root)
            if path.is_file() and not _is_hidden_temp(rel) and rel.as_posix().startswith(prefix):
                keys.append(rel.as_posix())
        return sorted(keys)

    def stat(self, key: str) -> ObjectInfo:
        path = self._existing(key)
        return ObjectInfo(key=key, size=path.stat().st_size, sha256=sha256_file(path))

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def _commit(self, local_dir: Path, key: str, manifest: Manifest, on_file: FileCallback | None) -> None:
        """Assemble the directory under the staging area, verify it, then rename it into place."""
        staging = self.root / STAGING_DIR / uuid.uuid4().hex
        try:
            for rel, entry in manifest.files.items():
                _copy_atomic(local_dir / rel, staging / rel)
                actual = sha256_file(staging / rel)
                if actual != entry.sha256:
                    raise ChecksumMismatchError(f"{key}/{rel}", entry.sha256, actual)
                if on_file is not None:
                    on_file(rel)
            atomic_write_bytes(staging / MANIFEST_NAME, manifest.model_dump_json(indent=1).encode())
            final = self._path(key)
            if final.exists():  # debris of an earlier plain put_dir or failed attempt: no manifest there
                shutil.rmtree(final)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
