"""Where throw-away trees go: a roomy tmpfs when there is one, else the system temp dir."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gagar import scratch


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    scratch.scratch_root.cache_clear()
    yield
    scratch.scratch_root.cache_clear()


def test_tmpdir_set_by_the_user_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert scratch.scratch_root() == tmp_path


def test_a_folder_that_is_no_tmpfs_is_not_chosen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.setattr(scratch, "MEMORY_ROOT", tmp_path)  # a folder on whatever the tests run on
    if scratch._is_tmpfs(tmp_path):
        pytest.skip("the test's temp dir is itself a tmpfs mount point")
    assert scratch.scratch_root() == Path(tempfile.gettempdir())


def test_a_tmpfs_without_room_is_not_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.setattr(scratch, "_is_tmpfs", lambda path: True)
    monkeypatch.setattr(scratch, "MIN_FREE_BYTES", 1 << 62)
    assert scratch.scratch_root() == Path(tempfile.gettempdir())


def test_a_roomy_writable_tmpfs_is_chosen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.setattr(scratch, "MEMORY_ROOT", tmp_path)
    monkeypatch.setattr(scratch, "_is_tmpfs", lambda path: path == tmp_path)
    monkeypatch.setattr(scratch, "MIN_FREE_BYTES", 1)
    assert scratch.scratch_root() == tmp_path
