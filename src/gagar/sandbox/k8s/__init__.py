"""The Kubernetes sandbox backend: objects, rate limits and retries, the pod watch, outcomes, the backend."""

from gagar.sandbox.k8s.backend import EvalSession, KubernetesBackend, RunStats, load_apis, pack
from gagar.sandbox.k8s.config import KubernetesSandboxConfig, ResourceSpec, RetryPolicy
from gagar.sandbox.k8s.objects import (
    ObjectTooLargeError,
    PodPlan,
    build_code_configmap,
    build_configmap,
    build_network_policy,
    build_pod,
    plan_pod,
    render_objects_yaml,
    to_dict,
)
from gagar.sandbox.k8s.ratelimit import BucketStats, TokenBucket, call_with_retry
from gagar.sandbox.k8s.straggler import StragglerPolicy

__all__ = [
    "BucketStats",
    "EvalSession",
    "KubernetesBackend",
    "KubernetesSandboxConfig",
    "ObjectTooLargeError",
    "PodPlan",
    "ResourceSpec",
    "RetryPolicy",
    "RunStats",
    "StragglerPolicy",
    "TokenBucket",
    "build_code_configmap",
    "build_configmap",
    "build_network_policy",
    "build_pod",
    "call_with_retry",
    "load_apis",
    "pack",
    "plan_pod",
    "render_objects_yaml",
    "to_dict",
]
