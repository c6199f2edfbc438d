"""The Kubernetes sandbox backend on a real cluster: gold, empty, the hostile and the reward-hacking suites,
each case inside a group pod beside neighbours whose verdicts must not change.

One batch per suite runs as real pods in the sandbox image, in a fresh namespace, through the
backend's token bucket, packed into pods of 8 evaluations of the task: every case is followed
in its pod by a neighbour that resolves only if nothing the case did is visible (for the hostile
suite, the checker of tests/sandbox/test_k8s_groups.py; for the reward hacks, the gold patch), and
the hostile suite gains that file's "leftovers" case (files in /tmp, /dev/shm and ahead in the
workspace, a detached process that tries to kill the runner). The core API is wrapped so that the
first pod creation answers 429 and the first batch delete 500 (what a loaded API server does),
which the backend must retry. Afterwards nothing of the backend is left in the namespace. The
cases are the local sandbox's own suites (tests/sandbox/test_sandbox_hostile.py,
test_sandbox_reward_hacking.py and the second wave's test_sandbox_evasive_hacks.py), loaded from
their files: the pod runner judges with the same monitor, report channel and cross-checks as the
forkserver path training uses.
"""

from __future__ import annotations

import importlib.util
import math
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
from gagar.sandbox.limits import SandboxLimits
from gagar.schema.result import Status, TestResult

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a cluster: KUBECONFIG is not set"),
]

SUITES = Path(__file__).resolve().parents[1] / "sandbox"
RATE, BURST = 4.0, 4
GROUP = 8


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_cluster_{name}", SUITES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    if str(SUITES) not in sys.path:  # test_k8s_groups imports test_k8s_backend
        sys.path.insert(0, str(SUITES))
    spec.loader.exec_module(module)
    return module


HOSTILE = _load("test_sandbox_hostile")
HACKS = _load("test_sandbox_reward_hacking")
GROUPS = _load("test_k8s_groups")
EVASIVE = _load("test_sandbox_evasive_hacks")


