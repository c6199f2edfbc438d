"""Build one of the pipelines with compile-time options and compile it to KFP YAML.

The pipelines are modules of :mod:`gagar.pipelines` and their components live in
:mod:`gagar.components` (``<stage>/component.py``): both ship inside the package, so an
installed wheel compiles them from any directory, with no source checkout on ``sys.path``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from gagar.pipeline.graph import DEFAULT_MAX_GEN_BATCHES
from gagar.pipeline.parameters import ParameterValue
from gagar.pipeline.platform import PlatformOptions

__all__ = ["PIPELINES", "build_pipeline", "compile_pipeline", "executor_images"]

PIPELINES = {
    "rl": "gagar.pipelines.rl",
    "grader-sft": "gagar.pipelines.grader_sft",
    "evaluation": "gagar.pipelines.evaluation",
}
"""Pipeline name -> its module."""


def _module(name: str) -> ModuleType:
    if name not in PIPELINES:
        raise ValueError(f"unknown pipeline {name!r}: choose one of {', '.join(PIPELINES)}")
    return importlib.import_module(PIPELINES[name])


def build_pipeline(
    name: str,
    *,
    steps_per_run: int = 1,
    options: PlatformOptions | None = None,
    max_gen_batches: int | None = None,
    defaults: Mapping[str, ParameterValue] | None = None,
) -> Any:
    """The pipeline ``name`` (a KFP ``GraphComponent``), ``defaults`` replacing some of its
    parameters' defaults; ``steps_per_run`` and ``max_gen_batches`` (None: the rl pipeline's
    default) apply to ``rl`` only.

    Raises:
        ValueError: an unknown name, or ``steps_per_run`` or ``max_gen_batches`` given for another pipeline.
    """
    module = _module(name)
    if name == "rl":
        bound = DEFAULT_MAX_GEN_BATCHES if max_gen_batches is None else max_gen_batches
        return module.build(steps_per_run, options, bound, defaults)
    if steps_per_run != 1:
        raise ValueError(f"--steps-per-run applies to the rl pipeline only, not {name!r}")
    if max_gen_batches is not None:
        raise ValueError(f"--max-gen-batches applies to the rl pipeline only, not {name!r}")
    return module.build(options, defaults)


def compile_pipeline(
    name: str,
    out: str | os.PathLike[str],
    *,
    steps_per_run: int = 1,
    options: PlatformOptions | None = None,
    max_gen_batches: int | None = None,
    defaults: Mapping[str, ParameterValue] | None = None,
) -> Path:
    """Compile pipeline ``name`` to the KFP YAML ``out`` (the file the Kubeflow UI uploads), its
    parameters' defaults replaced by ``defaults``."""
    from kfp import compiler

    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    pipeline = build_pipeline(
        name, steps_per_run=steps_per_run, options=options, max_gen_batches=max_gen_batches, defaults=defaults
    )
    compiler.Compiler().compile(pipeline, str(target))
    return target


def executor_images(path: str | os.PathLike[str]) -> dict[str, str]:
    """Executor name -> container image of a compiled pipeline file."""
    documents = [d for d in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")) if d]
    spec = next((d for d in documents if "deploymentSpec" in d), None)
    if spec is None:
        raise ValueError(f"{path}: not a compiled KFP pipeline (no deploymentSpec)")
    executors = spec["deploymentSpec"]["executors"]
    return {name: e["container"]["image"] for name, e in executors.items()}
