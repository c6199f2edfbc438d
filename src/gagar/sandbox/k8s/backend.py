"""KubernetesBackend: hardened pods, each judging a group of one task's trajectories; rate-limited,
watched, always cleaned up; fed as a stream.

A *run* (:meth:`KubernetesBackend.session`, or one :meth:`~KubernetesBackend.evaluate` call)
sweeps objects of earlier runs older than the TTL, creates a deny-all NetworkPolicy and the
run's code ConfigMap, and starts one watch over the run's pods
(:class:`~gagar.sandbox.k8s.watch.PodWatch`). Work may be submitted while earlier pods run:
each submission is packed into pods of up to ``group_size`` evaluations of one task and image
(:func:`pack`), which the in-pod runner judges one after another, each in its own isolated
child (:mod:`gagar.sandbox.k8s.pod_runner`). A driver thread keeps up to ``max_concurrency``
evaluations in flight: a pool of ``api_workers`` threads creates each pod's input ConfigMap
and pod, the watch reports how each pod ends, and its results come from the termination
message in the watched status (the pod log only when the message says the summary did not
fit). Finished pods and their ConfigMaps are deleted together, one request per kind every
``delete_batch_s``, by a set-based label selector. The driver owns all bookkeeping: it admits
pods, applies the start deadline, the lost-pod deadline and the step's straggler policy
(:mod:`gagar.sandbox.k8s.straggler`, once the input is closed), and hands results out as they
come. Every API request passes one adaptive token bucket and is retried on 409/429/5xx.
Whatever happens, the run's pods and ConfigMaps and its NetworkPolicy are deleted again by
label selector at the end. Platform failures are ``infra_error`` results, never the
policy's; a pod lost mid-group is ``infra_error`` for exactly the evaluations it held.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gagar.sandbox.base import Prediction, ProgressCallback
from gagar.sandbox.k8s.config import KubernetesSandboxConfig
from gagar.sandbox.k8s.objects import (
    APP_LABEL,
    POD_KEY,
    RUN_KEY,
    ObjectTooLargeError,
    PodPlan,
    build_code_configmap,
    build_configmap,
    build_network_policy,
    build_pod,
    code_configmap_name,
    image_for,
    plan_pod,
    pod_deadline_s,
)
from gagar.sandbox.k8s.outcome import OVERFLOW, decode_result, group_results, parse_summary
from gagar.sandbox.k8s.ratelimit import TokenBucket, call_with_retry
from gagar.sandbox.k8s.straggler import StragglerPolicy, quorum_size
from gagar.sandbox.k8s.watch import PodEvent, PodWatch
from gagar.sandbox.patch import PatchError, parse_patch
from gagar.schema.result import Status, TestResult
from gagar.schema.task import Task

__all__ = ["EvalSession", "KubernetesBackend", "RunStats", "configure_client", "load_apis", "pack"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_LOST_GRACE_S = 120.0
"""Past start deadline + the pod's activeDeadlineSeconds + this, a pod that has not ended is taken as lost."""
_TICK_S = 0.5
"""How often the driver checks deadlines and flushes deletes when no event arrives."""
_DELETE_BATCH_MAX = 100
"""Most pods one delete request names (their ids make the label selector, about 17 bytes each)."""
Job = tuple[Task, Prediction]


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
    """What the last run did, for benchmarks and logs."""

    evaluations: int = 0
    pods_created: int = 0
    peak_in_flight: int = 0
    stragglers_cut: int = 0
    wall_s: float = 0.0
    requests: int = 0
    throttled: int = 0
    min_rate: float = 0.0
    log_reads: int = 0
    delete_requests: int = 0
    watch_relists: int = 0
    watch_reconnects: int = 0


def pack(jobs: Sequence[tuple[int, Task, Prediction]], group_size: int) -> list[list[int]]:
    """Positions of ``jobs`` grouped into pods: same task and image, at most ``group_size`` each.

    Groups keep submission order, and a group is cut as soon as it is full, so a GRPO group
    submitted together lands in one pod. Example: tasks a, b, a, a with size 2 give
    ``[[0, 2], [1], [3]]``.
    """
    open_groups: dict[tuple[str, str | None], list[int]] = {}
    groups: list[list[int]] = []
    for position, (_, task, _) in enumerate(jobs):
        key = (task.instance_id, task.environment.image)
        group = open_groups.get(key)
        if group is None or len(group) >= group_size:
            group = open_groups[key] = []
            groups.append(group)
        group.append(position)
    return groups


