"""The train stage's distributed update on a cluster: a Kubeflow Trainer v2 TrainJob.

The train stage uploads the step's trajectories and train batch to the run's store, then creates a
``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) against the ClusterTrainingRuntime the chart installs
(``gagar-torch``): ``numNodes`` pods of the train image, each running ``torchrun -m gagar
train-update`` with ``numProcPerNode`` processes (torchrun reads the ``PET_*`` rendezvous variables the
Trainer's torch plugin sets). Every rank downloads the inputs; rank 0 publishes checkpoint
``step-N`` to the store. The stage waits for the job's ``Complete`` or ``Failed`` condition, logs its
status changes and, at the end, the node-0 pod's log, and deletes the job.

The object is built from kubernetes-client models (env, resources) and validated, before it is sent,
against the TrainJob CRD's OpenAPI schema vendored in ``schemas/`` (see its README for its source,
commit and what the excerpt keeps). Without the Trainer's CRD on the cluster
(:func:`trainer_installed`) the stage updates in its own pod instead.

On a cluster the runner's ServiceAccount needs to create, get, list and delete ``trainjobs`` and to
list pods and read their logs in its namespace (the chart's runner Role grants it with ``trainer.enabled``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "API_VERSION",
    "GROUP",
    "PLURAL",
    "TRAINJOB_CRD",
    "TrainJobError",
    "TrainJobSpec",
    "build_trainjob",
    "job_state",
    "run_trainjob",
    "trainer_installed",
    "update_args",
    "validate_trainjob",
]

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "trainjobs"
TRAINJOB_CRD = f"{PLURAL}.{GROUP}"
SCHEMA = Path(__file__).parent / "schemas" / "trainjob-v1alpha1.yaml"
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class TrainJobError(RuntimeError):
    """The TrainJob failed, timed out, or was refused; the message has its status and log tail."""


@dataclass(frozen=True)
class TrainJobSpec:
    """What one distributed update needs from the cluster."""

    name: str
    """The TrainJob's name (a DNS label of at most 63 characters)."""
    runtime: str
    """The ClusterTrainingRuntime it runs on (the chart's ``gagar-torch``)."""
    args: tuple[str, ...]
    """``gagar train-update`` arguments, after ``torchrun -m gagar train-update``."""
    image: str | None = None
    """The image every node runs; None: the runtime's (the chart's runtime runs the train image)."""
    nodes: int = 1
    procs_per_node: int = 1
    env: tuple[tuple[str, str], ...] = ()
    """Plain environment variables (store endpoint, region)."""
    secret_env: tuple[tuple[str, str, str], ...] = ()
    """``(variable, secret, key)``: variables from a Secret (the store's keys)."""
    gpus_per_node: int = 0
    accelerator: str = "nvidia.com/gpu"
    labels: tuple[tuple[str, str], ...] = (("app.kubernetes.io/part-of", "gagar"),)


def build_trainjob(spec: TrainJobSpec) -> dict[str, Any]:
    """The TrainJob object (a dict, its env and resources serialised from kubernetes-client models)."""
    from kubernetes.client import (
        ApiClient,
        V1EnvVar,
        V1EnvVarSource,
        V1ResourceRequirements,
        V1SecretKeySelector,
    )

    env = [V1EnvVar(name=k, value=v) for k, v in spec.env]
    for var, secret, key in spec.secret_env:
        selector = V1SecretKeySelector(name=secret, key=key, optional=True)
        env.append(V1EnvVar(name=var, value_from=V1EnvVarSource(secret_key_ref=selector)))
    trainer: dict[str, Any] = {
        "command": ["torchrun", "-m", "gagar", "train-update"],
        "args": list(spec.args),
        "numNodes": spec.nodes,
        "numProcPerNode": spec.procs_per_node,
        "env": ApiClient().sanitize_for_serialization(env),
    }
    if spec.image is not None:
        trainer["image"] = spec.image
    if spec.gpus_per_node:
        resources = V1ResourceRequirements(limits={spec.accelerator: str(spec.gpus_per_node)})
        trainer["resourcesPerNode"] = ApiClient().sanitize_for_serialization(resources)
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": spec.name, "labels": dict(spec.labels)},
        "spec": {"runtimeRef": {"apiGroup": GROUP, "kind": "ClusterTrainingRuntime", "name": spec.runtime},
                 "trainer": trainer},
    }  # fmt: skip


