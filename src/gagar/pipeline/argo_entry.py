"""The container entry point of the Argo Workflow's stages: one :mod:`gagar.pipeline.store_stages` call each.

``python -m gagar.pipeline.argo_entry STAGE [--io-root DIR] name=value ...`` runs stage ``STAGE`` of
:data:`gagar.pipeline.graph.RL_STEP` as its KFP component does, with Argo's conventions for I/O:
input artifacts are files at ``DIR/inputs/<argument>`` (Argo downloads them there), output artifacts
are written to ``DIR/outputs/<name>`` and output values to ``DIR/outputs/<name>`` as text (Argo
uploads and reads them from there). Metrics travel as a JSON object ``{name: value}``, the
``metadata`` of KFP's ``Metrics`` artifact. Every ``name=value`` is converted to the type its
source output declares; the pipeline's parameters travel as text in the stage's ``settings``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gagar.pipeline import store_stages
from gagar.pipeline.graph import RL_STEP, SETTINGS, Stage, stage
from gagar.pipeline.parameters import PARAMETERS

__all__ = ["IO_ROOT", "SETTING_PREFIX", "main", "parse_arguments", "run_stage", "setting_argument"]

SETTING_PREFIX = "setting-"
"""How a template names a pipeline parameter among its inputs: ``setting-rollout_group_size`` (the
hyphen keeps it apart from any stage argument, ``policy`` included)."""
_PARAMETER_NAMES = frozenset(p.name for p in PARAMETERS)


def setting_argument(name: str) -> str:
    """The template input (and ``name=value`` argument) that carries pipeline parameter ``name``."""
    return f"{SETTING_PREFIX}{name}"


USAGE = "gagar.pipeline.argo_entry STAGE [--io-root DIR] name=value ..."
IO_ROOT = "/tmp/gagar"
"""Where a stage's pod keeps its input and output files (an emptyDir volume mounted at ``/tmp``)."""


def _argument_type(spec: Stage, argument: str) -> type:
    if argument == "gen_batch" and spec.takes_gen_batch:
        return int
    if argument == "ends_run" and spec.takes_ends_run:
        return bool
    for name, source, output in spec.inputs:
        if name == argument:
            kind = stage(source).output_type(output)
            if kind is not None:
                return kind
            raise ValueError(f"{spec.name}: {argument!r} is an input artifact, not a name=value argument")
    raise ValueError(f"stage {spec.name!r} takes no argument {argument!r}")


def parse_arguments(spec: Stage, items: Sequence[str]) -> dict[str, Any]:
    """``["setting-rollout_group_size=4", "step=0", ...]`` -> the stage's keyword arguments: the
    pipeline's parameters gathered into ``settings`` (text, read by the stage), the rest typed; none
    missing.

    Raises:
        ValueError: an item without ``=``, an unknown or repeated argument, a bad value, or a
            missing one (every parameter and every input value must be given).
    """
    values: dict[str, Any] = {}
    settings: dict[str, str] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"{spec.name}: argument {item!r} is not name=value")
        if name in values:
            raise ValueError(f"{spec.name}: argument {name!r} is given twice")
        if name.startswith(SETTING_PREFIX):
            parameter = name.removeprefix(SETTING_PREFIX)
            if parameter not in _PARAMETER_NAMES:
                raise ValueError(f"{spec.name}: unknown pipeline parameter {parameter!r}")
            if parameter in settings:
                raise ValueError(f"{spec.name}: argument {name!r} is given twice")
            settings[parameter] = text
            continue
        try:
            values[name] = _typed(text, _argument_type(spec, name))
        except ValueError as exc:
            raise ValueError(f"{spec.name}: argument {name}: {exc}") from None
    expected = set(spec.value_inputs) | ({"gen_batch"} if spec.takes_gen_batch else set())
    expected |= {"ends_run"} if spec.takes_ends_run else set()
    missing = sorted(expected - set(values)) + sorted(map(setting_argument, _PARAMETER_NAMES - set(settings)))
    if missing:
        raise ValueError(f"{spec.name}: missing arguments {', '.join(missing)}")
    return {SETTINGS: settings, **values}


