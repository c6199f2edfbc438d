"""The Argo stages' entry point: argument checks, and the compiled Workflow run task by task on S3."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from fixtures.argo_local import run_in_process, run_subprocess, run_workflow
from fixtures.services import S3RVER_KEY, S3rver
from gagar.pipeline import store
from gagar.pipeline.argo import build_workflow
from gagar.pipeline.argo_entry import convert, main, parse_arguments
from gagar.pipeline.graph import stage
from gagar.storage import S3Store


def test_arguments_are_typed_by_their_pipeline_parameter_or_source_output() -> None:
    items = ["backend=local", "workers=3"]
    assert parse_arguments(stage("sandbox"), items) == {"backend": "local", "workers": 3}
    redistribute = parse_arguments(
        stage("redistribute"),
        ["algo=gagar", "decay=linear", "gamma=0.5", "floor=0.1", "norm_std=false"],
    )
    assert redistribute["norm_std"] is False
    assert redistribute["gamma"] == 0.5
    assert convert("True", bool) is True
    assert convert("2e-05", float) == 2e-5


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["backend=local"], "missing arguments workers"),
        (["backend=local", "workers=many"], "argument workers: invalid literal"),
        (["backend=local", "workers=1", "workers=2"], "given twice"),
        (["backend=local", "workers=1", "speed=9"], "takes no argument 'speed'"),
        (["backend=local", "workers=1", "tasks=/x"], "'tasks' is an input artifact"),
        (["backend"], "not name=value"),
    ],
)
def test_bad_arguments_are_refused(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_arguments(stage("sandbox"), items)


def test_main_refuses_before_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "--io-root", str(tmp_path), "backend=local", "workers=1"]) == 2
    assert "input artifacts missing" in capsys.readouterr().err
    assert main(["nope"]) == 2
    assert "unknown stage 'nope'" in capsys.readouterr().err
    assert main([]) == 2
    assert not (tmp_path / "outputs").exists()


def test_norm_std_default_reads_back_as_a_bool() -> None:
    parameters = {p["name"]: p.get("value") for p in build_workflow()["spec"]["arguments"]["parameters"]}
    assert convert(parameters["norm_std"], bool) is True
    assert convert(parameters["lr"], float) == 2e-5


def s3_store(s3rver: S3rver, bucket: str, prefix: str = "") -> S3Store:
    """The bucket of the running s3rver, with its fixed keys."""
    return S3Store(
        s3rver.endpoint, bucket, prefix, access_key=S3RVER_KEY, secret_key=S3RVER_KEY, secure=False
    )


@pytest.fixture
def s3_bucket(s3rver: S3rver) -> str:
    bucket = f"b-{uuid.uuid4().hex[:10]}"
    s3_store(s3rver, bucket).ensure_bucket()
    return bucket


@pytest.mark.slow
def test_compiled_workflow_runs_an_rl_step_against_s3(
    tiny_inputs: tuple[Path, Path],
    s3rver: S3rver,
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    """Every task runs its container command (``python -m gagar.pipeline.argo_entry``'s ``main``,
    in process to spare a torch import per task), the store on s3rver, the credentials and
    endpoint coming from the Secret and ConfigMap the templates reference. The untrained policy
    solves nothing, so no group is mixed and each batch's gather asks for a refill: the step draws
    all its ``max_gen_batches`` batches."""
    policy, tasks = tiny_inputs
    s3_store(s3rver, s3_bucket).put_file("inputs/tasks.jsonl", tasks)
    storage = f"s3://{s3_bucket}/run"
    runs = run_workflow(
        build_workflow(1, max_gen_batches=2),
        {
            "model": str(policy),
            "tasks": f"s3://{s3_bucket}/inputs/tasks.jsonl",
            "storage": storage,
            "group_size": "2",
            "train_batch_groups": "2",
            "gen_batch_groups": "2",
            "max_new_tokens": "16",
            "minibatch_size": "4",
            "sandbox_backend": "local",
            "sandbox_workers": "2",
        },
        tmp_path / "pods",
        execute=run_in_process,
        secrets={"mlpipeline-minio-artifact": {"accesskey": S3RVER_KEY, "secretkey": S3RVER_KEY}},
        config_maps={
            "gagar-settings": {
                "GAGAR_STORAGE__ENDPOINT": f"http://{s3rver.endpoint}",
                "GAGAR_STORAGE__REGION": "us-east-1",
            }
        },
    )
    assert runs["prepare-0"].parameters == {"step": "0", "policy": str(policy)}
    assert len(runs["rollout-0-0"].artifacts["trajectories"].read_text().splitlines()) == 4
    sandbox = json.loads(runs["sandbox-0-0"].artifacts["metrics"].read_text())
    assert sandbox["sandbox/evaluations"] == 4.0
    assert runs["gather-0-0"].parameters == {"short": "true"}
    assert runs["rollout-0-1"].phase == "Succeeded"  # the refill
    assert len(runs["select-0"].artifacts["trajectories"].read_text().splitlines()) == 8
    assert "## RL step 0" in runs["train-0"].artifacts["summary"].read_text()
    assert "Credit redistribution" in runs["redistribute-0"].artifacts["credit"].read_text()

    run = s3_store(s3rver, s3_bucket, "run")
    assert store.latest_step(run) == 0
    step = json.loads(run.get_bytes("metrics/step-000000.json"))
    assert step["rollout/trajectories"] == 8.0
    assert step["sandbox/evaluations"] == 8.0
    assert step["sampling/gen_batches"] == 2.0


def test_entry_point_runs_as_a_module(tmp_path: Path) -> None:
    command = ["python", "-m", "gagar.pipeline.argo_entry", "grade", "--io-root", str(tmp_path), "algo=grpo"]
    code, stderr = run_subprocess(command, dict(os.environ))
    assert code == 2
    missing = "endpoint, grader, grader_model, max_steps, position_guard"
    assert f"missing arguments {missing}" in stderr
