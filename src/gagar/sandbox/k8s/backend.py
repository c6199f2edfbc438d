"""KubernetesBackend: one hardened pod per evaluation, rate-limited, retried, always cleaned up.

Per ``evaluate()`` call (a *run*): sweep objects of earlier runs older than the TTL, create
a deny-all NetworkPolicy, then, through a bounded thread pool, for each job create its
input ConfigMap and pod, poll the pod until it ends, read the runner's summary from its
log and delete both. Every API request passes one token bucket and is retried on
409/429/5xx. Whatever happens, the run's pods, ConfigMaps and NetworkPolicy are deleted
again by label selector at the end.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gagar.sandbox.base import Prediction, ProgressCallback
from gagar.sandbox.k8s.config import KubernetesSandboxConfig
from gagar.sandbox.k8s.objects import (
    APP_LABEL,
    RUN_KEY,
    EvalPlan,
    ObjectTooLargeError,
    build_configmap,
    build_network_policy,
    build_pod,
    plan_evaluation,
)
from gagar.sandbox.k8s.outcome import check_pod, parse_summary, result_from_summary
from gagar.sandbox.k8s.ratelimit import TokenBucket, call_with_retry
from gagar.sandbox.patch import PatchError, parse_patch
from gagar.schema.result import Status, TestResult
from gagar.schema.task import Task

__all__ = ["KubernetesBackend", "load_apis"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_LOST_GRACE_S = 120.0
"""Past start deadline + activeDeadlineSeconds + this, a pod that has not ended is taken as lost."""


def load_apis(max_concurrency: int) -> tuple[client.CoreV1Api, client.NetworkingV1Api]:
    """Core and networking APIs from KUBECONFIG (or ~/.kube/config), else the in-cluster service account."""
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    kube_config.load_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = max(4, max_concurrency + 2)
    api = client.ApiClient(configuration)
    return client.CoreV1Api(api), client.NetworkingV1Api(api)


class KubernetesBackend:
    """SandboxBackend running each evaluation in its own pod (see the module docstring)."""

    def __init__(
        self,
        config: KubernetesSandboxConfig,
        core_api: Any = None,
        networking_api: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``core_api``/``networking_api`` default to clients built by :func:`load_apis`."""
        if core_api is None or networking_api is None:
            core_api, networking_api = load_apis(config.max_concurrency)
        self.config, self.core, self.networking = config, core_api, networking_api
        self._clock, self._sleep = clock, sleep
        self.bucket = TokenBucket(config.create_rate_per_s, config.burst, clock=clock, sleep=sleep)
        self._stop = threading.Event()

    # -- API calls -------------------------------------------------------------------------------

    def _call(self, fn: Callable[[], T], *, retry_conflict: bool = True) -> T:
        return call_with_retry(
            fn, self.config.retry, self.bucket, retry_conflict=retry_conflict, sleep=self._sleep
        )

    def _create(self, create: Callable[..., Any], read: Callable[..., Any], body: Any) -> None:
        """Create ``body``; on 409, an object already carrying all its labels is our earlier attempt."""
        ns, name = self.config.namespace, body.metadata.name
        try:
            self._call(lambda: create(ns, body), retry_conflict=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
            existing = self._call(lambda: read(name, ns))
            labels = existing.metadata.labels or {}
            if any(labels.get(key) != value for key, value in body.metadata.labels.items()):
                raise
            log.info("%s %s already existed from an earlier attempt; reusing it", body.kind, name)

    def _delete(self, delete: Callable[..., Any], name: str) -> None:
        """Delete one object; absent is fine, other failures are logged (the run sweep retries them)."""
        try:
            self._call(lambda: delete(name, self.config.namespace, grace_period_seconds=0))
        except ApiException as exc:
            if exc.status != 404:
                log.warning("could not delete %s: %s %s", name, exc.status, exc.reason)

    # -- one evaluation --------------------------------------------------------------------------

    def _result(self, task: Task, pred: Prediction, start: float, status: Status, reason: str) -> TestResult:
        duration = self._clock() - start
        return TestResult(
            trajectory_id=pred.key,
            instance_id=task.instance_id,
            status=status,
            reason=reason,
            duration_s=duration,
        )

    def _evaluate_one(self, run_id: str, index: int, task: Task, pred: Prediction) -> TestResult:
        start = self._clock()
        try:
            if pred.model_patch.strip():  # refuse what the local backend refuses, before any pod exists
                parse_patch(pred.model_patch, self.config.max_patch_bytes)
            plan = plan_evaluation(self.config, run_id, index, task, pred)
            configmap, pod = build_configmap(self.config, plan), build_pod(self.config, plan)
        except PatchError as exc:
            return self._result(task, pred, start, Status.ERROR, f"refused patch: {exc}")
        except ObjectTooLargeError as exc:
            return self._result(
                task, pred, start, Status.ERROR if exc.policy_fault else Status.INFRA_ERROR, str(exc)
            )
        except ValueError as exc:
            return self._result(task, pred, start, Status.INFRA_ERROR, str(exc))
        try:
            self._create(
                self.core.create_namespaced_config_map,
                self.core.read_namespaced_config_map,
                configmap,
            )
            self._create(self.core.create_namespaced_pod, self.core.read_namespaced_pod, pod)
            return self._await_pod(plan, start)
        except ApiException as exc:
            reason = f"Kubernetes API error {exc.status} ({exc.reason}) for {plan.name}"
            return self._result(task, pred, start, Status.INFRA_ERROR, reason)
        except Exception as exc:  # a connection error must not sink the other evaluations
            return self._result(task, pred, start, Status.INFRA_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            self._delete(self.core.delete_namespaced_pod, plan.name)
            self._delete(self.core.delete_namespaced_config_map, plan.name)

    def _await_pod(self, plan: EvalPlan, start: float) -> TestResult:
        """Poll the pod until it ends, then turn it into a TestResult."""
        cfg, task, pred = self.config, plan.task, plan.prediction
        created = self._clock()
        while not self._stop.is_set():
            pod = self._call(lambda: self.core.read_namespaced_pod(plan.name, cfg.namespace))
            check = check_pod(pod)
            waited = self._clock() - created
            if check.state == "finished":
                text = self._call(
                    lambda: self.core.read_namespaced_pod_log(plan.name, cfg.namespace, container="sandbox")
                )
                summary = parse_summary(text, plan.nonce)
                return result_from_summary(
                    task, pred.key, summary, self._clock() - start, cfg.max_log_chars, text, cfg.judge
                )
            if check.state == "timeout":
                return self._result(task, pred, start, Status.TIMEOUT, check.reason or "timeout")
            if check.state in ("oom_killed", "evicted_limit"):
                return self._result(task, pred, start, Status.FAILED, check.reason or check.state)
            if check.state == "infra_error":
                return self._result(task, pred, start, Status.INFRA_ERROR, check.reason or "infra error")
            if check.state == "waiting" and waited > cfg.start_deadline_s:
                why = f" ({check.reason})" if check.reason else ""
                reason = f"pod did not start within {cfg.start_deadline_s:.0f} s{why}"
                return self._result(task, pred, start, Status.INFRA_ERROR, reason)
            if waited > cfg.start_deadline_s + cfg.active_deadline_s + _LOST_GRACE_S:
                return self._result(task, pred, start, Status.INFRA_ERROR, "pod never ended (node lost?)")
            self._stop.wait(cfg.poll_interval_s)
        return self._result(task, pred, start, Status.INFRA_ERROR, "evaluation cancelled")

    # -- a run -----------------------------------------------------------------------------------

    def _selector(self, run_id: str | None = None) -> str:
        parts = [f"{k}={v}" for k, v in APP_LABEL.items()] + ([f"{RUN_KEY}={run_id}"] if run_id else [])
        return ",".join(parts)

    def sweep_stale(self) -> int:
        """Delete this backend's objects older than ``ttl_s`` (left by crashed runs); return how many."""
        cutoff = datetime.now(UTC) - timedelta(seconds=self.config.ttl_s)
        ns, count = self.config.namespace, 0
        kinds = [
            (self.core.list_namespaced_pod, self.core.delete_namespaced_pod),
            (self.core.list_namespaced_config_map, self.core.delete_namespaced_config_map),
            (
                self.networking.list_namespaced_network_policy,
                self.networking.delete_namespaced_network_policy,
            ),
        ]
        for list_fn, delete_fn in kinds:
            items = self._call(lambda lf=list_fn: lf(ns, label_selector=self._selector())).items
            for item in items:
                created = item.metadata.creation_timestamp
                if created is not None and created < cutoff:
                    self._delete(delete_fn, item.metadata.name)
                    count += 1
        return count

    def _cleanup_run(self, run_id: str) -> None:
        """Delete everything of the run by label selector; failures are logged, never raised."""
        ns, selector = self.config.namespace, self._selector(run_id)
        for delete_all in (
            self.core.delete_collection_namespaced_pod,
            self.core.delete_collection_namespaced_config_map,
        ):
            try:
                self._call(lambda d=delete_all: d(ns, label_selector=selector, grace_period_seconds=0))
            except ApiException as exc:
                log.warning("cleanup of run %s failed: %s %s", run_id, exc.status, exc.reason)
        self._delete(
            self.networking.delete_namespaced_network_policy,
            build_network_policy(self.config, run_id).metadata.name,
        )

    def evaluate(
        self, jobs: Sequence[tuple[Task, Prediction]], on_result: ProgressCallback | None = None
    ) -> list[TestResult]:
        """One TestResult per job, in order; infrastructure failures come back as ``infra_error`` results."""
        run_id = secrets.token_hex(6)
        self._stop.clear()
        results: list[TestResult | None] = [None] * len(jobs)
        try:
            try:
                self.sweep_stale()
            except ApiException as exc:
                log.warning("sweep of stale sandbox objects failed: %s %s", exc.status, exc.reason)
            policy = build_network_policy(self.config, run_id)
            self._create(
                self.networking.create_namespaced_network_policy,
                self.networking.read_namespaced_network_policy,
                policy,
            )
            with ThreadPoolExecutor(self.config.max_concurrency, thread_name_prefix="gagar-k8s") as pool:
                futures = {
                    pool.submit(self._evaluate_one, run_id, i, t, p): i for i, (t, p) in enumerate(jobs)
                }
                try:
                    for future in as_completed(futures):
                        results[futures[future]] = result = future.result()
                        if on_result is not None:
                            on_result(result)
                except BaseException:
                    self._stop.set()
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
        finally:
            self._cleanup_run(run_id)
        return [r for r in results if r is not None]
