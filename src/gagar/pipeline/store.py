"""The RL state a pipeline run keeps in the artifact store: checkpoints, step metrics, the tasks file.

Layout under the ``storage`` URI (a local directory or ``s3://bucket/prefix``)::

    checkpoints/step-000003/    one published directory per RL step (``MANIFEST.json`` written last):
        model/                  the policy the next step samples from (Hugging Face format)
        optimizer.pt, rng.json, state.json
        MANIFEST.json           the trainer's own manifest: one format for a checkpoint and the store
    metrics/step-000003.json    every stage's metrics of that step, merged
    adapters/policy-step-4/     the LoRA adapter of checkpoint step-3 (published when lora is on): what
                                the policy server loads as version ``policy-step-4``
    train/step-000003/          a distributed update's inputs and its metrics (TrainJob or torchrun)
    generation/step-000003/batch-1/   one generation batch of the step being drawn (trajectories.jsonl,
                                results.jsonl, metrics.json): written by ``gather``, read by ``select``

Each run resumes from the latest complete checkpoint: its step is the latest step + 1 and it samples
from that checkpoint's ``model/``, or from the initial ``model`` when the store holds none.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gagar.schema.manifest import sha256_file
from gagar.storage import (
    MANIFEST_NAME,
    ArtifactStore,
    ChecksumMismatchError,
    Manifest,
    ObjectNotFoundError,
    open_store,
)
from gagar.storage.base import join_key

__all__ = [
    "ADAPTERS",
    "CHECKPOINTS",
    "GENERATION",
    "METRICS",
    "TRAIN",
    "GenerationBatchFiles",
    "StepStart",
    "checkpoint_key",
    "fetch_file",
    "fetch_generation_batches",
    "fetch_policy",
    "latest_step",
    "normalise_storage",
    "prune_checkpoints",
    "publish_adapter",
    "publish_checkpoint",
    "put_generation_batch",
    "read_step_metrics",
    "resolve_start",
    "restore_checkpoint",
    "split_ref",
    "sync_adapters",
    "write_step_metrics",
]

CHECKPOINTS = "checkpoints"
"""Key prefix of the published checkpoints."""
METRICS = "metrics"
"""Key prefix of the per-step metrics."""
TRAIN = "train"
"""Key prefix of a distributed update's inputs and metrics (``train/step-N/``)."""
ADAPTERS = "adapters"
"""Key prefix of the published LoRA adapters (``adapters/policy-step-N``)."""
GENERATION = "generation"
"""Key prefix of the generation batches of the step being drawn."""
_BATCH_FILES = ("trajectories.jsonl", "results.jsonl", "metrics.json")


@dataclass(frozen=True)
class StepStart:
    """Where an RL step starts: its number and the policy it samples from (a directory reference)."""

    step: int
    policy: str


