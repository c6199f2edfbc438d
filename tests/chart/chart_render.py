"""Render the gagar chart offline with the Helm SDK (helm-python-sdk): helpers of the chart tests."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import helm_python
import yaml
from helm_python import _native

__all__ = [
    "CHART_DIR",
    "MONITORING_API",
    "SCENARIOS",
    "TRAINER_API",
    "by_kind",
    "objects",
    "pod_specs",
    "render",
    "render_objects",
    "scenario_values",
]

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "gagar"
CI_DIR = CHART_DIR / "ci"
SCENARIOS = sorted(p.name.removesuffix("-values.yaml") for p in CI_DIR.glob("*-values.yaml"))
KUBE_VERSION = "1.30.0"
# What a cluster running the Prometheus operator advertises in .Capabilities.APIVersions.
MONITORING_API = ("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor")
# What a cluster running Kubeflow Trainer v2 advertises.
TRAINER_API = ("trainer.kubeflow.org/v1alpha1", "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime")
RELEASE = "gagar"
NAMESPACE = "kubeflow"


def scenario_values(scenario: str) -> dict[str, Any]:
    """The values of ``helm/gagar/ci/<scenario>-values.yaml``."""
    return yaml.safe_load((CI_DIR / f"{scenario}-values.yaml").read_text()) or {}


def render(
    values: dict[str, Any] | None = None,
    *,
    api_versions: Sequence[str] = (),
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    kube_version: str = KUBE_VERSION,
) -> dict[str, str]:
    """Render the chart as ``helm template`` would, returning ``{template path: manifest text}``.

    ``Chart.render`` of helm-python-sdk 0.2 does not expose the API versions the cluster would
    advertise, which the monitoring templates test; the native call it wraps accepts them
    (``api_versions``, ``kube_version``), so this goes through it directly.
    """
    options = {"name": name, "namespace": namespace, "kube_version": f"v{kube_version}", "is_install": True}
    if api_versions:
        options["api_versions"] = list(api_versions)
    with helm_python.Chart.load(CHART_DIR) as chart:
        rendered = _native.call_string(
            "helm_render", chart._raw(), json.dumps(values or {}), json.dumps(options)
        )
    manifests: dict[str, str] = json.loads(rendered)
    return manifests


def objects(manifests: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object of a rendering (NOTES.txt and empty documents left out)."""
    found: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        found.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return found


def render_objects(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """Render and parse in one call; see :func:`render`."""
    return objects(render(values, **kwargs))


def pod_specs(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(object name, pod spec)`` of every workload among ``objs``."""
    for obj in objs:
        if obj["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The objects of one kind."""
    return [o for o in objs if o["kind"] == kind]
