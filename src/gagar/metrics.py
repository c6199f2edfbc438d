"""Prometheus metrics: every GAGAR metric declared once in :data:`METRICS`, a step recorder, push helpers.

The trainer and the pipeline's train stage build the metrics on their own
:class:`CollectorRegistry` and push it to a Pushgateway (:func:`push_step`). A pipeline task
pushes one step into a fresh registry, so it first turns its per-step counts into running totals
over the run store's earlier steps (:func:`cumulative_totals`): the pushed ``_total`` counters then
grow across steps and runs, as ``rate()`` expects. A pushed step marks its run active
(``run/active``); :func:`finish_run` marks it finished, succeeded or failed, which is what the stall
and failed-run alerts read. Names follow
Prometheus conventions: base units, ``_total`` counters, ``_ratio`` gauges in [0, 1], fixed label
names and no trajectory or task ids in labels.
A metrics failure never stops training unless asked to (``strict=True``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    push_to_gateway,
    pushadd_to_gateway,
)

from gagar.schema.result import Status, TestResult

__all__ = [
    "LATENCY_BUCKETS_S",
    "METRICS",
    "RUN_ACTIVE_KEY",
    "GagarMetrics",
    "Kind",
    "Metric",
    "MetricsPushError",
    "build_metrics",
    "cumulative_totals",
    "finish_run",
    "publish_step",
    "push_step",
    "record_step",
    "step_observations",
]

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
"""Histogram buckets (seconds) for sandbox, grader and step latencies: 100 ms up to an hour."""

RUN_ACTIVE_KEY = "run/active"
"""Step key of :data:`METRICS`' ``gagar_run_active``: 1 in every step a run pushes."""

_LABEL_VALUE = re.compile(r"^[a-z0-9_]{1,40}$")
_STATUSES = tuple(s.value for s in Status)


class MetricsPushError(RuntimeError):
    """The Pushgateway could not be reached or refused the push."""


class Kind(StrEnum):
    """How a step key feeds its collector."""

    COUNTER = "counter"
    """``inc`` by the key's value (a per-step count)."""
    GAUGE = "gauge"
    """``set`` to the key's value."""
    RATIO = "ratio"
    """A gauge ``set`` to a value that must lie in [0, 1]."""
    HISTOGRAM = "histogram"
    """``observe`` the key's value, or each of its observations (:func:`record_step`)."""
    TIMESTAMP = "timestamp"
    """A gauge ``set`` to the time the key was recorded."""


@dataclass(frozen=True)
class Metric:
    """One Prometheus metric and the step key that feeds it.

    ``key`` is a step-metrics key (``grader/fallbacks/<reason>``): a trailing ``<label>`` segment
    stands for any value of that label, which must be one of ``values`` when they are given.
    """

    name: str
    kind: Kind
    key: str
    help: str
    values: tuple[str, ...] | None = None

    @property
    def label(self) -> str | None:
        """The label the key's last segment fills, if any."""
        last = self.key.rpartition("/")[2]
        return last[1:-1] if last.startswith("<") and last.endswith(">") else None

    def match(self, key: str) -> str | None:
        """The label value ``key`` carries for this metric ("" for an unlabelled match), else None."""
        if self.label is None:
            return "" if key == self.key else None
        prefix = self.key.rpartition("/")[0] + "/"
        if not key.startswith(prefix):
            return None
        value = key[len(prefix) :]
        if self.values is not None and value not in self.values:
            return None
        if not _LABEL_VALUE.match(value):
            raise ValueError(f"metric key {key!r}: label value {value!r} must match {_LABEL_VALUE.pattern}")
        return value


