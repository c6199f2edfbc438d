"""The chart's Argo CronWorkflow: the compiled one, adapted to the release, valid for Argo and Kubernetes."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
import yaml
from chart_render import CHART_DIR, KUBE_VERSION, by_kind, render_objects, scenario_values

from gagar.pipeline.argo import CronSchedule, build_cron_workflow
from gagar.pipeline.argo_models import pod_manifests, to_manifest, to_model, validate_pods
from gagar.pipeline.graph import RL_STEP

REQUIRED = {"policy": "s3://b/models/policy", "tasks": "s3://b/tasks.jsonl"}


@pytest.fixture(scope="module")
def argo_objects() -> list[dict[str, Any]]:
    return render_objects(scenario_values("argo"))


def cron_of(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (cron,) = by_kind(objs, "CronWorkflow")
    return cron


def test_cron_workflow_round_trips_through_the_sdk_and_its_pods_validate(
    argo_objects: list[dict[str, Any]],
) -> None:
    cron = cron_of(argo_objects)
    assert to_manifest(to_model(cron)) == cron
    assert validate_pods(cron, KUBE_VERSION) == len(RL_STEP)


def test_the_stages_and_their_wiring_are_the_compiled_ones(argo_objects: list[dict[str, Any]]) -> None:
    rendered = cron_of(argo_objects)["spec"]["workflowSpec"]
    compiled = build_cron_workflow(CronSchedule("0 2 * * *"))["spec"]["workflowSpec"]
    assert rendered["templates"][0] == compiled["templates"][0]  # the DAG
    for mine, source in zip(rendered["templates"][1:], compiled["templates"][1:], strict=True):
        assert mine["name"] == source["name"]
        assert (mine["inputs"], mine["outputs"]) == (source["inputs"], source["outputs"])
        assert mine["container"]["args"] == source["container"]["args"]
        assert mine.get("retryStrategy") == source.get("retryStrategy")


def test_release_settings_replace_the_compiled_defaults(argo_objects: list[dict[str, Any]]) -> None:
    cron = cron_of(argo_objects)
    spec = cron["spec"]
    assert (cron["metadata"]["name"], cron["metadata"]["namespace"]) == ("gagar-rl", "kubeflow")
    assert spec["schedules"] == ["30 3 * * 1-5"]
    assert spec["timezone"] == "Europe/Berlin"
    assert spec["concurrencyPolicy"] == "Forbid"
    workflow = spec["workflowSpec"]
    assert workflow["serviceAccountName"] == "gagar-runner"
    assert workflow["imagePullSecrets"] == [{"name": "registry-credentials"}]
    (repository,) = [
        o for o in by_kind(argo_objects, "ConfigMap") if o["metadata"]["name"] == "gagar-argo-artifacts"
    ]
    assert workflow["artifactRepositoryRef"] == {"configMap": "gagar-argo-artifacts", "key": "s3"}
    values = {p["name"]: p["value"] for p in workflow["arguments"]["parameters"]}
    assert values["policy"] == "s3://mlpipeline/gagar/models/sft-policy"
    assert values["storage"] == "s3://mlpipeline/gagar/runs/gagar-rl"
    assert (values["rollout_group_size"], values["advantage_norm_std"], values["advantage_algo"]) == (
        "16",
        "false",
        "gagar",
    )
    assert values["sandbox_backend"] == "kubernetes"  # the chart's compiled default
    for pod in pod_manifests(cron):
        container = pod["spec"]["containers"][0]
        stage = pod["metadata"]["labels"]["gagar/stage-image"]
        assert container["image"] == f"registry.example.com/gagar-project/gagar-{stage}:1.2.3"
        assert pod["spec"]["serviceAccountName"] == "gagar-runner"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        for env in container["env"]:
            ref = env["valueFrom"].get("configMapKeyRef") or env["valueFrom"]["secretKeyRef"]
            assert ref["name"] in {"gagar-settings", "mlpipeline-minio-artifact"}
    s3 = yaml.safe_load(repository["data"]["s3"])["s3"]
    assert s3["endpoint"] == "seaweedfs.kubeflow.svc.cluster.local:8333"
    assert s3["accessKeySecret"] == {"name": "mlpipeline-minio-artifact", "key": "accesskey"}


def test_artifact_repository_is_what_argo_reads(argo_objects: list[dict[str, Any]]) -> None:
    from argo_workflows.configuration import Configuration
    from argo_workflows.model.io_argoproj_workflow_v1alpha1_artifact_repository import (
        IoArgoprojWorkflowV1alpha1ArtifactRepository,
    )
    from argo_workflows.model_utils import validate_and_convert_types

    from gagar.pipeline.argo_models import unknown_fields

    (repository,) = [
        o for o in by_kind(argo_objects, "ConfigMap") if o["metadata"]["name"] == "gagar-argo-artifacts"
    ]
    data = yaml.safe_load(repository["data"]["s3"])
    model = validate_and_convert_types(
        data,
        (IoArgoprojWorkflowV1alpha1ArtifactRepository,),
        ["s3"],
        True,
        True,
        configuration=Configuration(),
    )
    assert unknown_fields(model) == []
    assert model.s3.bucket == "mlpipeline"


def test_beside_the_kfp_recurring_run_and_off_by_default() -> None:
    assert by_kind(render_objects(), "CronWorkflow") == []
    both = render_objects({"argo": {"cronWorkflow": {"enabled": True, "parameters": REQUIRED}}})
    assert len(by_kind(both, "CronWorkflow")) == 1
    assert [j["metadata"]["name"] for j in by_kind(both, "Job")] == ["gagar-pipeline-upload"]


def test_existing_repository_and_required_parameters() -> None:
    objs = render_objects(
        {
            "argo": {
                "cronWorkflow": {"enabled": True, "parameters": REQUIRED},
                "artifactRepository": {
                    "create": False,
                    "configMapName": "artifact-repositories",
                    "key": "gagar",
                },
            }
        }
    )
    assert cron_of(objs)["spec"]["workflowSpec"]["artifactRepositoryRef"] == {
        "configMap": "artifact-repositories",
        "key": "gagar",
    }
    assert not [o for o in by_kind(objs, "ConfigMap") if "argo" in o["metadata"]["name"]]
    with pytest.raises(
        helm_python.HelmRenderError, match=r"argo\.cronWorkflow\.parameters\.tasks is required"
    ):
        render_objects({"argo": {"cronWorkflow": {"enabled": True, "parameters": {"policy": "m"}}}})
    with pytest.raises(helm_python.HelmRenderError, match="configMapName must name an existing ConfigMap"):
        render_objects(
            {
                "argo": {
                    "cronWorkflow": {"enabled": True, "parameters": REQUIRED},
                    "artifactRepository": {"create": False},
                }
            }
        )


def test_schema_refuses_a_kfp_style_six_field_cron() -> None:
    with helm_python.Chart.load(CHART_DIR) as chart, pytest.raises(Exception, match="schedule"):
        chart.validate_schema({"argo": {"cronWorkflow": {"enabled": True, "schedule": "0 0 2 * * *"}}})
