"""Fixtures of the Argo target's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.policy import untrained_policy_and_tasks


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tiny untrained policy directory, tasks JSONL with two generated tasks)."""
    return untrained_policy_and_tasks(tmp_path_factory.mktemp("inputs"))