@dataclass(slots=True)
class _Pod:
    """One admitted pod, owned by the driver: all memory its evaluations hold while out."""

    seq: int
    plan: PodPlan
    indices: list[int]
    admitted: float
    created: float | None = None
    running: bool = False
    waiting_reason: str | None = None
    finishing: bool = False


@dataclass(slots=True)
class _Msg:
    """What the submitting thread, the worker pools and the watch tell the driver."""

    kind: str  # "submit", "close", "stop" (the caller); "created", "create_failed", "split", "log",
    # "deleted" (the pools); "pod" (the watch)
    seq: int = -1
    """The pod the message is about."""
    count: int = 0
    """"close": evaluations submitted in all; "deleted": the requests the batch delete made."""
    pods: list[_Pod] = field(default_factory=list)
    results: list[tuple[int, TestResult]] = field(default_factory=list)
    plan: PodPlan | None = None
    event: PodEvent | None = None
    jobs: list[tuple[int, Task, Prediction]] = field(default_factory=list)
    reason: str = ""
    at: float = 0.0


class KubernetesBackend:
    """SandboxBackend running groups of evaluations in pods (see the module docstring)."""

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

    def _infra(self, pod: _Pod, reason: str) -> list[tuple[int, TestResult]]:
        """``infra_error`` for every evaluation the pod holds."""
        plan = pod.plan
        return [
            (index, self._result(plan.task, pred, pod.admitted, Status.INFRA_ERROR, reason))
            for index, pred in zip(pod.indices, plan.predictions, strict=True)
        ]

    def _all(self, pod: _Pod, status: Status, reason: str) -> list[tuple[int, TestResult]]:
        plan = pod.plan
        return [
            (index, self._result(plan.task, pred, pod.admitted, status, reason))
            for index, pred in zip(pod.indices, plan.predictions, strict=True)
        ]

    # -- the worker pools ------------------------------------------------------------------------

    def _create_objects(self, pod: _Pod) -> _Msg:
        """Worker: refuse the patches the local backend refuses, then create the pod's ConfigMap and pod.

        The message names the plan of what remains and the refusals; a group whose inputs do
        not fit one ConfigMap comes back as ``split`` (the driver re-queues its members alone).
        """
        plan, refused = pod.plan, []
        keep = []
        for index, pred in zip(pod.indices, plan.predictions, strict=True):
            try:
                if pred.model_patch.strip():
                    parse_patch(pred.model_patch, self.config.max_patch_bytes)
                keep.append(pred)
            except PatchError as exc:
                refused.append((index, self._refusal(plan.task, pred, pod.admitted, exc)))
        if not keep:
            return _Msg("created", pod.seq, results=refused, plan=None)
        plan = dataclasses.replace(plan, predictions=tuple(keep))
        try:
            try:
                configmap = build_configmap(self.config, plan)
            except ObjectTooLargeError as exc:
                if len(keep) > 1:
                    return _Msg("split", pod.seq, results=refused, plan=plan)
                (index,) = [i for i, p in zip(pod.indices, pod.plan.predictions, strict=True) if p is keep[0]]
                too_large = (index, self._refusal(plan.task, keep[0], pod.admitted, exc))
                return _Msg("created", pod.seq, results=[*refused, too_large], plan=None)
            self._create(
                self.core.create_namespaced_config_map, self.core.read_namespaced_config_map, configmap
            )
            del configmap
            self._create(
                self.core.create_namespaced_pod, self.core.read_namespaced_pod, build_pod(self.config, plan)
            )
            return _Msg("created", pod.seq, results=refused, plan=plan, at=self._clock())
        except ApiException as exc:
            reason = f"Kubernetes API error {exc.status} ({exc.reason}) for {plan.name}"
            return _Msg("create_failed", pod.seq, results=refused, plan=plan, reason=reason)
        except Exception as exc:  # a connection error must not sink the other evaluations
            reason = f"{type(exc).__name__}: {exc}"
            return _Msg("create_failed", pod.seq, results=refused, plan=plan, reason=reason)

    def _read_log_results(self, pod: _Pod) -> list[tuple[int, TestResult]]:
        """Results from the pod log: the summary did not fit the termination message, or none is there."""
        plan, cfg = pod.plan, self.config
        try:
            text = self._call(
                lambda: self.core.read_namespaced_pod_log(plan.name, cfg.namespace, container="sandbox")
            )
        except ApiException as exc:
            return self._infra(
                pod, f"Kubernetes API error {exc.status} ({exc.reason}) reading the log of {plan.name}"
            )
        except Exception as exc:
            return self._infra(pod, f"{type(exc).__name__}: {exc}")
        return self._group_results(pod, parse_summary(text, plan.nonce), text)

    def _group_results(
        self, pod: _Pod, group: dict[str, Any] | None, text: str = ""
    ) -> list[tuple[int, TestResult]]:
        plan, cfg = pod.plan, self.config
        results = group_results(
            plan.task, [p.key for p in plan.predictions], group, self._clock() - pod.admitted,
            cfg.max_log_chars, text, cfg.judge,
        )  # fmt: skip
        return list(zip(pod.indices, results, strict=True))

    def _delete_pods(self, run_id: str, pod_ids: Sequence[str]) -> int:
        """Worker: delete these pods and their ConfigMaps, one request per kind; return the requests made."""
        ns = self.config.namespace
        selector = f"{self._selector(run_id)},{POD_KEY} in ({','.join(pod_ids)})"
        made = 0
        for delete_all in (
            self.core.delete_collection_namespaced_pod,
            self.core.delete_collection_namespaced_config_map,
        ):
            made += 1
            try:
                self._call(lambda d=delete_all: d(ns, label_selector=selector, grace_period_seconds=0))
            except Exception as exc:  # the run's cleanup deletes them
                log.warning("batch delete of %d pods failed: %s", len(pod_ids), exc)
        return made

    # -- deciding from the watch and the clock ---------------------------------------------------

    def _decide(self, pod: _Pod, event: PodEvent) -> list[tuple[int, TestResult]] | bool:
        """What a pod event means: its results, True when only the pod log has them, False to keep waiting."""
        check = event.check
        if event.kind == "DELETED" and check.state not in (
            "finished",
            "timeout",
            "oom_killed",
            "infra_error",
        ):
            return self._infra(pod, "pod deleted before it ended (not by gagar)")
        if check.state == "finished":
            group = decode_result(event.message, pod.plan.nonce, self.config.max_report_bytes)
            if isinstance(group, dict):
                return self._group_results(pod, group)
            if group == OVERFLOW or event.message is None:
                return True
            return self._group_results(pod, None, event.message)
        if check.state == "timeout":
            return self._all(pod, Status.TIMEOUT, check.reason or "timeout")
        if check.state in ("oom_killed", "evicted_limit"):
            return self._all(pod, Status.FAILED, check.reason or check.state)
        if check.state == "infra_error":
            return self._infra(pod, check.reason or "infra error")
        if check.state == "running":
            pod.running = True
        elif check.state == "waiting":
            pod.waiting_reason = check.reason
        return False

    def _overdue(self, pod: _Pod, now: float) -> list[tuple[int, TestResult]] | None:
        """``infra_error`` results when the pod is past its start or lost deadline, else None."""
        if pod.created is None:
            return None
        waited, cfg = now - pod.created, self.config
        if not pod.running and waited > cfg.start_deadline_s:
            why = f" ({pod.waiting_reason})" if pod.waiting_reason else ""
            return self._infra(pod, f"pod did not start within {cfg.start_deadline_s:.0f} s{why}")
        lost_after = cfg.start_deadline_s + pod_deadline_s(cfg, len(pod.indices)) + _LOST_GRACE_S
        if waited > lost_after:
            return self._infra(pod, "pod never ended (node lost?)")
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

    def session(self, on_result: ProgressCallback | None = None) -> EvalSession:
        """A run that takes work while its earlier pods run (see :class:`EvalSession`)."""
        return EvalSession(self, on_result)

    def evaluate(
        self, jobs: Iterable[tuple[Task, Prediction]], on_result: ProgressCallback | None = None
    ) -> list[TestResult]:
        """One TestResult per job, in order; infrastructure failures come back as ``infra_error`` results.

        ``jobs`` is consumed as it arrives: each ``group_size`` jobs go out while later ones are
        still being produced.
        """
        with self.session(on_result) as run:
            batch: list[Job] = []
            for job in jobs:
                batch.append(job)
                if len(batch) >= self.config.group_size:
                    run.submit(batch)
                    batch = []
            run.submit(batch)
            run.close()
            return run.wait()


