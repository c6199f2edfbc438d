"""Upload and schedule through the KFP client: argument checks, the request, and a real server (KFP_HOST)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gagar.pipeline.client import Schedule, connect, create_schedule, parse_params, upload, validate_cron


@pytest.mark.parametrize("cron", ["0 0 2 * * *", "*/30 * * * * ?", "0 0 0 1-7 * MON", "0  15   10 * * *"])
def test_six_field_crons_are_accepted(cron: str) -> None:
    assert validate_cron(cron) == " ".join(cron.split())


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("0 2 * * *", "has 5 fields"),
        ("", "has 0 fields"),
        ("0 0 2 * * * 2030 x", "has 8 fields"),
        ("0 0 2 * * $", "'\\$'"),
    ],
)
def test_other_crons_are_refused(cron: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_cron(cron)


def test_params_parse_and_refuse_malformed_items() -> None:
    given = ["rollout_group_size=8", "tasks=s3://b/t.jsonl", "rollout_endpoint=", "lora_enabled=true"]
    assert parse_params(given) == {  # typed by their parameter
        "rollout_group_size": 8,
        "tasks": "s3://b/t.jsonl",
        "rollout_endpoint": "",
        "lora_enabled": True,
    }
    with pytest.raises(ValueError, match="use name=value"):
        parse_params(["rollout_group_size"])
    with pytest.raises(ValueError, match="given twice"):
        parse_params(["seed=1", "seed=2"])
    with pytest.raises(
        ValueError, match="unknown pipeline parameter 'group_size'; did you mean rollout_group_size"
    ):
        parse_params(["group_size=8"])
    with pytest.raises(ValueError, match="parameter rollout_group_size: expected a whole number"):
        parse_params(["rollout_group_size=many"])


def test_schedule_builds_the_recurring_run_request() -> None:
    schedule = Schedule(
        pipeline="gagar-rl",
        version="0.1.0-r1",
        experiment="gagar",
        name="nightly",
        cron="0 0 2 * * *",
        max_concurrency=1,
        catchup=False,
        service_account="gagar-runner",
        params={"group_size": "8"},
    )
    assert schedule.request("exp", "pipe", "ver") == {
        "experiment_id": "exp",
        "job_name": "nightly",
        "cron_expression": "0 0 2 * * *",
        "max_concurrency": 1,
        "no_catchup": True,
        "params": {"group_size": "8"},
        "pipeline_id": "pipe",
        "version_id": "ver",
        "enabled": True,
        "service_account": "gagar-runner",
    }
    with pytest.raises(ValueError, match="max_concurrency must be at least 1"):
        Schedule("p", "v", "e", "n", "0 0 2 * * *", max_concurrency=0)
    with pytest.raises(ValueError, match="needs a version"):
        Schedule("p", " ", "e", "n", "0 0 2 * * *")


def test_schedule_cli_refuses_a_five_field_cron_before_connecting() -> None:
    from gagar.cli import app

    result = CliRunner().invoke(
        app,
        [
            "schedule",
            "--host",
            "http://127.0.0.1:9",
            "--pipeline",
            "p",
            "--pipeline-version",
            "v",
            "--name",
            "n",
            "--cron",
            "0 2 * * *",
            "--no-catchup",
            "--param",
            "rollout_group_size=8",
        ],
        prog_name="gagar",
    )
    assert result.exit_code == 2  # a one-line user error, not a connection attempt to the dead host
    assert "KFP needs 6" in result.output
    assert "cannot reach" not in result.output


def test_connect_reads_the_service_account_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(tmp_path / "missing-token"))
    with pytest.raises(ValueError, match="cannot read the token"):
        connect("http://127.0.0.1:9")


@pytest.mark.cluster
@pytest.mark.skipif(not os.environ.get("KFP_HOST"), reason="needs a KFP API server (set KFP_HOST)")
def test_upload_and_schedule_on_a_real_server(tmp_path: Path) -> None:
    from gagar.pipeline.build import compile_pipeline

    client = connect(os.environ["KFP_HOST"])
    package = compile_pipeline("rl", tmp_path / "rl.yaml")
    name = f"gagar-test-{uuid.uuid4().hex[:8]}"
    pipeline_id, version_id = upload(client, package, name, "v1")
    run_id = create_schedule(
        client,
        Schedule(name, "v1", "gagar-test", f"{name}-nightly", "0 0 2 * * *", params={"storage": "s3://x/y"}),
    )
    try:
        job = client.get_recurring_run(run_id)
        assert job.trigger.cron_schedule.cron == "0 0 2 * * *"
        assert job.no_catchup is True
    finally:
        client.delete_recurring_run(run_id)
        client.delete_pipeline_version(pipeline_id, version_id)
