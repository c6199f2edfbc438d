"""open_store URI parsing, environment settings and the retry policy."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import urllib3
from minio.error import S3Error

from gagar.storage import LocalStore, S3Store, StorageSettings, open_store
from gagar.storage.retry import RetryError, RetryPolicy, retry_call
from gagar.storage.s3 import is_retryable

_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    for name in ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY", "REGION", "SECURE"):
        monkeypatch.delenv(f"GAGAR_STORAGE__{name}", raising=False)


def test_local_uris(tmp_path: Path) -> None:
    assert isinstance(open_store(tmp_path), LocalStore)
    assert open_store(str(tmp_path / "a")).root == tmp_path / "a"
    assert open_store(f"file://{tmp_path}/b%20c").root == tmp_path / "b c"
    with pytest.raises(ValueError, match="remote host"):
        open_store("file://server/share")


@pytest.mark.parametrize(
    ("uri", "message"), [("gs://b/p", "unsupported store URI"), ("s3:///p", "no bucket")]
)
def test_bad_uris(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(uri)


def test_gagar_variables_win_over_aws_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://aws-endpoint:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "aws-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    cfg = StorageSettings()
    assert (cfg.endpoint_host, cfg.use_tls, cfg.access_key) == ("aws-endpoint:9000", False, "aws-key")
    monkeypatch.setenv("GAGAR_STORAGE__ENDPOINT", "https://minio.kubeflow:9000")
    monkeypatch.setenv("GAGAR_STORAGE__ACCESS_KEY", "gagar-key")
    monkeypatch.setenv("GAGAR_STORAGE__RETRY_ATTEMPTS", "2")
    cfg = StorageSettings()
    assert (cfg.endpoint_host, cfg.use_tls, cfg.access_key) == ("minio.kubeflow:9000", True, "gagar-key")
    assert cfg.secret_key is not None
    assert cfg.secret_key.get_secret_value() == "aws-secret"
    assert "aws-secret" not in repr(cfg)
    store = open_store("s3://bucket/runs/exp", cfg)
    assert isinstance(store, S3Store)
    assert (store.endpoint_url, store.bucket, store.prefix, store.retry.attempts) == (
        "https://minio.kubeflow:9000",
        "bucket",
        "runs/exp",
        2,
    )


def test_endpoint_defaults_and_errors() -> None:
    assert (StorageSettings().endpoint_host, StorageSettings().use_tls) == ("s3.amazonaws.com", True)
    assert StorageSettings(endpoint="seaweedfs:8333", secure=False).use_tls is False
    with pytest.raises(ValueError, match="no path"):
        _ = StorageSettings(endpoint="http://minio:9000/bucket").endpoint_host
    with pytest.raises(ValueError, match="part_size_bytes"):
        StorageSettings(part_size_bytes=1024)


def test_retry_policy_backs_off_exponentially_with_bounded_jitter() -> None:
    policy = RetryPolicy(attempts=6, base_delay_s=0.5, max_delay_s=3.0)
    rng = random.Random(0)
    for attempt, cap in enumerate([0.5, 1.0, 2.0, 3.0, 3.0]):
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        assert min(delays) >= 0
        assert max(delays) <= cap
        assert max(delays) > 0.8 * cap
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_retry_call_gives_up_after_the_budget_and_skips_permanent_errors() -> None:
    waits: list[float] = []
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    policy = RetryPolicy(attempts=3, base_delay_s=1.0)
    assert retry_call(flaky, policy, is_retryable, sleep=waits.append) == "ok"
    assert len(waits) == 2
    assert all(0 <= w <= 2.0 for w in waits)

    def down() -> None:
        raise urllib3.exceptions.NewConnectionError(None, "connection refused")  # type: ignore[arg-type]

    with pytest.raises(RetryError) as info:
        retry_call(down, policy, is_retryable, sleep=waits.append)
    assert info.value.attempts == 3
    assert len(waits) == 4

    def missing() -> None:
        raise S3Error(None, "NoSuchKey", "gone", "k", "r", "h")  # type: ignore[arg-type]

    with pytest.raises(S3Error):
        retry_call(missing, policy, is_retryable, sleep=waits.append)
    assert len(waits) == 4


def test_retryable_classification() -> None:
    def s3(code: str) -> S3Error:
        return S3Error(None, code, "m", "r", "i", "h")  # type: ignore[arg-type]

    assert is_retryable(s3("SlowDown"))
    assert is_retryable(s3("InternalError"))
    assert not is_retryable(s3("AccessDenied"))
    assert not is_retryable(s3("NoSuchBucket"))
    assert is_retryable(TimeoutError())
    assert not is_retryable(FileNotFoundError())
