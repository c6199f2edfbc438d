"""The RL pipeline: ``steps_per_run`` GAGAR steps, each resuming from the store's latest checkpoint.

One step, in order: prepare (tasks, step number, policy to sample from) -> rollout (one generation
batch of ``gen_batch_groups`` tasks) -> sandbox (every evaluation inside one task) -> grade (dynamic
sampling, kept groups) -> redistribute (advantages) -> train (update, publish ``checkpoints/step-N``).
The steps are chained at compile time: step i+1's prepare runs after step i's train, so it finds
step i's checkpoint. Build with :func:`build` (``gagar pipeline compile --steps-per-run N``).

The stages, their images and which pipeline parameter or earlier output feeds each argument come
from :data:`gagar.pipeline.graph.RL_STEP`, the list the Argo target (:mod:`gagar.pipeline.argo`)
is built from too; the signature of ``rl`` below is made from :data:`gagar.pipeline.graph.PARAMETERS`.
"""

from typing import Any

from kfp import dsl

from gagar.pipeline.components.grade.component import grade
from gagar.pipeline.components.prepare.component import prepare
from gagar.pipeline.components.redistribute.component import redistribute
from gagar.pipeline.components.rollout.component import rollout
from gagar.pipeline.components.sandbox.component import sandbox
from gagar.pipeline.components.train.component import train
from gagar.pipeline.graph import PARAMETERS, RL_STEP, signature
from gagar.pipeline.platform import PlatformOptions, configure

__all__ = ["COMPONENTS", "build"]


COMPONENTS = {
    "prepare": prepare,
    "rollout": rollout,
    "sandbox": sandbox,
    "grade": grade,
    "redistribute": redistribute,
    "train": train,
}
"""Component of each stage of :data:`gagar.pipeline.graph.RL_STEP`."""


def _add_step(p: dict[str, Any], index: int, options: PlatformOptions, after: Any | None) -> Any:
    """Add one RL step's tasks (:data:`RL_STEP`) to the pipeline being defined; returns its train task."""
    tasks: dict[str, Any] = {}
    for stage in RL_STEP:
        arguments = {argument: p[name] for argument, name in stage.parameters}
        arguments |= {argument: tasks[source].outputs[output] for argument, source, output in stage.inputs}
        task = COMPONENTS[stage.name](**arguments)
        if after is not None and not stage.inputs:
            task.after(after)
        tasks[stage.name] = task
    for stage in RL_STEP:
        configure(tasks[stage.name], stage.name, stage.image, options, store=stage.store).set_display_name(
            f"{stage.name}-{index}"
        )
    return tasks[RL_STEP[-1].name]


def build(steps_per_run: int = 1, options: PlatformOptions | None = None) -> Any:
    """The RL pipeline running ``steps_per_run`` chained steps, with ``options`` on every task."""
    if steps_per_run < 1:
        raise ValueError(f"steps_per_run must be at least 1, got {steps_per_run}")
    platform = options or PlatformOptions()

    names = [p.name for p in PARAMETERS]

    def rl(*args: Any) -> None:
        params = dict(zip(names, args, strict=True))
        previous = None
        for index in range(steps_per_run):
            previous = _add_step(params, index, platform, previous)

    rl.__signature__ = signature()  # type: ignore[attr-defined]  # the parameters, declared once
    return dsl.pipeline(
        name="gagar-rl",
        description=f"GAGAR: {steps_per_run} RL step(s) of GRPO with grader-aware credit redistribution, "
        "resuming from the latest checkpoint in the artifact store.",
    )(rl)
