"""Every scenario renders, lints strictly, and yields objects valid against the Kubernetes schemas."""

from __future__ import annotations

from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
from chart_render import CHART_DIR, KUBE_VERSION, MONITORING_API, by_kind, render_objects, scenario_values

from gagar.pipeline.argo_models import to_model, validate_pods

# The Prometheus operator's CRDs have no schema in kubernetes-validate: these are the fields of
# monitoring.coreos.com/v1 the chart uses, checked structurally (unknown fields refused).
_METADATA = {
    "type": "object",
    "required": ["name", "namespace", "labels"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": {"type": "object"}},
    "additionalProperties": False,
}
_CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "ServiceMonitor"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "additionalProperties": False,
                "properties": {
                    "selector": {
                        "type": "object",
                        "required": ["matchLabels"],
                        "properties": {"matchLabels": {"type": "object", "minProperties": 1}},
                        "additionalProperties": False,
                    },
                    "namespaceSelector": {
                        "type": "object",
                        "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                        "additionalProperties": False,
                    },
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["port"],
                            "additionalProperties": False,
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string", "pattern": "^/"},
                                "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                                "honorLabels": {"type": "boolean"},
                            },
                        },
                    },
                },
            },
        },
    },
    "PrometheusRule": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["groups"],
                "additionalProperties": False,
                "properties": {
                    "groups": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["name", "rules"],
                            "properties": {
                                "name": {"type": "string"},
                                "interval": {"type": "string"},
                                "rules": {
                                    "type": "array",
                                    "minItems": 1,
                                    "items": {
                                        "type": "object",
                                        "required": ["expr"],
                                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                        "additionalProperties": False,
                                        "properties": {
                                            "alert": {"type": "string"},
                                            "record": {"type": "string"},
                                            "expr": {"type": ["string", "integer"]},
                                            "for": {"type": "string"},
                                            "keep_firing_for": {"type": "string"},
                                            "labels": {"type": "object"},
                                            "annotations": {"type": "object"},
                                        },
                                    },
                                },
                            },
                            "additionalProperties": False,
                        },
                    }
                },
            },
        },
    },
}


def _validate(obj: dict[str, Any]) -> None:
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        jsonschema.validate(obj, _CRD_SCHEMAS[obj["kind"]])
    elif obj["apiVersion"].startswith("argoproj.io/"):  # the argo-workflows SDK's models, then its pods
        to_model(obj)
        validate_pods(obj, KUBE_VERSION)
    else:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_lint_is_clean_in_strict_mode(scenario: str) -> None:
    report = helm_python.lint(
        CHART_DIR, scenario_values(scenario), strict=True, kube_version=f"v{KUBE_VERSION}"
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [], report
    assert problems == [], problems


def test_every_object_is_schema_valid(scenario_objects: list[dict[str, Any]]) -> None:
    assert scenario_objects
    for obj in scenario_objects:
        _validate(obj)


def test_every_object_carries_the_recommended_labels(scenario_objects: list[dict[str, Any]]) -> None:
    for obj in scenario_objects:
        labels = obj["metadata"]["labels"]
        for key in ("name", "instance", "component", "version", "managed-by", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, (obj["kind"], obj["metadata"]["name"], key)


def test_object_identities_are_unique(scenario_objects: list[dict[str, Any]]) -> None:
    identities = [
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in scenario_objects
    ]
    assert len(identities) == len(set(identities))


def test_structural_crd_check_refuses_an_unknown_field() -> None:
    objs = render_objects({}, api_versions=MONITORING_API)
    monitor = by_kind(objs, "ServiceMonitor")[0]
    monitor["spec"]["endpoints"][0]["scrapeEvery"] = "1m"
    with pytest.raises(jsonschema.ValidationError, match="scrapeEvery"):
        _validate(monitor)


@pytest.mark.parametrize(
    ("api_versions", "enabled", "expected"),
    [
        ((), True, 0),
        (MONITORING_API, False, 0),
        (MONITORING_API, True, 1),
    ],
)
def test_monitoring_objects_need_the_api_and_the_switch(
    api_versions: tuple[str, ...], enabled: bool, expected: int
) -> None:
    values = {"monitoring": {"serviceMonitor": {"enabled": enabled}, "prometheusRule": {"enabled": enabled}}}
    objs = render_objects(values, api_versions=api_versions)
    assert len(by_kind(objs, "PrometheusRule")) == expected
    assert len(by_kind(objs, "ServiceMonitor")) == expected  # the Pushgateway's; vLLM servers are off
    assert len(by_kind(objs, "Deployment")) == 1  # the Pushgateway itself does not depend on the API


def test_monitoring_scenario_monitors_pushgateway_and_both_servers() -> None:
    objs = render_objects(scenario_values("monitoring"), api_versions=MONITORING_API)
    monitors = {
        m["metadata"]["labels"]["app.kubernetes.io/component"]: m for m in by_kind(objs, "ServiceMonitor")
    }
    assert set(monitors) == {"pushgateway", "policy-server", "grader-server"}
    assert monitors["pushgateway"]["spec"]["endpoints"][0]["honorLabels"] is True
    for monitor in monitors.values():
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert monitor["spec"]["endpoints"][0]["interval"] == "15s"


def test_minimal_scenario_renders_only_sandbox_rbac_and_launcher() -> None:
    objs = render_objects(scenario_values("minimal"), api_versions=MONITORING_API)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == [
        "ConfigMap",
        "ConfigMap",
        "Namespace",
        "NetworkPolicy",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "ServiceAccount",
    ]
