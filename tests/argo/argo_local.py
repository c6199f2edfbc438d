"""Run a compiled Argo Workflow on this machine the way Argo would, one container command per DAG task.

What the controller and executor do, reduced to what the GAGAR workflow uses: order the tasks by
their ``depends`` expressions (a task whose expression is false is Omitted, one whose ``when`` is
false is Skipped, as Argo marks them), resolve the task's arguments (``{{workflow.parameters.*}}``,
``{{tasks.T.outputs.*}}``) and the template's ``{{inputs.parameters.*}}``, place input artifacts at
their paths, resolve the container's ``env`` from the given Secrets and ConfigMaps, run the
container's command and collect the outputs from their paths. The pod's ``/tmp/gagar`` is a
directory of its own per task. Images, security contexts and retries are the cluster's business.

:func:`run_subprocess` runs each command as a process of its own (``python`` is this interpreter);
:func:`run_in_process` imports the ``python -m`` module once and calls its ``main(argv)`` under the
task's environment, which spares the suite a torch import per task.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Executor", "TaskRun", "run_in_process", "run_subprocess", "run_workflow"]

_TAG = re.compile(r"\{\{([^{}]+)\}\}")
IO_ROOT = "/tmp/gagar"

Executor = Callable[[list[str], dict[str, str]], tuple[int, str]]
"""Runs a container command with an environment; returns (exit status, stderr)."""


def run_subprocess(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """The command as a process of its own."""
    argv = [sys.executable if command[0] == "python" else command[0], *command[1:]]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    return result.returncode, result.stderr


def run_in_process(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """``python -m MODULE ARGS`` as ``MODULE.main(ARGS)`` in this process, ``env`` the environment."""
    assert command[:2] == ["python", "-m"], command
    main = importlib.import_module(command[2]).main
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return main(command[3:]), ""
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass
class TaskRun:
    """What one DAG task produced."""

    parameters: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, Path] = field(default_factory=dict)
    phase: str = "Succeeded"
    """Succeeded, Skipped (its ``when`` was false) or Omitted (its ``depends`` was false)."""


_TERM = re.compile(r"([A-Za-z0-9-]+)(?:\.([A-Za-z]+))?")


def _depends_on(task: dict[str, Any]) -> set[str]:
    return {m.group(1) for m in _TERM.finditer(task.get("depends", ""))}


def _depends_holds(expression: str, runs: dict[str, TaskRun]) -> bool:
    """Argo's ``depends``: ``A`` is ``A.Succeeded || A.Skipped || A.Daemoned``; ``&&``, ``||``, ``!``."""

    def term(match: re.Match[str]) -> str:
        name, phase = match.group(1), match.group(2)
        got = runs[name].phase
        return str(got in ("Succeeded", "Skipped") if phase is None else got == phase)

    python = _TERM.sub(term, expression).replace("&&", " and ").replace("||", " or ").replace("!", " not ")
    return bool(eval(python, {"__builtins__": {}}))  # only True/False/and/or/not


def _when_holds(expression: str, scope: dict[str, str]) -> bool:
    """Argo's ``when`` as the workflow uses it: ``LEFT == RIGHT`` after substitution."""
    left, op, right = _substitute(expression, scope).partition("==")
    assert op, f"unsupported when {expression!r}"
    return left.strip() == right.strip()


