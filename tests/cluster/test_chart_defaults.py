"""`helm install` of helm/gagar as a user first runs it, on a real cluster: with the defaults, then with
only the values a recurring run requires; each one's upload Job runs (compile, upload, schedule).

What differs from the chart's defaults is only what this offline node cannot have: the images
(the node cannot pull, so the stage images built here and a Pushgateway from Debian's binary are
named) and the KFP API address (KFP's API server cannot run here; ``kfp_api.KfpApi`` serves the part
of its API the Job uses, on the address the node's pods reach, and reviews the Job's projected
token with the cluster's API server as multi-user KFP does).

Shown: the install is deployed, every pod of the release Ready or its Job Complete, no Job failed;
the pipeline KFP received was compiled with this release's names (every ConfigMap it reads exists
in the namespace with the keys it reads; the images the chart rendered); the default install
schedules nothing and the one with the required values schedules a run with them, under the
chart's account; a sandbox evaluation runs under each account a run submitted from the Kubeflow UI
would have (``pipeline-runner``, ``default-editor``), and those accounts reach nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_wait import wait_until
from gold_as import evaluate_gold_as
from kfp_api import AUDIENCE, KfpApi
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gagar.pipeline.images import STAGES

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a cluster: KUBECONFIG is not set"),
    pytest.mark.skipif(
        not (os.environ.get("GAGAR_TEST_TRAIN_IMAGE") and os.environ.get("GAGAR_TEST_HOST_ADDRESS")),
        reason="needs the train image on the node and the address pods reach this host at "
        "(GAGAR_TEST_TRAIN_IMAGE, GAGAR_TEST_HOST_ADDRESS: scripts/test-cluster.sh sets both)",
    ),
]

CHART = Path(__file__).resolve().parents[2] / "helm" / "gagar"
REQUIRED = {"policy": "s3://mlpipeline/gagar/models/sft", "tasks": "s3://mlpipeline/gagar/tasks.jsonl"}
REQUIRED["storage"] = "s3://mlpipeline/gagar/runs/nightly"
UI_ACCOUNTS = ("pipeline-runner", "default-editor")  # the chart's sandbox.rbac.kfpServiceAccounts


def _image_values(sandbox_image: str) -> dict[str, Any]:
    """The images this node has, in the chart's terms: every stage from one registry and tag (the
    CPU variants where a stage has one), the Pushgateway built from Debian's binary."""
    registry, _, _ = sandbox_image.partition("/")
    sandbox_tag = sandbox_image.rpartition(":")[2]
    train_tag = os.environ["GAGAR_TEST_TRAIN_IMAGE"].rpartition(":")[2]
    pushgateway = os.environ.get("GAGAR_TEST_PUSHGATEWAY_IMAGE", "")
    repository, _, tag = pushgateway.rpartition(":")
    values: dict[str, Any] = {
        "images": {"registry": registry, "tag": sandbox_tag, "train": {"tag": train_tag}},
        "monitoring": {"pushgateway": {"enabled": bool(pushgateway)}},
    }
    if pushgateway:
        values["monitoring"]["pushgateway"]["image"] = {"repository": repository, "tag": tag}
    return values


@pytest.fixture(scope="module")
def kfp(api_client) -> Iterator[KfpApi]:
    authentication = client.AuthenticationV1Api(api_client)

    def review(token: str) -> str | None:
        spec = client.V1TokenReviewSpec(token=token, audiences=[AUDIENCE])
        status = authentication.create_token_review(client.V1TokenReview(spec=spec)).status
        return status.user.username if status.authenticated else None

    with KfpApi(os.environ["GAGAR_TEST_HOST_ADDRESS"], review=review) as api:
        yield api


def _install(namespace: str, release: str, values: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import helm_python

    config = helm_python.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=namespace)
    with helm_python.Chart.load(CHART) as chart:
        config.install(chart, release, values, namespace=namespace, wait="watcher", timeout=600)
    return config, config.status(release)


@pytest.fixture(scope="module")
def installs(api_client, core, fresh_namespace, sandbox_image, kfp) -> Iterator[dict[str, dict[str, Any]]]:
    """Two releases: ``rl`` with the defaults, ``gagar`` with only the required run parameters."""
    cases = {
        "defaults": ("rl", {}),
        "required": ("gagar", {"pipeline": {"recurringRun": {"enabled": True, "parameters": REQUIRED}}}),
    }
    made: dict[str, dict[str, Any]] = {}
    try:
        for case, (release, extra) in cases.items():
            namespace = fresh_namespace(f"gagar-{case}")
            for account in UI_ACCOUNTS:  # what KFP creates in a namespace it runs pipelines in
                core.create_namespaced_service_account(
                    namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account))
                )
            values = _merge(_image_values(sandbox_image), {"pipeline": {"kfpHost": kfp.url}}, extra)
            versions_before = set(kfp.store.versions)
            config, status = _install(namespace, release, values)
            made[case] = {
                "config": config,
                "status": status,
                "release": release,
                "namespace": namespace,
                "sandbox": f"{release}-sandbox",
                "versions": [kfp.store.versions[v] for v in set(kfp.store.versions) - versions_before],
            }
        yield made
    finally:
        for case in made.values():
            case["config"].uninstall(case["release"], wait="watcher", timeout=300, ignore_not_found=True)
        for case in made.values():
            wait_until(lambda c=case: _namespace_gone(core, c["sandbox"]), 180, f"{case['sandbox']} deleted")