def _strict(schema: Any) -> Any:
    """The CRD schema as JSON Schema that refuses undeclared fields (the API server would prune them)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in schema and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


@cache
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(_strict(yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))))


def validate_trainjob(obj: Mapping[str, Any]) -> None:
    """Check ``obj`` against the vendored TrainJob CRD schema and its name rules.

    Raises:
        ValueError: naming every offending field path and what is wrong there.
    """
    errors = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(_validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != "TrainJob":
        errors.append(f"apiVersion/kind: expected {API_VERSION} TrainJob")
    name = str(obj.get("metadata", {}).get("name", ""))
    if not _NAME.match(name):
        errors.append(f"metadata.name: {name!r} must match RFC 1035 DNS label format")
    if len(name) > 63:
        errors.append(f"metadata.name: {name!r} must be no more than 63 characters")
    if errors:
        raise ValueError("TrainJob does not match the Kubeflow Trainer CRD schema: " + "; ".join(errors))


def trainer_installed(api_client: Any, namespace: str) -> bool:
    """Whether the cluster serves Kubeflow Trainer's TrainJob in ``namespace`` (its CRD is installed).

    Asked by listing TrainJobs there, which the runner's namespaced Role allows: no CRD answers 404.
    """
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    try:
        CustomObjectsApi(api_client).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, limit=1)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def job_state(obj: Mapping[str, Any]) -> str | None:
    """``Complete`` or ``Failed`` once the TrainJob has ended (its condition True); else None."""
    for condition in obj.get("status", {}).get("conditions", []):
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return None


def _describe(obj: Mapping[str, Any]) -> str:
    conditions = obj.get("status", {}).get("conditions", [])
    return "; ".join(
        f"{c.get('type')}={c.get('status')} ({c.get('reason')}: {c.get('message')})" for c in conditions
    )


def _node_log(core: Any, namespace: str, name: str, tail: int = 200) -> str:
    """The log of the TrainJob's first node pod (the JobSet the Trainer makes is named after the job)."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items
    if not pods:
        return "(no pod found)"
    first = sorted(pods, key=lambda p: p.metadata.name)[0]
    return str(core.read_namespaced_pod_log(first.metadata.name, namespace, tail_lines=tail))


def run_trainjob(
    obj: Mapping[str, Any],
    namespace: str,
    api_client: Any,
    *,
    timeout_s: float = 6 * 3600,
    poll_s: float = 10.0,
    log: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Create the TrainJob, wait until it completes, log its status changes and its node-0 log; delete it.

    Returns:
        The job as last read (its status).

    Raises:
        ValueError: the object does not match the CRD schema (nothing is created).
        TrainJobError: it failed or did not finish within ``timeout_s``.
    """
    from kubernetes.client import CoreV1Api, CustomObjectsApi

    validate_trainjob(obj)
    custom, core = CustomObjectsApi(api_client), CoreV1Api(api_client)
    name = obj["metadata"]["name"]
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, dict(obj))
    log(f"created TrainJob {namespace}/{name} on runtime {obj['spec']['runtimeRef']['name']}")
    deadline, seen = time.monotonic() + timeout_s, ""
    try:
        while True:
            current = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            status = _describe(current)
            if status != seen:
                log(f"TrainJob {name}: {status or 'pending'}")
                seen = status
            state = job_state(current)
            if state is not None:
                tail = _node_log(core, namespace, name)
                log(f"TrainJob {name} {state}; node 0 log:\n{tail}")
                if state == "Failed":
                    raise TrainJobError(f"TrainJob {namespace}/{name} failed: {status}\n{tail[-3000:]}")
                return current
            if time.monotonic() > deadline:
                raise TrainJobError(f"TrainJob {namespace}/{name} not done after {timeout_s:.0f} s: {status}")
            sleep(poll_s)
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def update_args(
    *, settings: str, policy: str, step: int, trajectories: str, batch: str, policy_version: str | None
) -> tuple[str, ...]:
    """``gagar train-update`` arguments of a distributed update reading its inputs from the store."""
    args = ["--settings", settings, "--policy", policy, "--step", str(step)]
    args += ["--trajectories", trajectories, "--batch", batch]
    return (*args, *(("--policy-version", policy_version) if policy_version else ()))
