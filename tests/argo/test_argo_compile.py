"""The Argo target: the KFP pipeline's stages and knobs, SDK round trip, pod schemas, the shipped files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gagar.cli.pipeline import app
from gagar.pipeline.argo import (
    CLUSTER_DEFAULTS,
    CONTAINER_SECURITY_CONTEXT,
    ArgoOptions,
    CronSchedule,
    build_cron_workflow,
    build_workflow,
    parse_repository,
    to_yaml,
)
from gagar.pipeline.argo_entry import setting_argument
from gagar.pipeline.argo_models import ArgoSchemaError, pod_manifests, to_manifest, to_model, validate_pods
from gagar.pipeline.build import compile_pipeline
from gagar.pipeline.graph import DEFAULT_MAX_GEN_BATCHES, RL_STEP, generation_stages
from gagar.pipeline.images import STAGES, stage_image
from gagar.pipeline.parameters import PARAMETERS
from gagar.pipeline.platform import PlatformOptions

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {
    "Workflow": ROOT / "docs" / "argo" / "gagar-rl-workflow.yaml",
    "CronWorkflow": ROOT / "helm" / "gagar" / "files" / "argo" / "gagar-rl-cronworkflow.yaml",
}
DEFAULT_SCHEDULE = CronSchedule("0 2 * * *")


def templates(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = manifest["spec"].get("workflowSpec", manifest["spec"])
    return {t["name"]: t for t in spec["templates"]}


@pytest.fixture(scope="module")
def two_steps() -> dict[str, Any]:
    return build_workflow(2)


def test_one_template_per_stage_in_its_image(two_steps: dict[str, Any]) -> None:
    found = templates(two_steps)
    assert set(found) == {"rl"} | {s.name for s in RL_STEP}
    images = {name: t["container"]["image"] for name, t in found.items() if "container" in t}
    assert images == {s.name: stage_image(s.image) for s in RL_STEP}
    assert set(images.values()) == {stage_image(s) for s in STAGES}
    for spec in RL_STEP:
        container = found[spec.name]["container"]
        assert container["command"] == ["python", "-m", "gagar.pipeline.argo_entry"]
        assert container["args"][0] == spec.name


def test_dag_chains_steps_like_the_kfp_pipeline(two_steps: dict[str, Any]) -> None:
    tasks = {t["name"]: t for t in templates(two_steps)["rl"]["dag"]["tasks"]}
    per_batch = {s.name for s in generation_stages()}
    assert set(tasks) == {
        name
        for s in RL_STEP
        for i in (0, 1)
        for name in (
            [f"{s.name}-{i}-{b}" for b in range(DEFAULT_MAX_GEN_BATCHES)]
            if s.name in per_batch
            else [f"{s.name}-{i}"]
        )
    }
    assert "depends" not in tasks["prepare-0"]
    assert tasks["prepare-1"]["depends"] == "train-0"
    assert tasks["train-1"]["depends"] == "prepare-1 && select-1 && grade-1 && redistribute-1"
    sandbox = tasks["sandbox-1-1"]["arguments"]
    assert {
        "name": "trajectories",
        "from": "{{tasks.rollout-1-1.outputs.artifacts.trajectories}}",
    } in sandbox["artifacts"]
    # every stage takes every pipeline parameter, as its settings
    for task in tasks.values():
        given = {p["name"]: p["value"] for p in task["arguments"]["parameters"]}
        for p in PARAMETERS:
            assert given[setting_argument(p.name)] == f"{{{{workflow.parameters.{p.name}}}}}", task["name"]
    assert {"name": "gen_batch", "value": "1"} in tasks["rollout-1-1"]["arguments"]["parameters"]


def test_refill_draws_batch_b_only_when_batch_b_minus_1_was_short(two_steps: dict[str, Any]) -> None:
    tasks = {t["name"]: t for t in templates(two_steps)["rl"]["dag"]["tasks"]}
    assert "when" not in tasks["rollout-0-0"]
    for b in range(1, DEFAULT_MAX_GEN_BATCHES):
        rollout = tasks[f"rollout-0-{b}"]
        assert rollout["when"] == f"{{{{tasks.gather-0-{b - 1}.outputs.parameters.short}}}} == true"
        assert f"gather-0-{b - 1}.Succeeded" in rollout["depends"]
        # a skipped rollout omits the rest of its batch (Succeeded, not the bare name that a skip satisfies)
        assert f"rollout-0-{b}.Succeeded" in tasks[f"sandbox-0-{b}"]["depends"]
        assert (
            f"(gather-0-{b}.Succeeded || gather-0-{b}.Skipped || gather-0-{b}.Omitted)"
            in (tasks["select-0"]["depends"])
        )


def _kfp_tasks(spec: dict[str, Any]) -> dict[str, tuple[set[str], str | None]]:
    """The compiled KFP pipeline's component tasks named as the Argo tasks are (``rollout-<step>-<batch>``):
    each one's upstream tasks (a generation sub-pipeline stands for its gathers) and its refill condition."""
    components = spec["components"]
    found: dict[str, tuple[set[str], str | None]] = {}

    def walk(dag: dict[str, Any], rename: Any, condition: str | None) -> None:
        for task in dag["tasks"].values():
            ref = components[task["componentRef"]["name"]]
            if "dag" in ref:
                inner = task.get("triggerPolicy", {}).get("condition")
                walk(ref["dag"], rename, inner.split("--")[1].split("'")[0] if inner else condition)
                continue
            upstream = {rename(dag["tasks"][d]["taskInfo"]["name"]) for d in task.get("dependentTasks", [])}
            found[rename(task["taskInfo"]["name"])] = (upstream, condition)

    for task in spec["root"]["dag"]["tasks"].values():
        name = task["taskInfo"]["name"]
        if not name.startswith("generation-"):
            continue
        step = name.rpartition("-")[2]
        walk(
            components[task["componentRef"]["name"]]["dag"],
            lambda n, s=step: "-".join([*n.split("-")[:1], s, n.split("-")[1]]),
            None,
        )
    gathers = {n for n in found if n.startswith("gather-")}
    for task in spec["root"]["dag"]["tasks"].values():
        name = task["taskInfo"]["name"]
        if name.startswith("generation-"):
            continue
        upstream = set()
        for d in task.get("dependentTasks", []):
            dep = spec["root"]["dag"]["tasks"][d]["taskInfo"]["name"]
            step = dep.rpartition("-")[2]
            upstream |= (
                {g for g in gathers if g.split("-")[1] == step} if dep.startswith("generation-") else {dep}
            )
        found[name] = (upstream, None)
    return found


