"""The Kubernetes backend on a real cluster: one gold and one empty patch (runs when KUBECONFIG is set).

Needs an image with python3 and pytest (``GAGAR_K8S_TEST_IMAGE``) and a namespace the
kubeconfig may create pods, ConfigMaps and NetworkPolicies in (``GAGAR_K8S_TEST_NAMESPACE``,
default ``gagar-sandbox``); the namespace should enforce the ``restricted`` Pod Security level.
"""

from __future__ import annotations

import os

import pytest

from gagar.sandbox.base import Prediction
from gagar.sandbox.k8s import KubernetesBackend, KubernetesSandboxConfig
from gagar.sandbox.limits import SandboxLimits
from gagar.schema.result import Status
from gagar.schema.task import Task

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a cluster: KUBECONFIG is not set"),
]

GOLD = (
    "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
)


def test_gold_and_empty_patch_on_a_cluster() -> None:
    image = os.environ.get("GAGAR_K8S_TEST_IMAGE")
    if not image:
        pytest.fail("KUBECONFIG is set but GAGAR_K8S_TEST_IMAGE (an image with python3 and pytest) is not")
    task = Task(
        instance_id="demo__calc-1",
        repo="demo/calc",
        snapshot={
            "calc.py": "def add(a, b):\n    return a - b\n",
            "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
        },
        problem_statement="add subtracts",
        patch=GOLD,
        FAIL_TO_PASS=["tests/test_calc.py::test_add"],
        environment=image,
    )
    config = KubernetesSandboxConfig(
        namespace=os.environ.get("GAGAR_K8S_TEST_NAMESPACE", "gagar-sandbox"),
        runtime_class_name=os.environ.get("GAGAR_K8S_TEST_RUNTIME_CLASS"),
        limits=SandboxLimits(wall_time_s=300),
        start_deadline_s=300,
        max_concurrency=2,
    )
    backend = KubernetesBackend(config)
    jobs = [
        (task, Prediction(instance_id=task.instance_id, model_patch=GOLD, trajectory_id="gold")),
        (task, Prediction(instance_id=task.instance_id, model_patch="", trajectory_id="empty")),
    ]
    gold, empty = backend.evaluate(jobs)
    assert (gold.status, gold.resolved) == (Status.PASSED, True), gold
    assert (empty.status, empty.resolved) == (Status.FAILED, False), empty
    selector = "app.kubernetes.io/managed-by=gagar,app.kubernetes.io/name=gagar-sandbox"
    leftover = backend.core.list_namespaced_pod(config.namespace, label_selector=selector).items
    assert not [p for p in leftover if p.metadata.deletion_timestamp is None]
