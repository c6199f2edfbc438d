"""Store configuration from the environment, and :func:`open_store` for a URI.

Environment (``GAGAR_STORAGE__*`` first, then the standard AWS names)::

    GAGAR_STORAGE__ENDPOINT    / AWS_ENDPOINT_URL        http://minio.kubeflow:9000
    GAGAR_STORAGE__ACCESS_KEY  / AWS_ACCESS_KEY_ID
    GAGAR_STORAGE__SECRET_KEY  / AWS_SECRET_ACCESS_KEY
    GAGAR_STORAGE__REGION      / AWS_REGION, AWS_DEFAULT_REGION
    GAGAR_STORAGE__SECURE, GAGAR_STORAGE__PART_SIZE_BYTES, GAGAR_STORAGE__RETRY_ATTEMPTS, ...
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from gagar.storage.base import MIN_PART_SIZE, ArtifactStore
from gagar.storage.local import LocalStore
from gagar.storage.retry import RetryPolicy

__all__ = ["AWS_DEFAULT_ENDPOINT", "StorageSettings", "open_store"]

AWS_DEFAULT_ENDPOINT = "s3.amazonaws.com"


def _env(name: str, *fallbacks: str) -> AliasChoices:
    return AliasChoices(f"GAGAR_STORAGE__{name}", *fallbacks)


class StorageSettings(BaseSettings):
    """Where and how to reach an S3-compatible store; unset values fall back to AWS's defaults."""

    model_config = SettingsConfigDict(env_prefix="GAGAR_STORAGE__", populate_by_name=True, extra="ignore")

    endpoint: str | None = Field(None, validation_alias=_env("ENDPOINT", "AWS_ENDPOINT_URL"))
    """``http(s)://host:port`` or ``host:port``; None means AWS S3."""
    access_key: str | None = Field(None, validation_alias=_env("ACCESS_KEY", "AWS_ACCESS_KEY_ID"))
    """Access key id; None for anonymous access."""
    secret_key: SecretStr | None = Field(None, validation_alias=_env("SECRET_KEY", "AWS_SECRET_ACCESS_KEY"))
    """Secret access key."""
    region: str | None = Field(None, validation_alias=_env("REGION", "AWS_REGION", "AWS_DEFAULT_REGION"))
    """Bucket region; None lets the client discover it."""
    secure: bool | None = None
    """Use TLS; None means: from the endpoint's scheme, TLS when it has none."""
    part_size_bytes: int = Field(64 * 1024 * 1024, ge=MIN_PART_SIZE)
    """Multipart part size; larger files are uploaded in parts."""
    retry_attempts: int = Field(5, ge=1)
    """Tries per operation before StoreUnavailableError."""
    retry_base_delay_s: float = Field(0.5, ge=0)
    """Backoff scale between tries (exponential, full jitter)."""
    retry_max_delay_s: float = Field(8.0, ge=0)
    """Cap on one wait between tries."""
    connect_timeout_s: float = Field(5.0, gt=0)
    """TCP connect timeout per request."""
    read_timeout_s: float = Field(120.0, gt=0)
    """Socket read timeout per request."""

    @property
    def endpoint_host(self) -> str:
        """``host:port`` for the minio client."""
        if self.endpoint is None:
            return AWS_DEFAULT_ENDPOINT
        parts = urlsplit(self.endpoint if "://" in self.endpoint else f"//{self.endpoint}")
        if not parts.netloc or parts.path.strip("/"):
            raise ValueError(f"storage endpoint {self.endpoint!r} must be http(s)://host[:port] with no path")
        return parts.netloc

    @property
    def use_tls(self) -> bool:
        """Whether to speak HTTPS."""
        if self.secure is not None:
            return self.secure
        return not (self.endpoint or "").startswith("http://")

    @property
    def retry_policy(self) -> RetryPolicy:
        """The retry policy these settings describe."""
        return RetryPolicy(self.retry_attempts, self.retry_base_delay_s, self.retry_max_delay_s)


def open_store(uri: str | os.PathLike[str], settings: StorageSettings | None = None) -> ArtifactStore:
    """Open ``s3://bucket/prefix`` (endpoint and keys from ``settings`` or the environment),
    ``file:///path`` or a plain path.

    Raises:
        ValueError: an unsupported scheme or an ``s3://`` URI without a bucket.
    """
    text = os.fspath(uri)
    parts = urlsplit(text)
    if parts.scheme in ("", "file"):
        if parts.scheme == "file" and parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URI {text!r} names a remote host; use file:///absolute/path")
        return LocalStore(Path(unquote(parts.path)) if parts.scheme == "file" else Path(text))
    if parts.scheme != "s3":
        raise ValueError(f"unsupported store URI {text!r}: use s3://bucket/prefix, file:///path or a path")
    if not parts.netloc:
        raise ValueError(f"store URI {text!r} has no bucket: use s3://bucket/prefix")
    from gagar.storage.s3 import S3Store  # minio is imported only for an S3 store

    cfg = settings or StorageSettings()
    return S3Store(
        cfg.endpoint_host,
        parts.netloc,
        parts.path.strip("/"),
        access_key=cfg.access_key,
        secret_key=cfg.secret_key.get_secret_value() if cfg.secret_key else None,
        secure=cfg.use_tls,
        region=cfg.region,
        retry=cfg.retry_policy,
        part_size=cfg.part_size_bytes,
        connect_timeout_s=cfg.connect_timeout_s,
        read_timeout_s=cfg.read_timeout_s,
    )
