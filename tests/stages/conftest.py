"""A tiny policy and groups of hand-made trajectories (gold, noisy, wrong answers) on generated tasks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fixtures.policy import tiny_sft_config
from gagar.policy.agent_format import answer_from_patch, build_prompt
from gagar.policy.generation import Sample, sequence_logprobs
from gagar.policy.model import load_policy
from gagar.policy.rollout import to_trajectory
from gagar.records import write_records
from gagar.schema.task import Task
from gagar.schema.trajectory import SamplingParams, Trajectory
from gagar.tasks.generate import generate_tasks
from gagar.tasks.loaders import write_tasks
from gagar.tasks.noise import add_noise


@pytest.fixture(scope="session")
def tasks() -> list[Task]:
    return generate_tasks(3, seed=11)


@pytest.fixture(scope="session")
def tasks_file(tmp_path_factory: pytest.TempPathFactory, tasks: list[Task]) -> Path:
    path = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
    write_tasks(path, tasks)
    return path


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory, tasks: list[Task]) -> Path:
    """A tiny policy after a few SFT steps: enough for real token ids and log-probs."""
    from gagar.policy.sft import train_sft

    out = tmp_path_factory.mktemp("policy")
    config = tiny_sft_config()
    train_sft(tasks, out, config, progress=False)
    return out


def _trajectory(task: Task, answer: str, member: int, model, tokenizer) -> Trajectory:
    messages, prompt_ids = build_prompt(task, tokenizer, 768)
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    params = SamplingParams()
    logprobs = sequence_logprobs(model, prompt_ids, ids, params.temperature).tolist()
    sample = Sample(token_ids=ids, logprobs=logprobs, finish_reason="stop")
    return to_trajectory(task, messages, prompt_ids, sample, tokenizer, member, 0, params, "test")


@pytest.fixture(scope="session")
def trajectories_file(tmp_path_factory: pytest.TempPathFactory, tasks: list[Task], tiny_policy: Path) -> Path:
    """Per task one group: the gold answer, a noisy answer that also passes, and two that fail."""
    torch.manual_seed(0)
    model, tokenizer = load_policy(tiny_policy)
    rows = []
    for task in tasks:
        snapshot = task.snapshot or {}
        gold = answer_from_patch(snapshot, task.patch)
        noisy = answer_from_patch(snapshot, add_noise(task, task.patch, ["comment", "dead_code"], rng=1))
        wrong = "this answer has no edit blocks"
        for member, answer in enumerate([noisy, gold, wrong, wrong]):
            rows.append(_trajectory(task, answer, member, model, tokenizer))
    path = tmp_path_factory.mktemp("rollout") / "trajectories-0.jsonl"
    write_records(path, rows)
    return path
