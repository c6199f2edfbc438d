"""The RL pipeline: ``steps_per_run`` GAGAR steps, each resuming from the store's latest checkpoint.

One step, in order: prepare (tasks, step number, policy to sample from) -> generation (rollout ->
sandbox -> gather for batch 0, then again for batch 1, 2, … while gather says the train batch is
still short of ``train_batch_groups`` mixed groups, up to ``max_gen_batches``) -> select (dynamic
sampling over the batches drawn) -> grade -> redistribute (advantages) -> train (update, publish
``checkpoints/step-N``). The refills are unrolled at compile time as nested ``dsl.If`` inside one
sub-pipeline per step (``generation``), so select waits for whichever batches ran. The steps are
chained at compile time: step i+1's prepare runs after step i's train, so it finds step i's
checkpoint. Build with :func:`build` (``gagar pipeline compile --steps-per-run N --max-gen-batches M``).

The stages, their images and which earlier output feeds each argument come from
:data:`gagar.pipeline.graph.RL_STEP`, the list the Argo target (:mod:`gagar.pipeline.argo`) is
built from too. The signature of ``rl`` below is made from :data:`gagar.pipeline.parameters.PARAMETERS`
(generated from the training config), and every task gets them all as its ``settings``.
"""

import inspect
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

from kfp import dsl
from kfp.dsl import Dataset, Input

from gagar.components.gather.component import gather
from gagar.components.grade.component import grade
from gagar.components.prepare.component import prepare
from gagar.components.redistribute.component import redistribute
from gagar.components.rollout.component import rollout
from gagar.components.sandbox.component import sandbox
from gagar.components.select.component import select
from gagar.components.train.component import train
from gagar.pipeline.graph import (
    DEFAULT_MAX_GEN_BATCHES,
    REFILL,
    RL_STEP,
    SETTINGS,
    docstring,
    generation_stages,
    signature,
)
from gagar.pipeline.parameters import PARAMETERS, ParameterValue
from gagar.pipeline.platform import PlatformOptions, configure

__all__ = ["COMPONENTS", "build"]


COMPONENTS = {
    "prepare": prepare,
    "rollout": rollout,
    "sandbox": sandbox,
    "gather": gather,
    "select": select,
    "grade": grade,
    "redistribute": redistribute,
    "train": train,
}
"""Component of each stage of :data:`gagar.pipeline.graph.RL_STEP`."""

_FIRST = RL_STEP[0].name  # prepare: what the generation sub-pipeline takes from it is passed in


_NAMES = [p.name for p in PARAMETERS]


def _prepare_outputs() -> list[str]:
    """The outputs of prepare the generation sub-pipeline takes (passed in as its inputs)."""
    taken: list[str] = []
    for spec in generation_stages():
        taken += [o for _, source, o in spec.inputs if source == _FIRST and o not in taken]
    return taken


def _generation(max_gen_batches: int, options: PlatformOptions) -> Any:
    """The sub-pipeline drawing one step's generation batches: batch b+1 nested in ``dsl.If`` on
    batch b's gather output :data:`REFILL`."""
    taken = _prepare_outputs()
    first = RL_STEP[0]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD

    def annotation(output: str) -> Any:
        found = first.output_type(output)
        return Input[Dataset] if found is None else found

    params = [inspect.Parameter(p.name, kind, annotation=p.type) for p in PARAMETERS]
    params += [inspect.Parameter(f"{_FIRST}_{o}", kind, annotation=annotation(o)) for o in taken]
    order = [p.name for p in params]
    source, _ = REFILL  # the component's single return value (kfp.local evaluates conditions on it)

    def generation(*args: Any) -> None:
        given = dict(zip(order, args, strict=True))
        settings = {name: given[name] for name in _NAMES}
        with ExitStack() as nested:
            previous = None
            for b in range(max_gen_batches):
                if previous is not None:
                    nested.enter_context(dsl.If(previous.output == True, name=f"refill-{b}"))  # noqa: E712
                tasks: dict[str, Any] = {}
                for spec in generation_stages():
                    arguments: dict[str, Any] = {SETTINGS: settings}
                    arguments |= {"gen_batch": b} if spec.takes_gen_batch else {}
                    for argument, origin, out in spec.inputs:
                        upstream = (
                            given[f"{_FIRST}_{out}"] if origin == _FIRST else tasks[origin].outputs[out]
                        )
                        arguments[argument] = upstream
                    task = COMPONENTS[spec.name](**arguments)
                    configure(task, spec.name, spec.image, options, store=spec.store).set_display_name(
                        f"{spec.name}-{b}"
                    )
                    tasks[spec.name] = task
                previous = tasks[source]

    generation.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return dsl.pipeline(
        name="generation",
        description=f"One RL step's generation batches: refilled while short, at most {max_gen_batches}.",
    )(generation)


