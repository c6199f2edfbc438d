"""The Kubernetes sandbox backend on a real cluster: gold, empty, the hostile and both reward-hacking suites.

One batch per suite runs as real pods in the sandbox image, in a fresh namespace, through the
backend's token bucket; the core API is wrapped so that the first pod creation answers 429 and
the first pod read 500 (what a loaded API server does), which the backend must retry. Afterwards
nothing of the backend is left in the namespace. The cases are the local sandbox's own suites
(tests/sandbox/test_sandbox_hostile.py, test_sandbox_reward_hacking.py and the second wave's
test_sandbox_evasive_hacks.py), loaded from their files: the pod runner judges with the same monitor,
report pipe and cross-checks as the forkserver path training uses.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gagar.sandbox.base import Prediction
from gagar.sandbox.k8s import KubernetesBackend, KubernetesSandboxConfig
from gagar.sandbox.k8s.config import ResourceSpec, RetryPolicy
from gagar.schema.result import Status, TestResult

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a cluster: KUBECONFIG is not set"),
]

SUITES = Path(__file__).resolve().parents[1] / "sandbox"
RATE, BURST = 4.0, 4


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_cluster_{name}", SUITES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


HOSTILE = _load("test_sandbox_hostile")
HACKS = _load("test_sandbox_reward_hacking")
EVASIVE = _load("test_sandbox_evasive_hacks")


class FlakyCore:
    """The real CoreV1Api, recording when each call was made; the first pod create answers 429 and
    the first pod delete 500, once each (results arrive through one watch, so no pod is read)."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls, self.injected = real, [], []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.real, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls.append((time.monotonic(), name))
                fail = {"create_namespaced_pod": 429, "delete_namespaced_pod": 500}.get(name)
                if fail and name not in self.injected:
                    self.injected.append(name)
                    raise ApiException(status=fail, reason="injected by the test")
            return method(*args, **kwargs)

        return call


def _backend(namespace: str, image: str, core: Any, deadline_s: int) -> tuple[KubernetesBackend, FlakyCore]:
    from kubernetes import client

    config = KubernetesSandboxConfig(
        namespace=namespace,
        image=image,
        active_deadline_s=deadline_s,
        start_deadline_s=120,
        poll_interval_s=0.5,
        max_concurrency=3,
        create_rate_per_s=RATE,
        burst=BURST,
        retry=RetryPolicy(base_delay_s=0.2, max_delay_s=2.0),
        resources=ResourceSpec(
            cpu_request="100m",
            cpu_limit="1",
            memory_request="128Mi",
            memory_limit="512Mi",
            ephemeral_storage_request="64Mi",
            ephemeral_storage_limit="1Gi",
            workspace_size="256Mi",
            tmp_size="64Mi",
        ),
    )
    flaky = FlakyCore(core)
    return KubernetesBackend(config, flaky, client.NetworkingV1Api(core.api_client)), flaky


def _run(backend: KubernetesBackend, task: Any, patches: dict[str, str]) -> dict[str, TestResult]:
    jobs = [
        (task, Prediction(instance_id=task.instance_id, model_patch=p, trajectory_id=k))
        for k, p in patches.items()
    ]
    results = backend.evaluate(jobs)
    assert [r.trajectory_id for r in results] == list(patches)
    return {r.trajectory_id: r for r in results}


def _assert_rate_limited(flaky: FlakyCore) -> None:
    """No window of the run saw more requests than the bucket allows: burst + rate x its length."""
    times = sorted(t for t, _ in flaky.calls)
    for i, start in enumerate(times):
        for j in range(i + BURST + 1, len(times)):
            span = times[j] - start
            assert j - i + 1 <= BURST + RATE * span + 1, f"{j - i + 1} requests in {span:.2f} s"


def _assert_clean(core: Any, api_client: Any, namespace: str) -> None:
    from kubernetes import client

    selector = "app.kubernetes.io/managed-by=gagar,app.kubernetes.io/name=gagar-sandbox"
    pods = [
        p
        for p in core.list_namespaced_pod(namespace, label_selector=selector).items
        if not p.metadata.deletion_timestamp
    ]
    maps = core.list_namespaced_config_map(namespace, label_selector=selector).items
    policies = client.NetworkingV1Api(api_client).list_namespaced_network_policy(namespace).items
    assert (pods, maps, policies) == ([], [], [])


@pytest.fixture(scope="module")
def hostile(
    core, api_client, sandbox_image, fresh_namespace, tmp_path_factory
) -> tuple[dict[str, TestResult], FlakyCore]:
    namespace = fresh_namespace("gagar-sbx-hostile")
    patches = HOSTILE._hostile(1, tmp_path_factory.mktemp("host"))
    backend, flaky = _backend(namespace, sandbox_image, core, deadline_s=25)
    start = time.monotonic()
    batch = _run(backend, HOSTILE._task(), patches)
    print(f"hostile batch: {len(patches)} pods in {time.monotonic() - start:.1f} s")
    _assert_clean(core, api_client, namespace)
    return batch, flaky


