"""One watch over a run's pods: the informer-style cache the backend waits on instead of polling.

:class:`PodWatch` lists the pods matching a label selector once, then watches them from
that list's resourceVersion (bookmarks on), relisting when the server says the version is
gone (410) and reconnecting after a dropped stream. It keeps nothing per pod itself: each
event is classified on arrival (:func:`gagar.sandbox.k8s.outcome.check_pod`, on the raw
JSON, never deserialised into client models) and handed on as a small :class:`PodEvent`,
so its memory does not grow with the pods in flight.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from gagar.sandbox.k8s.outcome import PodCheck, check_pod, termination_message

__all__ = ["PodEvent", "PodWatch"]

log = logging.getLogger(__name__)

EventKind = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True, slots=True)
class PodEvent:
    """What one watch event says about one pod: its classification and, once ended, its message."""

    name: str
    kind: EventKind
    check: PodCheck
    message: str | None


class PodWatch:
    """A thread that lists, then watches, the pods of ``selector`` and calls ``on_event`` for each change.

    ``call`` passes every list and watch request through the backend's rate limiter and
    retries; ``on_event`` runs on the watch thread and must be quick (the backend queues).
    """

    def __init__(
        self,
        core_api: Any,
        namespace: str,
        selector: str,
        on_event: Callable[[PodEvent], None],
        call: Callable[[Callable[[], Any]], Any],
        timeout_s: int = 60,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core, self.namespace, self.selector = core_api, namespace, selector
        self._on_event, self._call, self._timeout_s, self._sleep = on_event, call, timeout_s, sleep
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name="gagar-k8s-watch", daemon=True)
        self.relists = 0
        self.reconnects = 0

    def start(self, timeout_s: float = 60.0) -> None:
        """Start watching; return once the first list is in (raises TimeoutError past ``timeout_s``)."""
        self._thread.start()
        if not self._synced.wait(timeout_s):
            raise TimeoutError(f"the first list of pods ({self.selector}) took over {timeout_s:.0f} s")

    def stop(self) -> None:
        """End the watch: shut its socket down (a plain close would wait for the server's timeout)."""
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # the reading thread sees the stream end
                (getattr(resp, "shutdown", None) or resp.close)()
        self._thread.join(timeout=10)

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        name = obj.get("metadata", {}).get("name")
        if name:
            self._on_event(PodEvent(name, kind, check_pod(obj), termination_message(obj)))  # type: ignore[arg-type]

    def _list(self) -> str:
        """List the pods, emit each as ADDED, return the list's resourceVersion."""
        resp = self._call(
            lambda: self.core.list_namespaced_pod(
                self.namespace, label_selector=self.selector, _preload_content=False
            )
        )
        body = json.loads(resp.data)
        for item in body.get("items") or []:
            self._emit("ADDED", item)
        self.relists += 1
        self._synced.set()
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str | None:
        """Follow one watch request; return the version to resume from, None to relist."""
        self._resp = self._call(
            lambda: self.core.list_namespaced_pod(
                self.namespace,
                label_selector=self.selector,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._timeout_s,
                _preload_content=False,
            )
        )
        try:
            for line in iter_resp_lines(self._resp):
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:  # our version is too old: relist
                        return None
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                self._emit(str(event.get("type")), obj)
                if self._stop.is_set():
                    break
        finally:
            self._resp.release_conn()
            self._resp = None
        return version

    def _run(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
            except ApiException as exc:
                if self._stop.is_set():
                    return
                if exc.status == 410:
                    version = None
                log.warning("pod watch (%s) failed: %s %s; resuming", self.selector, exc.status, exc.reason)
                self.reconnects += 1
                self._sleep(1.0)
            except Exception as exc:  # a dropped connection: resume from the last version
                if self._stop.is_set():
                    return
                log.warning("pod watch (%s) interrupted: %s; resuming", self.selector, exc)
                self.reconnects += 1
                self._sleep(1.0)
