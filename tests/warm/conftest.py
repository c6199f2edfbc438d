"""Fixtures of the warm-inference tests: a tiny SFT policy, peft LoRA adapters for it, one vLLM server.

The vLLM server is shared by the whole session (an engine start costs a minute or more on 2 cores);
tests that load adapters into it use names of their own and unload what they load.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.policy import tiny_sft_config
from gagar.policy.vllm_server import PolicyServer, start_policy_server


@pytest.fixture(scope="session")
def sft_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tasks file and a tiny SFT policy trained on it: (tasks.jsonl, policy directory)."""
    from gagar.policy.sft import train_sft
    from gagar.tasks.generate import generate_tasks
    from gagar.tasks.loaders import write_tasks

    root = tmp_path_factory.mktemp("warm")
    tasks = generate_tasks(3, seed=11)
    write_tasks(root / "tasks.jsonl", tasks)
    # head dim 32 (64 wide, 2 heads): a size vLLM's CPU attention kernels take
    config = tiny_sft_config(hidden_size=64, num_heads=2, num_kv_heads=1)
    train_sft(tasks, root / "policy", config, progress=False)
    return root / "tasks.jsonl", root / "policy"


@pytest.fixture(scope="session")
def base_policy(sft_run: tuple[Path, Path]) -> Path:
    """The SFT policy: the base every adapter applies to."""
    return sft_run[1]


@pytest.fixture(scope="session")
def vllm_server(base_policy: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyServer]:
    """vLLM's server on the base policy, LoRA on, fp32 (the trainer's precision), no graph compilation."""
    with start_policy_server(
        base_policy, dtype="float32", enforce_eager=True, max_lora_rank=16,
        cache_dir=tmp_path_factory.mktemp("vllm-cache"), startup_timeout_s=300,
    ) as server:  # fmt: skip
        yield server