def test_dag_is_the_kfp_pipelines_task_for_task(tmp_path: Path) -> None:
    kfp_spec = next(
        d
        for d in yaml.safe_load_all(compile_pipeline("rl", tmp_path / "rl.yaml", steps_per_run=2).read_text())
        if d and "root" in d
    )
    kfp = _kfp_tasks(kfp_spec)
    argo: dict[str, tuple[set[str], str | None]] = {}
    for task in templates(build_workflow(2))["rl"]["dag"]["tasks"]:
        names = {m.group(1) for m in re.finditer(r"([a-z]+-\d+(?:-\d+)?)", task.get("depends", ""))}
        when = re.match(r"\{\{tasks\.([a-z]+-\d+-\d+)\.", task.get("when", ""))
        argo[task["name"]] = (names, when.group(1) if when else None)
    assert set(argo) == set(kfp)
    for name, (upstream, _) in kfp.items():
        # KFP passes a sub-pipeline's inputs (prepare's outputs) without a task edge inside it, and a
        # refill condition's source gather is an edge of the condition group: Argo lists both
        argo_upstream, argo_condition = argo[name]
        assert upstream <= argo_upstream, name
        assert argo_upstream - upstream <= {f"prepare-{name.split('-')[1]}", argo_condition}, name
    for name, (_, condition) in argo.items():
        if condition is not None:  # KFP nests the batch in the condition: every task of it has one
            assert kfp[name][1] is not None, name
            assert kfp[name][1].startswith("gather"), name


def _kfp_parameters(path: Path, **defaults: str) -> dict[str, Any]:
    compiled = compile_pipeline("rl", path, defaults=defaults or None)
    spec = next(d for d in yaml.safe_load_all(compiled.read_text()) if d and "root" in d)
    return spec["root"]["inputDefinitions"]["parameters"]