class EvalSession:
    """One run of the backend, fed as a stream: work is submitted while earlier pods run.

    ::

        with backend.session() as run:
            run.submit(group)            # indices in submission order, across calls
            ...                          # more groups as their rollouts finish
            run.close()                  # no more work: the straggler policy may now apply
            for index, result in run.results():
                ...

    A driver thread owns the bookkeeping (see the module docstring); :meth:`results` hands
    each result out once, in the order they come back, and calls ``on_result`` with it in the
    caller's thread. Leaving the ``with`` block ends the run and deletes all it created.
    """

    def __init__(self, backend: KubernetesBackend, on_result: ProgressCallback | None = None) -> None:
        self.backend, self.config = backend, backend.config
        self.run_id = secrets.token_hex(6)
        self.stats = RunStats()
        self._on_result = on_result
        self._inbox: queue.SimpleQueue[_Msg] = queue.SimpleQueue()
        self._out: queue.SimpleQueue[tuple[int, TestResult] | BaseException | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._submitted, self._closed = 0, False
        self._watch = PodWatch(
            backend.core,
            self.config.namespace,
            backend._selector(self.run_id),
            lambda event: self._inbox.put(_Msg("pod", event=event)),
            backend._call,
            timeout_s=self.config.watch_timeout_s,
            sleep=backend._sleep,
        )
        workers = self.config.api_workers
        self._creators = ThreadPoolExecutor(workers, thread_name_prefix="gagar-k8s-create")
        self._finishers = ThreadPoolExecutor(workers, thread_name_prefix="gagar-k8s-finish")
        self._driver = threading.Thread(target=self._drive_or_report, name="gagar-k8s-driver", daemon=True)

    # -- the caller's side -----------------------------------------------------------------------

    def __enter__(self) -> EvalSession:
        backend = self.backend
        self._started, self._before = backend._clock(), backend.bucket.stats
        backend.last_run = self.stats
        try:
            backend._prepare_run(self.run_id)
            self._watch.start()
        except BaseException:
            self._teardown()
            raise
        self._driver.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._inbox.put(_Msg("stop"))
        if self._driver.is_alive():
            self._driver.join()
        self._teardown()

    def submit(self, jobs: Iterable[Job]) -> range:
        """Queue ``jobs`` (packed into pods of one task each); return their indices."""
        jobs = list(jobs)
        with self._lock:
            if self._closed:
                raise RuntimeError("submit() after close(): the run takes no more work")
            first = self._submitted
            self._submitted += len(jobs)
        if jobs:
            batch = [(first + i, task, pred) for i, (task, pred) in enumerate(jobs)]
            self._inbox.put(_Msg("submit", jobs=batch, at=self.backend._clock()))
        return range(first, first + len(jobs))

    def close(self) -> None:
        """No more work: once every submitted evaluation is back, :meth:`results` ends."""
        with self._lock:
            self._closed = True
            total = self._submitted
        self._inbox.put(_Msg("close", count=total, at=self.backend._clock()))

    def results(self) -> Iterator[tuple[int, TestResult]]:
        """``(index, result)`` as each evaluation comes back; ends after :meth:`close` and the last one."""
        while True:
            item = self._out.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            if self._on_result is not None:
                self._on_result(item[1])
            yield item

    def wait(self) -> list[TestResult]:
        """Every result in submission order (call :meth:`close` first)."""
        got = dict(self.results())
        return [got[index] for index in range(len(got))]

    def _teardown(self) -> None:
        backend, stats = self.backend, self.stats
        self._creators.shutdown(wait=True, cancel_futures=True)
        self._finishers.shutdown(wait=True, cancel_futures=True)
        self._watch.stop()
        backend._cleanup_run(self.run_id)
        after = backend.bucket.stats
        stats.wall_s = backend._clock() - self._started
        stats.requests = after.requests - self._before.requests
        stats.throttled = after.throttled - self._before.throttled
        stats.min_rate = after.min_rate_seen
        stats.watch_relists, stats.watch_reconnects = self._watch.relists, self._watch.reconnects

    # -- the driver --------------------------------------------------------------------------------

    def _drive_or_report(self) -> None:
        try:
            self._drive()
        except BaseException as exc:  # the caller's results() raises it
            self._out.put(exc)
            return
        self._out.put(None)

    def _drive(self) -> None:
        """Admit pods, follow the watch, apply deadlines, batch deletes, hand results out.

        A result is handed out as soon as it is known (most come from the watched status);
        a pod's evaluations leave the in-flight count once its objects are deleted.
        """
        backend, cfg, stats = self.backend, self.config, self.stats
        clock = backend._clock
        pending: deque[_Pod] = deque()
        pods: dict[int, _Pod] = {}
        by_name: dict[str, _Pod] = {}
        early: dict[str, PodEvent] = {}  # events of pods whose create has not returned yet
        recorded: set[int] = set()
        to_delete: deque[_Pod] = deque()
        first_delete_at: float | None = None
        total: int | None = None
        in_flight = next_seq = 0
        quorum_at: float | None = None
        last_scan = self._started

        def record(index: int, result: TestResult) -> None:
            nonlocal quorum_at
            if index in recorded:
                return
            recorded.add(index)
            self._out.put((index, result))
            if (
                total is not None
                and quorum_at is None
                and len(recorded) >= quorum_size(total, cfg.step_quorum)
            ):
                quorum_at = clock()

        def record_all(results: Iterable[tuple[int, TestResult]]) -> None:
            for index, result in results:
                record(index, result)

        def queue_pods(jobs: list[tuple[int, Task, Prediction]], at: float) -> None:
            nonlocal next_seq
            for group in pack(jobs, min(cfg.group_size, cfg.max_concurrency)):
                members = [jobs[position] for position in group]
                task = members[0][1]
                try:
                    image_for(cfg, task)
                except ValueError as exc:
                    record_all((i, backend._refusal(task, p, at, exc)) for i, _, p in members)
                    continue
                plan = plan_pod(cfg, self.run_id, next_seq, task, [p for _, _, p in members])
                pending.append(_Pod(next_seq, plan, [i for i, _, _ in members], at))
                next_seq += 1

        def forget(pod: _Pod) -> None:
            nonlocal in_flight
            if pods.pop(pod.seq, None) is not None:
                in_flight -= len(pod.indices)
            by_name.pop(pod.plan.name, None)
            early.pop(pod.plan.name, None)

        def drop_refused(pod: _Pod, msg: _Msg) -> None:
            """Record the members the creator refused and keep the rest."""
            nonlocal in_flight
            record_all(msg.results)
            refused = {index for index, _ in msg.results}
            if refused:
                pod.indices = [i for i in pod.indices if i not in refused]
                in_flight -= len(refused)
            if msg.plan is not None:
                pod.plan = msg.plan

        def finish(pod: _Pod, outcome: list[tuple[int, TestResult]] | bool) -> None:
            """Record the results (unless only the log has them); then the pod goes to the deletes."""
            nonlocal first_delete_at
            if pod.finishing:
                return
            pod.finishing = True
            if outcome is True:
                stats.log_reads += 1
                self._finishers.submit(lambda: self._inbox.put(
                    _Msg("log", pod.seq, results=backend._read_log_results(pod))
                ))  # fmt: skip
                return
            if isinstance(outcome, list):
                record_all(outcome)
            to_delete.append(pod)
            first_delete_at = first_delete_at or clock()

        def on_pod(pod: _Pod, event: PodEvent) -> None:
            outcome = backend._decide(pod, event)
            if outcome is not False:
                finish(pod, outcome)

        def handle(msg: _Msg) -> bool:
            """Apply one message; False when the run must stop."""
            nonlocal total, quorum_at, first_delete_at, next_seq
            if msg.kind == "stop":
                return False
            if msg.kind == "submit":
                queue_pods(msg.jobs, msg.at)
            elif msg.kind == "close":
                total = msg.count
                if quorum_at is None and len(recorded) >= quorum_size(total, cfg.step_quorum):
                    quorum_at = clock()
            elif msg.kind == "pod":
                event = msg.event
                assert event is not None
                pod = by_name.get(event.name)
                if pod is None or pod.finishing:
                    return True
                if pod.created is None:  # the watch was faster than the create's response
                    early[event.name] = event
                else:
                    on_pod(pod, event)
            elif msg.kind == "deleted":
                stats.delete_requests += msg.count
                for pod in msg.pods:
                    forget(pod)
            elif (pod := pods.get(msg.seq)) is not None:
                if msg.kind == "created":
                    drop_refused(pod, msg)
                    if msg.plan is None:  # every member refused: nothing was created
                        forget(pod)
                        return True
                    pod.created = clock()
                    stats.pods_created += 1
                    if (event := early.pop(pod.plan.name, None)) is not None and not pod.finishing:
                        on_pod(pod, event)
                elif msg.kind == "split":  # too large together: each member alone, first in line
                    drop_refused(pod, msg)
                    forget(pod)
                    for index, pred in reversed(list(zip(pod.indices, pod.plan.predictions, strict=True))):
                        plan = plan_pod(cfg, self.run_id, next_seq, pod.plan.task, [pred])
                        pending.appendleft(_Pod(next_seq, plan, [index], pod.admitted))
                        next_seq += 1
                elif msg.kind == "create_failed":
                    drop_refused(pod, msg)
                    pod.created = clock()
                    finish(pod, backend._infra(pod, msg.reason))  # and delete whatever half exists
                elif msg.kind == "log":
                    record_all(msg.results)
                    to_delete.append(pod)
                    first_delete_at = first_delete_at or clock()
            return True

        def flush_deletes(now: float) -> None:
            """Send the deletes when the batch is full or its first pod has waited ``delete_batch_s``;
            while admission waits for room (``max_concurrency``), after a tick."""
            nonlocal first_delete_at
            if not to_delete:
                return
            blocked = bool(pending) and in_flight + len(pending[0].indices) > cfg.max_concurrency
            wait_s = min(_TICK_S, cfg.delete_batch_s) if blocked else cfg.delete_batch_s
            if len(to_delete) < _DELETE_BATCH_MAX and now - (first_delete_at or now) < wait_s:
                return
            while to_delete:
                batch = [to_delete.popleft() for _ in range(min(_DELETE_BATCH_MAX, len(to_delete)))]
                ids = [pod.plan.pod_id for pod in batch]
                self._finishers.submit(lambda b=batch, i=ids: self._inbox.put(
                    _Msg("deleted", count=backend._delete_pods(self.run_id, i), pods=b)
                ))  # fmt: skip
            first_delete_at = None

        while total is None or len(recorded) < total:
            while pending and (in_flight == 0 or in_flight + len(pending[0].indices) <= cfg.max_concurrency):
                pod = pending.popleft()
                pods[pod.seq], by_name[pod.plan.name] = pod, pod
                in_flight += len(pod.indices)
                self._creators.submit(lambda p=pod: self._inbox.put(backend._create_objects(p)))
            stats.peak_in_flight = max(stats.peak_in_flight, in_flight)
            try:
                if not handle(self._inbox.get(timeout=_TICK_S)):
                    return
                while True:
                    if not handle(self._inbox.get_nowait()):
                        return
            except queue.Empty:
                pass
            now = clock()
            flush_deletes(now)
            if now - last_scan < _TICK_S:
                continue
            last_scan = now
            for pod in list(pods.values()):
                if not pod.finishing and (overdue := backend._overdue(pod, now)) is not None:
                    finish(pod, overdue)
            if total is None:
                continue
            stats.evaluations = total
            reason = backend.policy.cut_reason(total, len(recorded), self._started, quorum_at, now)
            if reason is not None:  # the step ends: everything not back is infra_error, cleaned up by label
                for pod in [*pods.values(), *pending]:
                    for index, pred in zip(pod.indices, pod.plan.predictions, strict=True):
                        if index not in recorded:
                            stats.stragglers_cut += pod.seq in pods
                            record(
                                index, backend._result(pod.plan.task, pred, now, Status.INFRA_ERROR, reason)
                            )
        stats.evaluations = total
