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

__all__ = [
    "DEFAULT_MAX_GEN_BATCHES",
    "PARAMETERS",
    "REFILL",
    "RL_STEP",
    "Parameter",
    "ParameterValue",
    "Stage",
    "describe",
    "docstring",
    "generation_stages",
    "parameter",
    "signature",
    "stage",
]

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
    setting: str | None = None
    """The :class:`gagar.train.config.TrainConfig` field it is (``rollout.group_size``): its
    documentation is the parameter's description, so it is written once."""
    note: str | None = None
    """What the description adds for the pipeline (the whole description when ``setting`` is None)."""


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
    per_gen_batch: bool = False
    """Runs once per generation batch (a task per batch); its inputs from other per-batch stages
    come from the same batch's tasks."""
    takes_gen_batch: bool = False
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


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("model", str, None, "policy", "A model directory or a store reference (s3://…)."),
    Parameter("tasks", str, None, "tasks", "A local path or a store URI (s3://…/tasks.jsonl)."),
    Parameter(
        "storage",
        str,
        None,
        note="The run's artifact store, a local directory or s3://bucket/prefix: checkpoints, "
        "adapters, step metrics; each run resumes from its latest checkpoint.",
    ),
    Parameter("group_size", int, 8, "rollout.group_size"),
    Parameter("train_batch_groups", int, 8, "rollout.train_batch_groups"),
    Parameter("gen_batch_groups", int, 16, "rollout.gen_batch_groups"),
    Parameter("algo", str, "gagar", "advantage.algo"),
    Parameter("grader", str, "heuristic", "grader.kind"),
    Parameter("grader_model", str, "", "grader.model"),
    Parameter(
        "grader_endpoint",
        str,
        "",
        "grader.endpoint",
        "On a cluster: the chart's grader server, http://<release>-grader-server:8000/v1.",
    ),
    Parameter("grader_max_steps", int, 8, "grader.max_steps"),
    Parameter("grader_position_guard", float, 0.0, "grader.position_guard"),
    Parameter("seed", int, 0, "seed"),
    Parameter("temperature", float, 1.0, "rollout.temperature"),
    Parameter("top_p", float, 1.0, "rollout.top_p"),
    Parameter("max_new_tokens", int, 256, "rollout.max_new_tokens"),
    Parameter("agent", str, "single", "rollout.agent.kind"),
    Parameter("max_turns", int, 8, "rollout.agent.max_turns"),
    Parameter("max_trajectory_tokens", int, 2048, "rollout.agent.max_tokens"),
    Parameter("max_trajectory_seconds", float, 600.0, "rollout.agent.max_seconds"),
    Parameter("max_live_conversations", int, 0, "rollout.agent.max_live", "0: the whole generation batch."),
    Parameter("rollout_backend", str, "hf", "rollout.backend"),
    Parameter(
        "policy_endpoint",
        str,
        "",
        "rollout.endpoint",
        "On a cluster: the chart's policy server, http://<release>-policy-server:8000/v1.",
    ),
    Parameter("served_model", str, "policy", "rollout.served_model"),
    Parameter(
        "policy_adapters_dir",
        str,
        "",
        note="Where the policy server reads the adapters the train stage publishes to the store "
        "(the chart's adapter-sync sidecar mirrors them to /adapters); empty: the store's own "
        "adapters/ directory, for a local store.",
    ),
    Parameter(
        "sandbox_backend", str, "kubernetes", "sandbox.backend", "A cluster pipeline defaults to kubernetes."
    ),
    Parameter("sandbox_workers", int, 0, "sandbox.workers"),
    Parameter("decay", str, "geometric", "advantage.decay"),
    Parameter("gamma", float, 0.5, "advantage.gamma"),
    Parameter("floor", float, 0.1, "advantage.floor"),
    Parameter("norm_std", bool, True, "advantage.norm_std"),
    Parameter("lr", float, 2e-5, "optim.lr"),
    Parameter("epochs", int, 1, "optim.epochs"),
    Parameter("minibatch_size", int, 16, "optim.minibatch_size"),
    Parameter("lora", bool, False, "lora.enabled", "Each step's adapter is published as policy-step-N."),
    Parameter("lora_rank", int, 8, "lora.rank"),
    Parameter("lora_alpha", float, 16.0, "lora.alpha"),
    Parameter("train_nodes", int, 1, "distributed.nodes"),
    Parameter("train_procs_per_node", int, 1, "distributed.procs_per_node"),
    Parameter("train_strategy", str, "ddp", "distributed.strategy"),
    Parameter("train_runtime", str, "", "distributed.runtime"),
    Parameter("keep_checkpoints", int, 3, "keep_checkpoints"),
    Parameter("pushgateway", str, "", "metrics.pushgateway"),
)
"""The RL pipeline's parameters in order (KFP's ``rl`` signature, Argo's ``arguments``)."""

