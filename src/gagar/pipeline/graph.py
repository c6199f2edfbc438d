"""The RL step as data: its stages, shared by every pipeline target.

This module says which stages one RL step runs, in which image, fed by which earlier outputs; what
each stage computes is :mod:`gagar.pipeline.store_stages` (one phase of :mod:`gagar.rl_step`
each). Every stage takes the pipeline's parameters whole, as one ``settings`` mapping
(:mod:`gagar.pipeline.parameters`, generated from the training config).
:mod:`gagar.pipelines.rl` builds the Kubeflow pipeline from it and
:mod:`gagar.pipeline.argo` the Argo Workflow, so both targets run the same graph with the same knobs.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass

from gagar.pipeline.parameters import PARAMETERS, ParameterValue, convert

__all__ = [
    "DEFAULT_MAX_GEN_BATCHES",
    "REFILL",
    "RL_STEP",
    "SETTINGS",
    "Stage",
    "docstring",
    "generation_stages",
    "settings_of",
    "signature",
    "stage",
]

SETTINGS = "settings"
"""The argument every stage takes the pipeline's parameters in, as one mapping."""


@dataclass(frozen=True)
class Stage:
    """One task of an RL step."""

    name: str
    """Task name (``prepare``, ``rollout``, …); the component in ``components/`` and the Argo template."""
    image: str
    """Stage image it runs in (one of :data:`gagar.pipeline.images.STAGES`)."""
    store: bool
    """Reads or writes the run's artifact store (it gets the store credentials)."""
    inputs: tuple[tuple[str, str, str], ...]
    """``(argument, stage, output)``: arguments taken from an earlier stage's outputs."""
    artifacts: tuple[str, ...]
    """Output files (datasets, metrics, reports)."""
    results: tuple[tuple[str, type], ...] = ()
    """Output values (small parameters) and their types."""
    per_gen_batch: bool = False
    """Runs once per generation batch (a task per batch); its inputs from other per-batch stages
    come from the same batch's tasks."""
    takes_gen_batch: bool = False
    takes_ends_run: bool = False
    """Takes whether its step is the run's last as its ``ends_run`` argument (fixed when the pipeline
    is built): the train stage then marks the run finished for monitoring."""
    """Takes the batch's index as its ``gen_batch`` argument (fixed when the pipeline is built)."""

    @property
    def value_inputs(self) -> tuple[str, ...]:
        """Arguments taken from earlier stages' output values (``step``, ``policy``)."""
        return tuple(arg for arg, source, output in self.inputs if stage(source).output_type(output))

    @property
    def artifact_inputs(self) -> tuple[str, ...]:
        """Arguments taken from earlier stages' output files."""
        return tuple(arg for arg, source, output in self.inputs if not stage(source).output_type(output))

    def output_type(self, output: str) -> type | None:
        """The type of output value ``output``; None for an artifact."""
        found = dict(self.results).get(output)
        if found is None and output not in self.artifacts:
            raise ValueError(f"stage {self.name!r} has no output {output!r}")
        return found


DEFAULT_MAX_GEN_BATCHES = 3
"""Generation batches a compiled step can draw when the build does not say; each run draws at most
``rollout.max_gen_batches`` of them (a run parameter), so compile with the largest a run may want."""
REFILL = ("gather", "short")
"""The output that draws the next generation batch: batch b+1 runs only when gather-b says the
train batch is still short of ``train_batch_groups`` mixed groups (KFP ``dsl.If``, Argo ``when``)."""

