"""S3Store against a real S3-protocol server (npm s3rver) on loopback, including the server dying mid-run."""

from __future__ import annotations

import io
import os
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3

from fixtures.services import S3RVER_KEY, S3rver, free_port
from gagar.schema.manifest import sha256_file
from gagar.storage import (
    ChecksumMismatchError,
    ObjectNotFoundError,
    RetryPolicy,
    S3Store,
    StorageSettings,
    StoreError,
    StoreUnavailableError,
    open_store,
)
from gagar.storage.s3 import MIN_PART_SIZE

FAST_RETRY = RetryPolicy(attempts=3, base_delay_s=0.05, max_delay_s=0.2)


def make_store(server: S3rver, bucket: str | None = None, prefix: str = "runs", **kw: object) -> S3Store:
    store = S3Store(
        server.endpoint,
        bucket or f"b-{uuid.uuid4().hex[:10]}",
        prefix,
        access_key=S3RVER_KEY,
        secret_key=S3RVER_KEY,
        secure=False,
        region="us-east-1",
        retry=FAST_RETRY,
        connect_timeout_s=1.0,
        read_timeout_s=5.0,
        **kw,  # type: ignore[arg-type]
    )
    store.ensure_bucket()
    return store


def make_checkpoint(root: Path, tag: str, n_files: int = 4) -> Path:
    root.mkdir(parents=True)
    for i in range(n_files):
        (root / f"shard-{i}.bin").write_bytes(f"{tag}-{i}".encode() * 4096)
    return root


def test_round_trips(s3rver_module: S3rver, tmp_path: Path) -> None:
    store = make_store(s3rver_module)
    store.put_bytes("a/x.json", b'{"ok": true}')
    assert store.get_bytes("a/x.json") == b'{"ok": true}'
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(100_000))
    store.put_file("a/f.bin", src)
    store.get_file("a/f.bin", tmp_path / "down" / "f.bin")
    assert (tmp_path / "down" / "f.bin").read_bytes() == src.read_bytes()
    assert store.stat("a/f.bin").sha256 == sha256_file(src)
    assert store.list() == ["a/f.bin", "a/x.json"]
    assert store.list("a/x") == ["a/x.json"]
    assert store.exists("a/x.json")
    assert not store.exists("a/none")
    store.delete("a/x.json")
    with pytest.raises(ObjectNotFoundError, match=r"a/x\.json"):
        store.get_bytes("a/x.json")
    # The prefix isolates stores sharing a bucket.
    other = make_store(s3rver_module, bucket=store.bucket, prefix="other")
    assert other.list() == []


class RecordingPool(urllib3.PoolManager):
    """A real connection pool that remembers the (method, url) of every request it sends."""

    def __init__(self) -> None:
        super().__init__(retries=False)
        self.sent: list[tuple[str, str]] = []

    def urlopen(self, method: str, url: str, redirect: bool = True, **kw: Any) -> Any:
        self.sent.append((method, url))
        return super().urlopen(method, url, redirect=redirect, **kw)


def test_multipart_upload_of_a_file_larger_than_the_part_size(s3rver_module: S3rver, tmp_path: Path) -> None:
    pool = RecordingPool()
    store = make_store(s3rver_module, part_size=MIN_PART_SIZE, http_client=pool)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12 * 1024 * 1024))
    store.put_file("ckpt/big.bin", big)
    parts = sorted(
        q for m, u in pool.sent if m == "PUT" for q in parse_qs(urlsplit(u).query).get("partNumber", [])
    )
    assert parts == ["1", "2", "3"], f"expected a 3-part multipart upload, requests were {pool.sent}"
    store.get_file("ckpt/big.bin", tmp_path / "back.bin")
    assert sha256_file(tmp_path / "back.bin") == sha256_file(big) == store.stat("ckpt/big.bin").sha256


def test_publish_and_restore_a_checkpoint(s3rver_module: S3rver, tmp_path: Path) -> None:
    store = make_store(s3rver_module)
    store.publish_dir(make_checkpoint(tmp_path / "c1", "one"), "r/step-1", step=1)
    store.publish_dir(make_checkpoint(tmp_path / "c2", "two"), "r/step-2", step=2)
    store.put_dir(make_checkpoint(tmp_path / "c3", "three"), "r/step-3")  # no manifest: never trusted
    assert [k for k, _ in store.checkpoints("r/")] == ["r/step-2", "r/step-1"]
    assert store.latest_checkpoint("r/") == "r/step-2"
    store.get_dir("r/step-2", tmp_path / "restored")
    assert (tmp_path / "restored" / "shard-3.bin").read_bytes() == (
        tmp_path / "c2" / "shard-3.bin"
    ).read_bytes()
    assert store.delete_dir("r/step-2") == 5
    assert store.latest_checkpoint("r/") == "r/step-1"


