"""`helm install` of helm/gagar on a real cluster through helm-python-sdk, then `helm uninstall`.

The release goes into a fresh namespace with its own sandbox namespace. The servers whose images
exist here run: the Pushgateway (``GAGAR_TEST_PUSHGATEWAY_IMAGE``, Debian's build, made by
scripts/test-cluster.sh); the vLLM policy and grader servers have no image here and stay off, as
does the upload Job (it needs a KFP API server). A sandbox evaluation then runs in the chart's
sandbox namespace as the chart's ServiceAccount, so its Role is what allows it. Uninstalling
leaves no object of the release in any namespace.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest
from cluster_wait import wait_until
from gold_as import evaluate_gold_as
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a cluster: KUBECONFIG is not set"),
]

CHART = Path(__file__).resolve().parents[2] / "helm" / "gagar"


def _values(sandbox_namespace: str, sandbox_image: str) -> dict[str, Any]:
    registry, _, rest = sandbox_image.partition("/")
    pushgateway = os.environ.get("GAGAR_TEST_PUSHGATEWAY_IMAGE", "")
    repository, _, tag = pushgateway.rpartition(":")
    return {
        "images": {"registry": registry, "tag": rest.rpartition(":")[2]},
        "sandbox": {"namespace": {"name": sandbox_namespace}},
        "pipeline": {"upload": {"enabled": False}},
        "monitoring": {
            "pushgateway": {"enabled": bool(pushgateway), "image": {"repository": repository, "tag": tag}}
        },
    }


def _release_objects(api_client: Any, release: str, namespaces: list[str]) -> list[str]:
    """``kind/namespace/name`` of the release's objects in these namespaces, and its namespaces."""
    selector = f"app.kubernetes.io/instance={release}"
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    rbac, net = client.RbacAuthorizationV1Api(api_client), client.NetworkingV1Api(api_client)
    found = [f"Namespace//{n.metadata.name}" for n in core.list_namespace(label_selector=selector).items]
    for ns in namespaces:
        listers = {
            "Pod": core.list_namespaced_pod,
            "Service": core.list_namespaced_service,
            "ConfigMap": core.list_namespaced_config_map,
            "Secret": core.list_namespaced_secret,
            "ServiceAccount": core.list_namespaced_service_account,
            "ResourceQuota": core.list_namespaced_resource_quota,
            "LimitRange": core.list_namespaced_limit_range,
            "Deployment": apps.list_namespaced_deployment,
            "Role": rbac.list_namespaced_role,
            "RoleBinding": rbac.list_namespaced_role_binding,
            "NetworkPolicy": net.list_namespaced_network_policy,
        }
        for kind, lister in listers.items():
            try:
                items = lister(ns, label_selector=selector).items
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            found += [f"{kind}/{ns}/{o.metadata.name}" for o in items if not o.metadata.deletion_timestamp]
    return found


@pytest.fixture(scope="module")
def installed(api_client, core, fresh_namespace, sandbox_image):
    import helm_python

    namespace = fresh_namespace("gagar-chart")
    release = f"gagar-{secrets.token_hex(2)}"
    sandbox_ns = f"{release}-sandbox"
    config = helm_python.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=namespace)
    with helm_python.Chart.load(CHART) as chart:
        summary = config.install(
            chart,
            release,
            _values(sandbox_ns, sandbox_image),
            namespace=namespace,
            wait="watcher",
            timeout=300,
        )
    yield {
        "config": config,
        "release": release,
        "namespace": namespace,
        "sandbox": sandbox_ns,
        "summary": summary,
    }
    try:
        config.uninstall(release, wait="watcher", timeout=300, ignore_not_found=True)
    finally:
        wait_until(
            lambda: not _release_objects(api_client, release, [namespace, sandbox_ns]), 120, "release gone"
        )


def test_install_is_deployed_with_the_old_server_notes(installed, api_client) -> None:
    version = client.VersionApi(api_client).get_code()
    old = (int(version.major), int(version.minor.rstrip("+"))) < (1, 25)
    status = installed["config"].status(installed["release"])
    assert status["status"] == "deployed", status
    assert installed["summary"]["chart_version"] == status["chart_version"]
    # the chart saw the server's own version and gated on it
    assert ("has no (GA) Pod Security admission" in status["notes"]) is old, status["notes"]


def test_servers_with_an_image_here_are_ready(installed, api_client) -> None:
    if not os.environ.get("GAGAR_TEST_PUSHGATEWAY_IMAGE"):
        pytest.skip("no Pushgateway image here (GAGAR_TEST_PUSHGATEWAY_IMAGE)")
    apps = client.AppsV1Api(api_client)
    deployments = apps.list_namespaced_deployment(installed["namespace"]).items
    assert [d.metadata.name for d in deployments] == [f"{installed['release']}-pushgateway"]
    assert all(d.status.ready_replicas == d.spec.replicas for d in deployments), [
        d.status for d in deployments
    ]


def test_sandbox_runs_in_the_chart_namespace_as_its_service_account(
    installed, api_client, sandbox_image
) -> None:
    from gagar.schema.result import Status

    account = next(
        s.metadata.name
        for s in client.CoreV1Api(api_client).list_namespaced_service_account(installed["namespace"]).items
        if s.metadata.labels and s.metadata.labels.get("app.kubernetes.io/instance") == installed["release"]
    )
    user = f"system:serviceaccount:{installed['namespace']}:{account}"
    gold, as_runner = evaluate_gold_as(user, installed["sandbox"], sandbox_image)
    assert (gold.status, gold.resolved) == (Status.PASSED, True), (gold.reason, gold.log[-1000:])
    # the Role stops at the sandbox namespace
    with pytest.raises(ApiException) as refused:
        as_runner.list_namespaced_pod("kube-system")
    assert refused.value.status == 403


def test_uninstall_leaves_nothing(installed, api_client) -> None:
    release, namespaces = installed["release"], [installed["namespace"], installed["sandbox"]]
    assert _release_objects(api_client, release, namespaces)
    installed["config"].uninstall(release, wait="watcher", timeout=300)
    wait_until(
        lambda: not _release_objects(api_client, release, namespaces),
        120,
        "every object of the release deleted",
    )
    names = [n.metadata.name for n in client.CoreV1Api(api_client).list_namespace().items]
    wait_until(
        lambda: (
            installed["sandbox"]
            not in [n.metadata.name for n in client.CoreV1Api(api_client).list_namespace().items]
        ),
        120,
        f"sandbox namespace {installed['sandbox']} deleted (namespaces: {names})",
    )
