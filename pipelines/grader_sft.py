"""The grader-SFT pipeline: sample the current policy, test its answers, train the learned grader on them.

prepare (training tasks, the policy to sample from) -> rollout -> sandbox -> grader_sft, which
labels the groups with the patch-quality oracle, trains the learned grader and measures it on the
held-out tasks' groups. The grader comes out as a KFP Model artifact. Its parameters are the RL
pipeline's (the training config: how the policy samples and where tests run) and the grader SFT's own.
"""

import inspect
from collections.abc import Mapping
from typing import Any

from kfp import dsl

from gagar.components.grader_sft.component import grader_sft
from gagar.components.prepare.component import prepare
from gagar.components.rollout.component import rollout
from gagar.components.sandbox.component import sandbox
from gagar.pipeline.graph import SETTINGS, settings_of, signature
from gagar.pipeline.parameters import ParameterValue
from gagar.pipeline.platform import PlatformOptions, configure

__all__ = ["build"]

_KIND = inspect.Parameter.POSITIONAL_OR_KEYWORD
_OWN = (
    inspect.Parameter("eval_tasks", _KIND, annotation=str),
    inspect.Parameter("groups_per_task", _KIND, annotation=int, default=3),
    inspect.Parameter("epochs", _KIND, annotation=int, default=300),
)
"""The grader SFT's own parameters: held-out tasks, noise groups per task, the scorer's epochs."""


def build(
    options: PlatformOptions | None = None, defaults: Mapping[str, ParameterValue] | None = None
) -> Any:
    """The grader-SFT pipeline with ``options`` on every task."""
    platform = options or PlatformOptions()
    order = list(signature(_OWN, defaults).parameters)

    def grader_sft_pipeline(*args: Any) -> None:
        given = dict(zip(order, args, strict=True))
        settings = settings_of(given)
        start = prepare(**{SETTINGS: settings})
        held_out = prepare(**{SETTINGS: {**settings, "tasks": given["eval_tasks"]}})
        sampled = rollout(
            **{SETTINGS: settings},
            policy=start.outputs["policy"],
            step=start.outputs["step"],
            gen_batch=0,
            tasks=start.outputs["tasks"],
        )
        tested = sandbox(
            **{SETTINGS: settings}, tasks=start.outputs["tasks"], trajectories=sampled.outputs["trajectories"]
        )
        trained = grader_sft(
            tasks=start.outputs["tasks"],
            trajectories=sampled.outputs["trajectories"],
            results=tested.outputs["results"],
            eval_tasks=held_out.outputs["tasks"],
            groups_per_task=given["groups_per_task"],
            epochs=given["epochs"],
            seed=given["seed"],
        )
        for name, image, task, uses_store in (
            ("prepare", "train", start, True),
            ("prepare-eval", "train", held_out, True),
            ("rollout", "rollout", sampled, True),
            ("sandbox", "sandbox", tested, False),
            ("grader-sft", "grader", trained, False),
        ):
            configure(task, name, image, platform, store=uses_store).set_display_name(name)

    grader_sft_pipeline.__signature__ = signature(_OWN, defaults)  # type: ignore[attr-defined]
    return dsl.pipeline(name="gagar-grader-sft", description="Train and measure GAGAR's learned grader.")(
        grader_sft_pipeline
    )
