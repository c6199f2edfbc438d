"""A real Prometheus scrapes a gagar /metrics endpoint and a real Pushgateway fed by push_step."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from fixtures.services import Prometheus, Pushgateway, free_port, http_get, wait_until
from gagar.metrics import GagarMetrics, build_metrics, finish_run, push_step, record_step

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "monitoring"
SCRAPE_WAIT_S = 30.0


@dataclass
class Stack:
    server_metrics: GagarMetrics
    pushgateway: Pushgateway
    prometheus: Prometheus


@pytest.fixture(scope="module")
def stack(pushgateway: Pushgateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A gagar metrics server, the Pushgateway, and Prometheus scraping both (with gagar's rules)."""
    metrics = build_metrics(CollectorRegistry())
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    prometheus = Prometheus(
        tmp_path_factory.mktemp("prometheus"),
        targets=[f"127.0.0.1:{port}"],
        pushgateway=f"127.0.0.1:{pushgateway.port}",
        rule_files=[MONITORING / "gagar-rules.yaml"],
    )
    try:
        prometheus.start(timeout_s=30)
        yield Stack(metrics, pushgateway, prometheus)
    finally:
        prometheus.stop()
        server.shutdown()
        thread.join(timeout=5)


def scraped_value(prometheus: Prometheus, promql: str) -> float | None:
    result = prometheus.query(promql)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def test_prometheus_scrapes_the_server_endpoint(stack: Stack) -> None:
    record_step(
        stack.server_metrics, {"step": 7, "rollout/resolved_rate": 0.4375, "sampling/dropped/all_pass": 3}
    )
    stack.server_metrics["gagar_sandbox_duration_seconds"].labels("passed").observe(95.0)
    query = 'gagar_resolved_ratio{job="gagar-server"}'
    wait_until(lambda: scraped_value(stack.prometheus, query) == 0.4375, SCRAPE_WAIT_S, f"{query} == 0.4375")
    assert scraped_value(stack.prometheus, 'gagar_groups_dropped_total{reason="all_pass"}') == 3
    le = scraped_value(stack.prometheus, 'gagar_sandbox_duration_seconds_bucket{status="passed", le="120.0"}')
    assert le == 1


def test_push_step_reaches_prometheus_through_the_pushgateway(stack: Stack) -> None:
    step_registry = CollectorRegistry()
    record_step(build_metrics(step_registry), {"step": 41, "credit/moved_ratio": 0.25, "loss/policy": 0.125})
    group = {"run": "exp-1", "stage": "train"}
    assert push_step(stack.pushgateway.url, "gagar-rl", step_registry, group, strict=True)
    query = 'gagar_credit_moved_ratio{job="gagar-rl", run="exp-1", stage="train"}'
    wait_until(lambda: scraped_value(stack.prometheus, query) == 0.25, SCRAPE_WAIT_S, f"{query} == 0.25")
    assert scraped_value(stack.prometheus, 'gagar_train_step{job="gagar-rl"}') == 41
    assert finish_run(stack.pushgateway.url, "gagar-rl", group, succeeded=False, strict=True)
    pushed = http_get(f"{stack.pushgateway.url}/metrics").decode()
    # finished and failed; the step's values stay (a push-add replaces only the run's three gauges)
    assert re.search(r'gagar_run_active\{[^}]*run="exp-1"[^}]*\} 0', pushed), pushed
    assert re.search(r'gagar_run_failed\{[^}]*run="exp-1"[^}]*\} 1', pushed), pushed
    assert re.search(r'gagar_train_step\{[^}]*run="exp-1"[^}]*\} 41', pushed), pushed
    failed = 'gagar_run_failed{job="gagar-rl", run="exp-1"}'
    wait_until(lambda: scraped_value(stack.prometheus, failed) == 1, SCRAPE_WAIT_S, f"{failed} == 1")


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def as_promql(expr: str) -> str:
    """Replace Grafana's template variables by values Prometheus accepts."""
    return expr.replace("$__rate_interval", "1m").replace("$job", ".+")


def test_every_dashboard_expression_parses_in_prometheus(stack: Stack) -> None:
    for expr in dashboard_exprs():
        answer = stack.prometheus.api("query", query=as_promql(expr))
        assert answer["status"] == "success", f"dashboard expression {expr!r} failed: {answer.get('error')}"
    bad = stack.prometheus.api("query", query="rate(gagar_trajectories_total[)")  # the check can fail
    assert bad["status"] == "error"


def test_prometheus_loaded_the_rules(stack: Stack) -> None:
    groups = stack.prometheus.api("rules")["data"]["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]}
    declared = set(re.findall(r"(?:record|alert): (\S+)", (MONITORING / "gagar-rules.yaml").read_text()))
    assert loaded == declared
    assert all(rule.get("health") != "err" for group in groups for rule in group["rules"])
