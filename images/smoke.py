"""A stage's own code on inputs made here, inside its image: ``python smoke.py STAGE``.

``make images`` mounts this file read-only into each image and runs it as uid 1000 with no network.
Each stage builds what it consumes from gagar's own generators (tasks, a tiny untrained policy),
runs its stage function and checks what it wrote; a failure exits non-zero with the reason.
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


def _select(root: Path, paths: dict[str, Path]) -> Path:
    from gagar.stages import select_stage

    select_stage(
        trajectories=[paths["trajectories"]],
        results=[paths["results"]],
        out=root / "selection.jsonl",
        train_batch_groups=1,
    )
    return root / "selection.jsonl"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def smoke_rollout(root: Path) -> str:
    from gagar.stages import rollout_stage

    tasks, policy = _tasks_and_policy(root, with_policy=True)
    rollout_stage(
        policy=policy,
        tasks=tasks,
        out=root / "out.jsonl",
        step=0,
        groups=2,
        group_size=2,
        max_new_tokens=8,
        backend="hf",
        progress=False,
    )
    rows = _lines(root / "out.jsonl")
    assert len(rows) == 4, rows
    assert all("model_patch" in r for r in rows), rows
    return f"sampled {len(rows)} trajectories (2 groups of 2) with transformers"


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
    from gagar.stages import grade_stage

    paths = _generation_batch(root)
    grade_stage(
        tasks=paths["tasks"],
        trajectories=[paths["trajectories"]],
        results=[paths["results"]],
        out=root / "grades.jsonl",
        workspace=root / "ws",
        grader="heuristic",
        selection=_select(root, paths),
        progress=False,
    )
    grades = _lines(root / "grades.jsonl")
    assert [g["group_id"] for g in grades] == ["a"], grades
    return f"heuristic grader ranked group a: {grades[0]['ranking']}"


def smoke_redistribute(root: Path) -> str:
    from gagar.stages import redistribute_stage

    paths = _generation_batch(root)
    metrics = redistribute_stage(
        selection=_select(root, paths), grades=None, out=root / "batch.jsonl", algo="grpo"
    )
    rows = _lines(root / "batch.jsonl")
    assert len(rows) == 3, rows
    return f"GRPO advantages of {len(rows)} trajectories; {len(metrics)} metrics"


def smoke_train(root: Path) -> str:
    from gagar.records import write_records
    from gagar.schema import Status, TestResult
    from gagar.stages import redistribute_stage, rollout_stage, select_stage, train_stage

    tasks, policy = _tasks_and_policy(root, with_policy=True)
    rollout_stage(
        policy=policy,
        tasks=tasks,
        out=root / "traj.jsonl",
        step=0,
        groups=1,
        group_size=2,
        max_new_tokens=8,
        backend="hf",
        progress=False,
    )
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
    select_stage(
        trajectories=[root / "traj.jsonl"],
        results=[root / "results.jsonl"],
        out=root / "sel.jsonl",
        train_batch_groups=1,
    )
    redistribute_stage(selection=root / "sel.jsonl", grades=None, out=root / "batch.jsonl", algo="grpo")
    metrics = train_stage(
        policy=policy,
        trajectories=[root / "traj.jsonl"],
        batch=root / "batch.jsonl",
        checkpoints=root / "checkpoints",
        step=0,
    )
    written = sorted(p.name for p in (root / "checkpoints").iterdir())
    assert written == ["step-000000"], written
    loss = {k: round(v, 4) for k, v in metrics.items() if k.startswith("loss/")}
    return f"one policy update wrote checkpoint {written[0]} ({loss})"


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
