"""The Kubernetes objects of a run and of each evaluation.

Per run: a deny-all NetworkPolicy and one ConfigMap of the code every pod runs (the in-pod
runner and the judge's modules, about 50 KB). Per pod: a ConfigMap of its inputs (spec, the
model patches of its evaluations, the task's test patch and snapshot) and a hardened Pod that
mounts both ConfigMaps as one projected, read-only folder, so 10,000 evaluations store the
code once, not 10,000 times. A pod evaluates up to ``group_size`` trajectories of one task
(same image), each in its own isolated child (:mod:`gagar.sandbox.k8s.pod_runner`). The
runner's results come back as the container's termination message.

Every pod meets the ``restricted`` Pod Security Standard: non-root uid, no privilege
escalation, all capabilities dropped, RuntimeDefault seccomp, read-only root filesystem
(the repository lives in an emptyDir), no service-account token, no service links, a
deadline and resource requests and limits. Labels carry hashed ids only, so cleanup can
select a run's or an evaluation's objects whatever the trajectory ids look like.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client import ApiClient

from gagar.sandbox.base import Prediction
from gagar.sandbox.k8s.config import KubernetesSandboxConfig
from gagar.sandbox.pristine import MONITOR_MODULE, PLUGIN_MODULE, judged_paths
from gagar.schema.task import Task

__all__ = [
    "APP_LABEL",
    "CONFIGMAP_MAX_BYTES",
    "ObjectTooLargeError",
    "PodPlan",
    "build_code_configmap",
    "build_configmap",
    "build_network_policy",
    "build_pod",
    "code_configmap_name",
    "image_for",
    "plan_pod",
    "pod_deadline_s",
    "pod_labels",
    "render_objects_yaml",
    "run_labels",
    "to_dict",
]

APP_LABEL = {"app.kubernetes.io/name": "gagar-sandbox", "app.kubernetes.io/managed-by": "gagar"}
RUN_KEY, POD_KEY = "gagar.dev/run", "gagar.dev/pod"
CONFIGMAP_MAX_BYTES = 1024 * 1024 - 16 * 1024
"""Data a ConfigMap may carry: the API server's 1 MiB limit less room for metadata."""
INPUT_DIR, WORKSPACE_DIR, TMP_DIR = "/gagar/input", "/workspace", "/tmp"
RESULT_PATH = "/dev/termination-log"
"""The container's terminationMessagePath: where the runner writes its encoded summary."""
_RUNNER_SOURCE = resources.files("gagar.sandbox.k8s").joinpath("pod_runner.py").read_text(encoding="utf-8")
_SHIPPED = {
    "gagar_patch.py": "patch.py",
    "gagar_pristine.py": "pristine.py",
    f"{PLUGIN_MODULE}.py": "judge_plugin.py",
    f"{MONITOR_MODULE}.py": "judge_monitor.py",
    "gagar_forkserver.py": "forkserver_worker.py",
}
POD_SETUP_S = 300
"""Seconds a pod's deadline allows beyond its evaluations' own: image pull, repository copy."""
_SHIPPED_SOURCES = {
    name: resources.files("gagar.sandbox").joinpath(module).read_text(encoding="utf-8")
    for name, module in _SHIPPED.items()
}


class ObjectTooLargeError(ValueError):
    """The pod's inputs do not fit into one ConfigMap.

    ``policy_fault`` is True when the task's own inputs fit and the model patches tip them over.
    """

    def __init__(self, message: str, policy_fault: bool) -> None:
        super().__init__(message)
        self.policy_fault = policy_fault


@dataclass(frozen=True)
class PodPlan:
    """One pod: evaluations of one task in one image; ids are hex digests, safe as names and labels."""

    run_id: str
    pod_id: str
    nonce: str
    image: str
    task: Task
    predictions: tuple[Prediction, ...]

    @property
    def name(self) -> str:
        """Name of the pod and its ConfigMap (a DNS-1123 label)."""
        return f"gagar-sbx-{self.run_id[:8]}-{self.pod_id}"


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def image_for(config: KubernetesSandboxConfig, task: Task) -> str:
    """The image a task's pods run; raises ValueError when neither the task nor the backend names one."""
    image = task.environment.image or config.image
    if image is None:
        raise ValueError(f"task {task.instance_id!r} has no environment.image and the backend has no image")
    return image


def plan_pod(
    config: KubernetesSandboxConfig, run_id: str, seq: int, task: Task, predictions: Sequence[Prediction]
) -> PodPlan:
    """The plan of pod ``seq`` of run ``run_id``, evaluating ``predictions`` of ``task`` in turn."""
    if not predictions:
        raise ValueError("a pod needs at least one prediction")
    pod_id = _digest(f"{run_id}/{seq}/" + "/".join(p.key for p in predictions), 16)
    return PodPlan(run_id, pod_id, secrets.token_hex(16), image_for(config, task), task, tuple(predictions))


def pod_deadline_s(config: KubernetesSandboxConfig, evaluations: int) -> int:
    """activeDeadlineSeconds of a pod of ``evaluations``: each one's deadline plus the set-up."""
    return math.ceil(evaluations * config.limits.wall_time_s) + POD_SETUP_S


