"""Help shows every option's text as written (defaults and variables included); no two commands swap names."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from gagar.cli import app
from gagar.train.config import TrainConfig


def _commands(
    group: typer.core.TyperGroup, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], object]]:
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, typer.core.TyperGroup):
            yield from _commands(command, (*path, name))


ROOT = get_command(app)
COMMANDS = dict(_commands(ROOT))  # type: ignore[arg-type]


def _help(*path: str) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"}, prog_name="gagar")
    assert result.exit_code == 0, result.output
    return " ".join(result.output.replace("│", " ").split())


def test_train_help_shows_each_settings_default_and_variable() -> None:
    text = _help("train")
    assert "Initial policy directory [env: GAGAR_POLICY; required]." in text
    assert "Training tasks JSONL [env: GAGAR_TASKS; required]." in text
    assert f"RL steps [env: GAGAR_STEPS; default: {TrainConfig.model_fields['steps'].default}]." in text
    assert "Tool loop: most turns [env: GAGAR_ROLLOUT__AGENT__MAX_TURNS; default: 8]." in text
    assert "Advantage estimator [env: GAGAR_ADVANTAGE__ALGO; default: gagar]." in text


def _bracketed(command: object) -> list[str]:
    """The ``[...]`` parts of a command's option help texts, as written in the source."""
    return [
        match.replace("\\[", "[")
        for param in command.params  # type: ignore[attr-defined]
        for match in re.findall(r"\[[^\]]+\]", getattr(param, "help", None) or "")
    ]


BRACKETED = {path: _bracketed(c) for path, c in COMMANDS.items() if not isinstance(c, typer.core.TyperGroup)}


@pytest.mark.parametrize("path", sorted(p for p, parts in BRACKETED.items() if parts), ids=" ".join)
def test_no_bracketed_help_text_is_swallowed(path: tuple[str, ...]) -> None:
    text = _help(*path)
    for shown in BRACKETED[path]:
        assert " ".join(shown.split()) in text, (path, shown)


def test_servers_have_one_name_each() -> None:
    assert ("serve", "policy") in COMMANDS  # vLLM, the warm policy server
    assert ("serve", "transformers") in COMMANDS  # a small in-process one
    assert ("policy", "serve") not in COMMANDS
    pairs = {path for path in COMMANDS if len(path) == 2}
    swapped = sorted((a, b) for a, b in pairs if (b, a) in pairs)
    assert swapped == []


def test_escaping_twice_changes_nothing() -> None:
    from gagar.cli.core import escape_help

    before = _help("train")
    escape_help(app)
    assert _help("train") == before
