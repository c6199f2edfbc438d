"""The RL state a pipeline run keeps in the artifact store, on a local directory and on s3rver."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch

from fixtures.services import S3RVER_KEY, S3rver
from gagar.pipeline import store
from gagar.storage import MANIFEST_NAME, S3Store
from gagar.train.checkpoint import CheckpointManager, verify


def save_checkpoint(root: Path, step: int) -> Path:
    """A real trainer checkpoint (weights, optimizer, RNG, manifest) of a tiny module."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return CheckpointManager(root, keep_last=None).save(step, model, optimizer).path


@pytest.fixture
def s3_storage(s3rver: S3rver, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://bucket/run`` on a fresh bucket of a running s3rver, reachable through the environment."""
    bucket = f"b-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("GAGAR_STORAGE__ENDPOINT", f"http://{s3rver.endpoint}")
    monkeypatch.setenv("GAGAR_STORAGE__ACCESS_KEY", S3RVER_KEY)
    monkeypatch.setenv("GAGAR_STORAGE__SECRET_KEY", S3RVER_KEY)
    monkeypatch.setenv("GAGAR_STORAGE__REGION", "us-east-1")
    S3Store(
        s3rver.endpoint, bucket, "", access_key=S3RVER_KEY, secret_key=S3RVER_KEY, secure=False
    ).ensure_bucket()
    return f"s3://{bucket}/run"


def run_through_two_steps(storage: str, tmp_path: Path) -> None:
    """Publish checkpoints 0 and 1 the way the train task does, checking where each step starts."""
    initial = tmp_path / "initial-policy"
    initial.mkdir()
    (initial / "config.json").write_text("{}")
    assert store.resolve_start(storage, str(initial)) == store.StepStart(step=0, policy=str(initial))
    assert (
        store.fetch_policy(str(initial), tmp_path / "unused") == initial
    )  # a plain directory is used in place

    for step in (0, 1):
        local = save_checkpoint(tmp_path / f"trainer-{step}", step)
        key = store.publish_checkpoint(local, storage, step, tmp_path / f"staging-{step}")
        assert key == f"checkpoints/step-{step:06d}"
        start = store.resolve_start(storage, str(initial))
        assert start == store.StepStart(step=step + 1, policy=f"{storage}/{key}")

    model_dir = store.fetch_policy(start.policy, tmp_path / "policy")
    assert sorted(p.name for p in model_dir.iterdir()) == ["model.safetensors"]  # only model/, no optimizer

    restored = store.restore_checkpoint(start.policy, tmp_path / "restored")
    assert restored.name == "step-000001"
    verify(CheckpointManager(tmp_path / "restored").latest())  # the trainer accepts it as its own

    assert store.prune_checkpoints(storage, keep=1) == ["checkpoints/step-000000"]
    assert store.latest_step(store.open_store(storage)) == 1

    store.write_step_metrics(storage, 1, {"rollout/resolved_rate": 0.5})
    store.write_step_metrics(storage, 0, {"rollout/resolved_rate": 0.25})
    assert [row["step"] for row in store.read_step_metrics(storage)] == [0, 1]


def test_checkpoints_resume_and_prune_in_a_local_store(tmp_path: Path) -> None:
    storage = str(tmp_path / "store")
    run_through_two_steps(storage, tmp_path)
    published = tmp_path / "store" / "checkpoints" / "step-000001"
    manifest = json.loads((published / MANIFEST_NAME).read_text())
    assert manifest["step"] == 1
    assert MANIFEST_NAME not in manifest["files"]
    assert "optimizer.pt" in manifest["files"]  # the trainer's own manifest, published as is


def test_checkpoints_resume_and_prune_in_an_s3_store(s3_storage: str, tmp_path: Path) -> None:
    run_through_two_steps(s3_storage, tmp_path)


def test_fetch_file_from_a_path_and_from_s3(s3_storage: str, tmp_path: Path) -> None:
    source = tmp_path / "tasks.jsonl"
    source.write_text('{"a": 1}\n')
    assert store.fetch_file(str(source), tmp_path / "copy.jsonl").read_text() == '{"a": 1}\n'
    store.open_store(s3_storage).put_file("inputs/tasks.jsonl", source)
    fetched = store.fetch_file(f"{s3_storage}/inputs/tasks.jsonl", tmp_path / "s3.jsonl")
    assert fetched.read_text() == '{"a": 1}\n'
    with pytest.raises(FileNotFoundError, match="no such object"):
        store.fetch_file(f"{s3_storage}/inputs/missing.jsonl", tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="no such file"):
        store.fetch_file(str(tmp_path / "missing.jsonl"), tmp_path / "x.jsonl")


def test_an_unpublished_s3_prefix_is_fetched_whole(s3_storage: str, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "weights.bin").write_bytes(b"\0" * 10)
    store.open_store(s3_storage).put_dir(model, "models/sft")
    fetched = store.fetch_policy(f"{s3_storage}/models/sft", tmp_path / "fetched")
    assert sorted(p.name for p in fetched.iterdir()) == ["config.json", "weights.bin"]
    with pytest.raises(FileNotFoundError, match="no model directory"):
        store.fetch_policy(f"{s3_storage}/models/none", tmp_path / "none")


@pytest.mark.parametrize("ref", ["s3://bucket", "s3://", "/"])
def test_a_store_root_is_not_a_reference(ref: str) -> None:
    with pytest.raises(ValueError, match="names no file or directory"):
        store.split_ref(ref)


def test_argument_checks() -> None:
    with pytest.raises(ValueError, match="step must be >= 0"):
        store.checkpoint_key(-1)
    with pytest.raises(ValueError, match="storage is empty"):
        store.normalise_storage("")
    with pytest.raises(ValueError, match="keep must be at least 1"):
        store.prune_checkpoints("/tmp/unused-store", keep=0)
    assert store.normalise_storage("s3://b/p") == "s3://b/p"
    assert Path(store.normalise_storage("rel/store")).is_absolute()


def _adapter(root: Path, seed: int) -> Path:
    root.mkdir(parents=True)
    (root / "adapter_config.json").write_text(json.dumps({"r": 8, "seed": seed}))
    (root / "adapter_model.safetensors").write_bytes(bytes([seed]) * 64)
    return root


def test_adapters_published_to_the_store_are_mirrored_beside_the_server(tmp_path: Path) -> None:
    """What the chart's adapter-sync sidecar runs: complete adapters only, the newest kept."""
    from typer.testing import CliRunner

    from gagar.cli.serve import app

    storage, dest = str(tmp_path / "store"), tmp_path / "adapters"
    for n in (1, 2, 3, 4):
        store.publish_adapter(
            _adapter(tmp_path / f"a{n}", n), storage, f"policy-step-{n}", tmp_path / "stage"
        )
    # a half-published adapter (no manifest yet) is not mirrored
    (Path(storage) / "adapters" / "policy-step-5").mkdir()
    (Path(storage) / "adapters" / "policy-step-5" / "adapter_config.json").write_text("{}")
    assert store.sync_adapters(storage, dest, keep=3) == ["policy-step-3", "policy-step-4"]
    assert sorted(p.name for p in dest.iterdir()) == ["policy-step-3", "policy-step-4"]
    assert (dest / "policy-step-4" / "adapter_model.safetensors").read_bytes() == bytes([4]) * 64
    # republishing a version is a no-op; a new one arrives through the CLI, the oldest leaves
    assert store.publish_adapter(tmp_path / "a4", storage, "policy-step-4", tmp_path / "stage") == (
        "adapters/policy-step-4"
    )
    store.publish_adapter(_adapter(tmp_path / "a6", 6), storage, "policy-step-6", tmp_path / "stage")
    result = CliRunner().invoke(app, ["adapter-sync", "--storage", storage, "--dest", str(dest), "--once"])
    assert result.exit_code == 0, result.output
    assert "synced policy-step-6" in result.output
    assert sorted(p.name for p in dest.iterdir()) == ["policy-step-3", "policy-step-4", "policy-step-6"]
