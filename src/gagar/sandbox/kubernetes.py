"""Kubernetes sandbox backend: one hardened pod per evaluation (code in :mod:`gagar.sandbox.k8s`)."""

from gagar.sandbox.k8s import KubernetesBackend, KubernetesSandboxConfig, render_objects_yaml

__all__ = ["KubernetesBackend", "KubernetesSandboxConfig", "render_objects_yaml"]
