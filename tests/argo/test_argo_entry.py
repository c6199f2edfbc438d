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
from gagar.pipeline.argo import build_workflow, format_value
from gagar.pipeline.argo_entry import main, parse_arguments, setting_argument
from gagar.pipeline.graph import stage
from gagar.pipeline.parameters import PARAMETERS, convert
from gagar.storage import S3Store


def _settings(**changed: str) -> list[str]:
    """Every pipeline parameter as a ``setting-<name>=value`` argument: its default, or ``changed``'s."""
    values = {p.name: "" if p.default is None else format_value(p.default) for p in PARAMETERS}
    return [f"{setting_argument(name)}={value}" for name, value in (values | changed).items()]


def test_arguments_are_typed_by_their_source_output_and_settings_gathered() -> None:
    parsed = parse_arguments(stage("gather"), [*_settings(rollout_group_size="4"), "step=3", "gen_batch=1"])
    assert parsed.keys() == {"settings", "step", "gen_batch"}
    assert parsed["step"] == 3
    assert parsed["gen_batch"] == 1
    assert parsed["settings"].keys() == {p.name for p in PARAMETERS}
    assert parsed["settings"]["rollout_group_size"] == "4"  # text: the stage reads the settings
    assert parse_arguments(stage("sandbox"), _settings())["settings"]["advantage_norm_std"] == "true"
    assert convert("advantage_norm_std", "True") is True
    assert convert("optim_lr", "2e-05") == 2e-5


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (_settings()[1:], "missing arguments setting-policy"),
        ([*_settings(), "setting-rollout_group_siz=4"], "unknown pipeline parameter 'rollout_group_siz'"),
        ([*_settings(), "setting-rollout_group_size=4"], "given twice"),
        ([*_settings(), "speed=9"], "takes no argument 'speed'"),
        ([*_settings(), "tasks=/x"], "'tasks' is an input artifact"),
        ([*_settings(), "backend"], "not name=value"),
    ],
)
def test_bad_arguments_are_refused(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_arguments(stage("sandbox"), items)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["gen_batch=0"], "missing arguments step"),
        (["step=many", "gen_batch=0"], "argument step: invalid literal"),
        (["step=0", "gen_batch=0", "step=1"], "given twice"),
    ],
)
def test_bad_value_arguments_are_refused(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_arguments(stage("gather"), [*_settings(), *items])


def test_main_refuses_before_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "--io-root", str(tmp_path), *_settings()]) == 2
    assert "input artifacts missing" in capsys.readouterr().err
    assert main(["nope"]) == 2
    assert "unknown stage 'nope'" in capsys.readouterr().err
    assert main([]) == 2
    assert not (tmp_path / "outputs").exists()


def test_norm_std_default_reads_back_as_a_bool() -> None:
    parameters = {p["name"]: p.get("value") for p in build_workflow()["spec"]["arguments"]["parameters"]}
    assert convert("advantage_norm_std", parameters["advantage_norm_std"]) is True
    assert convert("optim_lr", parameters["optim_lr"]) == 2e-5


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
            "policy": str(policy),
            "tasks": f"s3://{s3_bucket}/inputs/tasks.jsonl",
            "storage": storage,
            "rollout_group_size": "2",
            "rollout_train_batch_groups": "2",
            "rollout_gen_batch_groups": "2",
            "rollout_max_gen_batches": "2",
            "rollout_max_new_tokens": "16",
            "optim_minibatch_size": "4",
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
    command = [
        "python", "-m", "gagar.pipeline.argo_entry", "grade", "--io-root", str(tmp_path),
        f"{setting_argument('advantage_algo')}=grpo",
    ]  # fmt: skip
    code, stderr = run_subprocess(command, dict(os.environ))
    assert code == 2
    missing = stderr.partition("missing arguments ")[2].strip().split(", ")
    assert missing == sorted(setting_argument(p.name) for p in PARAMETERS if p.name != "advantage_algo")
