"""Artifact store: a local directory or an S3-compatible bucket (minio client).

``open_store("s3://bucket/runs")`` or ``open_store("/data/runs")`` returns an
:class:`ArtifactStore`; checkpoints go through :meth:`ArtifactStore.publish_dir` (atomic:
files, then a ``MANIFEST.json`` of sha256s written last) and come back through
:meth:`ArtifactStore.latest_checkpoint` and :meth:`ArtifactStore.get_dir`, which trust only
complete, checksum-matching directories.
"""

from gagar.schema.manifest import MANIFEST_NAME, FileEntry, Manifest, build_manifest
from gagar.storage.base import ArtifactStore, ObjectInfo
from gagar.storage.errors import (
    ChecksumMismatchError,
    IncompleteCheckpointError,
    ObjectNotFoundError,
    StoreError,
    StoreUnavailableError,
)
from gagar.storage.local import LocalStore
from gagar.storage.retry import RetryPolicy
from gagar.storage.settings import StorageSettings, open_store

__all__ = [
    "MANIFEST_NAME",
    "ArtifactStore",
    "ChecksumMismatchError",
    "FileEntry",
    "IncompleteCheckpointError",
    "LocalStore",
    "Manifest",
    "ObjectInfo",
    "ObjectNotFoundError",
    "RetryPolicy",
    "S3Store",
    "StorageSettings",
    "StoreError",
    "StoreUnavailableError",
    "build_manifest",
    "open_store",
]


def __getattr__(name: str) -> object:
    if name == "S3Store":  # imports minio: only when asked for (a local store never needs it)
        from gagar.storage.s3 import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
