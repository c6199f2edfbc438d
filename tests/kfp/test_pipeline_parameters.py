"""One declaration per knob: the pipeline's parameters take their defaults from the typed settings.

The RL pipeline's signature is made from :data:`gagar.pipeline.graph.PARAMETERS`; this test checks,
mechanically, that each parameter's default is the training settings' default of the same knob
(KFP cannot express "unset": ``""`` and ``0`` stand for None) and that every component argument fed
by a parameter declares that same default.
"""

from __future__ import annotations

import inspect
from enum import Enum
from typing import Any

from pydantic import BaseModel

from gagar.pipeline.definitions.rl import COMPONENTS
from gagar.pipeline.graph import PARAMETERS, RL_STEP, parameter
from gagar.train.config import TrainConfig

SETTING = {
    "group_size": "rollout.group_size",
    "train_batch_groups": "rollout.train_batch_groups",
    "gen_batch_groups": "rollout.gen_batch_groups",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "max_new_tokens": "rollout.max_new_tokens",
    "rollout_backend": "rollout.backend",
    "policy_endpoint": "rollout.endpoint",
    "sandbox_workers": "sandbox.workers",
    "algo": "advantage.algo",
    "decay": "advantage.decay",
    "gamma": "advantage.gamma",
    "floor": "advantage.floor",
    "norm_std": "advantage.norm_std",
    "grader": "grader.kind",
    "grader_model": "grader.model",
    "grader_endpoint": "grader.endpoint",
    "grader_max_steps": "grader.max_steps",
    "grader_position_guard": "grader.position_guard",
    "lr": "optim.lr",
    "epochs": "optim.epochs",
    "minibatch_size": "optim.minibatch_size",
    "keep_checkpoints": "keep_checkpoints",
    "seed": "seed",
    "pushgateway": "metrics.pushgateway",
}
"""Pipeline parameter -> the TrainConfig field it is."""
PIPELINE_ONLY = {
    "model": "the initial policy (TrainConfig.policy, required in both)",
    "tasks": "the tasks (TrainConfig.tasks, required in both)",
    "storage": "the artifact store (a pipeline's whole state; the trainer has run_dir)",
    "sandbox_backend": "a cluster pipeline defaults to kubernetes, the trainer on one machine to local",
}


def _default(path: str) -> Any:
    model: type[BaseModel] = TrainConfig
    *sections, name = path.split(".")
    for section in sections:
        model = model.model_fields[section].annotation  # type: ignore[assignment]
    field = model.model_fields[name]
    value = field.get_default(call_default_factory=True)
    return value.value if isinstance(value, Enum) else value


def test_every_parameter_is_a_setting_with_its_default() -> None:
    assert {p.name for p in PARAMETERS} == set(SETTING) | set(PIPELINE_ONLY)
    for name, path in SETTING.items():
        expected = _default(path)
        if expected is None:  # unset: KFP's stand-ins
            expected = "" if parameter(name).type is str else parameter(name).type(0)
        assert parameter(name).default == expected, (
            f"{name} defaults to {parameter(name).default!r}, {path} to {expected!r}"
        )


def test_components_declare_the_parameters_defaults() -> None:
    for stage in RL_STEP:
        signature = inspect.signature(COMPONENTS[stage.name].python_func)
        for argument, name in stage.parameters:
            default = signature.parameters[argument].default
            if default is not inspect.Parameter.empty:
                assert default == parameter(name).default, f"{stage.name}.{argument}"
