"""The pipeline's parameters are generated from the training config (:mod:`gagar.pipeline.parameters`).

Every setting of :class:`~gagar.train.config.TrainConfig` (but the few a pipeline run does not take)
is a pipeline parameter with the setting's default and documentation; the parameters describe a
config exactly (a round trip gives it back); a typo or a bad value is refused naming the parameter;
the compiled KFP pipeline and the Argo Workflow take exactly these parameters, described.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gagar.pipeline.parameters import (
    EXCLUDED,
    PARAMETERS,
    PIPELINE_ONLY,
    REQUIRED_FIRST,
    config_from_parameters,
    convert,
    parameter,
    parameters_from_config,
)
from gagar.train.config import TrainConfig, setting_field


def _leaves(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every leaf setting of ``model`` by its dotted path (sections, optional or not, are walked)."""
    for name, info in model.model_fields.items():
        annotation = info.annotation
        inner = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
        section = annotation if isinstance(annotation, type) else (inner[0] if len(inner) == 1 else None)
        if isinstance(section, type) and issubclass(section, BaseModel):
            yield from _leaves(section, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


SETTINGS = [path for path in _leaves(TrainConfig) if path not in EXCLUDED]


def _expected_default(path: str) -> Any:
    """The field's default as the pipeline writes it: None for a required setting, "" for unset."""
    info = setting_field(path)
    if info.is_required():
        return None
    value = info.get_default(call_default_factory=True)
    if value is None:
        return ""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return value


def test_every_setting_but_the_excluded_is_a_parameter() -> None:
    assert EXCLUDED, "a pipeline run does not take run_dir, steps, …"
    for excluded in EXCLUDED:
        setting_field(excluded)  # an excluded setting exists
    by_setting = {p.setting: p for p in PARAMETERS if p.setting is not None}
    assert sorted(by_setting) == sorted(SETTINGS)
    assert {p.name for p in PARAMETERS} == {path.replace(".", "_") for path in SETTINGS} | {
        p.name for p in PIPELINE_ONLY
    }
    assert len({p.name for p in PARAMETERS}) == len(PARAMETERS)
    assert [p.name for p in PARAMETERS[: len(REQUIRED_FIRST)]] == list(REQUIRED_FIRST)
    # the names the pipeline users type
    for name in ("rollout_group_size", "advantage_algo", "grader_kind", "optim_lr", "sandbox_workers",
                 "rollout_agent_kind", "lora_enabled", "metrics_pushgateway", "policy", "tasks"):  # fmt: skip
        assert parameter(name).name == name


@pytest.mark.parametrize("path", SETTINGS)
def test_each_parameter_has_its_settings_default_and_documentation(path: str) -> None:
    p = parameter(path.replace(".", "_"))
    assert p.setting == path
    expected = _expected_default(path)
    if expected is None:
        assert p.default is None, f"{p.name} is required like {path}"
    elif p.type is str:
        assert p.default == str(expected), f"{p.name} defaults to {p.default!r}, {path} to {expected!r}"
    else:
        assert p.type is type(expected), p.name
        assert p.default == expected, f"{p.name} defaults to {p.default!r}, {path} to {expected!r}"
    documentation = " ".join((setting_field(path).description or "").split()).replace("``", "")
    assert documentation
    assert p.description.startswith(documentation), p.name
    assert "\n" not in p.description


def test_the_defaults_describe_the_default_config() -> None:
    config = TrainConfig.from_values({"tasks": "t.jsonl", "policy": "p", "run_dir": "r"})
    defaults = {p.name: p.default for p in PARAMETERS if p.setting is not None and p.default is not None}
    assert parameters_from_config(config) == defaults | {"tasks": "t.jsonl", "policy": "p"}


CHANGED = {
    "tasks": "/data/tasks.jsonl",
    "policy": "/models/sft",
    "run_dir": "/tmp/run",
    "seed": 7,
    "rollout": {
        "group_size": 4,
        "temperature": 0.7,
        "backend": "openai",
        "endpoint": "http://policy:8000/v1",
        "agent": {"kind": "tool-loop", "max_turns": 3, "max_live": 5, "max_seconds": None},
    },
    "sandbox": {"backend": "kubernetes", "workers": 3},
    "grader": {"kind": "learned", "model": "/models/grader", "position_guard": 0.25},
    "advantage": {
        "algo": "gagar-tiered",
        "decay": "linear",
        "norm_std": False,
        "tiers": {"cutoffs": [0.25, 0.5], "lambda_max": 2.0, "tier3": 0.1},
    },
    "optim": {"lr": 3e-6, "minibatch_size": 4, "loss": {"kl_coef": 0.05, "kl_estimator": "k1"}},
    "metrics": {"pushgateway": "http://pushgateway:9091"},
    "lora": {"enabled": True, "target_modules": ["q_proj", "v_proj"], "keep_adapters": None},
    "distributed": {"procs_per_node": 2, "runtime": "gagar-torch"},
}


@pytest.mark.parametrize("values", [{"tasks": "t.jsonl", "policy": "p", "run_dir": "r"}, CHANGED])
def test_parameters_round_trip_to_the_same_config(values: dict[str, Any]) -> None:
    config = TrainConfig.from_values(values)
    parameters = parameters_from_config(config)
    assert config_from_parameters(parameters, run_dir=config.run_dir) == config
    # as text, the way Argo and a command line hand them over
    text = {
        name: str(value).lower() if isinstance(value, bool) else str(value)
        for name, value in parameters.items()
    }
    assert config_from_parameters(text, run_dir=config.run_dir) == config


def test_the_changed_config_differs_from_the_defaults_in_every_section() -> None:
    """The round trip above would pass for settings that never reach the parameters; these do."""
    parameters = parameters_from_config(TrainConfig.from_values(CHANGED))
    assert parameters["rollout_agent_kind"] == "tool-loop"
    assert parameters["rollout_agent_max_seconds"] == ""  # unset
    assert parameters["sandbox_workers"] == "3"
    assert parameters["advantage_tiers_cutoffs"] == "0.25,0.5"
    assert parameters["advantage_norm_std"] is False
    assert parameters["lora_target_modules"] == "q_proj,v_proj"
    assert parameters["lora_keep_adapters"] == ""
    assert parameters["optim_loss_kl_coef"] == 0.05


def test_pipeline_only_parameters_are_not_settings() -> None:
    values = parameters_from_config(TrainConfig.from_values({"tasks": "t", "policy": "p"}))
    config = config_from_parameters(values | {"storage": "s3://bucket/run", "policy_adapters_dir": "/a"})
    assert config == config_from_parameters(values)


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        (
            {"rollout_group_siz": 4},
            r"unknown pipeline parameter 'rollout_group_siz'; did you mean rollout_group_size",
        ),
        ({"rollout_group_size": "many"}, "parameter rollout_group_size: expected a whole number"),
        ({"rollout_group_size": "2.5"}, "parameter rollout_group_size: expected a whole number"),
        ({"rollout_group_size": 0}, "parameter rollout_group_size: "),
        # a check across the config's sections names the setting
        ({"rollout_group_size": 1}, "rollout.group_size must be at least 2"),
        ({"optim_lr": "fast"}, "parameter optim_lr: expected a number"),
        ({"advantage_norm_std": "yes"}, "parameter advantage_norm_std: expected true or false"),
        ({"advantage_algo": "gagr"}, "parameter advantage_algo: "),
        # a check across a section's fields names the section, and the field in its message
        ({"advantage_tiers_lambda_max": "0"}, "parameter advantage_tiers: .*lambda_max must be at least 1"),
        ({"sandbox_workers": "0"}, "parameter sandbox_workers: "),
        ({"rollout_endpoint": 'http://x/v1"'}, "parameter rollout_endpoint: text holds no double quote"),
    ],
)
def test_a_typo_or_bad_value_names_the_parameter(changed: dict[str, Any], message: str) -> None:
    values = parameters_from_config(TrainConfig.from_values({"tasks": "t", "policy": "p"}))
    with pytest.raises(ValueError, match=message):
        config_from_parameters(values | changed)


