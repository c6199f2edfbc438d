"""The RL pipeline as an Argo Workflow or CronWorkflow, for clusters running Argo without KFP.

Built from :data:`gagar.pipeline.graph.RL_STEP`, the stage list the KFP pipeline is built from:
one container template per stage in that stage's image, running ``python -m
gagar.pipeline.argo_entry STAGE`` (the same :mod:`gagar.pipeline.store_stages` call as the KFP
component), and a DAG template chaining ``steps_per_run`` RL steps (step i+1's prepare after step
i's train). Each step's generation stages are unrolled ``max_gen_batches`` times: batch b+1's rollout
runs ``when`` batch b's gather says the train batch is short, its later tasks are omitted otherwise,
and select ``depends`` on every batch, drawn or not. The workflow's parameters are the KFP
pipeline's (:data:`~gagar.pipeline.graph.PARAMETERS`); the stage artifacts go to the S3 artifact
repository the workflow references; the options of :class:`~gagar.pipeline.platform.PlatformOptions`
(images, GPUs, store credentials, settings, deadline, retries) mean what they mean for KFP. Every pod
runs with the restricted Pod Security Standard's settings; the sandbox stage runs under the
ServiceAccount allowed to create evaluation pods in the sandbox namespace.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from gagar.pipeline.argo_entry import IO_ROOT, setting_argument
from gagar.pipeline.graph import DEFAULT_MAX_GEN_BATCHES, REFILL, RL_STEP, Stage, generation_stages, stage
from gagar.pipeline.images import stage_image
from gagar.pipeline.parameters import PARAMETERS, ParameterValue
from gagar.pipeline.platform import SETTINGS_KEYS, PlatformOptions

__all__ = [
    "API_VERSION",
    "CLUSTER_DEFAULTS",
    "CONTAINER_SECURITY_CONTEXT",
    "POD_SECURITY_CONTEXT",
    "SANDBOX_POD_STAGES",
    "ArgoOptions",
    "CronSchedule",
    "build_cron_workflow",
    "build_workflow",
    "compile_argo",
    "format_value",
    "parse_repository",
    "to_yaml",
]

API_VERSION = "argoproj.io/v1alpha1"
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "fsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""Pod security context of every stage pod (restricted PSS; uid 1000 is the images' user)."""
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""Container security context of every stage container; ``/tmp`` is a writable emptyDir."""
SANDBOX_POD_STAGES = ("sandbox", "rollout")
"""Stages that start pods in the sandbox namespace: the judge's evaluations, and the tool-loop agent's
RUN_TESTS of the visible tests during rollout (``agent`` is a run parameter, so the rollout always gets
the account)."""
_STORE_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,?-]+$")


CLUSTER_DEFAULTS: dict[str, ParameterValue] = {"sandbox_backend": "kubernetes"}
"""Parameter defaults of every compiled Workflow, which runs on a cluster: the tests run in sandbox pods."""


@dataclass(frozen=True)
class ArgoOptions:
    """What the Argo target adds to :class:`PlatformOptions`: names, accounts, artifact repository."""

    name: str = "gagar-rl"
    """CronWorkflow name, or the Workflow's ``generateName`` prefix."""
    namespace: str | None = None
    """Namespace written into the manifest; None leaves it to ``kubectl -n`` / ``argo -n``."""
    service_account: str | None = "gagar-runner"
    """ServiceAccount of the stage pods (the chart's ``<release>-runner``); None: the namespace default."""
    sandbox_service_account: str | None = "gagar-runner"
    """ServiceAccount of the stages that start sandbox pods (:data:`SANDBOX_POD_STAGES`): the one bound
    to the sandbox namespace's pod Role."""
    artifact_repository: tuple[str, str] | None = ("gagar-argo-artifacts", "s3")
    """``(ConfigMap, key)`` of the S3 artifact repository; None uses the namespace's default one."""
    parameters: tuple[tuple[str, ParameterValue], ...] = ()
    """Values of pipeline parameters (``name``, ``value``) replacing their defaults."""
    labels: tuple[tuple[str, str], ...] = (("app.kubernetes.io/part-of", "gagar"),)
    """Labels of the manifest and of every workflow it creates."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", self.name) or len(self.name) > 52:
            raise ValueError(f"name {self.name!r} must be a DNS label of at most 52 characters")
        known = [p.name for p in PARAMETERS]
        unknown = sorted({name for name, _ in self.parameters} - set(known))
        if unknown:
            raise ValueError(
                f"unknown pipeline parameters {', '.join(unknown)}: choose from {', '.join(known)}"
            )


@dataclass(frozen=True)
class CronSchedule:
    """When a CronWorkflow runs; each run resumes from the store's latest checkpoint."""

    cron: str
    """Five-field cron (minute hour day-of-month month day-of-week), e.g. ``0 2 * * *``."""
    timezone: str = "UTC"
    """IANA time zone the schedule is read in."""
    starting_deadline_s: int = 3600
    """A run missed (controller down) by more than this is skipped rather than started late."""
    history: int = 3
    """Finished workflows kept, successful and failed each."""

    def __post_init__(self) -> None:
        fields = self.cron.split()
        if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
            raise ValueError(
                f"schedule {self.cron!r}: Argo takes a 5-field cron (minute hour day month weekday), "
                "e.g. '0 2 * * *'; KFP's 6-field form with seconds first is not accepted"
            )
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {self.timezone!r}: use an IANA name, e.g. Europe/Berlin"
            ) from None
        if self.starting_deadline_s < 0 or self.history < 1:
            raise ValueError(f"starting_deadline_s must be >= 0 and history >= 1: {self}")