def checkpoint_key(step: int) -> str:
    """``checkpoints/step-000003``: the same directory name the trainer's checkpoint manager uses."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"{CHECKPOINTS}/step-{step:06d}"


def normalise_storage(storage: str) -> str:
    """``storage`` with a local path made absolute (task processes may run elsewhere); URIs unchanged."""
    if not storage:
        raise ValueError("storage is empty: give a local directory or s3://bucket/prefix")
    return storage if "://" in storage else str(Path(storage).resolve())


def split_ref(ref: str) -> tuple[ArtifactStore, str]:
    """The store holding the directory or file ``ref`` names, and its key there.

    ``s3://bucket/runs/checkpoints/step-000003`` -> (store ``s3://bucket/runs/checkpoints``, ``step-000003``).

    Raises:
        ValueError: ``ref`` names a store root rather than something inside one.
    """
    parent, _, name = ref.rstrip("/").rpartition("/")
    parts = urlsplit(parent)
    if not name or not parent or (parts.scheme and not parts.netloc and parts.scheme != "file"):
        raise ValueError(f"{ref!r} names no file or directory inside a store (e.g. s3://bucket/key)")
    return open_store(parent), name


def latest_step(store: ArtifactStore) -> int | None:
    """Step of the latest complete, verified checkpoint in ``store``; None when there is none."""
    key = store.latest_checkpoint(f"{CHECKPOINTS}/")
    if key is None:
        return None
    manifest = store.read_manifest(key)
    if manifest is None or manifest.step is None:
        raise ValueError(f"{store.uri}/{key}: a checkpoint's manifest must record its step")
    return manifest.step


def resolve_start(storage: str, model: str) -> StepStart:
    """The next step of the run in ``storage`` and the policy it samples from.

    Args:
        storage: the run's store (absolute local path or ``s3://bucket/prefix``).
        model: the initial policy: a local model directory or a store reference to one.
    """
    last = latest_step(open_store(storage))
    if last is None:
        return StepStart(step=0, policy=model)
    return StepStart(step=last + 1, policy=f"{storage.rstrip('/')}/{checkpoint_key(last)}")


def _download(store: ArtifactStore, key: str, manifest: Manifest, sub: str, dest: Path) -> None:
    """Download the files of a published directory under ``sub`` to ``dest``, checking each sha256."""
    for rel, entry in manifest.files.items():
        if not rel.startswith(sub):
            continue
        target = dest / rel[len(sub) :]
        store.get_file(join_key(key, rel), target)
        actual = sha256_file(target)
        if actual != entry.sha256:
            raise ChecksumMismatchError(join_key(key, rel), entry.sha256, actual)


def fetch_policy(ref: str, dest: Path) -> Path:
    """The model directory ``ref`` names, on local disk.

    ``ref`` is a plain local model directory (used where it is), a published checkpoint (its
    ``model/`` is downloaded), a published model directory, or an unpublished prefix of an S3
    store (every object under it is downloaded) into ``dest``.

    Raises:
        FileNotFoundError: nothing is stored under ``ref``.
    """
    local = Path(ref)
    if "://" not in ref and local.is_dir() and not (local / MANIFEST_NAME).exists():
        return local
    store, key = split_ref(ref)
    manifest = store.read_manifest(key)
    if manifest is not None:
        sub = "model/" if any(rel.startswith("model/") for rel in manifest.files) else ""
        _download(store, key, manifest, sub, dest)
        return dest
    keys = store.list(key + "/")
    if not keys:
        raise FileNotFoundError(f"{ref}: no model directory there (no published directory, no objects)")
    for k in keys:
        store.get_file(k, dest / k[len(key) + 1 :])
    return dest


def fetch_file(ref: str, dest: Path) -> Path:
    """Copy the file ``ref`` names (a local path or a store URI) to ``dest``.

    Raises:
        FileNotFoundError: no file is there.
    """
    if "://" not in ref:
        if not Path(ref).is_file():
            raise FileNotFoundError(f"{ref}: no such file")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ref, dest)
        return dest
    store, key = split_ref(ref)
    try:
        store.get_file(key, dest)
    except ObjectNotFoundError:
        raise FileNotFoundError(f"{ref}: no such object") from None
    return dest


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def publish_checkpoint(checkpoint_dir: Path, storage: str, step: int, staging: Path) -> str:
    """Publish the trainer's checkpoint directory as ``checkpoints/step-N`` of ``storage``; returns the key.

    The checkpoint's own ``MANIFEST.json`` (one format with the store's) is checked against its files
    and written last, so a reader never sees a part of the checkpoint. ``staging`` is kept for
    callers that assemble the directory elsewhere first; the directory is published in place.
    """
    assembled = staging / checkpoint_dir.name
    shutil.copytree(checkpoint_dir, assembled, copy_function=_link_or_copy)
    key = checkpoint_key(step)
    open_store(storage).publish_dir(assembled, key, step=step)
    shutil.rmtree(assembled)
    return key


def restore_checkpoint(ref: str, root: Path) -> Path:
    """Download the published checkpoint ``ref`` into the trainer's checkpoint directory ``root``.

    Returns ``root/step-N``, laid out as the trainer wrote it, its manifest included.
    """
    store, key = split_ref(ref)
    target = root / key
    partial = root / f".restore-{key}"
    manifest = store.get_dir(key, partial)
    (partial / MANIFEST_NAME).write_text(manifest.model_dump_json(indent=1), encoding="utf-8")
    partial.rename(target)
    return target


def prune_checkpoints(storage: str, keep: int) -> list[str]:
    """Delete all but the ``keep`` latest published checkpoints of ``storage``; returns the deleted keys."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    store = open_store(storage)
    stale = [key for key, _ in store.checkpoints(f"{CHECKPOINTS}/")][keep:]
    for key in stale:
        store.delete_dir(key)
    return stale


def write_step_metrics(storage: str, step: int, metrics: dict[str, float]) -> str:
    """Store one step's merged metrics as ``metrics/step-N.json``; returns the key."""
    key = f"{METRICS}/step-{step:06d}.json"
    open_store(storage).put_bytes(key, json.dumps({"step": step, **metrics}, sort_keys=True).encode())
    return key


