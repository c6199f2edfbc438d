"""Find the project's pipelines, build one with compile-time options, compile it to KFP YAML.

The pipelines live in ``pipelines/`` and their components in ``components/`` at the project root
(a checkout, or ``/opt/gagar`` in the train image), found through ``GAGAR_PROJECT_ROOT``, the
working directory and its parents, or the source tree this package was installed from.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from gagar.pipeline.platform import PlatformOptions

__all__ = ["PIPELINES", "build_pipeline", "compile_pipeline", "executor_images", "project_root"]

PIPELINES = {"rl": "pipelines.rl", "grader-sft": "pipelines.grader_sft", "evaluation": "pipelines.evaluation"}
"""Pipeline name -> module under the project root."""


def _is_root(path: Path) -> bool:
    return (path / "pipelines" / "rl.py").is_file() and (path / "components").is_dir()


def project_root() -> Path:
    """The directory holding ``pipelines/`` and ``components/``.

    Raises:
        FileNotFoundError: none of the places searched holds them.
    """
    env = os.environ.get("GAGAR_PROJECT_ROOT")
    cwd = Path.cwd().resolve()
    candidates = [Path(env)] if env else []
    candidates += [cwd, *cwd.parents, Path(__file__).resolve().parents[3]]
    for candidate in candidates:
        if _is_root(candidate):
            return candidate
    raise FileNotFoundError(
        "no pipelines/rl.py and components/ found in GAGAR_PROJECT_ROOT, the working directory or its "
        "parents: run from a GAGAR checkout or set GAGAR_PROJECT_ROOT"
    )


def _module(name: str) -> ModuleType:
    if name not in PIPELINES:
        raise ValueError(f"unknown pipeline {name!r}: choose one of {', '.join(PIPELINES)}")
    root = str(project_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(PIPELINES[name])


def build_pipeline(name: str, *, steps_per_run: int = 1, options: PlatformOptions | None = None) -> Any:
    """The pipeline ``name`` (a KFP ``GraphComponent``); ``steps_per_run`` applies to ``rl`` only.

    Raises:
        ValueError: an unknown name, or ``steps_per_run`` other than 1 for another pipeline.
    """
    module = _module(name)
    if name == "rl":
        return module.build(steps_per_run, options)
    if steps_per_run != 1:
        raise ValueError(f"--steps-per-run applies to the rl pipeline only, not {name!r}")
    return module.build(options)


def compile_pipeline(
    name: str, out: str | os.PathLike[str], *, steps_per_run: int = 1, options: PlatformOptions | None = None
) -> Path:
    """Compile pipeline ``name`` to the KFP YAML ``out`` (the file the Kubeflow UI uploads)."""
    from kfp import compiler

    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(
        build_pipeline(name, steps_per_run=steps_per_run, options=options), str(target)
    )
    return target


def executor_images(path: str | os.PathLike[str]) -> dict[str, str]:
    """Executor name -> container image of a compiled pipeline file."""
    documents = [d for d in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")) if d]
    spec = next((d for d in documents if "deploymentSpec" in d), None)
    if spec is None:
        raise ValueError(f"{path}: not a compiled KFP pipeline (no deploymentSpec)")
    executors = spec["deploymentSpec"]["executors"]
    return {name: e["container"]["image"] for name, e in executors.items()}