RL_STEP: tuple[Stage, ...] = (
    Stage(
        "prepare",
        "train",
        store=True,
        inputs=(),
        artifacts=("tasks",),
        results=(("step", int), ("policy", str)),
    ),
    Stage(
        "rollout",
        "rollout",
        store=True,
        inputs=(("policy", "prepare", "policy"), ("step", "prepare", "step"), ("tasks", "prepare", "tasks")),
        artifacts=("trajectories", "metrics"),
        per_gen_batch=True,
        takes_gen_batch=True,
    ),
    Stage(
        "sandbox",
        "sandbox",
        store=False,
        inputs=(("tasks", "prepare", "tasks"), ("trajectories", "rollout", "trajectories")),
        artifacts=("results", "metrics"),
        per_gen_batch=True,
    ),
    Stage(
        "gather",
        "grader",
        store=True,
        inputs=(
            ("step", "prepare", "step"),
            ("trajectories", "rollout", "trajectories"),
            ("results", "sandbox", "results"),
            ("rollout_metrics", "rollout", "metrics"),
            ("sandbox_metrics", "sandbox", "metrics"),
        ),
        artifacts=(),
        results=(("short", bool),),
        per_gen_batch=True,
        takes_gen_batch=True,
    ),
    Stage(
        "select",
        "grader",
        store=True,
        inputs=(("step", "prepare", "step"),),
        artifacts=("trajectories", "results", "selection", "metrics"),
    ),
    Stage(
        "grade",
        "grader",
        store=False,
        inputs=(
            ("tasks", "prepare", "tasks"),
            ("trajectories", "select", "trajectories"),
            ("results", "select", "results"),
            ("selection", "select", "selection"),
        ),
        artifacts=("grades", "metrics"),
    ),
    Stage(
        "redistribute",
        "redistribute",
        store=False,
        inputs=(("selection", "select", "selection"), ("grades", "grade", "grades")),
        artifacts=("batch", "metrics", "credit"),
    ),
    Stage(
        "train",
        "train",
        store=True,
        inputs=(
            ("policy", "prepare", "policy"),
            ("step", "prepare", "step"),
            ("trajectories", "select", "trajectories"),
            ("results", "select", "results"),
            ("grades", "grade", "grades"),
            ("batch", "redistribute", "batch"),
            ("select_metrics", "select", "metrics"),
            ("grade_metrics", "grade", "metrics"),
            ("redistribute_metrics", "redistribute", "metrics"),
        ),
        artifacts=("metrics", "summary", "model"),
        takes_ends_run=True,
    ),
)
"""One RL step's stages in dependency order: each input names an earlier stage. The per-batch
stages (:func:`generation_stages`) run once per generation batch (up to ``max_gen_batches``,
unrolled when the pipeline is built); ``select`` then reads every batch drawn back from the store."""


def generation_stages() -> tuple[Stage, ...]:
    """The stages run once per generation batch (rollout, sandbox, gather), in order."""
    return tuple(s for s in RL_STEP if s.per_gen_batch)


def signature(
    extra: tuple[inspect.Parameter, ...] = (), defaults: Mapping[str, ParameterValue] | None = None
) -> inspect.Signature:
    """A pipeline function's signature: one parameter per :data:`PARAMETERS` entry, typed, with its
    default (the pipeline takes it from here, so its parameters are declared only in the config;
    ``defaults`` replaces some for one compiled pipeline, e.g. ``sandbox_backend=kubernetes`` for a
    cluster), then a pipeline's own ``extra`` ones (required ones before the rest)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    chosen = {p.name: p.default for p in PARAMETERS} | {k: convert(k, v) for k, v in (defaults or {}).items()}
    generated = [
        inspect.Parameter(p.name, kind, annotation=p.type)
        if chosen[p.name] is None
        else inspect.Parameter(p.name, kind, annotation=p.type, default=chosen[p.name])
        for p in PARAMETERS
    ]
    every = [*generated, *extra]
    required = [p for p in every if p.default is inspect.Parameter.empty]
    return inspect.Signature([*required, *(p for p in every if p.default is not inspect.Parameter.empty)])


def settings_of(arguments: dict[str, object]) -> dict[str, object]:
    """The ``settings`` every stage takes: the pipeline's parameters among a pipeline's ``arguments``."""
    return {p.name: arguments[p.name] for p in PARAMETERS}


def stage(name: str) -> Stage:
    """The stage ``name`` of :data:`RL_STEP`.

    Raises:
        ValueError: no stage has that name.
    """
    for found in RL_STEP:
        if found.name == name:
            return found
    raise ValueError(f"unknown stage {name!r}: choose one of {', '.join(s.name for s in RL_STEP)}")


def docstring(summary: str) -> str:
    """A pipeline function's docstring: ``summary`` and an ``Args:`` section describing every
    parameter (KFP compiles it into each parameter's ``description``)."""
    lines = [summary, "", "Args:"]
    lines += [f"    {p.name}: {p.description}" for p in PARAMETERS]
    return "\n".join(lines) + "\n"