def test_a_missing_required_parameter_is_named() -> None:
    values = parameters_from_config(TrainConfig.from_values({"tasks": "t", "policy": "p"}))
    del values["policy"]
    with pytest.raises(ValueError, match=r"missing pipeline parameter.*policy"):
        config_from_parameters(values)


def test_a_text_parameter_with_a_double_quote_or_backslash_is_refused() -> None:
    """KFP hands a stage its settings in a JSON document made by substitution: a quote would break it."""
    for text in ('say "hi"', "C:\\models"):
        with pytest.raises(ValueError, match="parameter metrics_job: text holds no double quote"):
            convert("metrics_job", text)
    assert convert("metrics_job", "gagar-train") == "gagar-train"
    assert convert("optim_lr", "2e-05") == 2e-5
    assert convert("advantage_norm_std", "True") is True
    assert convert("rollout_group_size", "4") == 4


def _compiled_kfp(tmp_path: Path) -> dict[str, Any]:
    from gagar.pipeline.build import compile_pipeline

    path = compile_pipeline("rl", tmp_path / "rl.yaml")
    spec = next(d for d in yaml.safe_load_all(path.read_text()) if d and "root" in d)
    return spec["root"]["inputDefinitions"]["parameters"]


KFP_TYPES = {str: "STRING", int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", bool: "BOOLEAN"}


def test_the_compiled_kfp_pipeline_takes_exactly_the_parameters_described(tmp_path: Path) -> None:
    """The run form in the Kubeflow UI explains each knob with its setting's documentation."""
    compiled = _compiled_kfp(tmp_path)
    assert set(compiled) == {p.name for p in PARAMETERS}
    for p in PARAMETERS:
        spec = compiled[p.name]
        assert spec["parameterType"] == KFP_TYPES[p.type], p.name
        assert spec.get("description") == p.description, p.name
        if p.default is None:
            assert "defaultValue" not in spec, p.name
            assert not spec.get("isOptional", False), p.name
        else:
            assert spec["defaultValue"] == p.default, p.name


def test_the_argo_workflow_takes_exactly_the_parameters_described() -> None:
    """Its defaults are the settings' but for those a cluster run changes (:data:`CLUSTER_DEFAULTS`)."""
    from gagar.pipeline.argo import CLUSTER_DEFAULTS, build_workflow

    arguments = build_workflow()["spec"]["arguments"]["parameters"]
    assert [a["name"] for a in arguments] == [p.name for p in PARAMETERS]
    for entry, p in zip(arguments, PARAMETERS, strict=True):
        assert entry["description"] == p.description, p.name
        if p.default is None:
            assert "value" not in entry, p.name
        else:
            assert convert(p.name, entry["value"]) == CLUSTER_DEFAULTS.get(p.name, p.default), p.name