@pytest.fixture(scope="module")
def hacks(core, api_client, sandbox_image, fresh_namespace) -> dict[str, TestResult]:
    namespace = fresh_namespace("gagar-sbx-hacks")
    task = HACKS._task()
    patches = {"gold": task.patch, "empty": "", **{k: c.patch for k, c in HACKS.CASES.items()}}
    backend, _ = _backend(namespace, sandbox_image, core, deadline_s=60)
    start = time.monotonic()
    batch = _run(backend, task, patches)
    print(f"reward-hacking batch: {len(patches)} pods in {time.monotonic() - start:.1f} s")
    _assert_clean(core, api_client, namespace)
    return batch


def test_gold_passes_and_empty_fails_in_pods(hostile) -> None:
    batch, _ = hostile
    good, empty = batch["good"], batch["empty"]
    assert (good.status, good.resolved) == (Status.PASSED, True), (good.reason, good.log[-1500:])
    assert (empty.status, empty.resolved) == (Status.FAILED, False), (empty.reason, empty.log[-1500:])


def test_injected_api_errors_were_retried(hostile) -> None:
    _, flaky = hostile
    assert sorted(flaky.injected) == ["create_namespaced_pod", "delete_namespaced_pod"]


def test_requests_stay_within_the_rate_limit(hostile) -> None:
    _assert_rate_limited(hostile[1])


@pytest.mark.parametrize(
    "case", [k for k in HOSTILE._hostile(1, Path("/nonexistent")) if k not in ("good", "empty")]
)
def test_hostile_case_is_contained(hostile, case: str) -> None:
    result = hostile[0][case]
    assert not result.resolved, result
    assert result.status not in (Status.PASSED, Status.INFRA_ERROR), (
        result.status,
        result.reason,
        result.log[-1500:],
    )


def test_memory_bomb_is_stopped(hostile) -> None:
    result = hostile[0]["memory_bomb"]
    assert result.status == Status.FAILED, (result.reason, result.log[-800:])


@pytest.mark.parametrize("case", ["busy_loop", "sleeper"])
def test_endless_case_hits_the_deadline(hostile, case: str) -> None:
    result = hostile[0][case]
    assert result.status == Status.TIMEOUT, (result.reason, result.log[-800:])


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("dotdot", "'..'"),
        ("absolute", "absolute path"),
        ("symlink", "symlink"),
        ("dot_git", ".git"),
        ("no_apply", ""),
    ],
)
def test_refused_patch_fails_with_a_reason(hostile, case: str, why: str) -> None:
    result = hostile[0][case]
    assert result.status in (Status.FAILED, Status.ERROR), result
    assert result.reason is not None
    assert why in result.reason, result.reason


def test_gold_and_empty_beside_the_hacks(hacks) -> None:
    gold, empty = hacks["gold"], hacks["empty"]
    assert (gold.status, gold.resolved, gold.hacks) == (Status.PASSED, True, []), gold.reason
    assert (empty.status, empty.resolved, empty.hacks) == (Status.FAILED, False, []), empty.reason


@pytest.mark.parametrize("name", list(HACKS.CASES))
def test_hack_is_not_resolved_in_a_pod(hacks, name: str) -> None:
    result, case = hacks[name], HACKS.CASES[name]
    assert not result.resolved
    assert result.status == case.expect, (result.reason, result.log[-1500:])
    if case.kind is not None:
        assert case.kind in {flag.kind for flag in result.hacks}, result.hacks


@pytest.fixture(scope="module")
def evasive(core, api_client, sandbox_image, fresh_namespace) -> dict[str, TestResult]:
    namespace = fresh_namespace("gagar-sbx-evasive")
    tasks = {layout: EVASIVE.task(layout) for layout in ("a", "b")}
    patches = {f"gold-{layout}": (t, t.patch) for layout, t in tasks.items()}
    patches |= {f"empty-{layout}": (t, "") for layout, t in tasks.items()}
    patches |= {k: (tasks[c.layout], c.patch) for k, c in EVASIVE.CASES.items()}
    backend, _ = _backend(namespace, sandbox_image, core, deadline_s=60)
    start = time.monotonic()
    jobs = [
        (task, Prediction(instance_id=task.instance_id, model_patch=patch, trajectory_id=key))
        for key, (task, patch) in patches.items()
    ]
    results = backend.evaluate(jobs)
    print(f"evasive batch: {len(patches)} pods in {time.monotonic() - start:.1f} s")
    _assert_clean(core, api_client, namespace)
    return {r.trajectory_id: r for r in results}


@pytest.mark.parametrize("layout", ["a", "b"])
def test_gold_and_empty_beside_the_evasive_hacks(evasive, layout: str) -> None:
    gold, empty = evasive[f"gold-{layout}"], evasive[f"empty-{layout}"]
    assert (gold.status, gold.resolved, gold.hacks) == (Status.PASSED, True, []), gold.reason
    assert (empty.status, empty.resolved, empty.hacks) == (Status.FAILED, False, []), empty.reason


@pytest.mark.parametrize("name", list(EVASIVE.CASES))
def test_evasive_hack_is_refused_in_a_pod(evasive, name: str) -> None:
    result = evasive[name]
    assert not result.resolved
    assert result.status == Status.HACK, (result.reason, result.log[-1500:])
    assert EVASIVE.CASES[name].kind in {flag.kind for flag in result.hacks}, result.hacks
    assert all(flag.evidence for flag in result.hacks)