METRICS: tuple[Metric, ...] = (
    Metric("gagar_train_step", Kind.GAUGE, "step", "Last completed RL step."),
    Metric(
        "gagar_run_active",
        Kind.GAUGE,
        RUN_ACTIVE_KEY,
        "1 while a training run is in progress (it pushed a step and has not finished), 0 once it finished.",
    ),
    Metric(
        "gagar_run_failed",
        Kind.GAUGE,
        "run/failed",
        "1 when the last training run of this job and run group failed, 0 when it succeeded.",
    ),
    Metric(
        "gagar_run_finished_timestamp_seconds",
        Kind.TIMESTAMP,
        "run/finished",
        "Unix time the last training run finished, succeeded or failed.",
    ),
    Metric(
        "gagar_train_last_step_timestamp_seconds",
        Kind.TIMESTAMP,
        "step",
        "Unix time the last RL step completed.",
    ),
    Metric(
        "gagar_resolved_ratio",
        Kind.RATIO,
        "rollout/resolved_rate",
        "Fraction of the last step's trajectories that resolved their task (infra errors excluded).",
    ),
    Metric(
        "gagar_rollout_turns_per_trajectory",
        Kind.GAUGE,
        "rollout/turns_mean",
        "Mean assistant turns per trajectory in the last step (1 for the single-shot agent).",
    ),
    Metric(
        "gagar_rollout_sampled_tokens_per_trajectory",
        Kind.GAUGE,
        "rollout/sampled_tokens_mean",
        "Mean tokens the policy sampled per trajectory in the last step (tool output left out).",
    ),
    Metric(
        "gagar_rollout_sampled_tokens_per_turn",
        Kind.GAUGE,
        "rollout/sampled_tokens_per_turn_mean",
        "Mean tokens the policy sampled per assistant turn in the last step.",
    ),
    Metric(
        "gagar_rollout_tool_calls_per_trajectory",
        Kind.GAUGE,
        "rollout/tool_calls/<command>",
        "Mean tool calls per trajectory in the last step, by command (the multi-turn agents).",
        (
            "view",
            "search",
            "edit",
            "run_tests",
            "submit",
            "invalid",
            "bash",
            "bash_tests",
            "create",
            "str_replace",
            "insert",
            "undo_edit",
            "malformed",
        ),
    ),
    Metric(
        "gagar_rollout_ran_tests_ratio",
        Kind.RATIO,
        "rollout/ran_tests_ratio",
        "Fraction of the last step's trajectories that ran the visible tests at least once.",
    ),
    Metric(
        "gagar_rollout_submitted_ratio",
        Kind.RATIO,
        "rollout/submitted_ratio",
        "Fraction of the last step's trajectories that ended by themselves (SUBMIT within the budgets).",
    ),
    Metric(
        "gagar_trajectories_total",
        Kind.COUNTER,
        "sandbox/<status>",
        "Trajectories evaluated, by test status.",
        _STATUSES,
    ),
    Metric(
        "gagar_sandbox_evaluations_total",
        Kind.COUNTER,
        "sandbox/<status>",
        "Sandboxed test runs, by status.",
        _STATUSES,
    ),
    Metric(
        "gagar_sandbox_duration_seconds",
        Kind.HISTOGRAM,
        "sandbox/duration_s/<status>",
        "Wall time of one sandboxed test run, by status.",
        _STATUSES,
    ),
    Metric(
        "gagar_sandbox_hacks_total",
        Kind.COUNTER,
        "sandbox/hacks/<kind>",
        "Evaluations judged a reward hack, by kind (one evaluation may count under several kinds).",
    ),
    Metric(
        "gagar_sandbox_hack_ratio",
        Kind.RATIO,
        "sandbox/hack_ratio",
        "Fraction of the last step's evaluations judged a reward hack (infra errors excluded).",
    ),
    Metric(
        "gagar_groups_kept_total",
        Kind.COUNTER,
        "sampling/groups_kept",
        "Groups kept by dynamic sampling (mixed pass/fail).",
    ),
    Metric(
        "gagar_groups_dropped_total",
        Kind.COUNTER,
        "sampling/dropped/<reason>",
        "Groups dropped by dynamic sampling, by reason.",
    ),
    Metric(
        "gagar_grader_fallbacks_total",
        Kind.COUNTER,
        "grader/fallbacks/<reason>",
        "Groups whose grade was invalid or failed and fell back to GRPO advantages, by reason.",
    ),
    Metric(
        "gagar_grader_duration_seconds", Kind.HISTOGRAM, "grader/group_duration_s", "Time to grade one group."
    ),
    Metric(
        "gagar_credit_moved_ratio",
        Kind.RATIO,
        "credit/moved_ratio",
        "Share of passing advantage mass the grader moved between trajectories in the last step.",
    ),
    Metric(
        "gagar_policy_entropy_nats",
        Kind.GAUGE,
        "policy/entropy",
        "Token-mean entropy of the policy over the last update's sampled response tokens, in nats.",
    ),
    Metric(
        "gagar_train_loss", Kind.GAUGE, "loss/<term>", "Loss of the last step, by term (policy, kl, total)."
    ),
    Metric(
        "gagar_train_tokens_per_second",
        Kind.GAUGE,
        "perf/tokens_per_s",
        "Training throughput of the last step.",
    ),
    Metric(
        "gagar_rl_step_duration_seconds", Kind.HISTOGRAM, "perf/step_s", "Wall time of one whole RL step."
    ),
)
"""Every GAGAR metric, once: adding a metric is adding an entry here (and a row in docs/metrics.md)."""


