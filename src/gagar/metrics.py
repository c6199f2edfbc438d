"""Prometheus metrics: every GAGAR metric declared once, a step recorder, push and scrape helpers.

Pipeline steps build the metrics on their own :class:`CollectorRegistry` and push it to a
Pushgateway (:func:`push_step`); long-running servers expose theirs on ``/metrics``
(:func:`serve_metrics`). Names follow Prometheus conventions: base units, ``_total`` counters,
``_ratio`` gauges in [0, 1], fixed label names and no trajectory or task ids in labels.
A metrics failure never stops training unless asked to (``strict=True``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from http.server import ThreadingHTTPServer
from threading import Thread

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    delete_from_gateway,
    push_to_gateway,
    start_http_server,
)

__all__ = [
    "LATENCY_BUCKETS_S",
    "GagarMetrics",
    "MetricsPushError",
    "build_metrics",
    "finish_run",
    "push_step",
    "record_step",
    "serve_metrics",
]

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
"""Histogram buckets (seconds) for sandbox, grader and step latencies: 100 ms up to an hour."""

_LABEL_VALUE = re.compile(r"^[a-z0-9_]{1,40}$")
_RATIOS = ("rollout/resolved_rate", "credit/moved_ratio", "sandbox/hack_ratio")
_STATUSES = frozenset({"passed", "failed", "error", "timeout", "infra_error", "hack"})
"""The sandbox statuses (:class:`gagar.sandbox.results.Status`), kept here so metrics import no sandbox."""


class MetricsPushError(RuntimeError):
    """The Pushgateway could not be reached or refused the push."""


@dataclass(frozen=True)
class GagarMetrics:
    """The collectors of one registry; build with :func:`build_metrics`."""

    registry: CollectorRegistry
    trajectories_total: Counter
    resolved_ratio: Gauge
    groups_kept_total: Counter
    groups_dropped_total: Counter
    credit_moved_ratio: Gauge
    grader_fallbacks_total: Counter
    grader_duration_seconds: Histogram
    sandbox_evaluations_total: Counter
    sandbox_duration_seconds: Histogram
    sandbox_hacks_total: Counter
    sandbox_hack_ratio: Gauge
    train_step: Gauge
    train_last_step_timestamp_seconds: Gauge
    train_loss: Gauge
    train_tokens_per_second: Gauge
    rl_step_duration_seconds: Histogram

    def series_names(self) -> set[str]:
        """Every series name these collectors can expose (``_total``, ``_bucket``, ... included)."""
        names: set[str] = set()
        for f in fields(self):
            collector = getattr(self, f.name)
            if isinstance(collector, CollectorRegistry):
                continue
            for family in collector.describe():
                if family.type == "counter":
                    names |= {f"{family.name}_total", f"{family.name}_created"}
                elif family.type == "histogram":
                    names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count", "created")}
                else:
                    names.add(family.name)
        return names


def build_metrics(registry: CollectorRegistry | None = None) -> GagarMetrics:
    """Declare every GAGAR metric on ``registry`` (a fresh one when None)."""
    reg = registry if registry is not None else CollectorRegistry()

    def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, labels, registry=reg)

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=reg)

    def hist(name: str, doc: str, labels: tuple[str, ...] = ()) -> Histogram:
        return Histogram(name, doc, labels, registry=reg, buckets=LATENCY_BUCKETS_S)

    return GagarMetrics(
        registry=reg,
        trajectories_total=counter(
            "gagar_trajectories_total", "Trajectories evaluated, by test status.", ("status",)
        ),
        resolved_ratio=gauge(
            "gagar_resolved_ratio",
            "Fraction of the last step's trajectories that resolved their task (infra errors excluded).",
        ),
        groups_kept_total=counter(
            "gagar_groups_kept_total", "Groups kept by dynamic sampling (mixed pass/fail)."
        ),
        groups_dropped_total=counter(
            "gagar_groups_dropped_total", "Groups dropped by dynamic sampling, by reason.", ("reason",)
        ),
        credit_moved_ratio=gauge(
            "gagar_credit_moved_ratio",
            "Share of passing advantage mass the grader moved between trajectories in the last step.",
        ),
        grader_fallbacks_total=counter(
            "gagar_grader_fallbacks_total",
            "Groups whose grade was invalid or failed and fell back to GRPO advantages, by reason.",
            ("reason",),
        ),
        grader_duration_seconds=hist("gagar_grader_duration_seconds", "Time to grade one group."),
        sandbox_evaluations_total=counter(
            "gagar_sandbox_evaluations_total", "Sandboxed test runs, by status.", ("status",)
        ),
        sandbox_duration_seconds=hist(
            "gagar_sandbox_duration_seconds", "Wall time of one sandboxed test run, by status.", ("status",)
        ),
        sandbox_hacks_total=counter(
            "gagar_sandbox_hacks_total",
            "Evaluations judged a reward hack, by kind (one evaluation may count under several kinds).",
            ("kind",),
        ),
        sandbox_hack_ratio=gauge(
            "gagar_sandbox_hack_ratio",
            "Fraction of the last step's evaluations judged a reward hack (infra errors excluded).",
        ),
        train_step=gauge("gagar_train_step", "Last completed RL step."),
        train_last_step_timestamp_seconds=gauge(
            "gagar_train_last_step_timestamp_seconds", "Unix time the last RL step completed."
        ),
        train_loss=gauge(
            "gagar_train_loss", "Loss of the last step, by term (policy, kl, total).", ("term",)
        ),
        train_tokens_per_second=gauge(
            "gagar_train_tokens_per_second", "Training throughput of the last step."
        ),
        rl_step_duration_seconds=hist("gagar_rl_step_duration_seconds", "Wall time of one whole RL step."),
    )


def _label(key: str, value: str) -> str:
    if not _LABEL_VALUE.match(value):
        raise ValueError(f"metric key {key!r}: label value {value!r} must match {_LABEL_VALUE.pattern}")
    return value


def _count(key: str, value: float) -> float:
    if value < 0:
        raise ValueError(f"metric key {key!r}: a count cannot be negative, got {value}")
    return value


def record_step(m: GagarMetrics, values: Mapping[str, float], *, now: float | None = None) -> list[str]:
    """Map one trainer step's metric dict onto the collectors; return the keys that map to nothing.

    Keys: ``step``, ``rollout/resolved_rate``, ``rollout/trajectories/<status>``,
    ``sampling/groups_kept``, ``sampling/dropped/<reason>``, ``grader/fallbacks`` and
    ``grader/fallbacks/<reason>``, ``credit/moved_ratio``, ``loss/<term>``, ``perf/tokens_per_s``,
    ``perf/step_s``, ``sandbox/<status>`` (counts), ``sandbox/hacks/<kind>`` (counts),
    ``sandbox/hack_ratio``. Counts are per-step increments.

    Raises:
        ValueError: a negative count, a ratio outside [0, 1], or a label value that is not a short
            lowercase identifier (ids never become labels).
    """
    unknown = []
    for key, raw in values.items():
        value = float(raw)
        head, _, rest = key.partition("/")
        if key in _RATIOS and not 0.0 <= value <= 1.0:
            raise ValueError(f"metric key {key!r}: a ratio must lie in [0, 1], got {value}")
        if key == "step":
            m.train_step.set(value)
            m.train_last_step_timestamp_seconds.set(time.time() if now is None else now)
        elif key == "rollout/resolved_rate":
            m.resolved_ratio.set(value)
        elif key.startswith("rollout/trajectories/"):
            m.trajectories_total.labels(_label(key, key.rsplit("/", 1)[1])).inc(_count(key, value))
        elif key == "sampling/groups_kept":
            m.groups_kept_total.inc(_count(key, value))
        elif key.startswith("sampling/dropped/"):
            m.groups_dropped_total.labels(_label(key, key.rsplit("/", 1)[1])).inc(_count(key, value))
        elif key == "grader/fallbacks":
            m.grader_fallbacks_total.labels("unspecified").inc(_count(key, value))
        elif key.startswith("grader/fallbacks/"):
            m.grader_fallbacks_total.labels(_label(key, key.rsplit("/", 1)[1])).inc(_count(key, value))
        elif key == "credit/moved_ratio":
            m.credit_moved_ratio.set(value)
        elif head == "loss" and rest:
            m.train_loss.labels(_label(key, rest)).set(value)
        elif key == "perf/tokens_per_s":
            m.train_tokens_per_second.set(value)
        elif key == "perf/step_s":
            m.rl_step_duration_seconds.observe(_count(key, value))
        elif key == "sandbox/hack_ratio":
            m.sandbox_hack_ratio.set(value)
        elif key.startswith("sandbox/hacks/"):
            m.sandbox_hacks_total.labels(_label(key, key.rsplit("/", 1)[1])).inc(_count(key, value))
        elif head == "sandbox" and rest in _STATUSES:
            m.sandbox_evaluations_total.labels(rest).inc(_count(key, value))
        else:
            unknown.append(key)
    return unknown


def push_step(
    gateway_url: str,
    job: str,
    registry: CollectorRegistry,
    grouping_key: Mapping[str, str] | None = None,
    *,
    strict: bool = False,
    timeout_s: float = 5.0,
) -> bool:
    """Push ``registry`` to the Pushgateway under ``job`` and ``grouping_key`` (e.g. ``{"run": ...}``).

    Returns True on success. On failure logs a warning and returns False, or raises
    :class:`MetricsPushError` naming the gateway when ``strict``.
    """
    try:
        push_to_gateway(
            gateway_url, job=job, registry=registry, grouping_key=dict(grouping_key or {}), timeout=timeout_s
        )
    except OSError as exc:  # URLError, HTTPError, refused connections and timeouts are all OSErrors
        message = f"could not push metrics of job {job!r} to Pushgateway {gateway_url}: {exc}"
        if strict:
            raise MetricsPushError(message) from exc
        log.warning("%s (training continues)", message)
        return False
    return True


def finish_run(
    gateway_url: str, job: str, grouping_key: Mapping[str, str] | None = None, *, strict: bool = False
) -> bool:
    """Delete a finished run's group from the Pushgateway, so its last values stop being scraped
    (and a finished run does not look like a stalled one). Same error handling as :func:`push_step`.
    """
    try:
        delete_from_gateway(gateway_url, job=job, grouping_key=dict(grouping_key or {}))
    except OSError as exc:
        message = f"could not delete metrics of job {job!r} from Pushgateway {gateway_url}: {exc}"
        if strict:
            raise MetricsPushError(message) from exc
        log.warning(message)
        return False
    return True


def serve_metrics(
    registry: CollectorRegistry, port: int, addr: str = "127.0.0.1"
) -> tuple[ThreadingHTTPServer, Thread]:
    """Serve ``registry`` on ``http://addr:port/metrics`` from a daemon thread.

    Returns the server and thread; ``server.shutdown()`` stops it.
    """
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return server, thread
