"""KubernetesBackend: one hardened pod per evaluation, rate-limited, watched, always cleaned up.

Per ``evaluate()`` call (a *run*): sweep objects of earlier runs older than the TTL, create
a deny-all NetworkPolicy and the run's code ConfigMap, start one watch over the run's pods
(:class:`~gagar.sandbox.k8s.watch.PodWatch`), then keep up to ``max_concurrency``
evaluations in flight: a pool of ``api_workers`` threads creates each one's input
ConfigMap and pod, the watch reports how each pod ends, and a second pool of the same
size reads its result (from the termination message in the watched status; the pod log
only when the message says the summary did not fit) and deletes both objects. Creates
wait behind deletes, never the reverse. The calling thread owns all bookkeeping: it
admits evaluations, applies the start deadline, the lost-pod deadline and the step's
straggler policy (:mod:`gagar.sandbox.k8s.straggler`), and collects results. Every API
request passes one adaptive token bucket and is retried on 409/429/5xx. Whatever happens,
the run's pods and ConfigMaps and its NetworkPolicy are deleted again by label selector
at the end. Platform failures are ``infra_error`` results, never the policy's.
"""

from __future__ import annotations

import logging
import queue
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
    build_code_configmap,
    build_configmap,
    build_network_policy,
    build_pod,
    code_configmap_name,
    plan_evaluation,
)
from gagar.sandbox.k8s.outcome import OVERFLOW, decode_result, parse_summary, result_from_summary
from gagar.sandbox.k8s.ratelimit import TokenBucket, call_with_retry
from gagar.sandbox.k8s.straggler import StragglerPolicy, quorum_size
from gagar.sandbox.k8s.watch import PodEvent, PodWatch
from gagar.sandbox.patch import PatchError, parse_patch
from gagar.schema.result import Status, TestResult
from gagar.schema.task import Task