def _add_step(
    p: dict[str, Any], index: int, last: bool, options: PlatformOptions, after: Any | None, generation: Any
) -> Any:
    """Add one RL step's tasks (:data:`RL_STEP`) to the pipeline being defined; returns its train task."""
    tasks: dict[str, Any] = {}
    prepare_spec = RL_STEP[0]
    settings = {name: p[name] for name in _NAMES}
    for spec in RL_STEP:
        if spec.per_gen_batch:
            continue
        arguments: dict[str, Any] = {SETTINGS: settings}
        arguments |= {"ends_run": last} if spec.takes_ends_run else {}
        arguments |= {argument: tasks[source].outputs[output] for argument, source, output in spec.inputs}
        task = COMPONENTS[spec.name](**arguments)
        if after is not None and not spec.inputs:
            task.after(after)
        configure(task, spec.name, spec.image, options, store=spec.store).set_display_name(
            f"{spec.name}-{index}"
        )
        tasks[spec.name] = task
        if spec is prepare_spec:
            drawn = generation(
                **{name: p[name] for name in _NAMES},
                **{f"{_FIRST}_{o}": task.outputs[o] for o in _prepare_outputs()},
            )
            drawn.set_caching_options(False).set_display_name(f"generation-{index}")
        elif spec.name == "select":
            task.after(drawn)
    return tasks[RL_STEP[-1].name]


def build(
    steps_per_run: int = 1,
    options: PlatformOptions | None = None,
    max_gen_batches: int = DEFAULT_MAX_GEN_BATCHES,
    defaults: Mapping[str, ParameterValue] | None = None,
) -> Any:
    """The RL pipeline running ``steps_per_run`` chained steps of at most ``max_gen_batches``
    generation batches each, with ``options`` on every task and ``defaults`` replacing some of its
    parameters' defaults."""
    if steps_per_run < 1:
        raise ValueError(f"steps_per_run must be at least 1, got {steps_per_run}")
    if max_gen_batches < 1:
        raise ValueError(f"max_gen_batches must be at least 1, got {max_gen_batches}")
    platform = options or PlatformOptions()
    generation = _generation(max_gen_batches, platform)

    def rl(*args: Any) -> None:
        params = dict(zip(_NAMES, args, strict=True))
        previous = None
        for index in range(steps_per_run):
            last = index == steps_per_run - 1
            previous = _add_step(params, index, last, platform, previous, generation)

    rl.__signature__ = signature(defaults=defaults)  # type: ignore[attr-defined]  # declared once
    rl.__doc__ = docstring("The GAGAR RL pipeline.")  # each parameter's description, from its setting
    return dsl.pipeline(
        name="gagar-rl",
        description=f"GAGAR: {steps_per_run} RL step(s) of GRPO with grader-aware credit redistribution "
        f"(dynamic sampling refilled up to {max_gen_batches} generation batches a step), "
        "resuming from the latest checkpoint in the artifact store.",
    )(rl)
