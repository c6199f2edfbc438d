"""A stage's own code on inputs made here, inside its image: ``python smoke.py STAGE``.

``make images`` mounts this file read-only into each image and runs it as uid 1000 with no network.
Each stage builds what it consumes from gagar's own generators (tasks, a tiny untrained policy),
runs its pipeline stage functions (:mod:`gagar.pipeline.store_stages`, with the settings mapping a
run's tasks receive and a store in a temporary folder) and checks what they wrote; a failure exits
non-zero with the reason.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def _tasks_and_policy(root: Path, with_policy: bool) -> tuple[Path, Path | None]:
    from gagar.records import write_records
    from gagar.tasks.generate import generate_tasks

    tasks = generate_tasks(2, seed=0)
    write_records(root / "tasks.jsonl", tasks)
    if not with_policy:
        return root / "tasks.jsonl", None
    from gagar.policy.model import ModelSize, build_model, save_policy
    from gagar.policy.tokenizer import train_tokenizer

    texts = [t.problem_statement for t in tasks] + [s for t in tasks for s in (t.snapshot or {}).values()]
    tokenizer = train_tokenizer(texts, vocab_size=400)
    size = ModelSize(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    save_policy(build_model(tokenizer, size), tokenizer, root / "policy")
    return root / "tasks.jsonl", root / "policy"


def _generation_batch(root: Path) -> dict[str, Path]:
    """Two groups of generated tasks: ``a`` pass, pass, fail (passing = the gold patch), ``b`` all fail."""
    from gagar.records import read_records, write_records
    from gagar.schema import Status, Task, TestResult, Trajectory

    tasks_path, _ = _tasks_and_policy(root, with_policy=False)
    tasks = read_records(tasks_path, Task)
    trajectories, results = [], []
    for task, group, passed in zip(tasks, "ab", ([True, True, False], [False] * 3), strict=True):
        for member, ok in enumerate(passed):
            tid = f"{group}/{member}"
            trajectories.append(
                Trajectory(
                    trajectory_id=tid,
                    instance_id=task.instance_id,
                    group_id=group,
                    model_patch=task.patch if ok else "",
                )
            )
            status = Status.PASSED if ok else Status.FAILED
            results.append(
                TestResult(trajectory_id=tid, instance_id=task.instance_id, status=status, resolved=ok)
            )
    write_records(root / "trajectories.jsonl", trajectories)
    write_records(root / "results.jsonl", results)
    return {
        "tasks": tasks_path,
        "trajectories": root / "trajectories.jsonl",
        "results": root / "results.jsonl",
    }


def _settings(root: Path, tasks: Path, policy: Path | None, **sections: dict) -> dict:
    """The pipeline parameters every stage takes (what a run's tasks receive), for a store under ``root``."""
    from gagar.pipeline.parameters import parameters_from_config
    from gagar.train.config import TrainConfig

    config = TrainConfig.from_values(
        {
            "tasks": str(tasks),
            "policy": str(policy or root / "no-policy"),
            "rollout": {"group_size": 2, "gen_batch_groups": 2, "train_batch_groups": 1, "max_new_tokens": 8},
            "sandbox": {"backend": "local"},
            **sections,
        }
    )
    return {**parameters_from_config(config), "storage": str(root / "store")}


def _select(root: Path, settings: dict, paths: dict[str, Path]) -> Path:
    """The batch stored by the gather stage and selected by the select stage, as a pipeline runs them."""
    from gagar.pipeline import store_stages

    store_stages.gather(
        settings=settings, step=0, gen_batch=0, trajectories=str(paths["trajectories"]),
        results=str(paths["results"]), rollout_metrics={}, sandbox_metrics={},
    )  # fmt: skip
    store_stages.select(
        settings=settings, step=0, trajectories=str(root / "selected.jsonl"),
        results=str(root / "selected-results.jsonl"), selection=str(root / "selection.jsonl"),
    )  # fmt: skip
    return root / "selection.jsonl"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def smoke_rollout(root: Path) -> str:
    from gagar.pipeline import store_stages

    tasks, policy = _tasks_and_policy(root, with_policy=True)
    settings = _settings(root, tasks, policy)
    store_stages.rollout(
        settings=settings, policy=str(policy), tasks=str(tasks), trajectories=str(root / "out.jsonl"), step=0,
        gen_batch=0,
    )  # fmt: skip
    rows = _lines(root / "out.jsonl")
    assert len(rows) == 4, rows
    assert all("model_patch" in r for r in rows), rows
    return f"the rollout stage sampled {len(rows)} trajectories (2 groups of 2) with transformers"


def smoke_sandbox(root: Path) -> str:
    import yaml
    from kubernetes_validate import validate

    from gagar.records import read_records
    from gagar.sandbox.base import Prediction
    from gagar.sandbox.k8s import KubernetesSandboxConfig
    from gagar.sandbox.k8s.objects import render_objects_yaml
    from gagar.schema import Task

    tasks, _ = _tasks_and_policy(root, with_policy=False)
    task = read_records(tasks, Task)[0]
    config = KubernetesSandboxConfig(image="gagar-sandbox:smoke")
    prediction = Prediction(instance_id=task.instance_id, model_patch=task.patch, trajectory_id="gold")
    objects = list(yaml.safe_load_all(render_objects_yaml(task, prediction, config)))
    for obj in objects:
        validate(obj, "1.30.0", strict=True)
    return f"built and validated {', '.join(o['kind'] for o in objects)} of one evaluation"


def smoke_grader(root: Path) -> str:
    from gagar.pipeline import store_stages

    paths = _generation_batch(root)
    settings = _settings(root, paths["tasks"], None, advantage={"algo": "gagar"})
    selection = _select(root, settings, paths)
    store_stages.grade(
        settings=settings, tasks=str(paths["tasks"]), trajectories=str(root / "selected.jsonl"),
        results=str(root / "selected-results.jsonl"), selection=str(selection),
        grades=str(root / "grades.jsonl"),
    )  # fmt: skip
    grades = _lines(root / "grades.jsonl")
    assert [g["group_id"] for g in grades] == ["a"], grades
    return f"gather, select and grade stages: the heuristic grader ranked group a: {grades[0]['ranking']}"


def smoke_redistribute(root: Path) -> str:
    from gagar import rl_step
    from gagar.pipeline import store_stages
    from gagar.records import read_records, write_records
    from gagar.schema import TestResult, Trajectory
    from gagar.train.config import RolloutSettings

    paths = _generation_batch(root)
    settings = _settings(root, paths["tasks"], None, advantage={"algo": "grpo"})
    batch = rl_step.generation_batch(
        read_records(paths["trajectories"], Trajectory), read_records(paths["results"], TestResult)
    )
    chosen = rl_step.select([batch], RolloutSettings(train_batch_groups=1, max_gen_batches=1))
    write_records(root / "selection.jsonl", [chosen.kept_batch])
    (root / "grades.jsonl").write_text("")
    metrics = store_stages.redistribute(
        settings=settings, selection=str(root / "selection.jsonl"), grades=str(root / "grades.jsonl"),
        batch=str(root / "batch.jsonl"), credit=str(root / "credit.md"),
    )  # fmt: skip
    rows = _lines(root / "batch.jsonl")
    assert len(rows) == 3, rows
    return f"the redistribute stage: GRPO advantages of {len(rows)} trajectories; {len(metrics)} metrics"


def smoke_train(root: Path) -> str:
    from gagar.pipeline import store_stages
    from gagar.records import write_records
    from gagar.schema import Status, TestResult

    tasks, policy = _tasks_and_policy(root, with_policy=True)
    settings = _settings(root, tasks, policy, advantage={"algo": "grpo"})
    settings["rollout_gen_batch_groups"] = 1
    store_stages.rollout(
        settings=settings, policy=str(policy), tasks=str(tasks), trajectories=str(root / "traj.jsonl"),
        step=0, gen_batch=0,
    )  # fmt: skip
    rows = _lines(root / "traj.jsonl")
    results = [  # one passes, one fails: a group with something to learn
        TestResult(
            trajectory_id=r["trajectory_id"],
            instance_id=r["instance_id"],
            status=Status.PASSED if i == 0 else Status.FAILED,
            resolved=i == 0,
        )
        for i, r in enumerate(rows)
    ]
    write_records(root / "results.jsonl", results)
    paths = {"trajectories": root / "traj.jsonl", "results": root / "results.jsonl"}
    selection = _select(root, settings, paths)
    (root / "grades.jsonl").write_text("")
    store_stages.redistribute(
        settings=settings, selection=str(selection), grades=str(root / "grades.jsonl"),
        batch=str(root / "batch.jsonl"), credit=str(root / "credit.md"),
    )  # fmt: skip
    metrics = store_stages.train(
        settings=settings, policy=str(policy), trajectories=str(root / "selected.jsonl"),
        results=str(root / "selected-results.jsonl"), grades=str(root / "grades.jsonl"),
        batch=str(root / "batch.jsonl"), step=0, select_metrics={}, grade_metrics={}, redistribute_metrics={},
        summary=str(root / "summary.md"), model=str(root / "model.json"),
    )  # fmt: skip
    written = sorted(p.name for p in (root / "store" / "checkpoints").iterdir())
    assert written == ["step-000000"], written
    loss = {k: round(v, 4) for k, v in metrics.items() if k.startswith("loss/")}
    return f"the train stage published checkpoint {written[0]} to the store ({loss})"


SMOKES = {
    "rollout": smoke_rollout,
    "sandbox": smoke_sandbox,
    "grader": smoke_grader,
    "redistribute": smoke_redistribute,
    "train": smoke_train,
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in SMOKES:
        print(f"usage: python smoke.py {{{','.join(SMOKES)}}}", file=sys.stderr)
        return 2
    import gagar.pipeline.store_stages  # noqa: F401  what every pipeline component imports first

    with tempfile.TemporaryDirectory() as tmp:
        print(f"{argv[0]}: {SMOKES[argv[0]](Path(tmp))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
