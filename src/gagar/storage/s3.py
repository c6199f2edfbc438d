"""Artifact store on an S3-compatible endpoint (MinIO, SeaweedFS, Ceph, AWS) through the minio client.

Every object carries its sha256 in user metadata (``x-amz-meta-sha256``), which
:meth:`ArtifactStore.verify` compares with the manifest without downloading. Transient failures
(connection errors, timeouts, 5xx, SlowDown) are retried with backoff; when the budget runs out
a :class:`StoreUnavailableError` names the endpoint and the operation.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError

from gagar.schema.manifest import MANIFEST_NAME, Manifest, sha256_bytes, sha256_file
from gagar.storage.base import MIN_PART_SIZE, ArtifactStore, FileCallback, ObjectInfo, check_key, join_key
from gagar.storage.errors import ObjectNotFoundError, StoreError, StoreUnavailableError
from gagar.storage.retry import RetryError, RetryPolicy, retry_call

__all__ = ["MIN_PART_SIZE", "RETRYABLE_S3_CODES", "S3Store", "is_retryable"]

T = TypeVar("T")

"""Smallest multipart part S3 accepts (5 MiB)."""

RETRYABLE_S3_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "OperationAborted",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchObject"})
_SHA_HEADER = "x-amz-meta-sha256"


def is_retryable(exc: BaseException) -> bool:
    """Whether a failure talking to S3 is transient: network errors, timeouts, 5xx and throttling."""
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, S3Error):
        return exc.code in RETRYABLE_S3_CODES
    if isinstance(exc, ServerError):
        return exc.status_code >= 500
    return isinstance(exc, InvalidResponseError)


class S3Store(ArtifactStore):
    """Objects under ``prefix`` in ``bucket`` at ``endpoint`` (``host:port``).

    ``http_client`` replaces the default connection pool (custom CA bundle, proxy); it should
    not retry by itself (``retries=False``), since the store retries with backoff.
    """

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        prefix: str = "",
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        secure: bool = True,
        region: str | None = None,
        retry: RetryPolicy | None = None,
        part_size: int = 64 * 1024 * 1024,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 120.0,
        http_client: urllib3.PoolManager | None = None,
    ) -> None:
        if "://" in endpoint or "/" in endpoint:
            raise ValueError(f"S3 endpoint must be host[:port] without scheme or path, got {endpoint!r}")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be >= {MIN_PART_SIZE} bytes (S3 minimum), got {part_size}")
        self.bucket, self.prefix = bucket, check_key(prefix, allow_empty=True)
        self.endpoint_url = f"{'https' if secure else 'http'}://{endpoint}"
        self.retry, self.part_size = retry or RetryPolicy(), part_size
        http = http_client or urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s), retries=False, maxsize=8
        )
        self.client = Minio(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            secure=secure,
            region=region,
            http_client=http,
        )

    def __repr__(self) -> str:
        return f"S3Store({self.endpoint_url!r}, {self.uri!r})"

    @property
    def uri(self) -> str:
        return f"s3://{join_key(self.bucket, self.prefix)}"

    def _name(self, key: str) -> str:
        return join_key(self.prefix, check_key(key))

    def _call(self, operation: str, key: str | None, fn: Callable[[], T]) -> T:
        """Run one client call with retries; translate S3 errors into store errors."""
        try:
            return retry_call(fn, self.retry, is_retryable, what=f"{operation} on {self.endpoint_url}")
        except RetryError as exc:
            raise StoreUnavailableError(
                f"{self.endpoint_url}/{self.bucket}", operation, key, exc.attempts, exc.cause
            ) from exc.cause
        except S3Error as exc:
            if exc.code in _NOT_FOUND_CODES:
                raise ObjectNotFoundError(f"no object {key!r} in {self.uri} at {self.endpoint_url}") from None
            if exc.code == "NoSuchBucket":
                raise StoreError(f"bucket {self.bucket!r} does not exist at {self.endpoint_url}") from None
            raise StoreError(
                f"{operation}({key!r}) on {self.endpoint_url}/{self.bucket} failed: {exc.code}: {exc.message}"
            ) from exc

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist."""
        if not self._call("bucket_exists", None, lambda: self.client.bucket_exists(self.bucket)):
            self._call("make_bucket", None, lambda: self.client.make_bucket(self.bucket))

    def put_bytes(self, key: str, data: bytes) -> None:
        meta = {"sha256": sha256_bytes(data)}
        self._call(
            "put_bytes",
            key,
            lambda: self.client.put_object(
                self.bucket, self._name(key), io.BytesIO(data), len(data), metadata=meta
            ),
        )

    def get_bytes(self, key: str) -> bytes:
        def read() -> bytes:
            response = self.client.get_object(self.bucket, self._name(key))
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()

        return self._call("get_bytes", key, read)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload a file; files over ``part_size`` go as a multipart upload (completed atomically)."""
        source = Path(path)
        if not source.is_file():
            raise FileNotFoundError(f"cannot upload {source} to {key!r}: not a file")
        meta = {"sha256": sha256_file(source)}
        self._call(
            "put_file",
            key,
            lambda: self.client.fput_object(
                self.bucket, self._name(key), str(source), metadata=meta, part_size=self.part_size
            ),
        )

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        try:
            self._call(
                "get_file",
                key,
                lambda: self.client.fget_object(
                    self.bucket, self._name(key), tmp, tmp_file_path=tmp + ".part"
                ),
            )
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
            Path(tmp + ".part").unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""
        names = self._call(
            "list",
            prefix,
            lambda: [
                o.object_name
                for o in self.client.list_objects(self.bucket, prefix=root + prefix, recursive=True)
            ],
        )
        return sorted(name[len(root) :] for name in names if name is not None)

    def stat(self, key: str) -> ObjectInfo:
        obj = self._call("stat", key, lambda: self.client.stat_object(self.bucket, self._name(key)))
        meta = {k.lower(): v for k, v in (obj.metadata or {}).items()}
        return ObjectInfo(key=key, size=int(obj.size or 0), sha256=meta.get(_SHA_HEADER))

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.client.remove_object(self.bucket, self._name(key)))

    def _commit(self, local_dir: Path, key: str, manifest: Manifest, on_file: FileCallback | None) -> None:
        """Upload each file, verify what the store reports against the manifest, then the manifest."""
        for rel in manifest.files:
            self.put_file(join_key(key, rel), local_dir / rel)
            if on_file is not None:
                on_file(rel)
        problems = self.verify(key, manifest)
        if problems:
            raise StoreError(f"publication of {self.uri}/{key} did not verify: {'; '.join(problems)}")
        self.put_bytes(join_key(key, MANIFEST_NAME), manifest.model_dump_json(indent=1).encode())
