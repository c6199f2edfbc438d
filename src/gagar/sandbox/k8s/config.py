"""Settings of the Kubernetes sandbox backend: one typed model per concern."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gagar.sandbox.hacks import JudgeConfig
from gagar.sandbox.limits import SandboxLimits

__all__ = ["KubernetesSandboxConfig", "ResourceSpec", "RetryPolicy"]

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class RetryPolicy(BaseModel):
    """How API calls that fail with 409, 429 or 5xx are retried."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=5, ge=1)
    """Attempts per call that fails with 409 or 5xx, the first one included."""
    max_throttled: int = Field(default=30, ge=1)
    """429 answers one call may get before it gives up (each waits Retry-After or backs off)."""
    base_delay_s: float = Field(default=0.5, gt=0)
    """Delay before the second attempt; doubled for each further one."""
    max_delay_s: float = Field(default=30.0, gt=0)
    """Cap on one delay, Retry-After included."""
    jitter: float = Field(default=0.25, ge=0, le=1)
    """Each delay is multiplied by a uniform factor in [1 - jitter, 1 + jitter]."""


class ResourceSpec(BaseModel):
    """Requests and limits of the sandbox container, in Kubernetes quantity strings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_request: str = "500m"
    cpu_limit: str = "2"
    memory_request: str = "1Gi"
    memory_limit: str = "4Gi"
    ephemeral_storage_request: str = "1Gi"
    ephemeral_storage_limit: str = "4Gi"
    workspace_size: str = "2Gi"
    """sizeLimit of the emptyDir holding the repository copy."""
    tmp_size: str = "512Mi"
    """sizeLimit of the emptyDir mounted on /tmp (also HOME)."""


class KubernetesSandboxConfig(BaseSettings):
    """Where and how the sandbox pods run; each field reads ``GAGAR_KUBERNETES__<FIELD>`` from the env."""

    model_config = SettingsConfigDict(env_prefix="GAGAR_KUBERNETES__", extra="ignore", frozen=True)

    namespace: str = "gagar-sandbox"
    """Namespace of the pods, ConfigMaps and the NetworkPolicy."""
    image: str | None = None
    """Image for tasks whose ``environment.image`` is unset; it needs python3 (and git or patch)."""
    image_repo_dir: str = "/testbed"
    """Where the repository sits in a task image, for tasks without a bundled snapshot (SWE-bench layout)."""
    runner_python: str = "python3"
    """Interpreter in the image that runs the in-pod runner (standard library only)."""
    default_test_cmd: str = "python -m pytest -q -p no:cacheprovider"
    """Test command for tasks whose ``test_cmd`` is unset; PYTEST_ADDOPTS pins pytest and loads the judge."""
    runtime_class_name: str | None = None
    """RuntimeClass of the pods, e.g. ``gvisor``; None uses the cluster default."""
    service_account_name: str | None = None
    """ServiceAccount of the pods (its token is never mounted); None uses the namespace default."""
    run_as_user: int = Field(default=65532, ge=1)
    """Non-root uid the container runs as."""
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    group_size: int = Field(default=8, ge=1)
    """Evaluations of one task and image one pod runs, one after another, each in its own isolated child."""
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    """What one evaluation may use inside its pod, as in the local sandbox (env GAGAR_LIMITS__...):
    past ``wall_time_s`` it is a timeout; CPU, address space, processes and file size are rlimits."""
    start_deadline_s: float = Field(default=600.0, gt=0)
    """A pod not running this long after creation is an infra_error (unschedulable, slow pull, ...)."""
    session_deadline_s: int = Field(default=7200, ge=60)
    """Longest an agent's session pod lives (its activeDeadlineSeconds). A session ends with its
    conversation; this bounds what a command left running after its rollout was killed."""
    ttl_s: int = Field(default=3600, ge=60)
    """Objects of this backend older than this are swept at the start of each evaluate()."""
    max_concurrency: int = Field(default=16, ge=1)
    """Evaluations in flight at once (in pods that, with their ConfigMaps, exist at the same time)."""
    delete_batch_s: float = Field(default=5.0, ge=0)
    """Finished pods (and their ConfigMaps) are deleted together, one request per kind, this often
    (every half second while new pods wait for room under max_concurrency)."""
    api_workers: int = Field(default=16, ge=1)
    """Threads issuing API requests (creates, deletes, log reads); also the connection pool's size."""
    create_rate_per_s: float = Field(default=10.0, gt=0)
    """Highest API request rate of the client-side token bucket, all requests together (it adapts to 429s)."""
    burst: int = Field(default=20, ge=1)
    """Requests the token bucket allows at once."""
    watch_timeout_s: int = Field(default=60, ge=1)
    """Server-side timeout of one watch request; the watch then resumes from its last version."""
    step_quorum: float = Field(default=1.0, gt=0, le=1)
    """Share of a call's evaluations after which the rest are stragglers, given straggler_wait_s more."""
    straggler_wait_s: float = Field(default=60.0, ge=0)
    """How long stragglers may still finish once step_quorum is back; then they are infra_error."""
    step_deadline_s: float | None = Field(default=None, gt=0)
    """Longest one evaluate() call may take; evaluations not back by then are infra_error. None: no limit."""
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels on every object (e.g. team, cost centre)."""
    max_patch_bytes: int = Field(default=512 * 1024, ge=1)
    """Model patches larger than this are refused before any object is created."""
    max_log_chars: int = Field(default=20_000, ge=100)
    """Test output kept in each TestResult."""
    max_report_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest judge report the in-pod runner reads back."""
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    """What the pristine judge resets and flags (the local backend's; env GAGAR_JUDGE__...)."""

    @field_validator("namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError(f"namespace {value!r} is not a DNS-1123 label")
        return value

    @field_validator("labels")
    @classmethod
    def _valid_labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not _LABEL_KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
                raise ValueError(f"label key {key!r} is not a valid Kubernetes label key")
            if not _LABEL_VALUE.match(val):
                raise ValueError(f"label value {val!r} (key {key!r}) is not a valid Kubernetes label value")
        return value
