"""The user docs are real: the commands, chart values and run parameters they name exist; no lab notebook."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.main import get_command

from gagar.cli import app
from gagar.pipeline.parameters import PARAMETERS
from gagar.train.config import setting_field

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = [ROOT / "README.md", ROOT / "docs" / "install.md"]
VALUES = yaml.safe_load((ROOT / "helm" / "gagar" / "values.yaml").read_text())
_COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def _values_has(path: str) -> bool:
    node: Any = VALUES
    for part in path.split("."):
        if node == {}:
            return True  # a free-form map (parameters, labels): any key
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_license_matches_pyproject_and_the_chart() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    chart = yaml.safe_load((ROOT / "helm" / "gagar" / "Chart.yaml").read_text())
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"


def test_readme_opens_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first_block] == [["make", "run"], ["make", "test"]]
    assert readme.index("```bash") < readme.index("## ")  # before any section


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_no_machine_paths_or_commit_ids(doc: Path) -> None:
    text = doc.read_text()
    assert not re.search(r"/work/|/tmp/|/root/|/home/", text)
    assert not _COMMIT.findall(text), _COMMIT.findall(text)


_SET = re.compile(r"--set(?:-file)? ([A-Za-z][\w.]*)=")


def _helm_commands(text: str) -> list[str]:
    """Every ``helm`` command of the text's fenced blocks, continuation lines joined."""
    commands, block, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if fenced:
                joined = "\n".join(block).replace("\\\n", " ")
                commands += [c for c in joined.splitlines() if c.strip().startswith("helm ")]
            block, fenced = [], not fenced
        elif fenced:
            block.append(line)
    return commands


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_chart_values_and_run_parameters_in_examples_exist(doc: Path) -> None:
    """A helm ``--set`` names a value of the chart; any other ``--set`` (``gagar train`` and
    ``gagar run`` take ``--set PATH=VALUE``) names a training setting."""
    text = doc.read_text()
    chart = [key for command in _helm_commands(text) for key in _SET.findall(command)]
    chart += re.findall(r"--set-file ([A-Za-z][\w.]*)=", text)  # helm's alone, in prose too
    assert chart, "the examples set no chart values"
    for key in chart:
        assert _values_has(key), f"{doc.name}: --set {key} is not a value of the chart"
    # the rest: gagar train and gagar run's --set (PATH=VALUE is a placeholder)
    settings = [key for key in _SET.findall(text) if key not in chart and not key.isupper()]
    for key in settings:
        try:
            setting_field(key)
        except ValueError:
            pytest.fail(f"{doc.name}: --set {key} is neither in a helm command nor a training setting")
    names = {p.name for p in PARAMETERS}
    for name in re.findall(r"recurringRun\.parameters\.(\w+)", text):
        assert name in names, f"{doc.name}: {name} is not a pipeline parameter"
    assert "kfp dsl compile" not in text


def _command_exists(words: list[str]) -> bool:
    command: Any = get_command(app)
    for word in words:
        if not isinstance(command, typer.core.TyperGroup):
            return True
        command = command.commands.get(word)
        if command is None:
            return False
    return True


def test_every_gagar_command_the_readme_names_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    named = re.findall(r"`gagar ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)", readme)
    assert len(named) > 10
    for words in named:
        assert _command_exists(words.split()), f"README names `gagar {words}`, which does not exist"
