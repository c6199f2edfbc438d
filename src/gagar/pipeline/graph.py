"""The RL step as data: its parameters and its stages, shared by every pipeline target.

Not to be confused with :mod:`gagar.stages` (what each stage computes): this module says which
stages one RL step runs, in which image, fed by which pipeline parameters and which earlier
outputs. :mod:`gagar.pipeline.definitions.rl` builds the Kubeflow pipeline from it and
:mod:`gagar.pipeline.argo` the Argo Workflow, so both targets run the same graph with the same knobs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TypeVar, Union

__all__ = ["PARAMETERS", "RL_STEP", "Parameter", "ParameterValue", "Stage", "parameter", "signature", "stage"]

ParameterValue = Union[str, int, float, bool]  # noqa: UP007 (a runtime alias of the KFP parameter types)


@dataclass(frozen=True)
class Parameter:
    """One knob of the RL pipeline."""

    name: str
    """Parameter name, the same in KFP and Argo."""
    type: type
    """``str``, ``int``, ``float`` or ``bool``."""
    default: ParameterValue | None
    """Default value; None makes the parameter required."""


@dataclass(frozen=True)
class Stage:
    """One task of an RL step."""

    name: str
    """Task name (``prepare``, ``rollout``, …); the component in ``components/`` and the Argo template."""
    image: str
    """Stage image it runs in (one of :data:`gagar.pipeline.images.STAGES`)."""
    store: bool
    """Reads or writes the run's artifact store (it gets the store credentials)."""
    parameters: tuple[tuple[str, str], ...]
    """``(argument, pipeline parameter)``: arguments taken from the pipeline's parameters."""
    inputs: tuple[tuple[str, str, str], ...]
    """``(argument, stage, output)``: arguments taken from an earlier stage's outputs."""
    artifacts: tuple[str, ...]
    """Output files (datasets, metrics, reports)."""
    results: tuple[tuple[str, type], ...] = ()
    """Output values (small parameters) and their types."""

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


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("model", str, None),
    Parameter("tasks", str, None),
    Parameter("storage", str, None),
    Parameter("group_size", int, 8),
    Parameter("train_batch_groups", int, 8),
    Parameter("gen_batch_groups", int, 16),
    Parameter("algo", str, "gagar"),
    Parameter("grader", str, "heuristic"),
    Parameter("grader_model", str, ""),
    Parameter("grader_endpoint", str, ""),
    Parameter("grader_max_steps", int, 8),
    Parameter("grader_position_guard", float, 0.0),
    Parameter("seed", int, 0),
    Parameter("temperature", float, 1.0),
    Parameter("top_p", float, 1.0),
    Parameter("max_new_tokens", int, 256),
    Parameter("rollout_backend", str, "hf"),
    Parameter("policy_endpoint", str, ""),
    Parameter("sandbox_backend", str, "kubernetes"),
    Parameter("sandbox_workers", int, 0),
    Parameter("decay", str, "geometric"),
    Parameter("gamma", float, 0.5),
    Parameter("floor", float, 0.1),
    Parameter("norm_std", bool, True),
    Parameter("lr", float, 2e-5),
    Parameter("epochs", int, 1),
    Parameter("minibatch_size", int, 16),
    Parameter("keep_checkpoints", int, 3),
    Parameter("pushgateway", str, ""),
)
"""The RL pipeline's parameters in order (KFP's ``rl`` signature, Argo's ``arguments``)."""

_SAME = ("group_size", "seed", "temperature", "top_p", "max_new_tokens")

RL_STEP: tuple[Stage, ...] = (
    Stage(
        "prepare",
        "train",
        store=True,
        parameters=(("storage", "storage"), ("model", "model"), ("tasks_uri", "tasks")),
        inputs=(),
        artifacts=("tasks",),
        results=(("step", int), ("policy", str)),
    ),
    Stage(
        "rollout",
        "rollout",
        store=True,
        parameters=(
            ("groups", "gen_batch_groups"),
            *((name, name) for name in _SAME),
            ("backend", "rollout_backend"),
            ("endpoint", "policy_endpoint"),
        ),
        inputs=(("policy", "prepare", "policy"), ("step", "prepare", "step"), ("tasks", "prepare", "tasks")),
        artifacts=("trajectories", "metrics"),
    ),
    Stage(
        "sandbox",
        "sandbox",
        store=False,
        parameters=(("backend", "sandbox_backend"), ("workers", "sandbox_workers")),
        inputs=(("tasks", "prepare", "tasks"), ("trajectories", "rollout", "trajectories")),
        artifacts=("results", "metrics"),
    ),
    Stage(
        "grade",
        "grader",
        store=False,
        parameters=(
            ("algo", "algo"),
            ("train_batch_groups", "train_batch_groups"),
            ("grader", "grader"),
            ("grader_model", "grader_model"),
            ("endpoint", "grader_endpoint"),
            ("max_steps", "grader_max_steps"),
            ("position_guard", "grader_position_guard"),
        ),
        inputs=(
            ("tasks", "prepare", "tasks"),
            ("trajectories", "rollout", "trajectories"),
            ("results", "sandbox", "results"),
        ),
        artifacts=("selection", "grades", "metrics"),
    ),
    Stage(
        "redistribute",
        "redistribute",
        store=False,
        parameters=tuple((name, name) for name in ("algo", "decay", "gamma", "floor", "norm_std")),
        inputs=(("selection", "grade", "selection"), ("grades", "grade", "grades")),
        artifacts=("batch", "metrics", "credit"),
    ),
    Stage(
        "train",
        "train",
        store=True,
        parameters=tuple(
            (name, name)
            for name in (
                "storage",
                "seed",
                "lr",
                "epochs",
                "minibatch_size",
                "keep_checkpoints",
                "pushgateway",
            )
        ),
        inputs=(
            ("policy", "prepare", "policy"),
            ("step", "prepare", "step"),
            ("trajectories", "rollout", "trajectories"),
            ("results", "sandbox", "results"),
            ("grades", "grade", "grades"),
            ("batch", "redistribute", "batch"),
            ("rollout_metrics", "rollout", "metrics"),
            ("sandbox_metrics", "sandbox", "metrics"),
            ("grade_metrics", "grade", "metrics"),
            ("redistribute_metrics", "redistribute", "metrics"),
        ),
        artifacts=("metrics", "summary"),
    ),
)
"""One RL step's stages in dependency order: each input names an earlier stage."""


_T = TypeVar("_T", "Parameter", "Stage")


def _named(items: tuple[_T, ...], name: str, kind: str) -> _T:
    for found in items:
        if found.name == name:
            return found
    names = ", ".join(item.name for item in items)
    raise ValueError(f"unknown {kind} {name!r}: choose one of {names}")


def parameter(name: str) -> Parameter:
    """The pipeline parameter ``name``.

    Raises:
        ValueError: no parameter has that name.
    """
    return _named(PARAMETERS, name, "pipeline parameter")


def signature() -> inspect.Signature:
    """The RL pipeline function's signature: one parameter per :data:`PARAMETERS` entry, typed, with
    its default (the KFP pipeline takes it from here, so its parameters are declared only once)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature(
        [
            inspect.Parameter(p.name, kind, annotation=p.type)
            if p.default is None
            else inspect.Parameter(p.name, kind, annotation=p.type, default=p.default)
            for p in PARAMETERS
        ]
    )


def stage(name: str) -> Stage:
    """The stage ``name`` of :data:`RL_STEP`.

    Raises:
        ValueError: no stage has that name.
    """
    return _named(RL_STEP, name, "stage")
