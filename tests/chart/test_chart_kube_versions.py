"""The chart's supported Kubernetes versions: what it states, and what it gates on older servers."""

from __future__ import annotations

import pytest
import yaml
from chart_render import CHART_DIR, by_kind, render, render_objects


def test_chart_states_its_supported_versions() -> None:
    assert yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["kubeVersion"] == ">=1.20.0-0"


@pytest.mark.parametrize(
    ("version", "has_ttl"), [("1.20.2", False), ("1.22.17", False), ("1.23.0", True), ("1.30.0", True)]
)
def test_job_ttl_only_where_it_is_generally_available(version: str, has_ttl: bool) -> None:
    (job,) = by_kind(render_objects(kube_version=version), "Job")
    assert ("ttlSecondsAfterFinished" in job["spec"]) is has_ttl


@pytest.mark.parametrize(("version", "warns"), [("1.20.2", True), ("1.24.17", True), ("1.25.0", False)])
def test_notes_warn_where_pod_security_is_not_enforced(version: str, warns: bool) -> None:
    notes = next(text for path, text in render(kube_version=version).items() if path.endswith("NOTES.txt"))
    assert ("Pod Security admission" in notes) is warns
    assert "WARNING" in notes if warns else "WARNING" not in notes


def test_every_object_uses_an_api_the_oldest_supported_server_serves() -> None:
    # the kinds and groups Kubernetes 1.20 serves (CRD-backed kinds are gated on their own API)
    served = {
        "v1", "apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1",
        "policy/v1beta1", "batch/v1beta1",
    }  # fmt: skip
    objs = render_objects(kube_version="1.20.2")
    assert {o["apiVersion"] for o in objs} <= served, {o["apiVersion"] for o in objs} - served