def test_parameters_are_the_kfp_pipelines_with_the_same_defaults(tmp_path: Path) -> None:
    """The Workflow runs on a cluster: its defaults are the KFP pipeline's compiled for a cluster
    (as the chart compiles it: the tests in sandbox pods), the config's elsewhere."""
    assert CLUSTER_DEFAULTS == {"sandbox_backend": "kubernetes"}
    assert _kfp_parameters(tmp_path / "local.yaml")["sandbox_backend"]["defaultValue"] == "local"
    kfp = _kfp_parameters(tmp_path / "rl.yaml", **CLUSTER_DEFAULTS)
    argo = {p["name"]: p.get("value") for p in build_workflow()["spec"]["arguments"]["parameters"]}
    assert argo["sandbox_backend"] == "kubernetes"
    assert list(argo) == [p.name for p in PARAMETERS]
    assert set(argo) == set(kfp)
    for name, value in argo.items():
        if "defaultValue" not in kfp[name]:
            assert value is None, name  # required in both
        else:
            expected = kfp[name]["defaultValue"]
            assert (
                type(expected)(yaml.safe_load(value) if not isinstance(expected, str) else value) == expected
            )


def test_retries_on_infrastructure_errors_except_train_and_deadlines() -> None:
    found = templates(build_workflow(platform=PlatformOptions(retries=3, timeout_s=600)))
    for spec in RL_STEP:
        template = found[spec.name]
        assert template["activeDeadlineSeconds"] == "600"
        if spec.name == "train":
            assert "retryStrategy" not in template  # it publishes a checkpoint
        else:
            assert template["retryStrategy"]["retryPolicy"] == "OnError"
            assert template["retryStrategy"]["limit"] == "3"
    assert all(
        "retryStrategy" not in t
        for t in templates(build_workflow(platform=PlatformOptions(retries=0))).values()
    )


def test_store_credentials_only_where_the_store_is_used_and_gpus_where_asked() -> None:
    found = templates(build_workflow())
    for spec in RL_STEP:
        container = found[spec.name]["container"]
        secrets = [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
        assert bool(secrets) == spec.store, spec.name
        gpus = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        assert gpus == ("1" if spec.name in ("rollout", "train") else None), spec.name
    cpu_only = templates(build_workflow(platform=PlatformOptions(gpus=(), store_secret=None)))
    for template in list(cpu_only.values())[1:]:  # CPU and memory only, requested and limited
        resources = template["container"]["resources"]
        assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}, template["name"]
    assert all(
        "secretKeyRef" not in e.get("valueFrom", {})
        for t in list(cpu_only.values())[1:]
        for e in t["container"]["env"]
    )


def test_hardened_pods_sandbox_account_and_s3_repository() -> None:
    manifest = build_workflow(argo=ArgoOptions(service_account="runner", sandbox_service_account="sandboxer"))
    spec = manifest["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["artifactRepositoryRef"] == {"configMap": "gagar-argo-artifacts", "key": "s3"}
    pods = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p["spec"] for p in pod_manifests(manifest)
    }
    # the tool-loop agent's RUN_TESTS start sandbox pods from the rollout stage
    assert {n for n, p in pods.items() if p["serviceAccountName"] == "sandboxer"} == {"sandbox", "rollout"}
    assert {p["serviceAccountName"] for n, p in pods.items() if n not in ("sandbox", "rollout")} == {"runner"}
    for pod in pods.values():
        assert pod["containers"][0]["securityContext"] == CONTAINER_SECURITY_CONTEXT
        assert pod["containers"][0]["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    for artifact in templates(manifest)["rollout"]["outputs"]["artifacts"]:
        assert artifact["archive"] == {"none": {}}  # stored as plain files
    assert "artifactRepositoryRef" not in build_workflow(argo=ArgoOptions(artifact_repository=None))["spec"]


def test_cron_workflow_forbids_overlap_and_validates_its_schedule() -> None:
    cron = build_cron_workflow(CronSchedule("30 1 * * 1-5", timezone="Europe/Berlin", starting_deadline_s=60))
    assert cron["metadata"] == {"name": "gagar-rl", "labels": {"app.kubernetes.io/part-of": "gagar"}}
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["schedules"] == ["30 1 * * 1-5"]
    assert spec["timezone"] == "Europe/Berlin"
    assert spec["startingDeadlineSeconds"] == 60
    assert spec["workflowSpec"] == build_workflow()["spec"]
    with pytest.raises(ValueError, match="5-field cron"):
        CronSchedule("0 0 2 * * *")
    with pytest.raises(ValueError, match="5-field cron"):
        CronSchedule("0 2 * *; rm")
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        CronSchedule("0 2 * * *", timezone="Mars/Olympus")


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="DNS label"):
        ArgoOptions(name="Gagar_RL")
    with pytest.raises(ValueError, match="unknown pipeline parameters nope"):
        ArgoOptions(parameters=(("nope", "1"),))
    with pytest.raises(ValueError, match="steps_per_run must be at least 1"):
        build_workflow(0)
    with pytest.raises(ValueError, match="CONFIGMAP/KEY"):
        parse_repository("only-a-name")
    assert parse_repository("artifact-repositories/s3") == ("artifact-repositories", "s3")
    assert parse_repository("") is None


