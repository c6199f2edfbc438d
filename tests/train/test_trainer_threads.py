"""While the step samples, torch gets the cores the local sandbox's workers leave free."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from gagar.train import trainer


@pytest.fixture(autouse=True)
def _four_cores(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    before = torch.get_num_threads()
    monkeypatch.setattr(trainer.os, "cpu_count", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("workers", "threads"), [(2, 2), (None, 1), (8, 1), (0, 4)])
def test_torch_threads_are_the_cores_the_workers_leave(workers: int | None, threads: int) -> None:
    torch.set_num_threads(3)
    assert trainer._share_cores_with_the_sandbox(workers) == 3  # what to restore for the update
    assert torch.get_num_threads() == threads


def test_omp_num_threads_set_by_the_user_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    torch.set_num_threads(3)
    trainer._share_cores_with_the_sandbox(None)
    assert torch.get_num_threads() == 3
