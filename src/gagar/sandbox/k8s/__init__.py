"""The Kubernetes sandbox backend: objects, rate limits and retries, the pod watch, outcomes, the backend."""

from gagar.sandbox.k8s.backend import KubernetesBackend, RunStats, load_apis
from gagar.sandbox.k8s.config import KubernetesSandboxConfig, ResourceSpec, RetryPolicy
from gagar.sandbox.k8s.objects import (
    EvalPlan,
    ObjectTooLargeError,
    build_code_configmap,
    build_configmap,
    build_network_policy,
    build_pod,
    plan_evaluation,
    render_objects_yaml,
    to_dict,
)
from gagar.sandbox.k8s.ratelimit import BucketStats, TokenBucket, call_with_retry
from gagar.sandbox.k8s.straggler import StragglerPolicy

__all__ = [
    "BucketStats",
    "EvalPlan",
    "KubernetesBackend",
    "KubernetesSandboxConfig",
    "ObjectTooLargeError",
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
    "plan_evaluation",
    "render_objects_yaml",
    "to_dict",
]