def run_labels(config: KubernetesSandboxConfig, run_id: str) -> dict[str, str]:
    """Labels of every object of one run (the user's extra labels first, ours win)."""
    return {**config.labels, **APP_LABEL, RUN_KEY: run_id}


def pod_labels(config: KubernetesSandboxConfig, plan: PodPlan) -> dict[str, str]:
    """Labels of one pod's objects."""
    return {**run_labels(config, plan.run_id), POD_KEY: plan.pod_id}


def _metadata(config: KubernetesSandboxConfig, plan: PodPlan) -> client.V1ObjectMeta:
    keys = json.dumps([p.key for p in plan.predictions])
    annotations = {"gagar.dev/instance-id": plan.task.instance_id, "gagar.dev/keys": keys[:4096]}
    return client.V1ObjectMeta(
        name=plan.name, namespace=config.namespace, labels=pod_labels(config, plan), annotations=annotations
    )


def _patch_name(position: int) -> str:
    return f"model-{position}.patch"


def _spec(config: KubernetesSandboxConfig, plan: PodPlan) -> dict[str, Any]:
    task, judge = plan.task, config.judge
    return {
        "nonce": plan.nonce,
        "patches": [_patch_name(i) for i in range(len(plan.predictions))],
        "limits": config.limits.model_dump(
            include={"wall_time_s", "cpu_time_s", "memory_bytes", "max_file_bytes", "max_output_bytes"}
        ),
        "repo_source": "snapshot" if task.snapshot is not None else "image",
        "image_repo_dir": config.image_repo_dir,
        "test_cmd": task.test_cmd or config.default_test_cmd,
        "max_log_chars": config.max_log_chars,
        "max_patch_bytes": config.max_patch_bytes,
        "max_report_bytes": config.max_report_bytes,
        "judged": sorted(judged_paths([*task.FAIL_TO_PASS, *task.PASS_TO_PASS], task.test_patch)),
        "shadowed": sorted(judge.shadowed),
        "test_dirs": list(judge.test_dirs),
        "tests": [*task.FAIL_TO_PASS, *task.PASS_TO_PASS],
    }


def code_configmap_name(run_id: str) -> str:
    """Name of the run's code ConfigMap."""
    return f"gagar-sandbox-code-{run_id[:8]}"


def build_code_configmap(config: KubernetesSandboxConfig, run_id: str) -> client.V1ConfigMap:
    """What every pod of the run executes: the runner, the judge's modules and its empty pytest.ini."""
    data = {"runner.py": _RUNNER_SOURCE, **_SHIPPED_SOURCES, "pytest.ini": "[pytest]\n"}
    return client.V1ConfigMap(
        api_version="v1",
        kind="ConfigMap",
        metadata=client.V1ObjectMeta(
            name=code_configmap_name(run_id), namespace=config.namespace, labels=run_labels(config, run_id)
        ),
        data=data,
    )


def build_configmap(config: KubernetesSandboxConfig, plan: PodPlan) -> client.V1ConfigMap:
    """The pod's own read-only inputs (spec, model patches, test patch, snapshot).

    Raises:
        ObjectTooLargeError: they exceed what one ConfigMap holds (1 MiB).
    """
    patches = {_patch_name(i): p.model_patch for i, p in enumerate(plan.predictions)}
    data = {"spec.json": json.dumps(_spec(config, plan)), **patches, "test.patch": plan.task.test_patch}
    if plan.task.snapshot is not None:
        data["snapshot.json"] = json.dumps(plan.task.snapshot)
    sizes = {key: len(key) + len(value.encode("utf-8")) for key, value in data.items()}
    total = sum(sizes.values())
    if total > CONFIGMAP_MAX_BYTES:
        largest = max(sizes, key=sizes.__getitem__)
        keys = ", ".join(repr(p.key) for p in plan.predictions)
        raise ObjectTooLargeError(
            f"inputs of {keys} take {total} bytes, over the ConfigMap limit of "
            f"{CONFIGMAP_MAX_BYTES} (largest: {largest}, {sizes[largest]} bytes)",
            policy_fault=total - sum(sizes[k] for k in patches) <= CONFIGMAP_MAX_BYTES,
        )
    return client.V1ConfigMap(api_version="v1", kind="ConfigMap", metadata=_metadata(config, plan), data=data)


def container_resources(config: KubernetesSandboxConfig) -> client.V1ResourceRequirements:
    """Requests and limits of a sandbox container (the config's ``resources``)."""
    res = config.resources
    return client.V1ResourceRequirements(
        requests={
            "cpu": res.cpu_request,
            "memory": res.memory_request,
            "ephemeral-storage": res.ephemeral_storage_request,
        },
        limits={
            "cpu": res.cpu_limit,
            "memory": res.memory_limit,
            "ephemeral-storage": res.ephemeral_storage_limit,
        },
    )


