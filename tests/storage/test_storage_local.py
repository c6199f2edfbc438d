"""LocalStore: round trips, atomic publication by rename, and readers that trust only sound checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gagar.storage import (
    MANIFEST_NAME,
    ChecksumMismatchError,
    IncompleteCheckpointError,
    LocalStore,
    ObjectNotFoundError,
    StoreError,
)
from gagar.storage.local import STAGING_DIR


def make_checkpoint(root: Path, tag: str) -> Path:
    """A small checkpoint directory with a nested file; contents depend on ``tag``."""
    (root / "adapter").mkdir(parents=True)
    (root / "adapter" / "weights.bin").write_bytes(tag.encode() * 1000)
    (root / "config.json").write_text(json.dumps({"tag": tag}))
    (root / "optimizer.pt").write_bytes(bytes(range(256)) * 10)
    return root


def test_bytes_and_files_round_trip(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put_bytes("a/b/c.txt", b"hello")
    assert store.get_bytes("a/b/c.txt") == b"hello"
    src = tmp_path / "src.bin"
    src.write_bytes(b"\x00\x01" * 5000)
    store.put_file("files/src.bin", src)
    store.get_file("files/src.bin", tmp_path / "out" / "copy.bin")
    assert (tmp_path / "out" / "copy.bin").read_bytes() == src.read_bytes()
    assert store.list() == ["a/b/c.txt", "files/src.bin"]
    assert store.list("files/") == ["files/src.bin"]
    assert store.exists("a/b/c.txt")
    assert not store.exists("a/b/missing")
    store.delete("a/b/c.txt")
    store.delete("a/b/c.txt")  # idempotent
    assert not store.exists("a/b/c.txt")
    with pytest.raises(ObjectNotFoundError, match=r"a/b/c\.txt"):
        store.get_bytes("a/b/c.txt")


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a", "a\\b"])
def test_bad_keys_are_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="invalid store key"):
        LocalStore(tmp_path).put_bytes(key, b"x")


def test_publish_get_dir_and_latest(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.publish_dir(make_checkpoint(tmp_path / "c1", "one"), "run/step-1", step=1)
    store.publish_dir(make_checkpoint(tmp_path / "c2", "two"), "run/step-2", step=2)
    assert store.latest_checkpoint("run/") == "run/step-2"
    manifest = store.get_dir("run/step-2", tmp_path / "restored")
    assert sorted(manifest.files) == ["adapter/weights.bin", "config.json", "optimizer.pt"]
    for rel in manifest.files:
        assert (tmp_path / "restored" / rel).read_bytes() == (tmp_path / "c2" / rel).read_bytes()
    assert store.exists(f"run/step-2/{MANIFEST_NAME}")
    assert not (store.root / STAGING_DIR).exists() or not any((store.root / STAGING_DIR).iterdir())


def test_republishing_a_complete_checkpoint_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.publish_dir(make_checkpoint(tmp_path / "c1", "one"), "ck", step=1)
    with pytest.raises(StoreError, match="already holds a published checkpoint"):
        store.publish_dir(make_checkpoint(tmp_path / "c2", "two"), "ck", step=2)
    assert json.loads(store.get_bytes("ck/config.json")) == {"tag": "one"}


def test_failed_publication_leaves_previous_checkpoint_latest(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.publish_dir(make_checkpoint(tmp_path / "c1", "one"), "run/step-1", step=1)
    copied = []

    def crash_after_two(rel: str) -> None:
        copied.append(rel)
        if len(copied) == 2:
            raise OSError("disk vanished")

    with pytest.raises(OSError, match="disk vanished"):
        store.publish_dir(
            make_checkpoint(tmp_path / "c2", "two"), "run/step-2", step=2, on_file=crash_after_two
        )
    assert store.latest_checkpoint("run/") == "run/step-1"
    assert store.list("run/step-2") == []
    assert store.read_manifest("run/step-2") is None
    with pytest.raises(IncompleteCheckpointError, match="run/step-2"):
        store.get_dir("run/step-2", tmp_path / "nope")


def test_corrupted_checkpoint_is_skipped_and_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.publish_dir(make_checkpoint(tmp_path / "c1", "one"), "run/step-1", step=1)
    store.publish_dir(make_checkpoint(tmp_path / "c2", "two"), "run/step-2", step=2)
    original = store.get_bytes("run/step-2/optimizer.pt")
    store.put_bytes("run/step-2/optimizer.pt", original[::-1])  # same size, different bytes
    assert store.verify("run/step-2") == [
        f"run/step-2/optimizer.pt: sha256 {store.stat('run/step-2/optimizer.pt').sha256}, "
        f"manifest says {store.read_manifest('run/step-2').files['optimizer.pt'].sha256}"
    ]
    assert store.latest_checkpoint("run/") == "run/step-1"
    with pytest.raises(ChecksumMismatchError, match=r"run/step-2/optimizer\.pt"):
        store.get_dir("run/step-2", tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    assert not list(tmp_path.glob(".restored.*"))


def test_publish_refuses_empty_dir_and_a_manifest_of_other_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="contains no files"):
        store.publish_dir(tmp_path / "empty", "x")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.bin").write_bytes(b"a")
    (tmp_path / "bad" / MANIFEST_NAME).write_text("{}")
    with pytest.raises(ValueError, match="is not a manifest"):
        store.publish_dir(tmp_path / "bad", "x")
    (tmp_path / "bad" / MANIFEST_NAME).write_text('{"files": {"a.bin": {"sha256": "0", "size": 1}}}')
    with pytest.raises(ValueError, match=r"does not match a\.bin"):
        store.publish_dir(tmp_path / "bad", "x")
    assert store.list() == []
