"""The evaluation pipeline: sample the latest policy of a run's store on held-out tasks and judge it.

prepare (the tasks, the policy to sample from: the store's latest checkpoint) -> rollout (one
generation batch: ``rollout_gen_batch_groups`` tasks, ``rollout_group_size`` answers each, the
agent and sampling settings of the run) -> evaluate (each answer's tests, pass@1, parse rate and
the share of unclean fixes). Its parameters are the RL pipeline's (the training config), so an
evaluation samples exactly as the run it measures does.
"""

import inspect
from collections.abc import Mapping
from typing import Any

from kfp import dsl

from gagar.components.evaluate.component import evaluate
from gagar.components.prepare.component import prepare
from gagar.components.rollout.component import rollout
from gagar.pipeline.graph import SETTINGS, docstring, settings_of, signature
from gagar.pipeline.parameters import ParameterValue
from gagar.pipeline.platform import PlatformOptions, configure

__all__ = ["build"]


def build(
    options: PlatformOptions | None = None, defaults: Mapping[str, ParameterValue] | None = None
) -> Any:
    """The evaluation pipeline with ``options`` on every task."""
    platform = options or PlatformOptions()
    order = list(signature(defaults=defaults).parameters)

    def evaluation(*args: Any) -> None:
        settings = settings_of(dict(zip(order, args, strict=True)))
        start = prepare(**{SETTINGS: settings})
        sampled = rollout(
            **{SETTINGS: settings},
            policy=start.outputs["policy"],
            step=start.outputs["step"],
            gen_batch=0,
            tasks=start.outputs["tasks"],
        )
        judged = evaluate(
            **{SETTINGS: settings}, tasks=start.outputs["tasks"], trajectories=sampled.outputs["trajectories"]
        )
        for name, image, task, uses_store in (
            ("prepare", "train", start, True),
            ("rollout", "rollout", sampled, True),
            ("evaluate", "sandbox", judged, False),
        ):
            configure(task, name, image, platform, store=uses_store).set_display_name(name)

    evaluation.__signature__ = signature(defaults=defaults)  # type: ignore[attr-defined]
    evaluation.__doc__ = docstring("Pass@1 and fix quality of the latest policy of a GAGAR run.")
    return dsl.pipeline(name="gagar-evaluation", description=inspect.cleandoc(__doc__ or ""))(evaluation)
