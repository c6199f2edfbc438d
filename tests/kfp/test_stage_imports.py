"""Stages that need no model never import torch: a kfp.local task pays every import at its start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fixtures.records import one_generation_batch
from gagar.pipeline.parameters import parameters_from_config
from gagar.train.config import TrainConfig

HEAVY = ("torch", "transformers", "peft", "matplotlib")

# Each runs in a fresh interpreter, as a kfp.local task does: its component module, then its body.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    args = json.loads(sys.argv[1])
    root, given, settings = Path(args["root"]), args["given"], args["settings"]
    module = __import__(f"gagar.components.{args['stage']}.component", fromlist=["_"])
    from gagar.pipeline import store_stages

    def select():
        store_stages.gather(
            settings=settings, step=0, gen_batch=0, trajectories=given["trajectories"],
            results=given["results"], rollout_metrics={}, sandbox_metrics={},
        )
        store_stages.select(
            settings=settings, step=0, trajectories=str(root / "kept.jsonl"),
            results=str(root / "kept-results.jsonl"), selection=str(root / "selection.jsonl"),
        )

    stage = args["stage"]
    if stage == "prepare":
        store_stages.prepare(settings=settings, tasks=str(root / "copied.jsonl"))
    elif stage == "sandbox":
        store_stages.sandbox(settings=settings, tasks=given["tasks"], trajectories=given["trajectories"],
                             results=str(root / "results-out.jsonl"))
    elif stage in ("gather", "select"):
        select()
    elif stage in ("grade", "redistribute"):
        select()
        store_stages.grade(
            settings=settings, tasks=given["tasks"], trajectories=str(root / "kept.jsonl"),
            results=str(root / "kept-results.jsonl"), selection=str(root / "selection.jsonl"),
            grades=str(root / "grades-out.jsonl"),
        )
        store_stages.redistribute(settings=settings, selection=str(root / "selection.jsonl"),
                                  grades=str(root / "grades-out.jsonl"), batch=str(root / "batch.jsonl"),
                                  credit=str(root / "credit.md"))
    elif stage == "rollout":
        import gagar.policy.rollout  # what its body imports before sampling
    print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
    """
)


def _settings(root: Path, given: dict[str, Path]) -> dict[str, Any]:
    """The pipeline's parameters of a run on ``given``'s tasks: gagar with the heuristic grader,
    one mixed group a batch, one sandbox worker, the store under ``root``."""
    config = TrainConfig.from_values(
        {
            "tasks": str(given["tasks"]),
            "policy": str(root),
            "rollout": {"train_batch_groups": 1},
            "sandbox": {"backend": "local", "workers": 1},
            "grader": {"kind": "heuristic"},
            "advantage": {"algo": "gagar"},
        }
    )
    return {**parameters_from_config(config), "storage": str(root / "store")}


def _imported(stage: str, root: Path, given: dict[str, Path]) -> set[str]:
    arguments = json.dumps(
        {
            "stage": stage,
            "root": str(root),
            "given": {k: str(v) for k, v in given.items()},
            "settings": _settings(root, given),
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, arguments],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("stage", ["prepare", "gather", "select", "grade", "redistribute"])
def test_a_stage_without_a_model_runs_without_importing_torch(tmp_path: Path, stage: str) -> None:
    given = one_generation_batch(tmp_path)
    assert not set(HEAVY) & _imported(stage, tmp_path, given)


@pytest.mark.skipif(os.geteuid() != 0, reason="the local sandbox drops to a sandbox uid: needs root")
def test_the_sandbox_stage_evaluates_without_importing_torch(tmp_path: Path) -> None:
    given = one_generation_batch(tmp_path)
    assert not set(HEAVY) & _imported("sandbox", tmp_path, given)
    assert (tmp_path / "results-out.jsonl").read_text().count("trajectory_id") == 6


def test_the_check_sees_torch_where_a_stage_imports_it(tmp_path: Path) -> None:
    """The checks above can fail: the rollout stage's body imports torch and transformers."""
    assert {"torch", "transformers"} <= _imported("rollout", tmp_path, one_generation_batch(tmp_path))
