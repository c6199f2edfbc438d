"""Kubernetes settings of the pipeline's tasks: image, CPU and memory, GPUs, store credentials,
timeout, retries.

They are compile-time options (``gagar pipeline compile``) and only shape the compiled YAML:
``kfp.local`` runs the same tasks as local processes and ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gagar import __version__
from gagar.pipeline.images import DEFAULT_REGISTRY, STAGES, stage_image

__all__ = [
    "DEFAULT_RESOURCES",
    "SETTINGS_KEYS",
    "PlatformOptions",
    "Resources",
    "configure",
    "parse_resources",
]

SETTINGS_KEYS = (
    "GAGAR_STORAGE__ENDPOINT",
    "GAGAR_STORAGE__REGION",
    "GAGAR_KUBERNETES__NAMESPACE",
)
"""Keys of the chart's settings ConfigMap every task gets as environment variables."""


@dataclass(frozen=True)
class Resources:
    """CPU and memory a stage's task requests and may use (Kubernetes quantities)."""

    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str

    def as_kubernetes(self) -> dict[str, dict[str, str]]:
        """``{"requests": {...}, "limits": {...}}`` of a container."""
        return {
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": {"cpu": self.cpu_limit, "memory": self.memory_limit},
        }


DEFAULT_RESOURCES: dict[str, Resources] = {
    "rollout": Resources("2", "4", "8Gi", "16Gi"),
    "sandbox": Resources("500m", "2", "1Gi", "4Gi"),
    "grader": Resources("1", "4", "4Gi", "8Gi"),
    "redistribute": Resources("250m", "1", "512Mi", "2Gi"),
    "train": Resources("2", "8", "16Gi", "32Gi"),
}
"""Requests and limits of each stage image's tasks unless the build says otherwise: rollout and
train hold the policy (GPU memory aside), the sandbox stage drives pods (or, with the local backend,
runs the tests itself), redistribute is numpy over one step's batch."""

LIGHT_TASKS = ("prepare", "gather", "select")
"""Tasks that only move files between the store and KFP: they get :data:`LIGHT` whatever their image."""
LIGHT = Resources("250m", "1", "1Gi", "4Gi")


def parse_resources(item: str) -> tuple[str, Resources]:
    """``"rollout=2/4,8Gi/16Gi"`` (stage image or light task = CPU request/limit, memory request/limit)
    -> that name and its resources.

    Raises:
        ValueError: naming the item when it is not of that form or names no stage image.
    """
    stage, sep, spec = item.partition("=")
    cpu, comma, memory = spec.partition(",")
    parts = [*cpu.split("/"), *memory.split("/")]
    if not sep or not comma or len(parts) != 4 or not all(p.strip() for p in parts):
        raise ValueError(f"--resources {item!r}: use STAGE=CPU_REQUEST/CPU_LIMIT,MEMORY_REQUEST/MEMORY_LIMIT")
    if stage not in (*STAGES, *LIGHT_TASKS):
        names = ", ".join((*STAGES, *LIGHT_TASKS))
        raise ValueError(f"--resources {item!r}: unknown stage {stage!r}, choose from {names}")
    return stage, Resources(*(p.strip() for p in parts))


@dataclass(frozen=True)
class PlatformOptions:
    """How the compiled tasks run on a cluster."""

    image_registry: str = DEFAULT_REGISTRY
    """Registry and organisation of the stage images (``<registry>/gagar-<stage>:<tag>``)."""
    image_tag: str = __version__
    """Tag of every stage image."""
    image_variant: str | None = None
    """``cpu``: the CPU variants of the stages whose release image needs CUDA (``make images``)."""
    images: tuple[tuple[str, str], ...] = ()
    """Full image reference per stage (the chart's ``images.<stage>``); stages not named use the above."""
    pull_secrets: tuple[str, ...] = ()
    """Image pull Secrets of every task (the chart's ``images.pullSecrets``)."""
    store_secret: str | None = "mlpipeline-minio-artifact"
    """Secret holding the S3 keys (KFP's own by default); None passes no credentials (e.g. IRSA)."""
    store_secret_keys: tuple[str, str] = ("accesskey", "secretkey")
    """Keys of the access key id and the secret key in that Secret."""
    settings_configmap: str | None = "gagar-settings"
    """The chart's settings ConfigMap (``<release>-settings``): store endpoint, sandbox namespace.
    Required: a task whose ConfigMap is missing fails to start instead of running without them."""
    accelerator_type: str = "nvidia.com/gpu"
    """Resource name of the GPUs."""
    gpus: tuple[tuple[str, int], ...] = (("rollout", 1), ("train", 1))
    """GPUs per task name; tasks not named get none."""
    resources: tuple[tuple[str, Resources], ...] = ()
    """Requests and limits per stage image (or light task), replacing the defaults for those named."""
    timeout_s: int = 6 * 3600
    """Deadline of every task."""
    retries: int = 2
    """Retries of a failed task (the train task is never retried: it publishes a checkpoint)."""

    def __post_init__(self) -> None:
        if self.timeout_s < 1 or self.retries < 0 or any(n < 0 for _, n in self.gpus):
            raise ValueError(f"timeout_s must be >= 1, retries and GPU counts >= 0: {self}")
        unknown = sorted(
            {stage for stage, _ in self.images} - set(STAGES)
            | {name for name, _ in self.resources} - {*STAGES, *LIGHT_TASKS}
        )
        if unknown:
            raise ValueError(f"unknown stage {unknown[0]!r}: choose from {', '.join(STAGES)}")

    def resources_of(self, task: str, image: str) -> Resources:
        """What task ``task``, in stage image ``image``, requests and may use."""
        given = dict(self.resources)
        if task.partition("-")[0] in LIGHT_TASKS:  # prepare-eval too
            return given.get(task.partition("-")[0], LIGHT)
        return given.get(image) or DEFAULT_RESOURCES[image]


def configure(task: Any, name: str, image: str, options: PlatformOptions, *, store: bool = True) -> Any:
    """Apply ``options`` to the pipeline task ``name`` that runs in stage image ``image``.

    ``store``: the task reads or writes the artifact store (it gets the credentials). Caching is off
    for every task: each step's outcome depends on the store's latest checkpoint.
    """
    from kfp import kubernetes

    task.set_container_image(
        dict(options.images).get(image)
        or stage_image(image, options.image_registry, options.image_tag, options.image_variant)
    )
    if options.pull_secrets:
        kubernetes.set_image_pull_secrets(task, list(options.pull_secrets))
    task.set_caching_options(False)
    if options.retries and name != "train":
        task.set_retry(options.retries, backoff_duration="30s", backoff_factor=2.0)
    kubernetes.set_timeout(task, options.timeout_s)
    wanted = options.resources_of(name, image)
    task.set_cpu_request(wanted.cpu_request).set_cpu_limit(wanted.cpu_limit)
    task.set_memory_request(wanted.memory_request).set_memory_limit(wanted.memory_limit)
    gpus = dict(options.gpus).get(name, 0)
    if gpus:
        task.set_accelerator_type(options.accelerator_type).set_accelerator_limit(gpus)
    if store and options.store_secret:
        access, secret = options.store_secret_keys
        kubernetes.use_secret_as_env(
            task,
            secret_name=options.store_secret,
            secret_key_to_env={access: "AWS_ACCESS_KEY_ID", secret: "AWS_SECRET_ACCESS_KEY"},
            optional=True,
        )
    if options.settings_configmap:
        kubernetes.use_config_map_as_env(
            task,
            config_map_name=options.settings_configmap,
            config_map_key_to_env={key: key for key in SETTINGS_KEYS},
            optional=False,
        )
    return task
