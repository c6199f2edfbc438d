"""The TrainJob the train stage builds, checked against Kubeflow Trainer's CRD schema (vendored excerpt).

There is no cluster here: the object is built from kubernetes-client models and validated offline;
``test_trainer_is_detected_on_a_cluster`` runs when a kubeconfig is present.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from gagar.train import trainjob
from gagar.train.trainjob import TrainJobSpec, build_trainjob, job_state, update_args, validate_trainjob

SPEC = TrainJobSpec(
    name="gagar-train-3-a1b2c3",
    runtime="gagar-torch",
    args=update_args(
        settings="s3://mlpipeline/gagar/runs/r1/train/step-000003/settings.json",
        policy="s3://mlpipeline/gagar/runs/r1/checkpoints/step-000002",
        step=3,
        trajectories="s3://mlpipeline/gagar/runs/r1/train/step-000003/trajectories.jsonl",
        batch="s3://mlpipeline/gagar/runs/r1/train/step-000003/batch.jsonl",
        policy_version="policy-step-3",
    ),
    nodes=2,
    procs_per_node=4,
    env=(("GAGAR_STORAGE__ENDPOINT", "http://seaweedfs.kubeflow:8333"),),
    secret_env=(("AWS_ACCESS_KEY_ID", "mlpipeline-minio-artifact", "accesskey"),),
    gpus_per_node=4,
)


def test_the_built_trainjob_matches_the_crd_schema() -> None:
    job = build_trainjob(SPEC)
    validate_trainjob(job)
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": "gagar-torch",
    }  # fmt: skip
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)
    assert trainer["command"] == ["torchrun", "-m", "gagar", "train-update"]
    assert trainer["args"][:2] == [
        "--settings",
        "s3://mlpipeline/gagar/runs/r1/train/step-000003/settings.json",
    ]
    assert trainer["args"][-2:] == ["--policy-version", "policy-step-3"]
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "4"}}
    secret = next(e for e in trainer["env"] if e["name"] == "AWS_ACCESS_KEY_ID")
    assert secret["valueFrom"]["secretKeyRef"] == {"name": "mlpipeline-minio-artifact", "key": "accesskey",
                                                   "optional": True}  # fmt: skip
    assert "image" not in trainer  # the runtime's (the chart's train image)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda j: j["spec"]["trainer"].__setitem__("gpus", 4), "spec.trainer: Additional properties"),
        (lambda j: j["spec"]["trainer"].__setitem__("numNodes", "two"), "spec.trainer.numNodes"),
        (lambda j: j["spec"].pop("runtimeRef"), "'runtimeRef' is a required property"),
        (lambda j: j["spec"]["trainer"]["env"].append({"value": "x"}), "'name' is a required property"),
        (lambda j: j["metadata"].__setitem__("name", "Gagar_Train"), "RFC 1035"),
        (lambda j: j["metadata"].__setitem__("name", "g" * 64), "no more than 63"),
        (lambda j: j.__setitem__("kind", "PyTorchJob"), "apiVersion/kind"),
    ],
)
def test_the_schema_refuses_what_the_crd_refuses(change, message: str) -> None:
    job = copy.deepcopy(build_trainjob(SPEC))
    change(job)
    with pytest.raises(ValueError, match=message):
        validate_trainjob(job)


def test_update_args_are_the_train_update_options() -> None:
    """What ``gagar train-update`` takes: settings, policy, inputs and step; the version only when set."""
    from typer.testing import CliRunner

    from gagar.cli import app

    args = update_args(settings="s.json", policy="p", step=2, trajectories="t.jsonl", batch="b.jsonl",
                       policy_version=None)  # fmt: skip
    assert args == ("--settings", "s.json", "--policy", "p", "--step", "2", "--trajectories", "t.jsonl",
                    "--batch", "b.jsonl")  # fmt: skip
    usage = CliRunner().invoke(app, ["train-update", "--help"], env={"COLUMNS": "200"}).output
    for option in ("--settings", "--policy", "--step", "--trajectories", "--batch", "--policy-version"):
        assert option in usage


def test_the_vendored_schema_names_its_source() -> None:
    header = trainjob.SCHEMA.read_text().splitlines()[:4]
    assert any("kubeflow/trainer" in line and "trainjobs.yaml" in line for line in header)
    assert any("9b1edb2f5e6f0d7fb867ee74a1a8e97d2f952b86" in line for line in header)
    readme = (trainjob.SCHEMA.parent / "README.md").read_text()
    assert "9b1edb2f5e6f0d7fb867ee74a1a8e97d2f952b86" in readme
    assert "Apache-2.0" in readme
    schema = yaml.safe_load(trainjob.SCHEMA.read_text())
    assert schema["properties"]["spec"]["required"] == ["runtimeRef"]


def test_job_state_reads_the_terminal_conditions() -> None:
    def condition(kind: str, status: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": "R",
            "message": "",
            "lastTransitionTime": "2026-12-01T00:00:00Z",
        }

    assert job_state({}) is None
    assert job_state({"status": {"conditions": [condition("Suspended", "False")]}}) is None
    assert job_state({"status": {"conditions": [condition("Complete", "True")]}}) == "Complete"
    assert job_state({"status": {"conditions": [condition("Failed", "True")]}}) == "Failed"
    done = {**build_trainjob(SPEC), "status": {"conditions": [condition("Complete", "True")]}}
    validate_trainjob(done)  # a status as the controller writes it is schema-valid too


@pytest.mark.skipif(
    not (os.environ.get("KUBECONFIG") or (Path.home() / ".kube" / "config").is_file()),
    reason="needs a kubeconfig",
)
def test_trainer_is_detected_on_a_cluster() -> None:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_config(client_configuration=configuration)
    assert isinstance(trainjob.trainer_installed(client.ApiClient(configuration), "default"), bool)
