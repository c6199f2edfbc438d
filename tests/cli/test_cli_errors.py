"""Every user error is one line naming what was wrong, with exit code 2; bugs keep their traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gagar.stages
from gagar.cli import app
from gagar.cli.params import typed_params
from gagar.errors import UserError, user_message

POLICY = Path(gagar.__file__).parent / "data" / "embedded-policy"


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Exit code and everything printed, as ``gagar ARGS`` gives them."""
    result = CliRunner().invoke(app, list(args), env=env, prog_name="gagar")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def one_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def tasks_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("")
    return path


def test_a_missing_policy_folder(tasks_file: Path, tmp_path: Path) -> None:
    code, output = run("train", "--tasks", str(tasks_file), "--policy", str(tmp_path / "nope"))
    assert code == 2
    assert one_line(output) == (
        f"gagar train: error: policy directory {tmp_path / 'nope'} does not exist (set by --policy)"
    )


def test_a_missing_tasks_file_named_in_a_config(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"tasks: {tmp_path / 'missing.jsonl'}\npolicy: {POLICY}\nsteps: 1\n")
    code, output = run("train", "--config", str(config))
    assert code == 2
    missing = tmp_path / "missing.jsonl"
    assert (
        one_line(output)
        == f"gagar train: error: tasks file {missing} does not exist (set by tasks: in {config})"
    )


def test_a_missing_tasks_file_from_the_environment(tmp_path: Path) -> None:
    code, output = run(
        "train", "--policy", str(POLICY), env={"GAGAR_TASKS": str(tmp_path / "t.jsonl"), "GAGAR_STEPS": "1"}
    )
    assert code == 2
    assert one_line(output).endswith("does not exist (set by GAGAR_TASKS)")


def test_a_malformed_jsonl_line_in_sandbox_run(tasks_file: Path, tmp_path: Path) -> None:
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text('{"instance_id": "a", "model_patch": ""}\n{"instance_id": "b"\n')
    code, output = run(
        "sandbox", "run", "--tasks", str(tasks_file), "--predictions", str(predictions), "--out", "o.jsonl"
    )
    assert code == 2
    line = one_line(output)
    assert line.startswith(f"gagar sandbox run: error: {predictions}:2: not valid JSON"), line


@pytest.mark.parametrize("command", ["upload", "schedule"])
def test_an_unreachable_kfp_host(command: str, closed_port: int, tmp_path: Path) -> None:
    host = f"http://127.0.0.1:{closed_port}"
    package = tmp_path / "rl.yaml"
    package.write_text("pipelineInfo: {name: gagar-rl}\n")
    args = {
        "upload": ["pipeline", "upload", "--host", host, "--package", str(package), "--version", "v1"],
        "schedule": ["schedule", "--host", host, "--pipeline", "p", "--pipeline-version", "v", "--name", "n",
                     "--cron", "0 0 2 * * *"],
    }[command]  # fmt: skip
    code, output = run(*args)
    assert code == 2
    assert one_line(output).endswith(f"error: cannot reach {host}: Connection refused")


def test_an_unresolvable_kfp_host_names_the_host() -> None:
    code, output = run(
        "pipeline",
        "upload",
        "--host",
        "http://no-such-host.invalid:8888",
        "--package",
        __file__,
        "--version",
        "v",
    )
    assert code == 2
    assert "cannot reach http://no-such-host.invalid:8888:" in one_line(output)


def test_a_param_of_the_wrong_type_names_the_parameter(tmp_path: Path) -> None:
    code, output = run(
        "pipeline",
        "compile",
        "--target",
        "argo",
        "--out",
        str(tmp_path / "wf.yaml"),
        "--param",
        "rollout_group_size=abc",
    )
    assert code == 2
    assert (
        one_line(output)
        == "gagar pipeline compile: error: parameter rollout_group_size: expected a whole number, got 'abc'"
    )
    assert not (tmp_path / "wf.yaml").exists()


def test_a_param_with_a_typo_names_the_close_ones(tmp_path: Path) -> None:
    code, output = run(
        "pipeline",
        "compile",
        "--target",
        "argo",
        "--out",
        str(tmp_path / "wf.yaml"),
        "--param",
        "group_size=8",
    )
    assert code == 2
    assert "unknown pipeline parameter 'group_size'; did you mean rollout_group_size?" in one_line(output)
    assert not (tmp_path / "wf.yaml").exists()


def test_typed_params_converts_each_value_to_its_parameters_type() -> None:
    given = ["rollout_group_size=8", "lora_enabled=true", "optim_lr=1e-5", "tasks=s3://b/t.jsonl"]
    assert typed_params(given) == {
        "rollout_group_size": 8,
        "lora_enabled": True,
        "optim_lr": 1e-5,
        "tasks": "s3://b/t.jsonl",
    }
    for bad, message in (
        ("lora_enabled=yes", "parameter lora_enabled: expected true or false, got 'yes'"),
        ("optim_lr=fast", "parameter optim_lr: expected a number, got 'fast'"),
        ("rollout_group_size", "use name=value"),
        ("lr=1e-5", "unknown pipeline parameter 'lr'"),
    ):
        with pytest.raises(UserError, match=message):
            typed_params([bad])


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--image=nostage=registry/x:1", "unknown stage 'nostage'"),
        ("--image=rollout", "expected STAGE=IMAGE"),
        ("--store-secret-keys=onlyone", "expected ACCESS_KEY_KEY,SECRET_KEY_KEY"),
    ],
)
def test_compile_names_a_bad_image_or_secret_key_flag(flag: str, message: str, tmp_path: Path) -> None:
    code, output = run("pipeline", "compile", "--out", str(tmp_path / "rl.yaml"), flag)
    assert code == 2
    assert message in one_line(output)


def test_a_usage_error_is_one_line_too(tmp_path: Path) -> None:
    code, output = run(
        "policy", "eval", "--policy", str(tmp_path / "nope"), "--tasks", __file__, "--out", "x"
    )
    assert code == 2
    line = one_line(output)
    assert "Invalid value for '--policy'" in line
    assert str(tmp_path / "nope") in line
    assert line.endswith("(see 'gagar policy eval --help')")


def test_gagar_debug_shows_the_traceback(tasks_file: Path, tmp_path: Path) -> None:
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("{\n")
    result = CliRunner().invoke(
        app,
        ["sandbox", "run", "--tasks", str(tasks_file), "--predictions", str(predictions), "--out", "o.jsonl"],
        env={"GAGAR_DEBUG": "1"},
    )
    assert isinstance(result.exception, ValueError)
    assert "not valid JSON" in str(result.exception)


def test_a_bug_keeps_its_traceback(tasks_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**_: object) -> None:
        raise ValueError("a bug outside GAGAR's own raises")  # raised here, not in the gagar package

    monkeypatch.setattr(gagar.stages, "sandbox_stage", broken)
    result = CliRunner().invoke(
        app,
        ["sandbox", "run", "--tasks", str(tasks_file), "--predictions", str(tasks_file), "--out", "o.jsonl"],
    )
    assert isinstance(result.exception, ValueError)
    assert result.exit_code == 1


def test_user_message_tells_user_errors_from_bugs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as missing:
        (tmp_path / "missing").read_text()
    assert user_message(missing.value) == f"{tmp_path / 'missing'}: No such file or directory"
    assert user_message(UserError("tasks: empty")) == "tasks: empty"
    assert user_message(KeyError("x")) is None
    assert user_message(ValueError("raised outside gagar")) is None
