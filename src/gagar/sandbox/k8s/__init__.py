"""The Kubernetes sandbox backend: object builders, rate limiting and retries, pod outcomes, the backend."""

from gagar.sandbox.k8s.backend import KubernetesBackend, load_apis
from gagar.sandbox.k8s.config import KubernetesSandboxConfig, ResourceSpec, RetryPolicy
from gagar.sandbox.k8s.objects import (
    EvalPlan,
    ObjectTooLargeError,
    build_configmap,
    build_network_policy,
    build_pod,
    plan_evaluation,
    render_objects_yaml,
    to_dict,
)
from gagar.sandbox.k8s.ratelimit import TokenBucket, call_with_retry

__all__ = [
    "EvalPlan",
    "KubernetesBackend",
    "KubernetesSandboxConfig",
    "ObjectTooLargeError",
    "ResourceSpec",
    "RetryPolicy",
    "TokenBucket",
    "build_configmap",
    "build_network_policy",
    "build_pod",
    "call_with_retry",
    "load_apis",
    "plan_evaluation",
    "render_objects_yaml",
    "to_dict",
]
