"""The RL pipeline: ``steps_per_run`` GAGAR steps, each resuming from the store's latest checkpoint.

One step, in order: prepare (tasks, step number, policy to sample from) -> rollout (one generation
batch of ``gen_batch_groups`` tasks) -> sandbox (every evaluation inside one task) -> grade (kept
groups) -> redistribute (dynamic sampling, advantages) -> train (update, publish ``checkpoints/step-N``).
The steps are chained at compile time: step i+1's prepare runs after step i's train, so it finds
step i's checkpoint. Build with :func:`build` (``gagar pipeline compile --steps-per-run N``).
"""

from typing import Any

from kfp import dsl

from components.grader.component import grade
from components.prepare.component import prepare
from components.redistribute.component import redistribute
from components.rollout.component import rollout
from components.sandbox.component import sandbox
from components.train.component import train
from gagar.pipeline.platform import PlatformOptions, configure

__all__ = ["build"]


def _add_step(p: dict[str, Any], index: int, options: PlatformOptions, after: Any | None) -> Any:
    """Add one RL step's tasks to the pipeline being defined; returns its train task."""
    start = prepare(storage=p["storage"], model=p["model"], tasks_uri=p["tasks"])
    if after is not None:
        start.after(after)
    tasks = start.outputs["tasks"]
    step, policy = start.outputs["step"], start.outputs["policy"]
    sampled = rollout(
        policy=policy,
        step=step,
        tasks=tasks,
        groups=p["gen_batch_groups"],
        group_size=p["group_size"],
        seed=p["seed"],
        temperature=p["temperature"],
        top_p=p["top_p"],
        max_new_tokens=p["max_new_tokens"],
        backend=p["rollout_backend"],
        endpoint=p["policy_endpoint"],
    )
    trajectories = sampled.outputs["trajectories"]
    tested = sandbox(
        tasks=tasks, trajectories=trajectories, backend=p["sandbox_backend"], workers=p["sandbox_workers"]
    )
    results = tested.outputs["results"]
    graded = grade(
        tasks=tasks,
        trajectories=trajectories,
        results=results,
        algo=p["algo"],
        train_batch_groups=p["train_batch_groups"],
        grader=p["grader"],
        grader_model=p["grader_model"],
        endpoint=p["grader_endpoint"],
    )
    assembled = redistribute(
        trajectories=trajectories,
        results=results,
        grades=graded.outputs["grades"],
        algo=p["algo"],
        train_batch_groups=p["train_batch_groups"],
        decay=p["decay"],
        gamma=p["gamma"],
        floor=p["floor"],
        norm_std=p["norm_std"],
    )
    updated = train(
        storage=p["storage"],
        policy=policy,
        step=step,
        trajectories=trajectories,
        batch=assembled.outputs["batch"],
        rollout_metrics=sampled.outputs["metrics"],
        sandbox_metrics=tested.outputs["metrics"],
        grade_metrics=graded.outputs["metrics"],
        redistribute_metrics=assembled.outputs["metrics"],
        seed=p["seed"],
        lr=p["lr"],
        epochs=p["epochs"],
        minibatch_size=p["minibatch_size"],
        keep_checkpoints=p["keep_checkpoints"],
        pushgateway=p["pushgateway"],
    )
    for name, image, task, uses_store in (
        ("prepare", "train", start, True),
        ("rollout", "rollout", sampled, True),
        ("sandbox", "sandbox", tested, False),
        ("grade", "grader", graded, False),
        ("redistribute", "redistribute", assembled, False),
        ("train", "train", updated, True),
    ):
        configure(task, name, image, options, store=uses_store).set_display_name(f"{name}-{index}")
    return updated


def build(steps_per_run: int = 1, options: PlatformOptions | None = None) -> Any:
    """The RL pipeline running ``steps_per_run`` chained steps, with ``options`` on every task."""
    if steps_per_run < 1:
        raise ValueError(f"steps_per_run must be at least 1, got {steps_per_run}")
    platform = options or PlatformOptions()

    @dsl.pipeline(
        name="gagar-rl",
        description=f"GAGAR: {steps_per_run} RL step(s) of GRPO with grader-aware credit redistribution, "
        "resuming from the latest checkpoint in the artifact store.",
    )
    def rl(
        model: str,
        tasks: str,
        storage: str,
        group_size: int = 8,
        train_batch_groups: int = 8,
        gen_batch_groups: int = 16,
        algo: str = "gagar",
        grader: str = "heuristic",
        grader_model: str = "",
        grader_endpoint: str = "",
        seed: int = 0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        rollout_backend: str = "hf",
        policy_endpoint: str = "",
        sandbox_backend: str = "kubernetes",
        sandbox_workers: int = 0,
        decay: str = "geometric",
        gamma: float = 0.5,
        floor: float = 0.1,
        norm_std: bool = True,
        lr: float = 2e-5,
        epochs: int = 1,
        minibatch_size: int = 16,
        keep_checkpoints: int = 3,
        pushgateway: str = "",
    ):
        params = dict(locals())
        previous = None
        for index in range(steps_per_run):
            previous = _add_step(params, index, platform, previous)

    return rl