__all__ = ["KubernetesBackend", "RunStats", "configure_client", "load_apis"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_LOST_GRACE_S = 120.0
"""Past start deadline + activeDeadlineSeconds + this, a pod that has not ended is taken as lost."""
_TICK_S = 0.5
"""How often the calling thread checks deadlines when no event arrives."""


def load_apis(api_workers: int) -> tuple[client.CoreV1Api, client.NetworkingV1Api]:
    """Core and networking APIs from KUBECONFIG (or ~/.kube/config), else the in-cluster service account."""
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    kube_config.load_config(client_configuration=configuration)
    configure_client(configuration, api_workers)
    api = client.ApiClient(configuration)
    return client.CoreV1Api(api), client.NetworkingV1Api(api)


def configure_client(configuration: client.Configuration, api_workers: int) -> None:
    """Size the connection pool for both worker pools and the watch, and leave 429s to us.

    urllib3 would otherwise retry a 429 carrying Retry-After itself, three times, unseen by
    the adaptive token bucket; connection errors keep urllib3's retries.
    """
    import urllib3

    configuration.connection_pool_maxsize = 2 * api_workers + 4
    configuration.retries = urllib3.Retry(total=3, respect_retry_after_header=False, status_forcelist=())


@dataclass
class RunStats:
    """What the last evaluate() call did, for benchmarks and logs."""

    evaluations: int = 0
    pods_created: int = 0
    peak_in_flight: int = 0
    stragglers_cut: int = 0
    wall_s: float = 0.0
    requests: int = 0
    throttled: int = 0
    min_rate: float = 0.0
    log_reads: int = 0
    watch_relists: int = 0
    watch_reconnects: int = 0


@dataclass(slots=True)
class _InFlight:
    """One admitted evaluation, owned by the calling thread: all memory an evaluation holds while out."""

    index: int
    plan: EvalPlan
    admitted: float
    created: float | None = None
    running: bool = False
    waiting_reason: str | None = None
    finishing: bool = False


@dataclass(slots=True)
class _Msg:
    """What the worker pools and the watch tell the calling thread."""

    kind: str  # "created", "refused", "create_failed", "deleted" (from the pools), "pod" (the watch)
    index: int = -1
    result: TestResult | None = None
    event: PodEvent | None = None
    at: float = 0.0


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
            core_api, networking_api = load_apis(config.api_workers)
        self.config, self.core, self.networking = config, core_api, networking_api
        self._clock, self._sleep = clock, sleep
        self.bucket = TokenBucket(config.create_rate_per_s, config.burst, clock=clock, sleep=sleep)
        self.policy = StragglerPolicy(config.step_quorum, config.straggler_wait_s, config.step_deadline_s)
        self.last_run = RunStats()
        self._log_reads = 0

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
        except Exception as exc:  # a connection error: the run's sweep deletes it
            log.warning("could not delete %s: %s", name, exc)

    # -- one evaluation --------------------------------------------------------------------------

    def _result(self, task: Task, pred: Prediction, start: float, status: Status, reason: str) -> TestResult:
        return TestResult(
            trajectory_id=pred.key,
            instance_id=task.instance_id,
            status=status,
            reason=reason,
            duration_s=self._clock() - start,
        )

    def _refusal(self, task: Task, pred: Prediction, start: float, exc: Exception) -> TestResult:
        """The result of an evaluation refused before any object exists."""
        if isinstance(exc, PatchError):
            return self._result(task, pred, start, Status.ERROR, f"refused patch: {exc}")
        if isinstance(exc, ObjectTooLargeError):
            status = Status.ERROR if exc.policy_fault else Status.INFRA_ERROR
            return self._result(task, pred, start, status, str(exc))
        return self._result(task, pred, start, Status.INFRA_ERROR, str(exc))

    def _create_objects(self, entry: _InFlight) -> _Msg:
        """Worker: build and create the evaluation's ConfigMap and pod (bodies dropped once sent)."""
        plan = entry.plan
        try:
            try:
                if plan.prediction.model_patch.strip():  # refuse what the local backend refuses
                    parse_patch(plan.prediction.model_patch, self.config.max_patch_bytes)
                configmap, pod = build_configmap(self.config, plan), build_pod(self.config, plan)
            except (PatchError, ValueError) as exc:
                refusal = self._refusal(plan.task, plan.prediction, entry.admitted, exc)
                return _Msg("refused", entry.index, refusal)
            self._create(
                self.core.create_namespaced_config_map, self.core.read_namespaced_config_map, configmap
            )
            del configmap
            self._create(self.core.create_namespaced_pod, self.core.read_namespaced_pod, pod)
            return _Msg("created", entry.index, at=self._clock())
        except ApiException as exc:
            reason = f"Kubernetes API error {exc.status} ({exc.reason}) for {plan.name}"
            return _Msg("create_failed", entry.index, self._infra(entry, reason))
        except Exception as exc:  # a connection error must not sink the other evaluations
            return _Msg("create_failed", entry.index, self._infra(entry, f"{type(exc).__name__}: {exc}"))

    def _infra(self, entry: _InFlight, reason: str) -> TestResult:
        plan = entry.plan
        return self._result(plan.task, plan.prediction, entry.admitted, Status.INFRA_ERROR, reason)

    def _read_log_result(self, entry: _InFlight) -> TestResult:
        """The result from the pod log: for a summary too large for the termination message, or none there."""
        plan, cfg = entry.plan, self.config
        self._log_reads += 1
        try:
            text = self._call(
                lambda: self.core.read_namespaced_pod_log(plan.name, cfg.namespace, container="sandbox")
            )
        except ApiException as exc:
            reason = f"Kubernetes API error {exc.status} ({exc.reason}) reading the log of {plan.name}"
            return self._infra(entry, reason)
        except Exception as exc:
            return self._infra(entry, f"{type(exc).__name__}: {exc}")
        return self._summary_result(entry, parse_summary(text, plan.nonce), text)

    def _summary_result(self, entry: _InFlight, summary: dict[str, Any] | None, text: str = "") -> TestResult:
        plan, cfg = entry.plan, self.config
        return result_from_summary(
            plan.task, plan.prediction.key, summary, self._clock() - entry.admitted,
            cfg.max_log_chars, text, cfg.judge,
        )  # fmt: skip

    def _finish(self, entry: _InFlight, read_log: bool) -> _Msg:
        """Worker: read the result from the log when asked, then delete the evaluation's objects."""
        try:
            result = self._read_log_result(entry) if read_log else None
        finally:
            self._delete(self.core.delete_namespaced_pod, entry.plan.name)
            self._delete(self.core.delete_namespaced_config_map, entry.plan.name)
        return _Msg("deleted", entry.index, result)

    # -- deciding from the watch and the clock ---------------------------------------------------

    def _decide(self, entry: _InFlight, event: PodEvent) -> TestResult | bool:
        """What a pod event means: its result, True when only the pod log has it, False to keep waiting."""
        task, pred, start, check = entry.plan.task, entry.plan.prediction, entry.admitted, event.check
        if event.kind == "DELETED" and check.state not in ("finished", "timeout", "oom_killed"):
            return self._infra(entry, "pod deleted before it ended (not by gagar)")
        if check.state == "finished":
            summary = decode_result(event.message, entry.plan.nonce, self.config.max_report_bytes)
            if isinstance(summary, dict):
                return self._summary_result(entry, summary)
            if summary == OVERFLOW or event.message is None:
                return True
            return self._summary_result(entry, None, event.message)
        if check.state == "timeout":
            return self._result(task, pred, start, Status.TIMEOUT, check.reason or "timeout")
        if check.state in ("oom_killed", "evicted_limit"):
            return self._result(task, pred, start, Status.FAILED, check.reason or check.state)
        if check.state == "infra_error":
            return self._result(task, pred, start, Status.INFRA_ERROR, check.reason or "infra error")
        if check.state == "running":
            entry.running = True
        elif check.state == "waiting":
            entry.waiting_reason = check.reason
        return False

    def _overdue(self, entry: _InFlight, now: float) -> TestResult | None:
        """An infra_error result when the pod is past its start or lost deadline, else None."""
        if entry.created is None:
            return None
        waited, cfg = now - entry.created, self.config
        if not entry.running and waited > cfg.start_deadline_s:
            why = f" ({entry.waiting_reason})" if entry.waiting_reason else ""
            return self._infra(entry, f"pod did not start within {cfg.start_deadline_s:.0f} s{why}")
        if waited > cfg.start_deadline_s + cfg.active_deadline_s + _LOST_GRACE_S:
            return self._infra(entry, "pod never ended (node lost?)")
        return None

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
            except Exception as exc:
                log.warning("cleanup of run %s failed: %s", run_id, exc)
        self._delete(
            self.networking.delete_namespaced_network_policy,
            build_network_policy(self.config, run_id).metadata.name,
        )
        self._delete(self.core.delete_namespaced_config_map, code_configmap_name(run_id))

    def _prepare_run(self, run_id: str) -> None:
        try:
            self.sweep_stale()
        except ApiException as exc:
            log.warning("sweep of stale sandbox objects failed: %s %s", exc.status, exc.reason)
        self._create(
            self.networking.create_namespaced_network_policy,
            self.networking.read_namespaced_network_policy,
            build_network_policy(self.config, run_id),
        )
        self._create(
            self.core.create_namespaced_config_map,
            self.core.read_namespaced_config_map,
            build_code_configmap(self.config, run_id),
        )

    def evaluate(
        self, jobs: Iterable[tuple[Task, Prediction]], on_result: ProgressCallback | None = None
    ) -> list[TestResult]:
        """One TestResult per job, in order; infrastructure failures come back as ``infra_error`` results."""
        jobs = list(jobs)
        run_id = secrets.token_hex(6)
        started = self._clock()
        self.last_run, self._log_reads = RunStats(evaluations=len(jobs)), 0
        before = self.bucket.stats
        inbox: queue.SimpleQueue[_Msg] = queue.SimpleQueue()
        watch = PodWatch(
            self.core,
            self.config.namespace,
            self._selector(run_id),
            lambda event: inbox.put(_Msg("pod", event=event)),
            self._call,
            timeout_s=self.config.watch_timeout_s,
            sleep=self._sleep,
        )
        workers = self.config.api_workers
        creators = ThreadPoolExecutor(workers, thread_name_prefix="gagar-k8s-create")
        finishers = ThreadPoolExecutor(workers, thread_name_prefix="gagar-k8s-finish")
        try:
            self._prepare_run(run_id)
            watch.start()
            return self._drive(run_id, jobs, inbox, creators, finishers, on_result, started)
        finally:
            creators.shutdown(wait=True, cancel_futures=True)
            finishers.shutdown(wait=True, cancel_futures=True)
            watch.stop()
            self._cleanup_run(run_id)
            after = self.bucket.stats
            stats = self.last_run
            stats.wall_s = self._clock() - started
            stats.requests = after.requests - before.requests
            stats.throttled = after.throttled - before.throttled
            stats.min_rate, stats.log_reads = after.min_rate_seen, self._log_reads
            stats.watch_relists, stats.watch_reconnects = watch.relists, watch.reconnects

    def _drive(
        self,
        run_id: str,
        jobs: Sequence[tuple[Task, Prediction]],
        inbox: queue.SimpleQueue[_Msg],
        creators: ThreadPoolExecutor,
        finishers: ThreadPoolExecutor,
        on_result: ProgressCallback | None,
        started: float,
    ) -> list[TestResult]:
        """The calling thread's loop: admit, follow the watch, apply deadlines, collect results.

        A result is recorded as soon as it is known (most come from the watched status);
        an evaluation leaves the in-flight count once its objects are deleted. Deletes
        still queued when the last result is in are left to the run's cleanup, which
        removes them by label selector in one request per kind.
        """
        total, cfg, stats = len(jobs), self.config, self.last_run
        results: list[TestResult | None] = [None] * total
        by_name: dict[str, _InFlight] = {}
        out: dict[int, _InFlight] = {}
        early: dict[str, PodEvent] = {}  # events of pods whose create has not returned yet
        next_job = done = 0
        quorum, quorum_at = quorum_size(total, cfg.step_quorum), None
        last_scan = started

        def record(index: int, result: TestResult) -> None:
            nonlocal done, quorum_at
            if results[index] is not None:
                return
            results[index] = result
            done += 1
            if quorum_at is None and done >= quorum:
                quorum_at = self._clock()
            if on_result is not None:
                on_result(result)

        def finish(entry: _InFlight, outcome: TestResult | bool) -> None:
            """Record the result (unless only the log has it) and have a finisher delete the objects."""
            if entry.finishing:
                return
            entry.finishing = True
            if isinstance(outcome, TestResult):
                record(entry.index, outcome)
            finishers.submit(lambda: inbox.put(self._finish(entry, read_log=outcome is True)))

        def on_pod(entry: _InFlight, event: PodEvent) -> None:
            outcome = self._decide(entry, event)
            if outcome is not False:
                finish(entry, outcome)

        def handle(msg: _Msg) -> None:
            if msg.kind == "pod":
                event = msg.event
                assert event is not None
                entry = by_name.get(event.name)
                if entry is None or entry.finishing:
                    return
                if entry.created is None:  # the watch was faster than the create's response
                    early[event.name] = event
                else:
                    on_pod(entry, event)
                return
            entry = out[msg.index]
            if msg.kind == "created":
                entry.created = msg.at
                stats.pods_created += 1
                if (event := early.pop(entry.plan.name, None)) is not None and not entry.finishing:
                    on_pod(entry, event)
            elif msg.kind == "refused":
                assert msg.result is not None
                record(msg.index, msg.result)
                forget(entry)
            elif msg.kind == "create_failed":
                assert msg.result is not None
                finish(entry, msg.result)  # and delete whatever half of it exists
            elif msg.kind == "deleted":
                if msg.result is not None:
                    record(msg.index, msg.result)
                forget(entry)

        def forget(entry: _InFlight) -> None:
            out.pop(entry.index, None)
            by_name.pop(entry.plan.name, None)
            early.pop(entry.plan.name, None)

        while done < total:
            now = self._clock()
            while next_job < total and len(out) < cfg.max_concurrency:
                task, pred = jobs[next_job]
                try:
                    plan = plan_evaluation(cfg, run_id, next_job, task, pred)
                except ValueError as exc:
                    record(next_job, self._refusal(task, pred, now, exc))
                else:
                    entry = _InFlight(next_job, plan, now)
                    out[next_job] = by_name[plan.name] = entry
                    creators.submit(lambda e=entry: inbox.put(self._create_objects(e)))
                next_job += 1
            stats.peak_in_flight = max(stats.peak_in_flight, len(out))
            try:
                handle(inbox.get(timeout=_TICK_S))
                while True:
                    handle(inbox.get_nowait())
            except queue.Empty:
                pass
            now = self._clock()
            if now - last_scan < _TICK_S:
                continue
            last_scan = now
            for entry in list(out.values()):
                if not entry.finishing and (overdue := self._overdue(entry, now)) is not None:
                    finish(entry, overdue)
            reason = self.policy.cut_reason(total, done, started, quorum_at, now)
            if reason is not None:  # the step ends: everything not back is infra_error, cleaned up by label
                for index, result in enumerate(results):
                    if result is None:
                        stats.stragglers_cut += index in out
                        task, pred = jobs[index]
                        record(index, self._result(task, pred, now, Status.INFRA_ERROR, reason))
        return [r for r in results if r is not None]
