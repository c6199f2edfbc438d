"""The Kubernetes backend on a real cluster: one gold and one empty patch (runs when KUBECONFIG is set).

Needs an image with python3 and pytest (``GAGAR_K8S_TEST_IMAGE``) and a namespace the
kubeconfig may create pods, ConfigMaps and NetworkPolicies in (``GAGAR_K8S_TEST_NAMESPACE``,
default ``gagar-sandbox``); the namespace should enforce the ``restricted`` Pod Security level.
"""

from __future__ import annotations

import os

import pytest

from fixtures.calc import GOLD, calc_task
from gagar.sandbox.base import Prediction
from gagar.sandbox.k8s import KubernetesBackend, KubernetesSandboxConfig
from gagar.sandbox.limits import SandboxLimits
from gagar.schema.result import Status

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a cluster: KUBECONFIG is not set"),
]


def test_gold_and_empty_patch_on_a_cluster() -> None:
    image = os.environ.get("GAGAR_K8S_TEST_IMAGE")
    if not image:
        pytest.fail("KUBECONFIG is set but GAGAR_K8S_TEST_IMAGE (an image with python3 and pytest) is not")
    task = calc_task(environment=image)
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
