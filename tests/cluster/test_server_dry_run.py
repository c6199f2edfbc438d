"""A server-side dry run (``dryRun=All``: admission and validation, nothing stored) of every object the
pipeline's stages create on a cluster, against the real API server.

- the sandbox stage: each evaluation's NetworkPolicy, ConfigMap and Pod, for a snapshot task and a
  task whose repository is in its image;
- the stage pods themselves, as the compiled Argo Workflow describes them (pod security context,
  volumes, ServiceAccount, container, deadline): what an Argo controller would create per stage.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from kubernetes import client, utils

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a cluster: KUBECONFIG is not set"),
]

GOLD = (
    "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
)


def _dry_run(api_client: Any, obj: dict[str, Any], namespace: str) -> None:
    """Create ``obj`` with dryRun=All; an ApiException (refused by validation or admission) fails the test."""
    utils.create_from_dict(api_client, obj, namespace=namespace, dry_run="All")


def _sandbox_objects(namespace: str) -> list[dict[str, Any]]:
    import yaml

    from gagar.sandbox.base import Prediction
    from gagar.sandbox.k8s import KubernetesSandboxConfig
    from gagar.sandbox.k8s.objects import render_objects_yaml
    from gagar.schema.task import Task

    config = KubernetesSandboxConfig(namespace=namespace, image="ghcr.io/gagar-project/gagar-sandbox:0.1.0")
    snapshot = Task(
        instance_id="demo__calc-1",
        repo="demo/calc",
        snapshot={
            "calc.py": "def add(a, b):\n    return a - b\n",
            "tests/test_calc.py": "def test_x():\n    pass\n",
        },
        problem_statement="add subtracts",
        patch=GOLD,
        FAIL_TO_PASS=["tests/test_calc.py::test_x"],
    )
    image = "swebench/sweb.eval.x86_64.demo:v1"
    in_image = Task.model_validate(
        {**snapshot.model_dump(), "snapshot": None, "base_commit": "0" * 40, "environment": {"image": image}}
    )
    objects = []
    for task in (snapshot, in_image):
        prediction = Prediction(instance_id=task.instance_id, model_patch=GOLD, trajectory_id="t/0")
        objects += list(yaml.safe_load_all(render_objects_yaml(task, prediction, config)))
    return objects


def _stage_pods(namespace: str) -> list[dict[str, Any]]:
    from gagar.pipeline.argo import build_workflow

    spec = build_workflow()["spec"]
    pods = []
    for template in spec["templates"]:
        if "container" not in template:
            continue
        container = dict(template["container"])
        # the controller substitutes {{inputs.parameters.x}}; any value does for validation
        container["args"] = [re.sub(r"\{\{[^}]*\}\}", "x", a) for a in container.get("args", [])]
        pod_spec = {
            "restartPolicy": "Never",
            "securityContext": spec["securityContext"],
            "volumes": spec["volumes"],
            "containers": [container],
            "activeDeadlineSeconds": int(template["activeDeadlineSeconds"]),
            "serviceAccountName": template.get(
                "serviceAccountName", spec.get("serviceAccountName", "default")
            ),
        }
        labels = template.get("metadata", {}).get("labels", {})
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"stage-{template['name']}", "namespace": namespace, "labels": labels},
                "spec": pod_spec,
            }
        )
    return pods


@pytest.fixture(scope="module")
def namespace(core, fresh_namespace) -> str:
    name = fresh_namespace("gagar-dry-run")
    core.create_namespaced_service_account(
        name, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="gagar-runner"))
    )
    return name


def test_sandbox_objects_pass_a_server_side_dry_run(api_client, core, namespace) -> None:
    objects = _sandbox_objects(namespace)
    assert sorted({o["kind"] for o in objects}) == ["ConfigMap", "NetworkPolicy", "Pod"]
    for obj in objects:
        _dry_run(api_client, obj, namespace)
    assert core.list_namespaced_pod(namespace).items == []  # nothing was stored


def test_every_stage_pod_passes_a_server_side_dry_run(api_client, namespace) -> None:
    from gagar.pipeline.images import STAGES

    pods = _stage_pods(namespace)
    images = {p["spec"]["containers"][0]["image"].rsplit("/", 1)[1].split(":")[0] for p in pods}
    assert images == {f"gagar-{s}" for s in STAGES}
    for pod in pods:
        _dry_run(api_client, pod, namespace)