def _merge(*parts: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = _merge(merged[key], value)
            else:
                merged[key] = value
    return merged


def _namespace_gone(core: Any, name: str) -> bool:
    try:
        core.read_namespace(name)
    except ApiException as exc:
        return exc.status == 404
    return False


@pytest.mark.parametrize("case", ["defaults", "required"])
def test_install_is_deployed_and_every_object_ready(installs, api_client, case: str) -> None:
    install = installs[case]
    assert install["status"]["status"] == "deployed", install["status"]
    namespace, release = install["namespace"], install["release"]
    selector = f"app.kubernetes.io/instance={release}"
    batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)
    jobs = batch.list_namespaced_job(namespace, label_selector=selector).items
    assert [j.metadata.name.endswith("-pipeline-upload") for j in jobs] == [True]
    for job in jobs:
        assert not job.status.failed, (job.metadata.name, job.status)
        assert job.status.succeeded == 1, (job.metadata.name, job.status)
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    assert pods
    for pod in pods:
        if pod.metadata.owner_references and pod.metadata.owner_references[0].kind == "Job":
            assert pod.status.phase == "Succeeded", (pod.metadata.name, pod.status.phase)
            continue
        ready = {c.type: c.status for c in pod.status.conditions or []}.get("Ready")
        assert (pod.status.phase, ready) == ("Running", "True"), pod.metadata.name
    for deployment in client.AppsV1Api(api_client).list_namespaced_deployment(namespace).items:
        assert deployment.status.ready_replicas == deployment.spec.replicas, deployment.metadata.name


@pytest.mark.parametrize("case", ["defaults", "required"])
def test_the_uploaded_pipeline_uses_what_the_release_rendered(installs, core, case: str) -> None:
    install = installs[case]
    namespace, release = install["namespace"], install["release"]
    (version,) = [v for v in install["versions"] if v["display_name"] == "0.1.0-r1"]
    pipeline, platform = version["documents"]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors
    settings = None
    for name, executor in executors.items():
        (config_map,) = executor["configMapAsEnv"]
        found = core.read_namespaced_config_map(config_map["configMapName"], namespace)  # 404 fails
        assert {k["configMapKey"] for k in config_map["keyToEnv"]} <= set(found.data), name
        assert config_map["optional"] is False, name
        settings = found.data
    assert settings is not None
    assert settings["GAGAR_KUBERNETES__NAMESPACE"] == f"{release}-sandbox"
    core.read_namespace(settings["GAGAR_KUBERNETES__NAMESPACE"])
    used = {e["container"]["image"] for e in pipeline["deploymentSpec"]["executors"].values()}
    assert used == {settings[f"GAGAR_IMAGES__{stage.upper()}"] for stage in STAGES}
    defaults = pipeline["root"]["inputDefinitions"]["parameters"]
    assert defaults["sandbox_backend"]["defaultValue"] == "kubernetes"
    if os.environ.get("GAGAR_TEST_PUSHGATEWAY_IMAGE"):
        pushgateway = defaults["metrics_pushgateway"]["defaultValue"]
        service, _, rest = pushgateway.removeprefix("http://").partition(".")
        assert rest == f"{namespace}.svc:9091"
        core.read_namespaced_service(service, namespace)  # 404 fails


def _runner_account(api_client: Any, install: dict[str, Any]) -> str:
    """The ServiceAccount the release created for its runs."""
    (account,) = [
        s.metadata.name
        for s in client.CoreV1Api(api_client).list_namespaced_service_account(install["namespace"]).items
        if (s.metadata.labels or {}).get("app.kubernetes.io/instance") == install["release"]
    ]
    return account


def test_the_default_install_schedules_nothing_and_the_required_values_schedule_a_run(
    installs, api_client, kfp
) -> None:
    runs = list(kfp.store.recurring_runs.values())
    assert len(runs) == 1, runs  # only the install with the required values scheduled one
    (run,) = runs
    parameters = run["runtime_config"]["parameters"]
    assert {k: parameters[k] for k in REQUIRED} == REQUIRED
    assert run["service_account"] == _runner_account(api_client, installs["required"])
    assert not kfp.store.refused, kfp.store.refused
    # each Job called KFP with its own projected token, reviewed as its release's account
    accounts = {
        f"system:serviceaccount:{i['namespace']}:{_runner_account(api_client, i)}" for i in installs.values()
    }
    assert accounts <= set(kfp.store.callers), kfp.store.callers


@pytest.mark.parametrize("ui_account", UI_ACCOUNTS)
def test_a_sandbox_evaluation_runs_under_the_account_of_a_ui_run(
    installs, api_client, sandbox_image, ui_account: str
) -> None:
    from gagar.schema.result import Status

    install = installs["defaults"]
    account = f"system:serviceaccount:{install['namespace']}:{ui_account}"
    result, as_account = evaluate_gold_as(account, install["sandbox"], sandbox_image)
    assert (result.status, result.resolved) == (Status.PASSED, True), (result.reason, result.log[-1000:])
    for elsewhere in ("kube-system", installs["required"]["sandbox"]):  # bound in its release's only
        with pytest.raises(ApiException) as refused:
            as_account.list_namespaced_pod(elsewhere)
        assert refused.value.status == 403
