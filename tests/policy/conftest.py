"""Fixtures of the policy tests: small hand-written tasks and a tiny trained policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from gagar.schema.task import Task
from gagar.tasks.diffs import make_diff

_MODULE = '''"""Small arithmetic helpers."""


def add(a, b):
    """Sum of ``a`` and ``b``."""
    return a + b


def scale(values, factor):
    """Each value times ``factor``."""
    return [v * factor for v in values]


def clamp(x, low, high):
    """``x`` limited to [low, high]."""
    if x < low:
        return low
    if x > high:
        return high
    return x
'''

_BUGS = [
    ("add", "    return a + b\n", "    return a - b\n", "`add(2, 3)` returns `-1`, expected `5`."),
    ("scale", "v * factor", "v + factor", "`scale([1, 2], 3)` returns `[4, 5]`, expected `[3, 6]`."),
    ("clamp", "    if x > high:\n", "    if x < high:\n", "`clamp(5, 0, 9)` returns `9`, expected `5`."),
]


def make_tasks(package: str = "calc") -> list[Task]:
    """One task per injected bug in a small package (gold patch = the fix)."""
    tasks = []
    for name, good, bad, statement in _BUGS:
        fixed = {
            f"{package}/__init__.py": '"""calc."""\n\n__version__ = "0.1.0"\n',
            f"{package}/ops.py": _MODULE,
            "tests/test_ops.py": f"from {package}.ops import {name}\n\n\ndef test_it():\n    assert {name}\n",
            "README.md": f"# {package}\n",
        }
        buggy = {**fixed, f"{package}/ops.py": _MODULE.replace(good, bad, 1)}
        tasks.append(
            Task(
                instance_id=f"{package}-{name}",
                repo=f"local/{package}",
                snapshot=buggy,
                problem_statement=f"Bug in `{name}`\n\n{statement}\n",
                patch=make_diff(buggy, fixed),
                FAIL_TO_PASS=["tests/test_ops.py::test_it"],
            )
        )
    return tasks


@pytest.fixture(scope="session")
def tasks() -> list[Task]:
    return make_tasks()


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory, tasks: list[Task]) -> Path:
    """A tiny policy trained for a few steps (tokenizer, model, HF format)."""
    from gagar.policy.sft import SFTConfig, train_sft

    out = tmp_path_factory.mktemp("policy")
    config = SFTConfig(
        vocab_size=400,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        steps=4,
        batch_size=2,
        warmup_steps=1,
        checkpoint_every=2,
        noise_share=0.0,
        max_prompt_tokens=512,
    )
    train_sft(tasks, out, config, progress=False)
    return out
