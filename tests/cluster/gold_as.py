"""A gold patch evaluated in the sandbox as a given account: what the chart's Roles must allow."""

from __future__ import annotations

import os
from typing import Any

from kubernetes import client
from kubernetes import config as kube_config

from fixtures.calc import GOLD, calc_task


def api_as(user: str) -> client.ApiClient:
    """An API client of the test's kubeconfig impersonating ``user`` (e.g. a ServiceAccount's name
    ``system:serviceaccount:<namespace>:<account>``)."""
    configuration = client.Configuration()
    kube_config.load_kube_config(config_file=os.environ["KUBECONFIG"], client_configuration=configuration)
    api = client.ApiClient(configuration)
    api.set_default_header("Impersonate-User", user)
    return api


def evaluate_gold_as(user: str, sandbox_namespace: str, sandbox_image: str) -> tuple[Any, client.CoreV1Api]:
    """The result of a bundled task's gold patch evaluated by the Kubernetes backend as ``user``, and
    that user's core API (to check what else it may do)."""
    from gagar.sandbox.base import Prediction
    from gagar.sandbox.k8s import KubernetesBackend, KubernetesSandboxConfig

    api = api_as(user)
    task = calc_task()
    config = KubernetesSandboxConfig(namespace=sandbox_namespace, image=sandbox_image)
    backend = KubernetesBackend(config, client.CoreV1Api(api), client.NetworkingV1Api(api))
    (result,) = backend.evaluate(
        [(task, Prediction(instance_id=task.instance_id, model_patch=GOLD, trajectory_id="gold"))]
    )
    return result, client.CoreV1Api(api)