def parse_repository(text: str) -> tuple[str, str] | None:
    """``CONFIGMAP/KEY`` -> ``(configmap, key)``; an empty text means the namespace's default repository.

    Raises:
        ValueError: text that is not two non-empty names separated by a slash.
    """
    if not text:
        return None
    config_map, sep, key = text.partition("/")
    if not sep or not config_map or not key or "/" in key:
        raise ValueError(f"artifact repository {text!r}: use CONFIGMAP/KEY, e.g. artifact-repositories/s3")
    return config_map, key


def format_value(value: ParameterValue) -> str:
    """A parameter value as Argo text: booleans lower case (what ``argo_entry`` reads back)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _path(kind: str, name: str) -> str:
    return f"{IO_ROOT}/{kind}/{name}"


def _env(spec: Stage, platform: PlatformOptions) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    if spec.store and platform.store_secret:
        for key, variable in zip(platform.store_secret_keys, _STORE_ENV, strict=True):
            ref = {"name": platform.store_secret, "key": key, "optional": True}
            env.append({"name": variable, "valueFrom": {"secretKeyRef": ref}})
    if platform.settings_configmap:
        for key in SETTINGS_KEYS:
            ref = {"name": platform.settings_configmap, "key": key, "optional": True}
            env.append({"name": key, "valueFrom": {"configMapKeyRef": ref}})
    return env


def _container_template(spec: Stage, platform: PlatformOptions, argo: ArgoOptions) -> dict[str, Any]:
    """The template of one stage: a container in its image running ``argo_entry``."""
    values = [setting_argument(p.name) for p in PARAMETERS]  # every stage takes the settings whole
    values += list(spec.value_inputs)
    values += ["gen_batch"] if spec.takes_gen_batch else []
    values += ["ends_run"] if spec.takes_ends_run else []
    files = spec.artifact_inputs
    container: dict[str, Any] = {
        "name": "main",
        "image": stage_image(spec.image, platform.image_registry, platform.image_tag, platform.image_variant),
        "command": ["python", "-m", "gagar.pipeline.argo_entry"],
        "args": [spec.name, "--io-root", IO_ROOT, *(f"{n}={{{{inputs.parameters.{n}}}}}" for n in values)],
        "env": _env(spec, platform),
        "securityContext": CONTAINER_SECURITY_CONTEXT,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    container["resources"] = platform.resources_of(spec.name, spec.image).as_kubernetes()
    gpus = dict(platform.gpus).get(spec.name, 0)
    if gpus:
        container["resources"]["limits"][platform.accelerator_type] = str(gpus)
    outputs: dict[str, Any] = {
        "artifacts": [
            {"name": n, "path": _path("outputs", n), "archive": {"none": {}}} for n in spec.artifacts
        ]
    }
    if spec.results:
        outputs["parameters"] = [
            {"name": n, "valueFrom": {"path": _path("outputs", n)}} for n, _ in spec.results
        ]
    template: dict[str, Any] = {
        "name": spec.name,
        "metadata": {"labels": {"app.kubernetes.io/component": spec.name, "gagar/stage-image": spec.image}},
        "inputs": {
            "parameters": [{"name": n} for n in values],
            **({"artifacts": [{"name": n, "path": _path("inputs", n)} for n in files]} if files else {}),
        },
        "outputs": outputs,
        "activeDeadlineSeconds": str(platform.timeout_s),
        "container": container,
    }
    if platform.retries and spec.name != "train":  # train publishes a checkpoint: never retried
        template["retryStrategy"] = {
            "limit": str(platform.retries),
            "retryPolicy": "OnError",
            "backoff": {"duration": "30s", "factor": "2"},
        }
    if spec.name in SANDBOX_POD_STAGES and argo.sandbox_service_account:
        template["serviceAccountName"] = argo.sandbox_service_account
    return template


def _task_name(spec: Stage, index: int, gen_batch: int | None) -> str:
    return f"{spec.name}-{index}" if gen_batch is None else f"{spec.name}-{index}-{gen_batch}"


def _source_task(source: str, index: int, gen_batch: int | None) -> str:
    return _task_name(stage(source), index, gen_batch if stage(source).per_gen_batch else None)


def _depends(spec: Stage, index: int, gen_batch: int | None, max_gen_batches: int) -> str | None:
    """Argo ``depends`` of a task: its inputs' tasks; a generation batch's tasks need the earlier
    ones of their batch to have succeeded (not been skipped); select waits for every batch, drawn
    or skipped."""
    terms = []
    for _, source, _ in spec.inputs:
        name = _source_task(source, index, gen_batch)
        term = f"{name}.Succeeded" if stage(source).per_gen_batch else name
        if term not in terms:
            terms.append(term)
    if spec is generation_stages()[0] and gen_batch:
        terms.append(f"{_task_name(stage(REFILL[0]), index, gen_batch - 1)}.Succeeded")
    if spec.name == "select":
        last = stage(REFILL[0])
        terms.append(f"{_task_name(last, index, 0)}.Succeeded")
        for b in range(1, max_gen_batches):
            name = _task_name(last, index, b)
            terms.append(f"({name}.Succeeded || {name}.Skipped || {name}.Omitted)")
    if not spec.inputs and index > 0:
        terms.append(f"{RL_STEP[-1].name}-{index - 1}")
    unique = list(dict.fromkeys(terms))
    return " && ".join(unique) if unique else None


def _dag_task(
    spec: Stage, index: int, gen_batch: int | None, max_gen_batches: int, steps_per_run: int
) -> dict[str, Any]:
    """Step ``index``'s task of stage ``spec`` (of generation batch ``gen_batch`` for a per-batch
    stage): parameters from the workflow, inputs from earlier tasks."""
    parameters = [
        {"name": setting_argument(p.name), "value": f"{{{{workflow.parameters.{p.name}}}}}"}
        for p in PARAMETERS
    ]
    if spec.takes_gen_batch:
        parameters.append({"name": "gen_batch", "value": str(gen_batch)})
    if spec.takes_ends_run:
        parameters.append({"name": "ends_run", "value": format_value(index == steps_per_run - 1)})
    artifacts = []
    for name, source, output in spec.inputs:
        task = _source_task(source, index, gen_batch)
        if stage(source).output_type(output) is None:
            artifacts.append({"name": name, "from": f"{{{{tasks.{task}.outputs.artifacts.{output}}}}}"})
        else:
            parameters.append({"name": name, "value": f"{{{{tasks.{task}.outputs.parameters.{output}}}}}"})
    task: dict[str, Any] = {"name": _task_name(spec, index, gen_batch), "template": spec.name}
    depends = _depends(spec, index, gen_batch, max_gen_batches)
    if depends:
        task["depends"] = depends
    if spec.per_gen_batch and gen_batch and spec is generation_stages()[0]:
        source, output = REFILL
        previous = _task_name(stage(source), index, gen_batch - 1)
        task["when"] = f"{{{{tasks.{previous}.outputs.parameters.{output}}}}} == true"
    arguments: dict[str, Any] = {"parameters": parameters}
    if artifacts:
        arguments["artifacts"] = artifacts
    task["arguments"] = arguments
    return task


def _step_tasks(index: int, max_gen_batches: int, steps_per_run: int) -> list[dict[str, Any]]:
    """Every task of RL step ``index``: the generation stages once per batch, unrolled."""
    tasks = []
    for spec in RL_STEP:
        if not spec.per_gen_batch:
            tasks.append(_dag_task(spec, index, None, max_gen_batches, steps_per_run))
        elif spec is generation_stages()[0]:
            for b in range(max_gen_batches):
                tasks += [_dag_task(s, index, b, max_gen_batches, steps_per_run) for s in generation_stages()]
    return tasks


def _workflow_spec(
    steps_per_run: int, platform: PlatformOptions, argo: ArgoOptions, max_gen_batches: int
) -> dict[str, Any]:
    if steps_per_run < 1:
        raise ValueError(f"steps_per_run must be at least 1, got {steps_per_run}")
    if max_gen_batches < 1:
        raise ValueError(f"max_gen_batches must be at least 1, got {max_gen_batches}")
    given = {**CLUSTER_DEFAULTS, **dict(argo.parameters)}
    arguments = []
    for p in PARAMETERS:
        chosen = given.get(p.name, p.default)
        value = None if chosen is None else format_value(chosen)
        entry: dict[str, Any] = {"name": p.name} if value is None else {"name": p.name, "value": value}
        arguments.append(entry | {"description": p.description})
    dag = [task for i in range(steps_per_run) for task in _step_tasks(i, max_gen_batches, steps_per_run)]
    spec: dict[str, Any] = {
        "entrypoint": "rl",
        "arguments": {"parameters": arguments},
        "securityContext": POD_SECURITY_CONTEXT,
        "volumes": [{"name": "tmp", "emptyDir": {}}],
        "podGC": {"strategy": "OnPodSuccess"},
        "podMetadata": {"labels": dict(argo.labels)},
        "templates": [
            {"name": "rl", "dag": {"tasks": dag}},
            *(_container_template(s, platform, argo) for s in RL_STEP),
        ],
    }
    if argo.service_account:
        spec["serviceAccountName"] = argo.service_account
    if argo.artifact_repository:
        config_map, key = argo.artifact_repository
        spec["artifactRepositoryRef"] = {"configMap": config_map, "key": key}
    return spec


def _metadata(argo: ArgoOptions, *, generate: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {"generateName": f"{argo.name}-"} if generate else {"name": argo.name}
    if argo.namespace:
        metadata["namespace"] = argo.namespace
    metadata["labels"] = dict(argo.labels)
    return metadata


def build_workflow(
    steps_per_run: int = 1,
    platform: PlatformOptions | None = None,
    argo: ArgoOptions | None = None,
    max_gen_batches: int = DEFAULT_MAX_GEN_BATCHES,
) -> dict[str, Any]:
    """The RL pipeline as a Workflow manifest (``argo submit`` / ``kubectl create`` it)."""
    argo = argo or ArgoOptions()
    return {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": _metadata(argo, generate=True),
        "spec": _workflow_spec(steps_per_run, platform or PlatformOptions(), argo, max_gen_batches),
    }


def build_cron_workflow(
    schedule: CronSchedule,
    steps_per_run: int = 1,
    platform: PlatformOptions | None = None,
    argo: ArgoOptions | None = None,
    max_gen_batches: int = DEFAULT_MAX_GEN_BATCHES,
) -> dict[str, Any]:
    """The RL pipeline as a CronWorkflow: one run at a time (``Forbid``), runs resume the store."""
    argo = argo or ArgoOptions()
    return {
        "apiVersion": API_VERSION,
        "kind": "CronWorkflow",
        "metadata": _metadata(argo, generate=False),
        "spec": {
            "schedules": [schedule.cron],
            "timezone": schedule.timezone,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": schedule.starting_deadline_s,
            "successfulJobsHistoryLimit": schedule.history,
            "failedJobsHistoryLimit": schedule.history,
            "workflowMetadata": {"labels": dict(argo.labels)},
            "workflowSpec": _workflow_spec(
                steps_per_run, platform or PlatformOptions(), argo, max_gen_batches
            ),
        },
    }


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-objects (the security contexts) out in full instead of as YAML aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(manifest: dict[str, Any]) -> str:
    """A manifest as YAML in its own field order, without anchors or aliases."""
    return yaml.dump(manifest, Dumper=_PlainDumper, sort_keys=False, width=120)


def compile_argo(
    out: str | os.PathLike[str],
    *,
    steps_per_run: int = 1,
    platform: PlatformOptions | None = None,
    argo: ArgoOptions | None = None,
    schedule: CronSchedule | None = None,
    max_gen_batches: int = DEFAULT_MAX_GEN_BATCHES,
) -> dict[str, Any]:
    """Write the Workflow, or with ``schedule`` the CronWorkflow, to the YAML file ``out``; returns it."""
    manifest = (
        build_workflow(steps_per_run, platform, argo, max_gen_batches)
        if schedule is None
        else build_cron_workflow(schedule, steps_per_run, platform, argo, max_gen_batches)
    )
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(to_yaml(manifest), encoding="utf-8")
    return manifest
