"""What the objects say: kfp-launcher shape, upload Job, vLLM servers, monitoring content, images."""

from __future__ import annotations

import json
from typing import Any

import yaml
from chart_render import (
    CHART_DIR,
    MONITORING_API,
    NAMESPACE,
    RELEASE,
    by_kind,
    render_objects,
    scenario_values,
)

REPO = CHART_DIR.parents[1]


def _one(objs: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    found = [
        o for o in by_kind(objs, kind) if o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    assert len(found) == 1, (kind, component, len(found))
    return found[0]


def _containers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_kfp_launcher_follows_the_kfp_provider_format() -> None:
    launcher = _one(render_objects(scenario_values("external-s3")), "ConfigMap", "kfp-launcher")
    assert launcher["metadata"]["name"] == "kfp-launcher"
    assert launcher["metadata"]["namespace"] == NAMESPACE
    assert launcher["data"]["defaultPipelineRoot"] == "s3://acme-ml-artifacts/gagar/prod"
    providers = yaml.safe_load(launcher["data"]["providers"])
    assert providers["s3"]["default"] == {
        "endpoint": "s3.amazonaws.com",
        "region": "eu-west-1",
        "disableSSL": False,
        "forcePathStyle": False,
        "credentials": {
            "fromEnv": False,
            "secretRef": {
                "secretName": "aws-s3-credentials",
                "accessKeyKey": "AWS_ACCESS_KEY_ID",
                "secretKeyKey": "AWS_SECRET_ACCESS_KEY",
            },
        },
    }
    assert providers["s3"]["overrides"][0]["bucketName"] == "acme-datasets"


def test_kfp_launcher_defaults_to_the_bundled_seaweedfs_store() -> None:
    launcher = _one(render_objects(), "ConfigMap", "kfp-launcher")
    default = yaml.safe_load(launcher["data"]["providers"])["s3"]["default"]
    assert default["endpoint"] == "seaweedfs.kubeflow.svc.cluster.local:8333"
    assert default["disableSSL"] is True
    assert default["forcePathStyle"] is True
    assert "overrides" not in yaml.safe_load(launcher["data"]["providers"])["s3"]


def test_upload_job_compiles_then_uploads_and_schedules_nothing_by_default() -> None:
    job = _one(render_objects(), "Job", "pipeline-upload")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    spec = job["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["compile"]
    assert [c["name"] for c in spec["containers"]] == ["upload"]
    compile_, upload = _containers(job)["compile"]["args"], _containers(job)["upload"]["args"]
    assert compile_[:2] == ["pipeline", "compile"]
    assert _flag(compile_, "--out") == _flag(upload, "--package") == "/tmp/rl.yaml"
    assert _flag(compile_, "--settings-configmap") == f"{RELEASE}-settings"
    assert _flag(compile_, "--store-secret") == "mlpipeline-minio-artifact"
    assert "--gpus" in compile_
    assert upload[:2] == ["pipeline", "upload"]
    assert _flag(upload, "--version") == "0.1.0-r1"
    assert _containers(job)["upload"]["image"] == "ghcr.io/gagar-project/gagar-train:0.1.0"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "pipeline-package" not in volumes
    token = volumes["kfp-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "pipelines.kubeflow.org"


def test_upload_job_schedules_with_the_required_parameters_and_the_pushgateway() -> None:
    job = _one(render_objects(scenario_values("external-s3")), "Job", "pipeline-upload")
    containers = _containers(job)
    schedule = containers["schedule"]["args"]
    assert [c["name"] for c in job["spec"]["template"]["spec"]["initContainers"]] == ["upload"]
    assert schedule[0] == "schedule"
    assert _flag(schedule, "--cron") == "0 30 3 * * 1-5"
    assert _flag(schedule, "--max-concurrency") == "1"
    assert "--no-catchup" in schedule
    assert _flag(schedule, "--service-account") == "gagar-pipeline"  # sandbox.serviceAccount.name
    params = dict(schedule[i + 1].split("=", 1) for i, arg in enumerate(schedule) if arg == "--param")
    assert params == {
        "rollout_group_size": "8",
        "policy": "s3://acme-ml-artifacts/gagar/prod/models/sft-policy",
        "tasks": "s3://acme-ml-artifacts/gagar/prod/tasks/train.jsonl",
        "storage": "s3://acme-ml-artifacts/gagar/prod/runs/nightly",
        "metrics_pushgateway": f"http://{RELEASE}-pushgateway.{NAMESPACE}.svc:9091",
    }
    assert _flag(containers["upload"]["args"], "--package") == "/pipeline/rl.yaml"
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["pipeline-package"]["configMap"]["name"] == "gagar-compiled-pipeline"
    assert containers["upload"]["image"] == "registry.example.com/gagar-project/gagar-train:0.1.0-rc1"
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry-credentials"}]


def test_a_pushgateway_parameter_given_wins_and_none_is_added_without_the_pushgateway() -> None:
    required = {"policy": "m", "tasks": "t", "storage": "s"}
    for monitoring, given, expected in (
        (True, {"metrics_pushgateway": "http://mine:9091"}, "http://mine:9091"),
        (False, {}, None),
    ):
        values = {
            "pipeline": {"recurringRun": {"enabled": True, "parameters": {**required, **given}}},
            "monitoring": {"pushgateway": {"enabled": monitoring}},
        }
        schedule = _containers(_one(render_objects(values), "Job", "pipeline-upload"))["schedule"]["args"]
        params = dict(schedule[i + 1].split("=", 1) for i, arg in enumerate(schedule) if arg == "--param")
        assert params.get("metrics_pushgateway") == expected


def test_inline_package_is_shipped_in_a_hook_configmap() -> None:
    objs = render_objects(scenario_values("inline-pipeline"))
    package = next(
        o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"] == f"{RELEASE}-pipeline-package"
    )
    assert yaml.safe_load(package["data"]["rl.yaml"])["pipelineInfo"]["name"] == "gagar-rl"
    assert package["metadata"]["annotations"]["helm.sh/hook-weight"] == "-5"
    job = _one(objs, "Job", "pipeline-upload")
    assert set(_containers(job)) == {"upload"}  # recurring run disabled
    assert "kfp-token" not in {v["name"] for v in job["spec"]["template"]["spec"]["volumes"]}


def test_settings_configmap_points_at_every_enabled_service() -> None:
    objs = render_objects(scenario_values("gpu-vllm"))
    settings = next(o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"] == f"{RELEASE}-settings")
    data = settings["data"]
    assert data["GAGAR_STORAGE__ENDPOINT"] == "http://seaweedfs.kubeflow.svc.cluster.local:8333"
    assert data["GAGAR_PIPELINE_ROOT"] == "s3://mlpipeline/gagar"
    assert data["GAGAR_KUBERNETES__NAMESPACE"] == f"{RELEASE}-sandbox"
    assert data["GAGAR_POLICY__BASE_URL"] == f"http://{RELEASE}-policy-server.{NAMESPACE}.svc:8000/v1"
    assert data["GAGAR_GRADER__BASE_URL"] == f"http://{RELEASE}-grader-server.{NAMESPACE}.svc:8000/v1"
    assert data["GAGAR_METRICS__PUSHGATEWAY"] == f"http://{RELEASE}-pushgateway.{NAMESPACE}.svc:9091"
    for stage in ("rollout", "sandbox", "grader", "redistribute", "train"):
        assert data[f"GAGAR_IMAGES__{stage.upper()}"] == f"ghcr.io/gagar-project/gagar-{stage}:0.1.0"


def test_vllm_servers_are_off_by_default() -> None:
    components = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in render_objects()}
    assert not components & {"policy-server", "grader-server"}


def test_policy_server_serves_lora_on_gpus_from_a_claim() -> None:
    objs = render_objects(scenario_values("gpu-vllm"))
    deployment = _one(objs, "Deployment", "policy-server")
    pod = deployment["spec"]["template"]["spec"]
    (vllm,) = pod["containers"]
    args = vllm["args"]
    assert _flag(args, "--model") == "/models/qwen2.5-coder-7b-instruct"
    assert _flag(args, "--port") == "8000"
    assert _flag(args, "--tensor-parallel-size") == "2"
    assert "--enable-lora" in args
    assert args[-1] == "--gpu-memory-utilization=0.85"
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "gagar-models"
    assert volumes["adapters"]["persistentVolumeClaim"]["claimName"] == "gagar-adapters"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    service = _one(objs, "Service", "policy-server")
    assert service["spec"]["ports"][0]["port"] == 8000
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_a_policy_server_with_no_gpus_runs_the_cpu_build_without_requesting_gpus() -> None:
    deployment = _one(render_objects(scenario_values("cpu-vllm")), "Deployment", "policy-server")
    pod = deployment["spec"]["template"]["spec"]
    (vllm,) = pod["containers"]
    assert vllm["image"] == "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.11.0"
    assert "--tensor-parallel-size" not in vllm["args"]
    assert "--enable-lora" in vllm["args"]
    assert _flag(vllm["args"], "--max-model-len") == "2048"
    assert vllm["resources"] == {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "tolerations" not in pod or not pod["tolerations"]


def test_grader_server_streams_weights_from_s3_with_the_store_secret() -> None:
    deployment = _one(render_objects(scenario_values("gpu-vllm")), "Deployment", "grader-server")
    (vllm,) = deployment["spec"]["template"]["spec"]["containers"]
    assert _flag(vllm["args"], "--model") == "s3://mlpipeline/gagar/models/grader-sft"
    assert _flag(vllm["args"], "--load-format") == "runai_streamer"
    assert "--enable-lora" not in vllm["args"]
    env = {e["name"]: e for e in vllm["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {
        "name": "mlpipeline-minio-artifact",
        "key": "accesskey",
    }
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://seaweedfs.kubeflow.svc.cluster.local:8333"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env


def test_prometheus_rule_carries_the_monitoring_rules() -> None:
    chart_rules = yaml.safe_load((CHART_DIR / "files" / "prometheus" / "gagar-rules.yaml").read_text())
    operator_rule = yaml.safe_load((REPO / "manifests" / "monitoring" / "prometheusrule.yaml").read_text())
    (rule,) = by_kind(render_objects({}, api_versions=MONITORING_API), "PrometheusRule")
    assert rule["spec"]["groups"] == chart_rules["groups"] == operator_rule["spec"]["groups"]
    summaries = [
        r.get("annotations", {}).get("summary", "") for g in rule["spec"]["groups"] for r in g["rules"]
    ]
    assert any("{{ $labels." in s for s in summaries)  # Prometheus templates pass through Helm untouched


def test_grafana_dashboard_is_labelled_for_the_sidecar_and_is_the_shipped_one() -> None:
    dashboard = _one(render_objects(), "ConfigMap", "monitoring")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((REPO / "manifests" / "monitoring" / "grafana-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["gagar-dashboard.json"]) == shipped
    assert shipped["panels"]
