"""Generated train and held-out tasks and a tiny SFT policy, shared by the experiment tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.policy import tiny_sft_config
from gagar.schema.task import Task
from gagar.tasks.generate import generate_tasks
from gagar.tasks.loaders import write_tasks


@pytest.fixture(scope="session")
def experiment_train_tasks() -> list[Task]:
    return generate_tasks(3, seed=11)


@pytest.fixture(scope="session")
def experiment_heldout_tasks() -> list[Task]:
    return generate_tasks(2, seed=5, split="heldout")


@pytest.fixture(scope="session")
def experiment_inputs(
    tmp_path_factory: pytest.TempPathFactory,
    experiment_train_tasks: list[Task],
    experiment_heldout_tasks: list[Task],
) -> dict[str, Path]:
    """Task files and a tiny policy after a few SFT steps on the training tasks."""
    from gagar.policy.sft import train_sft

    root = tmp_path_factory.mktemp("experiment-inputs")
    write_tasks(root / "train.jsonl", experiment_train_tasks)
    write_tasks(root / "heldout.jsonl", experiment_heldout_tasks)
    train_sft(experiment_train_tasks, root / "policy", tiny_sft_config(), progress=False)
    return {"train": root / "train.jsonl", "heldout": root / "heldout.jsonl", "policy": root / "policy"}