def test_checksum_mismatch_is_detected(s3rver_module: S3rver, tmp_path: Path) -> None:
    store = make_store(s3rver_module)
    store.publish_dir(make_checkpoint(tmp_path / "c1", "one"), "r/step-1", step=1)
    store.publish_dir(make_checkpoint(tmp_path / "c2", "two"), "r/step-2", step=2)
    good = store.get_bytes("r/step-2/shard-1.bin")
    bad = good[::-1]  # same size, different bytes
    # A second upload under the same key, behind the manifest's back, through the raw client.
    store.client.put_object(store.bucket, "runs/r/step-2/shard-1.bin", io.BytesIO(bad), len(bad))
    assert store.verify("r/step-2") == [
        f"r/step-2/shard-1.bin: sha256 None, manifest says {sha256_file(tmp_path / 'c2' / 'shard-1.bin')}"
    ]
    assert store.latest_checkpoint("r/") == "r/step-1"
    with pytest.raises(ChecksumMismatchError, match=r"r/step-2/shard-1\.bin"):
        store.get_dir("r/step-2", tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    # Same through the store itself: the recorded sha256 no longer matches the manifest.
    store.put_bytes("r/step-1/shard-0.bin", store.get_bytes("r/step-1/shard-0.bin")[::-1])
    assert len(store.verify("r/step-1")) == 1
    assert store.latest_checkpoint("r/") is None


def test_store_dying_mid_publication_keeps_previous_checkpoint(tmp_path: Path) -> None:
    server = S3rver(tmp_path / "data")
    server.start()
    try:
        store = make_store(server, bucket="ckpts")
        store.publish_dir(make_checkpoint(tmp_path / "c1", "one"), "r/step-1", step=1)
        uploaded: list[str] = []

        def kill_after_two(rel: str) -> None:
            uploaded.append(rel)
            if len(uploaded) == 2:
                server.stop()

        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            store.publish_dir(
                make_checkpoint(tmp_path / "c2", "two"), "r/step-2", step=2, on_file=kill_after_two
            )
        assert time.monotonic() - started < 10
        message = str(info.value)
        assert f"http://{server.endpoint}/ckpts" in message
        assert "put_file('r/step-2/shard-2.bin')" in message
        assert "after 3 attempt(s)" in message
        assert uploaded == ["shard-0.bin", "shard-1.bin"]

        server.start()  # same port, same data directory
        assert store.latest_checkpoint("r/") == "r/step-1"
        assert store.read_manifest("r/step-2") is None
        store.get_dir("r/step-1", tmp_path / "restored")
        assert sorted(p.name for p in (tmp_path / "restored").iterdir()) == [
            f"shard-{i}.bin" for i in range(4)
        ]
        # The interrupted publication can simply be redone.
        store.publish_dir(tmp_path / "c2", "r/step-2", step=2)
        assert store.latest_checkpoint("r/") == "r/step-2"
    finally:
        server.stop()


def test_unreachable_store_raises_a_clear_error() -> None:
    port = free_port()  # nothing listens there
    store = S3Store(
        f"127.0.0.1:{port}",
        "bucket",
        access_key="k",
        secret_key="s",
        secure=False,
        region="us-east-1",
        retry=FAST_RETRY,
        connect_timeout_s=0.5,
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as info:
        store.get_bytes("model/config.json")
    assert time.monotonic() - started < 5
    err = info.value
    assert (err.endpoint, err.operation, err.key, err.attempts) == (
        f"http://127.0.0.1:{port}/bucket",
        "get_bytes",
        "model/config.json",
        3,
    )
    assert str(err).startswith(f"artifact store http://127.0.0.1:{port}/bucket is unreachable: get_bytes(")


def test_missing_bucket_and_bad_credentials_are_not_retried(s3rver_module: S3rver) -> None:
    store = S3Store(
        s3rver_module.endpoint,
        "no-such-bucket",
        access_key=S3RVER_KEY,
        secret_key=S3RVER_KEY,
        secure=False,
        region="us-east-1",
        retry=RetryPolicy(attempts=5, base_delay_s=5),
    )
    started = time.monotonic()
    with pytest.raises(StoreError, match="bucket 'no-such-bucket' does not exist"):
        store.put_bytes("k", b"v")
    existing = make_store(s3rver_module).bucket
    wrong = S3Store(
        s3rver_module.endpoint,
        existing,
        access_key="nobody",
        secret_key="wrong",
        secure=False,
        region="us-east-1",
        retry=RetryPolicy(attempts=5, base_delay_s=5),
    )
    with pytest.raises(
        StoreError, match=r"get_bytes\('k'\) on http://127\.0\.0\.1:\d+/b-\w+ failed: InvalidAccessKeyId"
    ):
        wrong.get_bytes("k")
    assert time.monotonic() - started < 3  # no backoff was spent on permanent errors


def test_open_store_from_aws_environment(
    s3rver_module: S3rver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3rver_module.endpoint}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3RVER_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3RVER_KEY)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    store = open_store("s3://env-bucket/exp/1", StorageSettings())
    assert isinstance(store, S3Store)
    assert store.uri == "s3://env-bucket/exp/1"
    store.ensure_bucket()
    store.publish_dir(make_checkpoint(tmp_path / "c", "env"), "step-7", step=7)
    assert store.latest_checkpoint() == "step-7"
    assert store.client.stat_object("env-bucket", "exp/1/step-7/MANIFEST.json").size > 0