@dataclass(frozen=True)
class GagarMetrics:
    """The collectors of :data:`METRICS` on one registry; build with :func:`build_metrics`."""

    registry: CollectorRegistry
    collectors: Mapping[str, Counter | Gauge | Histogram]
    """Collector of each metric, by its Prometheus name."""

    def __getitem__(self, name: str) -> Counter | Gauge | Histogram:
        return self.collectors[name]

    def series_names(self) -> set[str]:
        """Every series name these collectors can expose (``_total``, ``_bucket``, ... included)."""
        names: set[str] = set()
        for collector in self.collectors.values():
            for family in collector.describe():
                if family.type == "counter":
                    names |= {f"{family.name}_total", f"{family.name}_created"}
                elif family.type == "histogram":
                    names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count", "created")}
                else:
                    names.add(family.name)
        return names


def build_metrics(
    registry: CollectorRegistry | None = None, only: Collection[str] | None = None
) -> GagarMetrics:
    """Declare every metric of :data:`METRICS` (or those named in ``only``) on ``registry`` (a fresh
    one when None)."""
    reg = registry if registry is not None else CollectorRegistry()
    collectors: dict[str, Counter | Gauge | Histogram] = {}
    for metric in METRICS:
        if only is not None and metric.name not in only:
            continue
        labels = (metric.label,) if metric.label else ()
        if metric.kind is Kind.COUNTER:
            collectors[metric.name] = Counter(metric.name, metric.help, labels, registry=reg)
        elif metric.kind is Kind.HISTOGRAM:
            collectors[metric.name] = Histogram(
                metric.name, metric.help, labels, registry=reg, buckets=LATENCY_BUCKETS_S
            )
        else:
            collectors[metric.name] = Gauge(metric.name, metric.help, labels, registry=reg)
    return GagarMetrics(registry=reg, collectors=collectors)


def _feed(collector: Any, metric: Metric, key: str, value: float | Sequence[float], now: float) -> None:
    observations = [float(v) for v in value] if isinstance(value, Sequence) else [float(value)]
    if metric.kind in (Kind.COUNTER, Kind.HISTOGRAM) and any(v < 0 for v in observations):
        raise ValueError(f"metric key {key!r}: a count or duration cannot be negative, got {value}")
    if metric.kind is Kind.RATIO and not all(0.0 <= v <= 1.0 for v in observations):
        raise ValueError(f"metric key {key!r}: a ratio must lie in [0, 1], got {value}")
    if metric.kind is Kind.HISTOGRAM:
        for v in observations:
            collector.observe(v)
    elif len(observations) != 1:
        raise ValueError(f"metric key {key!r}: {metric.kind.value} takes one number, got {len(observations)}")
    elif metric.kind is Kind.COUNTER:
        collector.inc(observations[0])
    elif metric.kind is Kind.TIMESTAMP:
        collector.set(now)
    else:
        collector.set(observations[0])


def record_step(
    m: GagarMetrics,
    values: Mapping[str, float],
    observations: Mapping[str, Sequence[float]] | None = None,
    *,
    now: float | None = None,
) -> list[str]:
    """Feed one step's metrics into the collectors of :data:`METRICS`; return the keys that feed none.

    ``values`` is the step's metric dict (counts are per-step increments); ``observations`` holds
    the per-item samples of histogram keys (:func:`step_observations`). A key may feed several
    metrics; each metric is fed only by its own key.

    Raises:
        ValueError: a negative count or duration, a ratio outside [0, 1], or a label value that is
            not a short lowercase identifier (ids never become labels), naming the key.
    """
    at = time.time() if now is None else now
    unknown = []
    items: list[tuple[str, float | Sequence[float]]] = [*values.items(), *(observations or {}).items()]
    for key, value in items:
        fed = False
        for metric in METRICS:
            label = metric.match(key)
            if label is None:
                continue
            collector: Any = m[metric.name]
            _feed(collector.labels(label) if label else collector, metric, key, value, at)
            fed = True
        if not fed:
            unknown.append(key)
    return unknown