class FlakyCore:
    """The real CoreV1Api, recording when each call was made; the first pod create answers 429 and
    the first batch delete of pods 500, once each (results arrive through one watch, so no pod is
    read, and finished pods go by label selector, so none is deleted alone)."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls, self.injected = real, [], []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.real, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls.append((time.monotonic(), name))
                fail = {"create_namespaced_pod": 429, "delete_collection_namespaced_pod": 500}.get(name)
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
        group_size=GROUP,
        limits=SandboxLimits(wall_time_s=deadline_s, cpu_time_s=deadline_s, memory_bytes=384 << 20),
        start_deadline_s=120,
        max_concurrency=2 * GROUP,
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


def _with_neighbours(cases: dict[str, str], neighbour: str) -> dict[str, str]:
    """Each case followed by a neighbour ``after-<case>`` (packed into the same pod, in order)."""
    out: dict[str, str] = {}
    for name, patch in cases.items():
        out[name] = patch
        out[f"after-{name}"] = neighbour
    return out


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
) -> tuple[dict[str, TestResult], FlakyCore, KubernetesBackend]:
    namespace = fresh_namespace("gagar-sbx-hostile")
    cases = HOSTILE._hostile(1, tmp_path_factory.mktemp("host"))
    cases["leftovers"] = HOSTILE._calc(GROUPS.HOSTILE_BODY)
    patches = _with_neighbours(cases, HOSTILE._calc(GROUPS.CHECKER_BODY))
    backend, flaky = _backend(namespace, sandbox_image, core, deadline_s=25)
    start = time.monotonic()
    batch = _run(backend, HOSTILE._task(), patches)
    print(f"hostile batch: {len(patches)} evaluations in {backend.last_run.pods_created} pods, "
          f"{time.monotonic() - start:.1f} s")  # fmt: skip
    _assert_clean(core, api_client, namespace)
    return batch, flaky, backend


@pytest.fixture(scope="module")
def hacks(core, api_client, sandbox_image, fresh_namespace) -> dict[str, TestResult]:
    namespace = fresh_namespace("gagar-sbx-hacks")
    task = HACKS._task()
    cases = {"gold": task.patch, "empty": "", **{k: c.patch for k, c in HACKS.CASES.items()}}
    patches = _with_neighbours(cases, task.patch)
    backend, _ = _backend(namespace, sandbox_image, core, deadline_s=60)
    start = time.monotonic()
    batch = _run(backend, task, patches)
    print(f"reward-hacking batch: {len(patches)} evaluations in {backend.last_run.pods_created} pods, "
          f"{time.monotonic() - start:.1f} s")  # fmt: skip
    _assert_clean(core, api_client, namespace)
    return batch


def test_gold_passes_and_empty_fails_in_pods(hostile) -> None:
    batch, _, _ = hostile
    good, empty = batch["good"], batch["empty"]
    assert (good.status, good.resolved) == (Status.PASSED, True), (good.reason, good.log[-1500:])
    assert (empty.status, empty.resolved) == (Status.FAILED, False), (empty.reason, empty.log[-1500:])


def test_injected_api_errors_were_retried(hostile) -> None:
    _, flaky, _ = hostile
    assert sorted(flaky.injected) == ["create_namespaced_pod", "delete_collection_namespaced_pod"]


def test_evaluations_share_group_pods_without_a_request_per_pod_end(hostile) -> None:
    batch, flaky, backend = hostile
    assert backend.last_run.pods_created == math.ceil(len(batch) / GROUP)
    names = [name for _, name in flaky.calls]
    assert not {"read_namespaced_pod", "delete_namespaced_pod"} & set(names)
    assert backend.last_run.log_reads == 0, "every group's account fitted its termination message"


@pytest.mark.parametrize("case", [*HOSTILE._hostile(1, Path("/nonexistent")), "leftovers"])
def test_the_neighbour_after_each_hostile_case_is_unaffected(hostile, case: str) -> None:
    result = hostile[0][f"after-{case}"]
    assert (result.status, result.resolved) == (Status.PASSED, True), (result.reason, result.log[-1500:])


def test_leftovers_case_itself_is_judged_on_its_patch(hostile) -> None:
    result = hostile[0]["leftovers"]
    assert result.status != Status.INFRA_ERROR, (result.reason, result.log[-1500:])


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


@pytest.mark.parametrize("name", ["gold", "empty", *HACKS.CASES])
def test_the_gold_neighbour_after_each_hack_resolves(hacks, name: str) -> None:
    result = hacks[f"after-{name}"]
    assert (result.status, result.resolved, result.hacks) == (Status.PASSED, True, []), result.reason


@pytest.mark.parametrize("name", list(HACKS.CASES))
def test_hack_is_not_resolved_in_a_pod(hacks, name: str) -> None:
    result, case = hacks[name], HACKS.CASES[name]
    assert not result.resolved
    assert result.status == case.expect, (result.reason, result.log[-1500:])
    if case.kind is not None:
        assert case.kind in {flag.kind for flag in result.hacks}, result.hacks


@pytest.fixture(scope="module")
def evasive(core, api_client, sandbox_image, fresh_namespace) -> dict[str, TestResult]:
    """The evasive suite in group pods, each case followed by its layout's gold patch."""
    namespace = fresh_namespace("gagar-sbx-evasive")
    tasks = {layout: EVASIVE.task(layout) for layout in ("a", "b")}
    cases = {f"gold-{layout}": (layout, t.patch) for layout, t in tasks.items()}
    cases |= {f"empty-{layout}": (layout, "") for layout in tasks}
    cases |= {name: (case.layout, case.patch) for name, case in EVASIVE.CASES.items()}
    jobs = []
    for name, (layout, patch) in cases.items():
        task = tasks[layout]
        for key, text in ((name, patch), (f"after-{name}", task.patch)):
            jobs.append((task, Prediction(instance_id=task.instance_id, model_patch=text, trajectory_id=key)))
    backend, _ = _backend(namespace, sandbox_image, core, deadline_s=60)
    start = time.monotonic()
    results = backend.evaluate(jobs)
    print(f"evasive batch: {len(jobs)} evaluations in {backend.last_run.pods_created} pods, "
          f"{time.monotonic() - start:.1f} s")  # fmt: skip
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


@pytest.mark.parametrize("name", list(EVASIVE.CASES))
def test_the_gold_neighbour_after_each_evasive_hack_resolves(evasive, name: str) -> None:
    result = evasive[f"after-{name}"]
    assert (result.status, result.resolved, result.hacks) == (Status.PASSED, True, []), result.reason
