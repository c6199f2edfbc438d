"""Every scenario renders, lints strictly, and yields objects valid against the Kubernetes schemas."""

from __future__ import annotations

from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
from chart_render import (
    CHART_DIR,
    KUBE_VERSION,
    MONITORING_API,
    TRAINER_API,
    by_kind,
    render_objects,
    scenario_values,
)

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


# The fields of Kubeflow Trainer's ClusterTrainingRuntime (trainer.kubeflow.org/v1alpha1) the chart
# uses, as its CRD declares them (kubeflow/trainer manifests/base/crds/
# trainer.kubeflow.org_clustertrainingruntimes.yaml @ ec2c640); each replicated job's template is a
# batch/v1 JobTemplateSpec, validated with the Kubernetes schemas below.
_RUNTIME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "trainer.kubeflow.org/v1alpha1"},
        "kind": {"const": "ClusterTrainingRuntime"},
        "metadata": {"type": "object", "required": ["name", "labels"], "not": {"required": ["namespace"]}},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "mlPolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "numNodes": {"type": "integer"},
                        "torch": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "numProcPerNode": {
                                    "anyOf": [
                                        {"type": "integer", "minimum": 1},
                                        {"enum": ["auto", "cpu", "gpu"]},
                                    ]
                                }
                            },
                        },
                    },
                },
                "template": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "spec": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "replicatedJobs": {
                                    "type": "array",
                                    "minItems": 1,
                                    "items": {
                                        "type": "object",
                                        "required": ["name", "template"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "name": {"type": "string"},
                                            "template": {"type": "object"},
                                        },
                                    },
                                }
                            },
                        }
                    },
                },
            },
        },
    },
}


def _validate_runtime(obj: dict[str, Any]) -> None:
    jsonschema.validate(obj, _RUNTIME_SCHEMA)
    for job in obj["spec"]["template"]["spec"]["replicatedJobs"]:
        as_job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job["name"]}}
        kubernetes_validate.validate(as_job | job["template"], KUBE_VERSION, strict=True)


def _validate(obj: dict[str, Any]) -> None:
    if obj["apiVersion"].startswith("trainer.kubeflow.org/"):
        _validate_runtime(obj)
    elif obj["apiVersion"].startswith("monitoring.coreos.com/"):
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


@pytest.mark.parametrize(
    ("api_versions", "enabled", "expected"), [((), True, 0), (TRAINER_API, False, 0), (TRAINER_API, True, 1)]
)
def test_training_runtime_needs_the_trainer_api_and_the_switch(
    api_versions: tuple[str, ...], enabled: bool, expected: int
) -> None:
    objs = render_objects({"trainer": {"enabled": enabled}}, api_versions=api_versions)
    runtimes = by_kind(objs, "ClusterTrainingRuntime")
    assert len(runtimes) == expected
    rules = by_kind(objs, "Role")
    runner = next(r for r in rules if r["metadata"]["name"].endswith("-runner"))
    assert any("trainjobs" in rule["resources"] for rule in runner["rules"]) == enabled


def test_trainer_scenario_runtime_runs_the_train_image_under_torchrun() -> None:
    objs = render_objects(scenario_values("trainer"), api_versions=TRAINER_API)
    (runtime,) = by_kind(objs, "ClusterTrainingRuntime")
    assert runtime["metadata"]["name"] == "gagar-torch"  # the pipeline's train_runtime
    assert runtime["spec"]["mlPolicy"]["torch"]["numProcPerNode"] == 4
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    (node,) = job["template"]["spec"]["template"]["spec"]["containers"]
    assert node["name"] == "node"
    assert "/gagar-project/gagar-train:" in node["image"]
    assert node["command"] == ["torchrun", "-m", "gagar", "train-update"]
    assert {e["name"] for e in node["env"]} >= {"GAGAR_STORAGE__ENDPOINT", "AWS_ACCESS_KEY_ID"}


def test_warm_lora_scenario_syncs_adapters_beside_the_policy_server() -> None:
    objs = render_objects(scenario_values("warm-lora"))
    policy = next(d for d in by_kind(objs, "Deployment") if d["metadata"]["name"].endswith("policy-server"))
    pod = policy["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert "--enable-lora" in containers["vllm"]["args"]
    env = {e["name"]: e.get("value") for e in containers["vllm"]["env"]}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    sync = containers["adapter-sync"]
    assert sync["command"] == ["gagar", "serve", "adapter-sync"]
    assert sync["args"][:4] == ["--storage", "s3://mlpipeline/gagar/runs/lora", "--dest", "/adapters"]
    mounts = {c: {m["name"]: m for m in containers[c]["volumeMounts"]} for c in containers}
    assert mounts["vllm"]["adapters"]["readOnly"] is True
    assert "readOnly" not in mounts["adapter-sync"]["adapters"]
    assert {"name": "adapters", "emptyDir": {}} in pod["volumes"]