def container_security(config: KubernetesSandboxConfig, uid: int | None = None) -> client.V1SecurityContext:
    """A sandbox container's security context: non-root (``uid``, default ``run_as_user``), no
    capabilities, read-only root."""
    uid = config.run_as_user if uid is None else uid
    return client.V1SecurityContext(
        allow_privilege_escalation=False,
        privileged=False,
        capabilities=client.V1Capabilities(drop=["ALL"]),
        read_only_root_filesystem=True,
        run_as_non_root=True,
        run_as_user=uid,
        run_as_group=uid,
        seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
    )


def pod_spec(
    config: KubernetesSandboxConfig,
    container: client.V1Container,
    volumes: list[client.V1Volume],
    deadline_s: int,
    uid: int | None = None,
) -> client.V1PodSpec:
    """The hardened spec of a sandbox pod (restricted Pod Security Standard) running ``container``
    as ``uid`` (default ``run_as_user``)."""
    uid = config.run_as_user if uid is None else uid
    return client.V1PodSpec(
        restart_policy="Never",
        active_deadline_seconds=deadline_s,
        termination_grace_period_seconds=5,
        automount_service_account_token=False,
        enable_service_links=False,
        service_account_name=config.service_account_name,
        runtime_class_name=config.runtime_class_name,
        security_context=client.V1PodSecurityContext(
            run_as_non_root=True,
            run_as_user=uid,
            run_as_group=uid,
            fs_group=uid,
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        ),
        containers=[container],
        volumes=volumes,
    )


def _container(config: KubernetesSandboxConfig, plan: PodPlan) -> client.V1Container:
    return client.V1Container(
        name="sandbox",
        image=plan.image,
        image_pull_policy="IfNotPresent",
        command=[
            config.runner_python,
            f"{INPUT_DIR}/runner.py",
            INPUT_DIR,
            WORKSPACE_DIR,
            RESULT_PATH,
            TMP_DIR,
        ],
        working_dir=WORKSPACE_DIR,
        env=[client.V1EnvVar(name="HOME", value="/tmp"), client.V1EnvVar(name="TMPDIR", value="/tmp")],
        resources=container_resources(config),
        security_context=container_security(config),
        volume_mounts=[
            client.V1VolumeMount(name="input", mount_path=INPUT_DIR, read_only=True),
            client.V1VolumeMount(name="workspace", mount_path=WORKSPACE_DIR),
            client.V1VolumeMount(name="tmp", mount_path=TMP_DIR),
        ],
        termination_message_path=RESULT_PATH,
        termination_message_policy="FallbackToLogsOnError",
    )


def build_pod(config: KubernetesSandboxConfig, plan: PodPlan) -> client.V1Pod:
    """The hardened pod that runs the plan's evaluations (restricted Pod Security Standard)."""
    res = config.resources
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=_metadata(config, plan),
        spec=pod_spec(
            config,
            _container(config, plan),
            [
                client.V1Volume(
                    name="input",
                    projected=client.V1ProjectedVolumeSource(
                        default_mode=0o444,
                        sources=[
                            client.V1VolumeProjection(
                                config_map=client.V1ConfigMapProjection(name=code_configmap_name(plan.run_id))
                            ),
                            client.V1VolumeProjection(
                                config_map=client.V1ConfigMapProjection(name=plan.name)
                            ),
                        ],
                    ),
                ),
                client.V1Volume(
                    name="workspace", empty_dir=client.V1EmptyDirVolumeSource(size_limit=res.workspace_size)
                ),
                client.V1Volume(name="tmp", empty_dir=client.V1EmptyDirVolumeSource(size_limit=res.tmp_size)),
            ],
            pod_deadline_s(config, len(plan.predictions)),
        ),
    )


def build_network_policy(config: KubernetesSandboxConfig, run_id: str) -> client.V1NetworkPolicy:
    """Deny all ingress and egress to every sandbox pod of the namespace (no rules = nothing allowed)."""
    return client.V1NetworkPolicy(
        api_version="networking.k8s.io/v1",
        kind="NetworkPolicy",
        metadata=client.V1ObjectMeta(
            name=f"gagar-sandbox-deny-all-{run_id[:8]}",
            namespace=config.namespace,
            labels=run_labels(config, run_id),
        ),
        spec=client.V1NetworkPolicySpec(
            pod_selector=client.V1LabelSelector(
                match_labels={"app.kubernetes.io/name": APP_LABEL["app.kubernetes.io/name"]}
            ),
            policy_types=["Ingress", "Egress"],
        ),
    )


def to_dict(obj: Any) -> dict[str, Any]:
    """A kubernetes client model as the plain dict the API server receives (camelCase keys, no nulls)."""
    return ApiClient().sanitize_for_serialization(obj)


def render_objects_yaml(
    task: Task, prediction: Prediction, config: KubernetesSandboxConfig, run_id: str = "0" * 12
) -> str:
    """The NetworkPolicy and code ConfigMap of a run, the ConfigMap and Pod of one evaluation, as YAML."""
    plan = plan_pod(config, run_id, 0, task, [prediction])
    objs = [
        build_network_policy(config, run_id),
        build_code_configmap(config, run_id),
        build_configmap(config, plan),
        build_pod(config, plan),
    ]
    return yaml.safe_dump_all([to_dict(o) for o in objs], sort_keys=False)