def step_observations(
    results: Iterable[TestResult], grade_durations_s: Iterable[float] = ()
) -> dict[str, list[float]]:
    """One step's histogram samples: each sandbox run's seconds by status, each group's grading seconds."""
    out: dict[str, list[float]] = {}
    for r in results:
        out.setdefault(f"sandbox/duration_s/{r.status.value}", []).append(r.duration_s)
    graded = list(grade_durations_s)
    if graded:
        out["grader/group_duration_s"] = graded
    return out


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
    gateway_url: str,
    job: str,
    grouping_key: Mapping[str, str] | None = None,
    *,
    succeeded: bool,
    strict: bool = False,
    now: float | None = None,
    timeout_s: float = 5.0,
) -> bool:
    """Mark a run finished in its Pushgateway group: ``gagar_run_active`` 0, ``gagar_run_failed``
    1 or 0, ``gagar_run_finished_timestamp_seconds``. Only these three are replaced (a push-add):
    the step's totals and gauges stay, so counters do not vanish between scheduled runs, and a
    finished run no longer looks stalled. Same error handling as :func:`push_step`.

    Call it where a run ends: at the end of the trainer's loop, in the pipeline's exit handler.
    """
    names = ("gagar_run_active", "gagar_run_failed", "gagar_run_finished_timestamp_seconds")
    m = build_metrics(CollectorRegistry(), only=names)
    values = {RUN_ACTIVE_KEY: 0.0, "run/failed": 0.0 if succeeded else 1.0, "run/finished": 1.0}
    record_step(m, values, now=now)
    try:
        pushadd_to_gateway(
            gateway_url,
            job=job,
            registry=m.registry,
            grouping_key=dict(grouping_key or {}),
            timeout=timeout_s,
        )
    except OSError as exc:
        message = f"could not push metrics of job {job!r} to Pushgateway {gateway_url}: {exc}"
        if strict:
            raise MetricsPushError(message) from exc
        log.warning(message)
        return False
    return True


def _counter_key(key: str) -> bool:
    """Whether ``key`` feeds counters only (a per-step count), so its totals are sums."""
    fed = [metric.kind for metric in METRICS if metric.match(key) is not None]
    return bool(fed) and all(kind is Kind.COUNTER for kind in fed)


def cumulative_totals(
    previous: Iterable[Mapping[str, float]], step_metrics: Mapping[str, float]
) -> dict[str, float]:
    """``step_metrics`` with each counter key's per-step count replaced by its running total.

    ``previous`` holds the earlier steps' metric dicts (the run store's ``metrics/step-N.json``,
    earlier scheduled runs included); entries of this step or later ones are left out, so the
    answer is the same before and after this step's metrics are stored, and on a retried step.
    Counter keys only earlier steps had (a status no trajectory of this step ended in) are carried
    with their totals, so no series disappears from a push. Other keys (gauges, ratios) are
    unchanged; histogram samples are not step keys and stay per step.

    The train stage pushes ``record_step(build_metrics(), {**cumulative_totals(earlier, merged),
    RUN_ACTIVE_KEY: 1})`` into a fresh registry: ``gagar_*_total`` then grow across steps and runs.
    """
    step = step_metrics.get("step")
    totals = {k: float(v) for k, v in step_metrics.items() if _counter_key(k)}
    for earlier in previous:
        if step is not None and earlier.get("step", -1.0) >= step:
            continue
        for key, value in earlier.items():
            if _counter_key(key):
                totals[key] = totals.get(key, 0.0) + float(value)
    return {**step_metrics, **totals}


def publish_step(
    gateway_url: str,
    job: str,
    run: str,
    step_metrics: Mapping[str, float],
    earlier: Iterable[Mapping[str, float]],
    observations: Mapping[str, Sequence[float]] | None = None,
) -> bool:
    """Push one step of run ``run`` to the Pushgateway (group ``{"run": run}``) as totals that grow:
    each count summed with the ``earlier`` steps' (:func:`cumulative_totals`; a resumed or scheduled
    run continues its totals), the run marked active, this step's histogram samples. What every
    runner calls after a step: ``gagar train`` with its metrics log, a pipeline's train stage with
    its store's step metrics. Returns whether the push went through (a failed push is logged)."""
    numbers = {k: float(v) for k, v in step_metrics.items() if isinstance(v, int | float)}
    m = build_metrics(CollectorRegistry())
    record_step(m, {**cumulative_totals(earlier, numbers), RUN_ACTIVE_KEY: 1.0}, observations)
    return push_step(gateway_url, job, m.registry, {"run": run})
