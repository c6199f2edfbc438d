"""The release's names reach the run: what the compiled pipeline references is what the chart rendered.

Each case renders the chart, compiles the pipeline with the upload Job's own ``compile`` arguments and
the environment its ``envFrom`` gives it (the settings ConfigMap), then looks up every ConfigMap, Secret,
key, image, ServiceAccount and namespace the compiled pipeline (and the schedule) uses in the rendering.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import by_kind, render_objects
from typer.testing import CliRunner

from gagar.cli import app
from gagar.pipeline.images import STAGES

REQUIRED = {"policy": "s3://b/models/policy", "tasks": "s3://b/tasks.jsonl", "storage": "s3://b/runs/nightly"}

CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "default-release": (
        "gagar",
        "kubeflow",
        {"pipeline": {"recurringRun": {"enabled": True, "parameters": REQUIRED}}},
    ),
    "rl-in-ml": (
        "rl",
        "ml",
        {
            "images": {
                "registry": "registry.example.com",
                "tag": "1.2.3",
                "pullSecrets": [{"name": "registry-credentials"}],
                "rollout": {"repository": "ml/rollout-cpu", "tag": "1.2.3-cpu"},
            },
            "objectStore": {
                "credentials": {
                    "existingSecret": "aws-s3-credentials",
                    "accessKeyKey": "AWS_ACCESS_KEY_ID",
                    "secretKeyKey": "AWS_SECRET_ACCESS_KEY",
                }
            },
            "pipeline": {
                "compile": {"gpus": False, "extraArgs": ["--steps-per-run=2"]},
                "recurringRun": {"enabled": True, "parameters": REQUIRED},
            },
        },
    ),
}


def _named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"the rendering has {len(found)} {kind} named {name!r}"
    return found[0]


def _job_containers(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (job,) = by_kind(objs, "Job")
    spec = job["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def compile_as_the_job_does(
    objs: list[dict[str, Any]], out: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """Run the Job's ``compile`` container's arguments with its environment; the compiled pipeline."""
    container = _job_containers(objs)["compile"]
    (source,) = container["envFrom"]
    env = _named(objs, "ConfigMap", source["configMapRef"]["name"])["data"]
    for stage in STAGES:  # only what the Job's pod would have
        monkeypatch.delenv(f"GAGAR_IMAGES__{stage.upper()}", raising=False)
    args = list(container["args"])
    args[args.index("--out") + 1] = str(out)  # the Job's emptyDir path, here a temporary file
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    pipeline, platform = yaml.safe_load_all(out.read_text())
    return {"pipeline": pipeline, "platform": platform["platforms"]["kubernetes"]["deploymentSpec"]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_name_the_pipeline_uses_is_rendered_by_the_chart(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, namespace, values = CASES[case]
    objs = render_objects(values, name=release, namespace=namespace)
    compiled = compile_as_the_job_does(objs, tmp_path / "rl.yaml", monkeypatch)
    settings_name = f"{release}-gagar-settings" if release != "gagar" else "gagar-settings"
    settings = _named(objs, "ConfigMap", settings_name)
    launcher = yaml.safe_load(_named(objs, "ConfigMap", "kfp-launcher")["data"]["providers"])
    store_ref = launcher["s3"]["default"]["credentials"]["secretRef"]
    pull_secrets = {s["name"] for s in values.get("images", {}).get("pullSecrets", [])}

    # Images: each task runs the image the chart renders for its stage.
    rendered_images = {settings["data"][f"GAGAR_IMAGES__{s.upper()}"] for s in STAGES}
    used_images = {
        e["container"]["image"] for e in compiled["pipeline"]["deploymentSpec"]["executors"].values()
    }
    assert used_images == rendered_images
    if case == "rl-in-ml":
        assert "registry.example.com/ml/rollout-cpu:1.2.3-cpu" in used_images
        assert "registry.example.com/gagar-project/gagar-train:1.2.3" in used_images

    executors = compiled["platform"]["executors"]
    assert executors
    for name, executor in executors.items():
        # ConfigMaps: required (a missing one fails the pod), and every key is in the rendered one.
        (config_map,) = executor["configMapAsEnv"]
        assert config_map["configMapName"] == settings_name, name
        assert config_map["optional"] is False, name
        assert {k["configMapKey"] for k in config_map["keyToEnv"]} <= set(settings["data"]), name
        # Secrets: the store credentials the kfp-launcher ConfigMap and the runner Role name.
        for secret in executor.get("secretAsEnv", []):
            assert secret["secretName"] == store_ref["secretName"], name
            assert {k["secretKey"] for k in secret["keyToEnv"]} == {
                store_ref["accessKeyKey"],
                store_ref["secretKeyKey"],
            }, name
        assert {s["secretName"] for s in executor.get("imagePullSecret", [])} == pull_secrets, name
        if case == "rl-in-ml":
            assert "nvidia.com/gpu" not in yaml.safe_dump(compiled["pipeline"]), "compile.gpus=false"
    runner_role = _named(objs, "Role", settings_name.removesuffix("-settings") + "-runner")
    secret_rule = next(r for r in runner_role["rules"] if r["resources"] == ["secrets"])
    assert secret_rule["resourceNames"] == [store_ref["secretName"]]

    # Namespace: the sandbox namespace the tasks are told is the one rendered, with the Role there.
    sandbox_namespace = settings["data"]["GAGAR_KUBERNETES__NAMESPACE"]
    assert sandbox_namespace == f"{release}-sandbox"
    _named(objs, "Namespace", sandbox_namespace)
    sandbox_binding = next(
        b for b in by_kind(objs, "RoleBinding") if b["metadata"]["namespace"] == sandbox_namespace
    )

    # ServiceAccount: the schedule's account is rendered and bound to the sandbox Role.
    schedule = _job_containers(objs)["schedule"]["args"]
    account = _named(objs, "ServiceAccount", _flag(schedule, "--service-account"))
    assert account["metadata"]["namespace"] == namespace
    assert {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace} in (
        sandbox_binding["subjects"]
    )

    # KFP names of its own: two releases sharing a KFP neither clash on version names nor replace each
    # other's recurring run.
    fullname = settings_name.removesuffix("-settings")
    upload = _job_containers(objs)["upload"]["args"]
    assert _flag(upload, "--name") == _flag(schedule, "--pipeline") == f"{fullname}-rl"
    assert _flag(schedule, "--name") == f"{fullname}-rl-nightly"

    # The Pushgateway the runs push to is the rendered Service.
    params = dict(schedule[i + 1].split("=", 1) for i, a in enumerate(schedule) if a == "--param")
    (service,) = [s for s in by_kind(objs, "Service") if s["metadata"]["name"].endswith("-pushgateway")]
    assert params["metrics_pushgateway"] == f"http://{service['metadata']['name']}.{namespace}.svc:9091"
    assert settings["data"]["GAGAR_METRICS__PUSHGATEWAY"] == params["metrics_pushgateway"]
    assert {k: params[k] for k in REQUIRED} == REQUIRED


def test_a_default_install_schedules_nothing() -> None:
    objs = render_objects()
    containers = _job_containers(objs)
    assert set(containers) == {"compile", "upload"}
    assert not any(c["args"][0] == "schedule" for c in containers.values())


@pytest.mark.parametrize(
    "parameters",
    [
        {},
        {"policy": "m", "tasks": "t"},
        {"policy": "m", "tasks": "t", "storage": ""},
        {"tasks": "t", "storage": "s"},
    ],
)
def test_a_recurring_run_without_its_required_parameters_is_refused(parameters: dict[str, str]) -> None:
    import helm_python

    values = {"pipeline": {"recurringRun": {"enabled": True, "parameters": parameters}}}
    with pytest.raises(helm_python.HelmValuesError, match=r"recurringRun/parameters"):
        render_objects(values)