_SAME = ("group_size", "seed", "temperature", "top_p", "max_new_tokens")
_TRAIN_SAME = (
    "storage", "seed", "lr", "epochs", "minibatch_size", "keep_checkpoints", "pushgateway", "model", "lora",
    "lora_rank", "lora_alpha", "rollout_backend", "served_model",
)  # fmt: skip

DEFAULT_MAX_GEN_BATCHES = 3
"""Generation batches a step may draw when the build does not say (``rollout.max_gen_batches``'s default)."""
REFILL = ("gather", "short")
"""The output that draws the next generation batch: batch b+1 runs only when gather-b says the
train batch is still short of ``train_batch_groups`` mixed groups (KFP ``dsl.If``, Argo ``when``)."""

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
            ("storage", "storage"),
            ("served_model", "served_model"),
            ("adapters_dir", "policy_adapters_dir"),
            ("agent", "agent"),
            ("max_turns", "max_turns"),
            ("max_trajectory_tokens", "max_trajectory_tokens"),
            ("max_trajectory_seconds", "max_trajectory_seconds"),
            ("max_live_conversations", "max_live_conversations"),
            ("sandbox", "sandbox_backend"),
            ("sandbox_workers", "sandbox_workers"),
        ),
        inputs=(("policy", "prepare", "policy"), ("step", "prepare", "step"), ("tasks", "prepare", "tasks")),
        artifacts=("trajectories", "metrics"),
        per_gen_batch=True,
        takes_gen_batch=True,
    ),
    Stage(
        "sandbox",
        "sandbox",
        store=False,
        parameters=(("backend", "sandbox_backend"), ("workers", "sandbox_workers")),
        inputs=(("tasks", "prepare", "tasks"), ("trajectories", "rollout", "trajectories")),
        artifacts=("results", "metrics"),
        per_gen_batch=True,
    ),
    Stage(
        "gather",
        "grader",
        store=True,
        parameters=(("storage", "storage"), ("train_batch_groups", "train_batch_groups")),
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
        parameters=(("storage", "storage"), ("train_batch_groups", "train_batch_groups")),
        inputs=(("step", "prepare", "step"),),
        artifacts=("trajectories", "results", "selection", "metrics"),
    ),
    Stage(
        "grade",
        "grader",
        store=False,
        parameters=(
            ("algo", "algo"),
            ("grader", "grader"),
            ("grader_model", "grader_model"),
            ("endpoint", "grader_endpoint"),
            ("max_steps", "grader_max_steps"),
            ("position_guard", "grader_position_guard"),
        ),
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
        parameters=tuple((name, name) for name in ("algo", "decay", "gamma", "floor", "norm_std")),
        inputs=(("selection", "select", "selection"), ("grades", "grade", "grades")),
        artifacts=("batch", "metrics", "credit"),
    ),
    Stage(
        "train",
        "train",
        store=True,
        parameters=(
            *((name, name) for name in _TRAIN_SAME),
            ("nodes", "train_nodes"),
            ("procs_per_node", "train_procs_per_node"),
            ("strategy", "train_strategy"),
            ("runtime", "train_runtime"),
        ),
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
        artifacts=("metrics", "summary"),
    ),
)
"""One RL step's stages in dependency order: each input names an earlier stage. The per-batch
stages (:func:`generation_stages`) run once per generation batch (up to ``max_gen_batches``,
unrolled when the pipeline is built); ``select`` then reads every batch drawn back from the store."""


def generation_stages() -> tuple[Stage, ...]:
    """The stages run once per generation batch (rollout, sandbox, gather), in order."""
    return tuple(s for s in RL_STEP if s.per_gen_batch)


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


def describe(p: Parameter) -> str:
    """The one-line description of pipeline parameter ``p``: its setting's documentation (the
    :class:`~gagar.train.config.TrainConfig` field's docstring, written once there), then what the
    pipeline adds, and how the parameter says "unset" when the setting's default is None.

    Raises:
        ValueError: the parameter has neither a documented setting nor a note.
    """
    from gagar.train.config import setting_field  # the trainer's settings: imported when building only

    parts: list[str] = []
    if p.setting is not None:
        field = setting_field(p.setting)
        if not field.description:
            raise ValueError(f"pipeline parameter {p.name!r}: setting {p.setting!r} has no documentation")
        parts.append(field.description)
        if field.get_default(call_default_factory=True) is None:
            parts.append("Empty means unset." if p.type is str else "0 means unset.")
    if p.note is not None:
        parts.append(p.note)
    if not parts:
        raise ValueError(f"pipeline parameter {p.name!r} has no description (no setting, no note)")
    return " ".join(" ".join(parts).split())


def docstring(summary: str) -> str:
    """A pipeline function's docstring: ``summary`` and an ``Args:`` section describing every
    parameter (KFP compiles it into each parameter's ``description``)."""
    lines = [summary, "", "Args:"]
    lines += [f"    {p.name}: {describe(p)}" for p in PARAMETERS]
    return "\n".join(lines) + "\n"
