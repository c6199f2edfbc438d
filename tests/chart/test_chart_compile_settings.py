"""What the chart's values set for every run reaches the pipeline it compiles: the run parameters'
defaults (the Kubeflow UI's run form) and each task's CPU and memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_render import render_objects
from test_chart_release_names import compile_as_the_job_does


def _defaults(compiled: dict[str, Any]) -> dict[str, Any]:
    parameters = compiled["pipeline"]["root"]["inputDefinitions"]["parameters"]
    return {name: p.get("defaultValue") for name, p in parameters.items()}


def _resources(compiled: dict[str, Any], executor: str) -> dict[str, str]:
    found = compiled["pipeline"]["deploymentSpec"]["executors"][executor]["container"]["resources"]
    return {k: v for k, v in found.items() if k.startswith("resource") and isinstance(v, str)}


def test_a_default_install_compiles_cluster_defaults_and_every_task_has_resources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = compile_as_the_job_does(render_objects({}), tmp_path / "rl.yaml", monkeypatch)
    defaults = _defaults(compiled)
    assert defaults["sandbox_backend"] == "kubernetes"  # a run from the UI evaluates in sandbox pods
    assert defaults["policy"] is None  # required: the run form asks for it
    for name, executor in compiled["pipeline"]["deploymentSpec"]["executors"].items():
        resources = executor["container"]["resources"]
        for key in ("resourceCpuRequest", "resourceCpuLimit", "resourceMemoryRequest", "resourceMemoryLimit"):
            assert key in resources, (name, key)
    assert _resources(compiled, "exec-prepare")["resourceMemoryLimit"] == "4Gi"  # a light task


def test_values_set_run_defaults_and_a_stages_resources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {
        "monitoring": {"pushgateway": {"enabled": True}},
        "pipeline": {
            "compile": {
                "parameters": {"rollout_group_size": 16, "advantage_algo": "gagar-tiered"},
                "resources": {
                    "train": {
                        "requests": {"cpu": "4", "memory": "32Gi"},
                        "limits": {"cpu": "8", "memory": "64Gi"},
                    }
                },
            }
        },
    }
    compiled = compile_as_the_job_does(render_objects(values), tmp_path / "rl.yaml", monkeypatch)
    defaults = _defaults(compiled)
    assert defaults["rollout_group_size"] == 16
    assert defaults["advantage_algo"] == "gagar-tiered"
    assert defaults["metrics_pushgateway"].startswith("http://gagar-pushgateway.")
    assert _resources(compiled, "exec-train") == {
        "resourceCpuRequest": "4",
        "resourceCpuLimit": "8",
        "resourceMemoryRequest": "32Gi",
        "resourceMemoryLimit": "64Gi",
    }
    assert _resources(compiled, "exec-rollout")["resourceMemoryRequest"] == "8Gi"  # not named: its default


def test_a_compile_parameter_the_pipeline_does_not_take_fails_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = render_objects({"pipeline": {"compile": {"parameters": {"group_sizee": 4}}}})
    with pytest.raises(AssertionError, match="unknown pipeline parameter 'group_sizee'"):
        compile_as_the_job_does(objs, tmp_path / "rl.yaml", monkeypatch)
