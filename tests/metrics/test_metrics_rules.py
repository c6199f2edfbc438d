"""Alert rules (promtool), the PrometheusRule wrapper and the Grafana dashboard stay consistent."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gagar.metrics import build_metrics

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "monitoring"
RULES = MONITORING / "gagar-rules.yaml"
_IDENT = re.compile(r"\bgagar[a-zA-Z0-9_:]*")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not found: run scripts/install-system-deps.sh")
    return subprocess.run([binary, *args], cwd=MONITORING, capture_output=True, text=True, timeout=60)


def rule_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def recorded_names() -> set[str]:
    return {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}


def referenced(expr: str) -> set[str]:
    """Names starting with 'gagar' in a PromQL expression (metrics and recording rules)."""
    return set(_IDENT.findall(expr))


def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 11 rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", "gagar-rules.test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    broken = RULES.read_text().replace(
        "gagar:grader_fallback_ratio:rate15m > 0.25", "gagar:grader_fallback_ratio:rate15m > 0.5"
    )
    (tmp_path / RULES.name).write_text(broken)
    shutil.copy(MONITORING / "gagar-rules.test.yaml", tmp_path)
    result = promtool("test", "rules", str(tmp_path / "gagar-rules.test.yaml"))
    assert result.returncode != 0
    assert "GagarGraderFallbackRatioHigh" in result.stdout + result.stderr


def test_prometheusrule_wraps_exactly_the_plain_rules() -> None:
    obj = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert (obj["apiVersion"], obj["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "gagar"
    assert obj["spec"]["groups"] == rule_groups()


def test_rules_and_dashboard_reference_only_declared_metrics() -> None:
    known = build_metrics().series_names() | recorded_names()
    rule_exprs = [r["expr"] for g in rule_groups() for r in g["rules"]]
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    dash_exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for expr in rule_exprs + dash_exprs:
        unknown = referenced(expr) - known
        assert not unknown, f"{expr!r} uses undeclared metrics {sorted(unknown)}"
    used = set().union(*(referenced(e) for e in dash_exprs))
    for required in (
        "gagar_resolved_ratio",
        "gagar_trajectories_total",
        "gagar_groups_kept_total",
        "gagar_groups_dropped_total",
        "gagar_credit_moved_ratio",
        "gagar_grader_fallbacks_total",
        "gagar_sandbox_duration_seconds_bucket",
        "gagar_sandbox_hacks_total",
        "gagar_sandbox_hack_ratio",
        "gagar_train_loss",
        "gagar_train_tokens_per_second",
    ):
        assert required in used, f"the dashboard has no panel for {required}"


def test_dashboard_layout_is_valid() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "job"}


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_alert_has_a_runbook_in_docs_metrics() -> None:
    docs = MONITORING.parents[1] / "docs" / "metrics.md"
    anchors = {
        _github_anchor(line.lstrip("#")) for line in docs.read_text().splitlines() if line.startswith("#")
    }
    alerts = [r for g in rule_groups() for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} >= {"GagarTrainingStalled", "GagarRunFailed"}
    for alert in alerts:
        url = alert["annotations"].get("runbook_url", "")
        page, _, anchor = url.partition("#")
        assert page == "https://github.com/gagar-project/gagar/blob/main/docs/metrics.md", alert["alert"]
        assert anchor in anchors, f"{alert['alert']}: docs/metrics.md has no heading for #{anchor}"


def test_the_stall_alert_needs_a_running_run() -> None:
    (stall,) = [r for g in rule_groups() for r in g["rules"] if r.get("alert") == "GagarTrainingStalled"]
    assert "gagar_run_active == 1" in stall["expr"]


def test_the_two_runs_test_catches_a_stall_alert_between_runs(tmp_path: Path) -> None:
    broken = RULES.read_text().replace("and on (job, run) (gagar_run_active == 1)", "")
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    shutil.copy(MONITORING / "gagar-rules.test.yaml", tmp_path)
    result = promtool("test", "rules", str(tmp_path / "gagar-rules.test.yaml"))
    assert result.returncode != 0
    assert "alertname: GagarTrainingStalled, time: 1h40m" in result.stdout + result.stderr