def read_step_metrics(storage: str) -> list[dict[str, float]]:
    """Every stored step's metrics, in step order."""
    store = open_store(storage)
    rows = [json.loads(store.get_bytes(key)) for key in store.list(f"{METRICS}/") if key.endswith(".json")]
    return sorted(rows, key=lambda row: row["step"])


@dataclass(frozen=True)
class GenerationBatchFiles:
    """One generation batch fetched from the store: its files on local disk."""

    trajectories: Path
    results: Path
    metrics: Path
    """The rollout and sandbox tasks' metrics of the batch (a JSON object)."""


def _generation_key(step: int, gen_batch: int) -> str:
    return f"{GENERATION}/step-{step:06d}/batch-{gen_batch}"


def put_generation_batch(
    storage: str, step: int, gen_batch: int, trajectories: Path, results: Path, metrics: dict[str, float]
) -> str:
    """Store generation batch ``gen_batch`` of ``step``; returns its key.

    Batch 0 starts the step's generation afresh: whatever an earlier (failed) attempt or an earlier
    step left under ``generation/`` is deleted first, so the batches stored are exactly the ones this
    attempt drew. The metrics file is written last: a batch counts as stored once it is there.
    """
    target = open_store(storage)
    if gen_batch == 0:
        for key in target.list(f"{GENERATION}/"):
            target.delete(key)
    key = _generation_key(step, gen_batch)
    target.put_file(join_key(key, _BATCH_FILES[0]), trajectories)
    target.put_file(join_key(key, _BATCH_FILES[1]), results)
    target.put_bytes(join_key(key, _BATCH_FILES[2]), json.dumps(metrics, sort_keys=True).encode())
    return key


def fetch_generation_batches(storage: str, step: int, dest: Path) -> list[GenerationBatchFiles]:
    """Every stored generation batch of ``step``, in batch order (0, 1, … while they are there)."""
    source = open_store(storage)
    found: list[GenerationBatchFiles] = []
    while source.exists(join_key(_generation_key(step, len(found)), _BATCH_FILES[2])):
        key, local = _generation_key(step, len(found)), dest / f"batch-{len(found)}"
        for name in _BATCH_FILES:
            source.get_file(join_key(key, name), local / name)
        found.append(GenerationBatchFiles(*(local / name for name in _BATCH_FILES)))
    return found


def publish_adapter(adapter_dir: Path, storage: str, version: str, staging: Path) -> str:
    """Publish the adapter files of ``adapter_dir`` as ``adapters/<version>`` (manifest last); returns
    the key. An adapter already published under that version (a resumed step) is kept."""
    from gagar.policy.adapter import ADAPTER_FILES, adapter_updates

    key = f"{ADAPTERS}/{version}"
    target = open_store(storage)
    if target.read_manifest(key) is not None:
        return key
    staged = staging / version
    staged.mkdir(parents=True)
    for name in ADAPTER_FILES:
        _link_or_copy(str(adapter_dir / name), str(staged / name))
    target.publish_dir(staged, key, step=adapter_updates(version))
    shutil.rmtree(staged)
    return key


def sync_adapters(storage: str, dest: Path, keep: int = 3) -> list[str]:
    """Mirror the store's published adapters into ``dest`` (``dest/policy-step-N``); returns the versions
    it downloaded. What the policy server's sidecar runs, so the server reads adapters from its disk.

    Only complete (manifest-bearing) adapters are copied, each verified in a temporary directory renamed
    into place, so the server never sees a partial one; the newest ``keep`` stay (at least the one being
    swapped out, while the newest loads).
    """
    from gagar.policy.adapter import adapter_updates, prune_adapters

    source = open_store(storage)
    versions = sorted(
        {key.split("/")[1] for key in source.list(f"{ADAPTERS}/") if key.count("/") >= 2},
        key=lambda v: adapter_updates(v) or -1,
    )
    fetched = []
    dest.mkdir(parents=True, exist_ok=True)
    for version in versions[-keep:]:
        if adapter_updates(version) is None or (dest / version).is_dir():
            continue
        key = f"{ADAPTERS}/{version}"
        if source.read_manifest(key) is None:
            continue  # still being published
        source.get_dir(key, dest / version)  # verified, renamed into place complete
        fetched.append(version)
    prune_adapters(dest, keep)
    return fetched
