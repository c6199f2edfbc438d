"""Fixtures of the Argo target's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tiny untrained policy directory, tasks JSONL with two generated tasks)."""
    from gagar.policy.model import ModelSize, build_model, save_policy
    from gagar.policy.tokenizer import train_tokenizer
    from gagar.records import write_records
    from gagar.tasks.generate import generate_tasks

    root = tmp_path_factory.mktemp("inputs")
    tasks = generate_tasks(2, seed=0)
    write_records(root / "tasks.jsonl", tasks)
    texts = [t.problem_statement for t in tasks] + [s for t in tasks for s in (t.snapshot or {}).values()]
    tokenizer = train_tokenizer(texts, vocab_size=400)
    size = ModelSize(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    save_policy(build_model(tokenizer, size), tokenizer, root / "policy")
    return root / "policy", root / "tasks.jsonl"
