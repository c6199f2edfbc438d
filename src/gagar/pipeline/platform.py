"""Kubernetes settings of the pipeline's tasks: image, GPUs, store credentials, timeout, retries.

They are compile-time options (``gagar pipeline compile``) and only shape the compiled YAML:
``kfp.local`` runs the same tasks as local processes and ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gagar import __version__
from gagar.pipeline.images import DEFAULT_REGISTRY, STAGES, stage_image

__all__ = ["SETTINGS_KEYS", "PlatformOptions", "configure"]

SETTINGS_KEYS = (
    "GAGAR_STORAGE__ENDPOINT",
    "GAGAR_STORAGE__REGION",
    "GAGAR_KUBERNETES__NAMESPACE",
)
"""Keys of the chart's settings ConfigMap every task gets as environment variables."""


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
    timeout_s: int = 6 * 3600
    """Deadline of every task."""
    retries: int = 2
    """Retries of a failed task (the train task is never retried: it publishes a checkpoint)."""

    def __post_init__(self) -> None:
        if self.timeout_s < 1 or self.retries < 0 or any(n < 0 for _, n in self.gpus):
            raise ValueError(f"timeout_s must be >= 1, retries and GPU counts >= 0: {self}")
        unknown = sorted({stage for stage, _ in self.images} - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stage {unknown[0]!r} in images: choose from {', '.join(STAGES)}")


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
