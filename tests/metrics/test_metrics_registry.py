"""Metric declarations, naming conventions, the step recorder and push error handling."""

from __future__ import annotations

import logging
import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fixtures.services import free_port
from gagar.metrics import (
    LATENCY_BUCKETS_S,
    METRICS,
    MetricsPushError,
    build_metrics,
    finish_run,
    push_step,
    record_step,
)

STEP = {
    "step": 12,
    "rollout/resolved_rate": 0.375,
    "sampling/groups_kept": 3,
    "sampling/dropped/all_pass": 1,
    "sampling/dropped/all_fail": 2,
    "grader/fallbacks": 2,
    "grader/fallbacks/invalid_ranking": 2,
    "credit/moved_ratio": 0.125,
    "policy/entropy": 0.75,
    "loss/policy": -0.02,
    "loss/total": 0.5,
    "perf/tokens_per_s": 11000.0,
    "perf/step_s": 42.0,
    "sandbox/passed": 6,
    "sandbox/failed": 9,
    "sandbox/infra_error": 1,
    "sandbox/hack": 2,
    "sandbox/hacks/introspection": 2,
    "sandbox/hacks/special_casing": 1,
    "sandbox/hack_ratio": 0.25,
    "sandbox/evaluations": 16,
    "advantage/mean": 0.0,
}


def test_names_follow_prometheus_conventions() -> None:
    metrics = build_metrics()
    families = [fam for c in metrics.collectors.values() for fam in c.describe()]
    assert len(families) == len(METRICS) == len({m.name for m in METRICS})
    for fam in families:
        assert re.fullmatch(r"gagar_[a-z_]+", fam.name), fam.name
        assert fam.documentation.endswith("."), f"{fam.name} needs help text"
        if fam.type == "gauge" and "ratio" in fam.name:
            assert fam.name.endswith("_ratio")
        if fam.type == "histogram":
            assert fam.name.endswith("_seconds")
    names = metrics.series_names()
    for expected in (
        "gagar_trajectories_total",
        "gagar_resolved_ratio",
        "gagar_groups_kept_total",
        "gagar_groups_dropped_total",
        "gagar_credit_moved_ratio",
        "gagar_grader_fallbacks_total",
        "gagar_sandbox_duration_seconds_bucket",
        "gagar_sandbox_hacks_total",
        "gagar_sandbox_hack_ratio",
        "gagar_train_step",
    ):
        assert expected in names
    assert max(LATENCY_BUCKETS_S) >= 1800  # sandbox and grader runs can take tens of minutes


def test_each_registry_gets_its_own_metrics_and_duplicates_are_refused() -> None:
    first, second = build_metrics(), build_metrics()
    first["gagar_resolved_ratio"].set(0.5)
    assert second.registry.get_sample_value("gagar_resolved_ratio") == 0.0
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        build_metrics(first.registry)


def test_record_step_maps_trainer_keys() -> None:
    m = build_metrics()
    unknown = record_step(m, STEP, {"sandbox/duration_s/passed": [1.0, 2.0]}, now=1_700_000_000.0)
    record_step(m, {"sampling/groups_kept": 2, "sampling/dropped/all_pass": 4, "perf/step_s": 30.0})
    value = m.registry.get_sample_value
    # the per-step total of fallbacks and the evaluation count feed nothing: their parts do
    assert unknown == ["grader/fallbacks", "sandbox/evaluations", "advantage/mean"]
    assert value("gagar_train_step") == 12
    assert value("gagar_train_last_step_timestamp_seconds") == 1_700_000_000.0
    assert value("gagar_resolved_ratio") == 0.375
    assert value("gagar_trajectories_total", {"status": "failed"}) == 9
    assert value("gagar_groups_kept_total") == 5  # counters accumulate over steps
    assert value("gagar_groups_dropped_total", {"reason": "all_pass"}) == 5
    assert value("gagar_groups_dropped_total", {"reason": "all_fail"}) == 2
    assert value("gagar_grader_fallbacks_total", {"reason": "invalid_ranking"}) == 2  # counted once
    assert value("gagar_grader_fallbacks_total", {"reason": "unspecified"}) is None
    assert value("gagar_credit_moved_ratio") == 0.125
    assert value("gagar_policy_entropy_nats") == 0.75
    assert value("gagar_train_loss", {"term": "policy"}) == -0.02
    assert value("gagar_train_tokens_per_second") == 11000.0
    assert value("gagar_rl_step_duration_seconds_count") == 2
    assert value("gagar_rl_step_duration_seconds_sum") == 72.0
    assert value("gagar_sandbox_evaluations_total", {"status": "infra_error"}) == 1
    assert value("gagar_trajectories_total", {"status": "passed"}) == 6
    assert value("gagar_sandbox_evaluations_total", {"status": "evaluations"}) is None
    assert value("gagar_sandbox_evaluations_total", {"status": "hack"}) == 2
    assert value("gagar_sandbox_hacks_total", {"kind": "introspection"}) == 2
    assert value("gagar_sandbox_hacks_total", {"kind": "special_casing"}) == 1
    assert value("gagar_sandbox_hack_ratio") == 0.25
    assert value("gagar_sandbox_duration_seconds_count", {"status": "passed"}) == 2
    assert value("gagar_sandbox_duration_seconds_sum", {"status": "passed"}) == 3.0
    text = generate_latest(m.registry).decode()
    assert "# HELP gagar_resolved_ratio Fraction" in text


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"sampling/groups_kept": -1}, "cannot be negative"),
        ({"perf/step_s": -1.0}, "cannot be negative"),
        ({"rollout/resolved_rate": 1.5}, r"ratio must lie in \[0, 1\]"),
        ({"sampling/dropped/Group-7f3a": 1}, "label value 'Group-7f3a'"),
        ({"loss/traj/abc": 1.0}, "label value 'traj/abc'"),
    ],
)
def test_record_step_refuses_bad_values(values: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        record_step(build_metrics(), values)


def test_push_to_an_unreachable_gateway_warns_or_raises(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    registry = CollectorRegistry()
    build_metrics(registry)["gagar_train_step"].set(3)
    with caplog.at_level(logging.WARNING, logger="gagar.metrics"):
        assert push_step(url, "gagar-train", registry, {"run": "r1"}, timeout_s=1) is False
        assert finish_run(url, "gagar-train", {"run": "r1"}, succeeded=True, timeout_s=1) is False
    assert f"could not push metrics of job 'gagar-train' to Pushgateway {url}" in caplog.text
    assert "training continues" in caplog.text
    with pytest.raises(MetricsPushError, match=re.escape(url)):
        push_step(url, "gagar-train", registry, strict=True, timeout_s=1)