def _typed(text: str, kind: type) -> Any:
    if kind is bool:
        if text.strip().lower() not in ("true", "false"):
            raise ValueError(f"expected true or false, got {text!r}")
        return text.strip().lower() == "true"
    return kind(text)


class _MetricsFile:
    """A KFP ``Metrics``-like sink of what :func:`store_stages.log_metrics` keeps (finite values)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def log_metric(self, metric: str, value: float) -> None:
        self.values[metric] = value


def _write_metrics(path: Path, metrics: Mapping[str, float]) -> None:
    sink = _MetricsFile()
    store_stages.log_metrics(sink, metrics)
    path.write_text(json.dumps(sink.values, sort_keys=True), encoding="utf-8")


def _call(spec: Stage, arguments: dict[str, Any], inputs: Path, outputs: Path) -> None:
    """Run ``spec``'s function of :data:`store_stages.RL_STAGES` with Argo's files: input artifacts
    from ``inputs`` (an earlier stage's metrics read as a dict), output artifacts to ``outputs``,
    the returned metrics as JSON and output values as text."""
    for argument, _, output in spec.inputs:
        if argument in spec.artifact_inputs:
            path = inputs / argument
            is_metrics = output == "metrics"
            arguments[argument] = json.loads(path.read_text(encoding="utf-8")) if is_metrics else str(path)
    arguments |= {name: str(outputs / name) for name in spec.artifacts if name != "metrics"}
    returned = store_stages.RL_STAGES[spec.name](**arguments)
    if "metrics" in spec.artifacts:
        _write_metrics(outputs / "metrics", returned)
    for name, _ in spec.results:
        value = getattr(returned, name)
        text = str(value).lower() if isinstance(value, bool) else str(value)  # Argo's `when` reads true/false
        (outputs / name).write_text(text, encoding="utf-8")


if set(store_stages.RL_STAGES) != {s.name for s in RL_STEP}:  # pragma: no cover - caught on import
    raise RuntimeError("store_stages.RL_STAGES and gagar.pipeline.graph.RL_STEP name different stages")


def _checked(name: str, items: Sequence[str], io_root: str | Path) -> tuple[dict[str, Any], Path, Path]:
    """Typed arguments and the input and output directories of stage ``name``, inputs checked."""
    spec = stage(name)
    arguments = parse_arguments(spec, items)
    inputs, outputs = Path(io_root) / "inputs", Path(io_root) / "outputs"
    absent = [argument for argument in spec.artifact_inputs if not (inputs / argument).is_file()]
    if absent:
        raise ValueError(f"{name}: input artifacts missing under {inputs}: {', '.join(absent)}")
    return arguments, inputs, outputs


def run_stage(name: str, items: Sequence[str], io_root: str | Path = IO_ROOT) -> None:
    """Run stage ``name`` with ``name=value`` arguments, reading and writing under ``io_root``.

    Raises:
        ValueError: an unknown stage, bad arguments, or an input artifact that is not there (before
            anything runs); the stage's own errors propagate unchanged.
    """
    arguments, inputs, outputs = _checked(name, items, io_root)
    outputs.mkdir(parents=True, exist_ok=True)
    _call(stage(name), arguments, inputs, outputs)


def main(argv: Sequence[str] | None = None) -> int:
    """``STAGE [--io-root DIR] name=value ...``; exit status 2 on bad arguments, before the stage runs."""
    args = list(sys.argv[1:] if argv is None else argv)
    io_root = IO_ROOT
    if len(args) >= 3 and args[1] == "--io-root":
        io_root = args[2]
        del args[1:3]
    if not args:
        print(f"usage: python -m {USAGE}", file=sys.stderr)
        return 2
    try:
        _checked(args[0], args[1:], io_root)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_stage(args[0], args[1:], io_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