def _substitute(text: str, scope: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        key = match.group(1).strip()
        if key not in scope:
            raise KeyError(f"unresolved {{{{{key}}}}}")
        return scope[key]

    return _TAG.sub(value, text)


@dataclass
class _Cluster:
    """The namespace's Secrets and ConfigMaps, a work directory and how commands run."""

    work: Path
    secrets: dict[str, dict[str, str]]
    config_maps: dict[str, dict[str, str]]
    execute: Executor

    def env(self, container: dict[str, Any]) -> dict[str, str]:
        env = dict(os.environ)
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
                continue
            (kind, ref), *_ = item["valueFrom"].items()
            source = (self.secrets if kind == "secretKeyRef" else self.config_maps).get(ref["name"], {})
            if ref["key"] in source:
                env[item["name"]] = source[ref["key"]]
            elif not ref.get("optional"):
                raise KeyError(f"{kind} {ref['name']}/{ref['key']} is missing and not optional")
        return env

    def run(self, task: dict[str, Any], template: dict[str, Any], scope: dict[str, str], runs) -> TaskRun:
        root = self.work / task["name"]

        def local(path: str) -> Path:
            assert path.startswith(IO_ROOT + "/"), path
            return root / path[len(IO_ROOT) + 1 :]

        arguments = task["arguments"]
        inputs = {p["name"]: _substitute(p["value"], scope) for p in arguments.get("parameters", [])}
        assert {p["name"] for p in template["inputs"].get("parameters", [])} == set(inputs), task["name"]
        given = {a["name"]: a["from"] for a in arguments.get("artifacts", [])}
        for artifact in template["inputs"].get("artifacts", []):
            _, producer, _, _, name = _TAG.fullmatch(given[artifact["name"]]).group(1).split(".")
            target = local(artifact["path"])
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(runs[producer].artifacts[name], target)
        own = {f"inputs.parameters.{k}": v for k, v in inputs.items()}
        container = template["container"]
        args = [_substitute(a, own).replace(IO_ROOT, str(root)) for a in container["args"]]
        code, stderr = self.execute([*container["command"], *args], self.env(container))
        if code != 0:
            raise RuntimeError(f"task {task['name']} failed ({code}):\n{stderr[-3000:]}")
        outputs = template.get("outputs", {})
        run = TaskRun(artifacts={a["name"]: local(a["path"]) for a in outputs.get("artifacts", [])})
        for parameter in outputs.get("parameters", []):
            run.parameters[parameter["name"]] = local(parameter["valueFrom"]["path"]).read_text()
        missing = [name for name, path in run.artifacts.items() if not path.is_file()]
        assert not missing, f"task {task['name']} wrote no {missing}"
        return run


def run_workflow(
    manifest: dict[str, Any],
    arguments: dict[str, str],
    work: Path,
    *,
    secrets: dict[str, dict[str, str]] | None = None,
    config_maps: dict[str, dict[str, str]] | None = None,
    execute: Executor = run_subprocess,
) -> dict[str, TaskRun]:
    """Run every task of the entrypoint DAG in dependency order; returns each task's outputs."""
    spec = manifest["spec"]["workflowSpec"] if manifest["kind"] == "CronWorkflow" else manifest["spec"]
    scope = {f"workflow.parameters.{p['name']}": p.get("value") for p in spec["arguments"]["parameters"]}
    scope |= {f"workflow.parameters.{k}": v for k, v in arguments.items()}
    missing = sorted(k for k, v in scope.items() if v is None)
    if missing:
        raise ValueError(f"no value for {', '.join(missing)}")
    cluster = _Cluster(work, secrets or {}, config_maps or {}, execute)
    templates = {t["name"]: t for t in spec["templates"]}
    pending = list(templates[spec["entrypoint"]]["dag"]["tasks"])
    runs: dict[str, TaskRun] = {}
    while pending:
        task = next(t for t in pending if _depends_on(t) <= set(runs))
        pending.remove(task)
        if "depends" in task and not _depends_holds(task["depends"], runs):
            runs[task["name"]] = TaskRun(phase="Omitted")
            continue
        if "when" in task and not _when_holds(task["when"], scope):
            runs[task["name"]] = TaskRun(phase="Skipped")
            continue
        runs[task["name"]] = cluster.run(task, templates[task["template"]], scope, runs)
        scope |= {
            f"tasks.{task['name']}.outputs.parameters.{k}": v
            for k, v in runs[task["name"]].parameters.items()
        }
    return runs
