"""Fixtures of the chart tests: one rendering per ``helm/gagar/ci/<scenario>-values.yaml``."""

from __future__ import annotations

from typing import Any

import pytest
from chart_render import MONITORING_API, SCENARIOS, TRAINER_API, render_objects, scenario_values


@pytest.fixture(scope="session", params=SCENARIOS)
def scenario(request: pytest.FixtureRequest) -> str:
    """Each ``ci/<scenario>-values.yaml`` of the chart."""
    return str(request.param)


@pytest.fixture(scope="session")
def scenario_objects(scenario: str) -> list[dict[str, Any]]:
    """The objects a scenario renders on a cluster with the Prometheus operator and Kubeflow Trainer."""
    return render_objects(scenario_values(scenario), api_versions=(*MONITORING_API, *TRAINER_API))
