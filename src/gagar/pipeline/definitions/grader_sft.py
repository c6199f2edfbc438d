"""The grader-SFT pipeline: sample the current policy, test its answers, train the learned grader on them.

prepare (training tasks, the policy to sample from) -> rollout -> sandbox -> grader_sft, which
labels the groups with the patch-quality oracle, trains the learned grader and measures it on the
held-out tasks' groups. The grader comes out as a KFP Model artifact.
"""

from typing import Any

from kfp import dsl

from gagar.pipeline.components.grader_sft.component import grader_sft
from gagar.pipeline.components.prepare.component import prepare
from gagar.pipeline.components.rollout.component import rollout
from gagar.pipeline.components.sandbox.component import sandbox
from gagar.pipeline.platform import PlatformOptions, configure

__all__ = ["build"]


def build(options: PlatformOptions | None = None) -> Any:
    """The grader-SFT pipeline with ``options`` on every task."""
    platform = options or PlatformOptions()

    @dsl.pipeline(name="gagar-grader-sft", description="Train and measure GAGAR's learned grader.")
    def grader_sft_pipeline(
        model: str,
        tasks: str,
        eval_tasks: str,
        storage: str,
        groups: int = 16,
        group_size: int = 8,
        seed: int = 0,
        temperature: float = 1.0,
        max_new_tokens: int = 256,
        rollout_backend: str = "hf",
        policy_endpoint: str = "",
        sandbox_backend: str = "kubernetes",
        sandbox_workers: int = 0,
        groups_per_task: int = 3,
        epochs: int = 300,
    ):
        start = prepare(storage=storage, model=model, tasks_uri=tasks)
        held_out = prepare(storage=storage, model=model, tasks_uri=eval_tasks)
        sampled = rollout(
            policy=start.outputs["policy"],
            step=start.outputs["step"],
            storage=storage,
            tasks=start.outputs["tasks"],
            groups=groups,
            group_size=group_size,
            seed=seed,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            backend=rollout_backend,
            endpoint=policy_endpoint,
        )
        tested = sandbox(
            tasks=start.outputs["tasks"],
            trajectories=sampled.outputs["trajectories"],
            backend=sandbox_backend,
            workers=sandbox_workers,
        )
        trained = grader_sft(
            tasks=start.outputs["tasks"],
            trajectories=sampled.outputs["trajectories"],
            results=tested.outputs["results"],
            eval_tasks=held_out.outputs["tasks"],
            groups_per_task=groups_per_task,
            epochs=epochs,
            seed=seed,
        )
        for name, image, task, uses_store in (
            ("prepare", "train", start, True),
            ("prepare-eval", "train", held_out, True),
            ("rollout", "rollout", sampled, True),
            ("sandbox", "sandbox", tested, False),
            ("grader-sft", "grader", trained, False),
        ):
            configure(task, name, image, platform, store=uses_store).set_display_name(name)

    return grader_sft_pipeline
