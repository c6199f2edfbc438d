"""One declaration per knob: the pipeline's parameters take their defaults from the typed settings.

The RL pipeline's signature is made from :data:`gagar.pipeline.graph.PARAMETERS`; this test checks,
mechanically, that each parameter's default is the training settings' default of the same knob
(KFP cannot express "unset": ``""`` and ``0`` stand for None) and that every component argument fed
by a parameter declares that same default.
"""

from __future__ import annotations

import inspect
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml

from gagar.pipeline.definitions.rl import COMPONENTS
from gagar.pipeline.graph import PARAMETERS, RL_STEP, Parameter, describe, parameter
from gagar.train.config import setting_field

SETTING = {
    p.name: p.setting
    for p in PARAMETERS
    if p.setting is not None and p.name not in {"model", "tasks", "sandbox_backend"}
}
"""Pipeline parameter -> the TrainConfig field it is (declared once, in the graph)."""
PIPELINE_ONLY = {
    "model": "the initial policy (TrainConfig.policy, required in both)",
    "tasks": "the tasks (TrainConfig.tasks, required in both)",
    "storage": "the artifact store (a pipeline's whole state; the trainer has run_dir)",
    "sandbox_backend": "a cluster pipeline defaults to kubernetes, the trainer on one machine to local",
    "policy_adapters_dir": "where the policy server reads adapters (the trainer has run_dir/adapters)",
}


def _default(path: str) -> Any:
    value = setting_field(path).get_default(call_default_factory=True)
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


def _compiled_parameters(tmp_path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from gagar.pipeline.argo import build_workflow
    from gagar.pipeline.build import compile_pipeline

    path = compile_pipeline("rl", tmp_path / "rl.yaml")
    spec = next(d for d in yaml.safe_load_all(path.read_text()) if d and "root" in d)
    return spec["root"]["inputDefinitions"]["parameters"], build_workflow()["spec"]["arguments"]["parameters"]


def test_every_compiled_parameter_has_a_one_line_description(tmp_path: Path) -> None:
    """The run form in the Kubeflow UI (and Argo's) explains each knob; fails on a parameter without one."""
    kfp, argo = _compiled_parameters(tmp_path)
    assert set(kfp) == {p.name for p in PARAMETERS} == {a["name"] for a in argo}
    undescribed = sorted(name for name, spec in kfp.items() if not spec.get("description", "").strip())
    assert not undescribed, f"compiled KFP parameters without a description: {undescribed}"
    for entry in argo:
        assert entry.get("description") == kfp[entry["name"]]["description"], entry["name"]
        assert "\n" not in entry["description"]


def test_descriptions_come_from_the_settings_documentation() -> None:
    for p in PARAMETERS:
        if p.setting is not None:
            assert describe(p).startswith(" ".join(setting_field(p.setting).description.split())), p.name


def test_a_parameter_without_documentation_is_refused() -> None:
    with pytest.raises(ValueError, match="no description"):
        describe(Parameter("mystery", int, 0))
