"""The pipeline's parameters, generated from the typed training config, and the config rebuilt from them.

Every knob is declared once, as a field of :class:`gagar.train.config.TrainConfig` with its type,
default and one-line documentation. The Kubeflow and Argo pipelines take one parameter per field
(the dotted path with ``_`` for ``.``: ``rollout.group_size`` is ``rollout_group_size``), typed and
defaulted from the field, described by its documentation. Every stage receives them all as one
``settings`` mapping and rebuilds the same ``TrainConfig`` with :func:`config_from_parameters`, so
the pipeline runs exactly the settings ``gagar train`` would with the same values.

KFP parameters cannot be unset: a field whose default is unset (``None``) becomes a text parameter
that is empty when unset. Lists and tuples travel as comma-separated text. KFP hands a stage its
``settings`` inside a JSON document it assembles by substitution, so text parameters hold no
double quote and no backslash (refused with the parameter's name).
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union

from pydantic.fields import FieldInfo

__all__ = [
    "EXCLUDED",
    "PARAMETERS",
    "PIPELINE_ONLY",
    "REQUIRED_FIRST",
    "Parameter",
    "ParameterValue",
    "config_from_parameters",
    "convert",
    "parameter",
    "parameters_from_config",
]

ParameterValue = Union[str, int, float, bool]  # noqa: UP007 (a runtime alias of the KFP parameter types)

EXCLUDED = {
    "run_dir": "the pipeline's state is its storage",
    "steps": "steps per run are the compiled pipeline's (gagar pipeline compile --steps-per-run)",
    "keep_step_artifacts": "KFP keeps every task's artifacts",
    "lora.publish_uri": "the pipeline publishes each adapter to its storage",
}
"""Settings of ``gagar train`` that a pipeline run does not take, and why."""


@dataclass(frozen=True)
class Parameter:
    """One pipeline parameter."""

    name: str
    """Parameter name, the same in KFP and Argo (``rollout_group_size``)."""
    type: type
    """``str``, ``int``, ``float`` or ``bool``."""
    default: ParameterValue | None
    """Default value; None makes the parameter required."""
    description: str
    """One plain-language line for the run form."""
    setting: str | None = None
    """The :class:`~gagar.train.config.TrainConfig` field it is (``rollout.group_size``); None for a
    parameter of the pipeline alone (:data:`PIPELINE_ONLY`)."""
    choices: tuple[str, ...] = ()
    """The values it may take, where the setting is an enumeration."""
    encoding: Literal["plain", "optional", "list"] = "plain"
    """How the setting's value is written: as it is, as text that is empty when unset, or as
    comma-separated items."""


PIPELINE_ONLY = (
    Parameter(
        "storage",
        str,
        None,
        "Where the run keeps its state: a local directory or s3://bucket/prefix. Checkpoints, adapters "
        "and step metrics go there, and each run resumes from its latest checkpoint.",
    ),
    Parameter(
        "policy_adapters_dir",
        str,
        "",
        "Where the policy server reads the adapters each update publishes (the chart's adapter-sync "
        "sidecar mirrors the store's to /adapters); empty: the store's own adapters folder, for a "
        "local store.",
    ),
)
"""Parameters of the pipeline that are not training settings."""

REQUIRED_FIRST = ("policy", "tasks", "storage")
"""The required parameters, first on the run form."""

_SCALARS = (str, int, float, bool)


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return annotation, False


def _plain(text: str) -> str:
    """A field's documentation as one plain line: no RST literals, no Python's None."""
    text = re.sub(r"``([^`]*)``", r"\1", " ".join(text.split()))
    return text.replace(":class:", "").replace(":func:", "")


def _parameter(path: str, info: FieldInfo) -> Parameter:
    annotation, optional = _strip_optional(info.annotation)
    default = info.get_default(call_default_factory=True)
    description = _plain(info.description or "")
    if not description:
        raise ValueError(f"setting {path!r} has no documentation: document the field where it is declared")
    choices: tuple[str, ...] = ()
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        choices = tuple(str(m.value) for m in annotation)
    elif typing.get_origin(annotation) is Literal:
        choices = tuple(str(a) for a in typing.get_args(annotation))
    required = info.is_required()
    if optional or (default is None and not required):
        encoding, kind, value = "optional", str, "" if default is None else _text(default)
        description += " Leave empty to unset."
    elif choices or annotation is Path or annotation is str:
        encoding, kind, value = "plain", str, None if required else _text(default)
    elif annotation in _SCALARS:
        encoding, kind, value = "plain", annotation, None if required else default
    else:  # lists, tuples
        encoding, kind, value = "list", str, None if required else _text(default)
        description += " Comma-separated."
    if choices:
        description += f" One of: {', '.join(choices)}."
    return Parameter(
        name=path.replace(".", "_"),
        type=kind,
        default=value,
        description=description,
        setting=path,
        choices=choices,
        encoding=encoding,  # type: ignore[arg-type]
    )


def _text(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def _generate() -> tuple[Parameter, ...]:
    from gagar.train.config import setting_leaves

    generated = [_parameter(path, info) for path, info in setting_leaves() if path not in EXCLUDED]
    every = [*generated, *PIPELINE_ONLY]
    names = [p.name for p in every]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"two settings make the same pipeline parameter: {', '.join(clash)}")
    required = [p for name in REQUIRED_FIRST for p in every if p.name == name]
    return (*required, *(p for p in every if p.name not in REQUIRED_FIRST))


PARAMETERS: tuple[Parameter, ...] = _generate()
"""The RL pipeline's parameters: the required ones first, then every setting in the config's order."""

_BY_NAME = {p.name: p for p in PARAMETERS}


def parameter(name: str) -> Parameter:
    """The pipeline parameter ``name``.

    Raises:
        ValueError: no parameter has that name (the message lists the close ones).
    """
    found = _BY_NAME.get(name)
    if found is None:
        import difflib

        close = difflib.get_close_matches(name, _BY_NAME, n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        hint += " (gagar pipeline parameters lists them)"
        raise ValueError(f"unknown pipeline parameter {name!r}{hint}")
    return found


def convert(name: str, value: Any) -> ParameterValue:
    """``value`` (text from a command line, Argo or KFP's executor) as parameter ``name``'s type.

    Raises:
        ValueError: naming the parameter when the name is unknown or the value is not of its type.
    """
    p = parameter(name)
    if p.type is str:  # checked whatever its type: text given as text is what KFP substitutes
        text = value if isinstance(value, str) else str(value).strip()
        if '"' in text or "\\" in text:
            raise ValueError(f"parameter {name}: text holds no double quote or backslash, got {text!r}")
        return text
    if isinstance(value, p.type) and not (p.type is int and isinstance(value, bool)):
        return value
    text = str(value).strip()
    if p.type is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(f"parameter {name}: expected true or false, got {str(value)!r}")
        return text.lower() == "true"
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if p.type is int:
        if not number.is_integer():
            raise ValueError(f"parameter {name}: expected a whole number, got {str(value)!r}")
        return int(number)
    if math.isnan(number):
        raise ValueError(f"parameter {name}: expected a number, got {str(value)!r}")
    return number


def _setting_value(p: Parameter, value: ParameterValue) -> Any:
    if p.encoding == "optional":
        return None if value == "" else value
    if p.encoding == "list":
        return [item.strip() for item in str(value).split(",") if item.strip()]
    return value


def config_from_parameters(values: Mapping[str, Any], *, run_dir: str | Path = ".") -> Any:
    """The :class:`~gagar.train.config.TrainConfig` the pipeline parameters ``values`` describe
    (every setting parameter; :data:`PIPELINE_ONLY` ones are ignored here), ``run_dir`` its scratch.

    The environment does not override them: a pipeline's parameters are its whole configuration.

    Raises:
        ValueError: one line naming the parameter that is unknown, missing or invalid.
    """
    from pydantic import ValidationError

    from gagar.train.config import TrainConfig

    nested: dict[str, Any] = {"run_dir": str(run_dir)}
    for name, raw in values.items():
        p = parameter(name)
        if p.setting is None:
            continue
        *sections, leaf = p.setting.split(".")
        target = nested
        for section in sections:
            target = target.setdefault(section, {})
        target[leaf] = _setting_value(p, convert(name, raw))
    missing = [p.name for p in PARAMETERS if p.setting and p.default is None and p.name not in values]
    if missing:
        raise ValueError(f"missing pipeline parameter(s): {', '.join(missing)}")
    try:
        return TrainConfig.from_values(nested)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "_".join(str(part) for part in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise ValueError(
            f"parameter {name}: {message}" if name else f"pipeline parameters: {message}"
        ) from None


def parameters_from_config(config: Any) -> dict[str, ParameterValue]:
    """The pipeline parameters that describe ``config`` (a TrainConfig): every setting parameter,
    so :func:`config_from_parameters` gives the same config back (``run_dir`` aside)."""
    values: dict[str, ParameterValue] = {}
    for p in PARAMETERS:
        if p.setting is None:
            continue
        value: Any = config
        for part in p.setting.split("."):
            value = getattr(value, part)
        if value is None:
            values[p.name] = ""
        elif isinstance(value, Enum | Path) or p.type is str:
            values[p.name] = _text(value)
        else:
            values[p.name] = p.type(value)
    return values
