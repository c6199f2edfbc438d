"""values.yaml, values.schema.json and the README table agree; bad values are refused."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python
import pytest
import yaml
from chart_render import CHART_DIR, SCENARIOS, render, scenario_values

ROOT = CHART_DIR.parents[1]


def _load_script(name: str) -> ModuleType:
    module_name = name.replace("-", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "scripts" / name)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


chart_docs = _load_script("chart-docs.py")


def _leaf_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [p for key, value in node.items() for p in _leaf_paths(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


def _schema_accepts_path(schema: dict[str, Any], path: str) -> bool:
    node = schema
    defs = schema["$defs"]
    for part in path.split("."):
        while "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[1]]
        props = node.get("properties")
        if props is not None and part in props:
            node = props[part]
            continue
        # Past a declared key, only a free-form map (labels, resources, security contexts) accepts more.
        extra = node.get("additionalProperties", True)
        return node.get("type") == "object" and (extra is True or isinstance(extra, dict))
    return True


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"unknownKey": True}, "additional properties 'unknownKey' not allowed"),
        ({"policyServer": {"gpus": "two"}}, "/policyServer/gpus"),
        ({"pipeline": {"recurringRun": {"maxConcurrency": 0}}}, "/pipeline/recurringRun/maxConcurrency"),
        ({"pipeline": {"recurringRun": {"cron": "0 2 * * *"}}}, "/pipeline/recurringRun/cron"),
        ({"pipeline": {"package": {"source": "url"}}}, "/pipeline/package/source"),
        ({"objectStore": {"endpoint": "https://s3.amazonaws.com"}}, "/objectStore/endpoint"),
        ({"sandbox": {"namespace": {"podSecurityLevel": "strict"}}}, "/sandbox/namespace/podSecurityLevel"),
        ({"sandbox": {"networkPolicy": {"enabled": "yes"}}}, "/sandbox/networkPolicy/enabled"),
        ({"images": {"pullPolicy": "Sometimes"}}, "/images/pullPolicy"),
        ({"graderServer": {"model": {"source": "hub"}}}, "/graderServer/model/source"),
    ],
)
def test_invalid_values_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=message.replace("/", r"\/").replace("'", ".")):
        render(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"policyServer": {"enabled": True}}, "model.existingClaim must name"),
        ({"graderServer": {"enabled": True, "model": {"source": "s3"}}}, "model.uri must be set"),
        ({"pipeline": {"package": {"source": "inline"}}}, "pipeline.package.inline must hold"),
        ({"pipeline": {"package": {"source": "configMap"}}}, "pipeline.package.configMapName must name"),
    ],
)
def test_incomplete_values_fail_with_a_clear_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(values)


def test_scenarios_cover_the_intended_set() -> None:
    assert {"default", "minimal", "external-s3", "gpu-vllm", "monitoring"} <= set(SCENARIOS)


def test_every_scenario_passes_the_schema(scenario: str) -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(scenario_values(scenario))


def test_schema_refuses_unknown_top_level_keys_and_knows_every_default() -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        schema = chart.schema
        defaults = chart.values
    assert schema is not None
    assert schema["additionalProperties"] is False
    assert set(defaults) == set(schema["properties"]) - {"global"}
    unknown = [p for p in _leaf_paths(defaults) if not _schema_accepts_path(schema, p)]
    assert unknown == []


def test_every_values_key_is_documented() -> None:
    text = (CHART_DIR / "values.yaml").read_text()
    assert chart_docs.undocumented_keys(text) == []
    documented = {doc.path for doc in chart_docs.parse_values(text)[0]}
    assert {"images.registry", "sandbox.namespace.name", "policyServer.gpus"} <= documented


def test_undocumented_key_is_reported() -> None:
    text = "# -- documented\na: 1\ngroup:\n  # -- inner\n  b: 2\n  c: 3\n"
    assert chart_docs.undocumented_keys(text) == ["group.c"]


def test_readme_values_table_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chart-docs.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_values_yaml_parses_to_the_chart_defaults() -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        assert chart.values == yaml.safe_load(Path(CHART_DIR / "values.yaml").read_text())
