"""Fixtures of the tests against a real cluster (``make test-cluster``: scripts/cluster-up.sh, then these).

They run when KUBECONFIG is set; GAGAR_K8S_TEST_IMAGE names the sandbox image the node has (an image
with python3 and pytest, e.g. ``make images``' gagar-sandbox). Each test module works in namespaces
of its own, created fresh and deleted at the end.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator

import pytest
from cluster_wait import wait_until


@pytest.fixture(scope="session")
def api_client():
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=os.environ["KUBECONFIG"], client_configuration=configuration)
    return client.ApiClient(configuration)


@pytest.fixture(scope="session")
def core(api_client):
    from kubernetes import client

    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    image = os.environ.get("GAGAR_K8S_TEST_IMAGE")
    if not image:
        pytest.fail("KUBECONFIG is set but GAGAR_K8S_TEST_IMAGE (an image with python3 and pytest) is not")
    return image


def _delete_namespace(core, name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, 120, f"namespace {name} deleted")


@pytest.fixture(scope="module")
def fresh_namespace(core) -> Iterator[Callable[[str], str]]:
    """``make(prefix)`` creates namespace ``<prefix>-<hex>`` (its default ServiceAccount ready);
    every namespace made is deleted at the end of the module."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}-{secrets.token_hex(3)}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        made.append(name)

        def has_default_account() -> bool:
            try:
                core.read_namespaced_service_account("default", name)
            except ApiException:
                return False
            return True

        wait_until(has_default_account, 60, f"default ServiceAccount of {name}")
        return name

    yield make
    for name in made:
        _delete_namespace(core, name)