@pytest.mark.parametrize("kind", ["Workflow", "CronWorkflow"])
def test_round_trip_through_the_sdk_models_and_pod_schemas(kind: str) -> None:
    manifest = build_workflow(3) if kind == "Workflow" else build_cron_workflow(DEFAULT_SCHEDULE, 3)
    model = to_model(yaml.safe_load(to_yaml(manifest)))
    assert type(model).__name__ == f"IoArgoprojWorkflowV1alpha1{kind}"
    assert to_manifest(model) == manifest
    assert validate_pods(manifest) == len(RL_STEP)


def test_schema_checks_catch_what_they_should() -> None:
    unknown = build_workflow()
    templates(unknown)["train"]["retries"] = 3
    with pytest.raises(ArgoSchemaError, match=rf"spec\.templates\[{len(RL_STEP)}\]\.retries"):
        to_model(unknown)
    mistyped = build_cron_workflow(DEFAULT_SCHEDULE)
    mistyped["spec"]["startingDeadlineSeconds"] = "soon"
    with pytest.raises(ArgoSchemaError, match="starting_deadline_seconds"):
        to_model(mistyped)
    bad_pod = build_workflow()
    templates(bad_pod)["sandbox"]["container"]["securityContext"] = {"runAsNonRoot": "yes"}
    with pytest.raises(ArgoSchemaError, match="gagar-rl-sandbox"):
        validate_pods(bad_pod)
    with pytest.raises(ArgoSchemaError, match="neither Workflow nor CronWorkflow"):
        to_model({"kind": "Pod"})


def test_shipped_default_manifests_are_current() -> None:
    """docs/argo and the chart carry the compiled default Workflow and CronWorkflow.

    Regenerate with ``gagar pipeline compile --target argo --out docs/argo/gagar-rl-workflow.yaml``
    and ``... --schedule '0 2 * * *' --out helm/gagar/files/argo/gagar-rl-cronworkflow.yaml``.
    """
    expected = {"Workflow": build_workflow(), "CronWorkflow": build_cron_workflow(DEFAULT_SCHEDULE)}
    for kind, path in SHIPPED.items():
        assert path.read_text() == to_yaml(expected[kind]), f"{path} is stale: regenerate it"


def test_cli_compiles_workflow_and_cron_workflow(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "wf.yaml"
    result = runner.invoke(
        app, ["compile", "--target", "argo", "--out", str(out), "--steps-per-run", "2", "--image-tag", "t1"]
    )
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(out.read_text())
    assert to_manifest(to_model(manifest)) == manifest
    assert {
        t["container"]["image"].rsplit(":", 1)[1] for t in templates(manifest).values() if "container" in t
    } == {"t1"}
    cron = tmp_path / "cron.yaml"
    args = ["compile", "--target", "argo", "--out", str(cron), "--schedule", "0 3 * * *", "--timezone", "UTC"]
    result = runner.invoke(app, [*args, "--param", "storage=s3://b/run", "--artifact-repository", ""])
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(cron.read_text())
    assert manifest["kind"] == "CronWorkflow"
    given = {p["name"]: p.get("value") for p in manifest["spec"]["workflowSpec"]["arguments"]["parameters"]}
    assert given["storage"] == "s3://b/run"
    assert "artifactRepositoryRef" not in manifest["spec"]["workflowSpec"]
    for bad, message in (
        (["--schedule", "0 0 3 * * *"], "5-field cron"),
        (["--param", "nope=1"], "unknown pipeline parameter 'nope'"),
        (["--pipeline", "evaluation"], "rl pipeline only"),
    ):
        result = runner.invoke(app, ["compile", "--target", "argo", "--out", str(cron), *bad])
        assert result.exit_code != 0
        assert message in result.output, result.output
    result = runner.invoke(app, ["compile", "--out", str(cron), "--schedule", "0 3 * * *"])
    assert result.exit_code != 0
    assert "--target argo" in result.output
    result = runner.invoke(app, ["compile", "--out", str(cron), "--target", "tekton"])
    assert result.exit_code != 0
    assert "unknown target" in result.output
