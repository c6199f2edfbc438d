"""Follow an Argo Workflow through the Argo server's REST API: phase, step durations, failed sandbox pods.

The API is plain HTTP (``GET /api/v1/workflows/{namespace}/{name}``) with the bearer token
``argo auth token`` prints. :func:`summarise` turns a workflow object into a
:class:`WorkflowSummary` (pure: tested on recorded-shape JSON); :class:`ArgoServer` fetches it;
:func:`watch` polls until the workflow finishes.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

__all__ = [
    "DONE_PHASES",
    "ArgoApiError",
    "ArgoServer",
    "StepRow",
    "WorkflowSummary",
    "format_summary",
    "server_url",
    "summarise",
    "watch",
]

DONE_PHASES = frozenset({"Succeeded", "Failed", "Error"})
"""Phases of a finished workflow or node."""
_FAILED = frozenset({"Failed", "Error"})


class ArgoApiError(RuntimeError):
    """The Argo server refused a request or could not be reached."""


@dataclass(frozen=True)
class StepRow:
    """One execution of a stage: an Argo node of type Pod (each retry is a row of its own)."""

    task: str
    """DAG task and attempt, e.g. ``sandbox-0(1)``."""
    template: str
    """The stage template (``sandbox``, ``train``, …)."""
    phase: str
    """Pending, Running, Succeeded, Failed or Error."""
    duration_s: float | None
    """Seconds from start to finish (to ``now`` while running); None before it starts."""
    pod: str
    """Name of the pod (Argo's v2 pod names: ``<workflow>-<template>-<node hash>``)."""
    message: str
    """Argo's message, e.g. ``OOMKilled (exit code 137)``; empty when none."""

    @property
    def failed(self) -> bool:
        """The pod failed or errored."""
        return self.phase in _FAILED


@dataclass(frozen=True)
class WorkflowSummary:
    """What :func:`format_summary` shows of a workflow."""

    name: str
    namespace: str
    phase: str
    """Pending, Running, Succeeded, Failed or Error ("Pending" before the controller saw it)."""
    progress: str
    """Argo's ``done/total`` pod count, e.g. ``3/6``."""
    duration_s: float | None
    message: str
    steps: tuple[StepRow, ...]
    """Pod nodes in start order."""

    @property
    def done(self) -> bool:
        """The workflow finished, successfully or not."""
        return self.phase in DONE_PHASES

    @property
    def failed_sandbox_pods(self) -> tuple[StepRow, ...]:
        """Sandbox stage pods that failed or errored (retried or not)."""
        return tuple(row for row in self.steps if row.template == "sandbox" and row.failed)


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _duration(started: str | None, finished: str | None, now: datetime) -> float | None:
    start = _time(started)
    if start is None:
        return None
    return ((_time(finished) or now) - start).total_seconds()


def _pod_name(workflow: str, node: dict[str, Any]) -> str:
    node_id, template = str(node.get("id", "")), str(node.get("templateName", ""))
    prefix = f"{workflow}-"
    if node_id.startswith(prefix) and template:
        return f"{workflow}-{template}-{node_id[len(prefix) :]}"
    return node_id


def summarise(workflow: dict[str, Any], now: datetime | None = None) -> WorkflowSummary:
    """The summary of a workflow object as the Argo API returns it.

    Args:
        workflow: ``GET /api/v1/workflows/{ns}/{name}``'s JSON body.
        now: the time running durations are measured to (default: the current UTC time).

    Raises:
        ValueError: an object without ``metadata.name`` (not a workflow).
    """
    metadata = workflow.get("metadata") or {}
    if "name" not in metadata:
        raise ValueError("not an Argo workflow: the object has no metadata.name")
    now = now or datetime.now(UTC)
    status = workflow.get("status") or {}
    name = str(metadata["name"])
    pods = [n for n in (status.get("nodes") or {}).values() if n.get("type") == "Pod"]
    pods.sort(key=lambda n: (n.get("startedAt") or "~", str(n.get("displayName", ""))))
    rows = tuple(
        StepRow(
            task=str(n.get("displayName") or n.get("name", "")),
            template=str(n.get("templateName", "")),
            phase=str(n.get("phase", "Pending")),
            duration_s=_duration(n.get("startedAt"), n.get("finishedAt"), now),
            pod=_pod_name(name, n),
            message=str(n.get("message", "")),
        )
        for n in pods
    )
    return WorkflowSummary(
        name=name,
        namespace=str(metadata.get("namespace", "")),
        phase=str(status.get("phase") or "Pending"),
        progress=str(status.get("progress", "")),
        duration_s=_duration(status.get("startedAt"), status.get("finishedAt"), now),
        message=str(status.get("message", "")),
        steps=rows,
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"


def format_summary(summary: WorkflowSummary) -> str:
    """A few lines for a terminal: the workflow, one line per step, then the failed sandbox pods."""
    lines = [
        f"{summary.namespace}/{summary.name}: {summary.phase} {summary.progress} "
        f"({_seconds(summary.duration_s)}){' - ' + summary.message if summary.message else ''}"
    ]
    width = max((len(row.task) for row in summary.steps), default=4)
    for row in summary.steps:
        note = f"  {row.message}" if row.message else ""
        lines.append(f"  {row.task:<{width}}  {row.phase:<9} {_seconds(row.duration_s):>7}{note}")
    failed = summary.failed_sandbox_pods
    if failed:
        lines.append(f"failed sandbox pods ({len(failed)}): kubectl logs -n {summary.namespace} POD -c main")
        lines.extend(f"  {row.pod}: {row.phase} {row.message}".rstrip() for row in failed)
    return "\n".join(lines)


def server_url(server: str, secure: bool = True) -> str:
    """The base URL of an Argo server given as ``ARGO_SERVER`` is (``host:port``) or as a URL."""
    if not server:
        raise ValueError("no Argo server: set ARGO_SERVER (host:port) or pass --server")
    if "://" in server:
        return server.rstrip("/")
    return f"{'https' if secure else 'http'}://{server.rstrip('/')}"


@dataclass(frozen=True)
class ArgoServer:
    """The Argo server's REST API."""

    url: str
    """Base URL, e.g. ``https://argo-server.argo:2746``."""
    token: str | None = None
    """Bearer token (with or without the ``Bearer`` prefix ``argo auth token`` prints)."""
    verify_tls: bool = True
    """Check the server's certificate (Argo's self-signed default needs False)."""
    timeout_s: float = 30.0

    def get(self, path: str) -> dict[str, Any]:
        """The JSON body of ``GET {url}{path}``.

        Raises:
            ArgoApiError: an HTTP error status (with the server's message) or no connection.
        """
        request = urllib.request.Request(f"{self.url}{path}", headers={"Accept": "application/json"})
        if self.token:
            token = self.token if self.token.startswith("Bearer ") else f"Bearer {self.token}"
            request.add_header("Authorization", token)
        context = None if self.verify_tls else ssl._create_unverified_context()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=context) as response:
                body: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise ArgoApiError(f"GET {path}: HTTP {exc.code} {detail}".rstrip()) from None
        except (urllib.error.URLError, TimeoutError) as exc:
            raise ArgoApiError(f"GET {self.url}{path}: {exc}") from None
        return body

    def workflow(self, namespace: str, name: str) -> dict[str, Any]:
        """The workflow ``name`` of ``namespace``."""
        return self.get(f"/api/v1/workflows/{quote(namespace)}/{quote(name)}")

    def workflow_names(self, namespace: str) -> list[str]:
        """Names of the workflows of ``namespace``, newest first."""
        items = self.get(f"/api/v1/workflows/{quote(namespace)}").get("items") or []
        items.sort(key=lambda w: w["metadata"].get("creationTimestamp", ""), reverse=True)
        return [str(w["metadata"]["name"]) for w in items]


def watch(
    server: ArgoServer,
    namespace: str,
    name: str,
    *,
    interval_s: float = 10.0,
    max_polls: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[WorkflowSummary]:
    """Poll the workflow every ``interval_s`` seconds, yielding its summary, until it finishes
    (or after ``max_polls`` polls)."""
    polls = 0
    while True:
        summary = summarise(server.workflow(namespace, name))
        polls += 1
        yield summary
        if summary.done or (max_polls is not None and polls >= max_polls):
            return
        sleep(interval_s)
