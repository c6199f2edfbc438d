"""The evaluation pipeline: sample the latest policy on held-out tasks and report the quality of its fixes.

prepare (tasks, the store's latest checkpoint or ``model``) -> rollout -> evaluate (tests every
answer; pass@1, parse rate and the share of resolving fixes the oracle calls unclean).
"""

from typing import Any

from kfp import dsl

from gagar.pipeline.components.evaluate.component import evaluate
from gagar.pipeline.components.prepare.component import prepare
from gagar.pipeline.components.rollout.component import rollout
from gagar.pipeline.platform import PlatformOptions, configure

__all__ = ["build"]


def build(options: PlatformOptions | None = None) -> Any:
    """The evaluation pipeline with ``options`` on every task."""
    platform = options or PlatformOptions()

    @dsl.pipeline(name="gagar-evaluation", description="Pass@1 and fix quality of the latest GAGAR policy.")
    def evaluation(
        model: str,
        tasks: str,
        storage: str,
        groups: int = 32,
        group_size: int = 4,
        seed: int = 1,
        temperature: float = 1.0,
        max_new_tokens: int = 256,
        rollout_backend: str = "hf",
        policy_endpoint: str = "",
        sandbox_backend: str = "kubernetes",
        sandbox_workers: int = 0,
        agent: str = "single",
        max_turns: int = 8,
        max_trajectory_tokens: int = 2048,
        max_trajectory_seconds: float = 600.0,
        max_live_conversations: int = 0,
    ):
        start = prepare(storage=storage, model=model, tasks_uri=tasks)
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
            agent=agent,
            max_turns=max_turns,
            max_trajectory_tokens=max_trajectory_tokens,
            max_trajectory_seconds=max_trajectory_seconds,
            max_live_conversations=max_live_conversations,
            sandbox=sandbox_backend,
            sandbox_workers=sandbox_workers,
        )
        judged = evaluate(
            tasks=start.outputs["tasks"],
            trajectories=sampled.outputs["trajectories"],
            backend=sandbox_backend,
            workers=sandbox_workers,
        )
        for name, image, task, uses_store in (
            ("prepare", "train", start, True),
            ("rollout", "rollout", sampled, True),
            ("evaluate", "sandbox", judged, False),
        ):
            configure(task, name, image, platform, store=uses_store).set_display_name(name)

    return evaluation
