"""What each stage of the pipelines does: one phase of :mod:`gagar.rl_step`, with the artifact store
and the stage's files at its edges.

Every function here reads its inputs, rebuilds the run's :class:`~gagar.train.config.TrainConfig`
from the pipeline's parameters (``settings``, every stage gets them all:
:func:`gagar.pipeline.parameters.config_from_parameters`), calls the phase ``gagar train`` calls in
process, and writes its outputs; none decides anything the phase does not. The KFP components
and the Argo entry point call these with the names of :data:`gagar.pipeline.graph.RL_STEP`, so
the components stay declarations (inputs, outputs, image). Each returns the stage's metrics plus
``perf/<phase>_s``, the seconds the phase itself took: the rest of a task's wall time (process
start, imports, KFP's executor, store transfers) is orchestration overhead.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from gagar.pipeline.warm_stages import LazyModule, warm
from gagar.scratch import scratch_root

# Imported on first use: a task that hands its call to the warm stage server never needs them.
rl_step = LazyModule("gagar.rl_step")
store = LazyModule("gagar.pipeline.store")
report = LazyModule("gagar.pipeline.report")
records = LazyModule("gagar.records")

__all__ = [
    "RL_STAGES",
    "GatherOutcome",
    "MetricsSink",
    "checkpoint_card",
    "evaluate",
    "gather",
    "grade",
    "grader_sft",
    "log_metrics",
    "prepare",
    "redistribute",
    "rollout",
    "sandbox",
    "select",
    "step_config",
    "train",
    "unset",
    "update",
]

log = logging.getLogger(__name__)

Settings = Mapping[str, Any]
"""The pipeline's parameters by name, as a stage receives them (values may arrive as text)."""


class MetricsSink(Protocol):
    """What KFP's ``Output[Metrics]`` offers: one scalar per name."""

    def log_metric(self, metric: str, value: float) -> None: ...


def unset(value: Any) -> Any:
    """None for a parameter left at its "unset" value ("" or 0), else the value."""
    return None if value in ("", 0) else value


def log_metrics(sink: MetricsSink, metrics: Mapping[str, float]) -> None:
    """Log every finite metric on a KFP ``Output[Metrics]`` (NaN and inf are not JSON numbers)."""
    for key, value in sorted(metrics.items()):
        if math.isfinite(float(value)):
            sink.log_metric(key, float(value))


def step_config(settings: Settings) -> Any:
    """The run's :class:`~gagar.train.config.TrainConfig` from the pipeline's parameters; a
    ``GAGAR_<NAME>__`` variable of the task's environment that no settings class reads is refused."""
    from gagar.pipeline.parameters import config_from_parameters
    from gagar.settings_env import check_environment
    from gagar.train.config import TrainConfig

    check_environment(TrainConfig)
    return config_from_parameters(settings, run_dir=scratch_root())


def _storage(settings: Settings) -> str:
    return store.normalise_storage(str(settings["storage"]))


def _reference(settings: Settings, name: str) -> str:
    """The ``tasks`` or ``policy`` parameter as given: a path, or a store URI (``s3://…``) that the
    config's ``Path`` field would fold to ``s3:/…``."""
    return str(settings[name])


def _timed(metrics: dict[str, float], phase: str) -> AbstractContextManager[None]:
    """:func:`gagar.rl_step.timed` under the phase's ``perf/<phase>_s`` key."""
    return rl_step.timed(metrics, f"perf/{phase}_s")


def _run_timed(phase: str, call: Callable[[], dict[str, float]]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    with _timed(metrics, phase):
        returned = call()
    return returned | metrics


def _read(path: str | Path, model: Any) -> list[Any]:
    return records.read_records(path, model)


def _kept_batch(path: str | Path) -> Any:
    from gagar.schema.selection import KeptBatch

    found = _read(path, KeptBatch)
    if len(found) != 1:
        raise ValueError(f"{path}: a selection file holds one record, found {len(found)}")
    return found[0]


@warm
def prepare(*, settings: Settings, tasks: str) -> Any:
    """Validate the run's settings, copy its tasks into ``tasks`` as JSONL (validated) and find the
    step's start in the store (its number, the policy it samples from)."""
    from gagar.tasks.loaders import load_tasks

    config = step_config(settings)
    with tempfile.TemporaryDirectory() as tmp:
        local = store.fetch_file(_reference(settings, "tasks"), Path(tmp) / config.tasks.name)
        records.write_records(tasks, load_tasks(local))
    start = store.resolve_start(_storage(settings), _reference(settings, "policy"))
    log.info("step %d samples from %s", start.step, start.policy)
    return start


def is_checkpoint(policy: str, storage: str) -> bool:
    """Whether ``policy`` (prepare's output) is one of the run's published checkpoints."""
    return policy.startswith(f"{storage.rstrip('/')}/{store.CHECKPOINTS}/")


def _updates_before(policy: str, storage: str, step: int) -> int:
    """Updates done before ``step`` samples: ``step`` when it samples a checkpoint, else 0."""
    return step if is_checkpoint(policy, storage) else 0


ADAPTER_WAIT_S = 300.0
"""How long the rollout waits for the policy server to be able to load a freshly published adapter."""


@warm
def rollout(
    *, settings: Settings, policy: str, tasks: str, trajectories: str, step: int, gen_batch: int
) -> dict[str, float]:
    """Generation batch ``gen_batch`` of ``step`` sampled from ``policy`` into ``trajectories``
    (:func:`gagar.rl_step.rollout`). With the warm policy server (``rollout.backend`` server) the
    server is first made to serve the step's version and nothing else, and every trajectory records it."""
    from gagar.policy.rollout import agent_for, make_backend
    from gagar.sandbox.runner import make_backend as make_sandbox
    from gagar.tasks.loaders import load_tasks
    from gagar.train.config import RolloutBackend

    config = step_config(settings)
    storage, c = _storage(settings), config.rollout
    metrics: dict[str, float] = {}
    backend, version = c.backend.value, policy
    if c.backend is RolloutBackend.SERVER:
        from gagar.policy.vllm_server import serve_step_version

        adapters = unset(settings.get("policy_adapters_dir", "")) or str(Path(storage) / store.ADAPTERS)
        with _timed(metrics, "adapter_swap"):
            version, _ = serve_step_version(
                c.endpoint or "", _updates_before(policy, storage, step), c.served_model, adapters,
                wait_s=ADAPTER_WAIT_S,
            )  # fmt: skip
        log.info("policy server %s serves %s", c.endpoint, version)
        backend = RolloutBackend.OPENAI.value
    needs_sandbox = agent_for(c.agent).needs_sandbox
    sandbox = make_sandbox(config.sandbox.backend, config.sandbox.workers) if needs_sandbox else None
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = store.fetch_policy(policy, Path(tmp) / "policy")
        generator, tokenizer = make_backend(
            str(model_dir),
            backend,
            endpoint=c.endpoint,
            model_name=None if version == policy else version,
            agent=c.agent,
        )
        with _timed(metrics, "rollout"):
            sampled = rl_step.rollout(
                c, generator, tokenizer, load_tasks(tasks), seed=config.seed, step=step, gen_batch=gen_batch,
                policy_version=version, sandbox=sandbox,
            )  # fmt: skip
    records.write_records(trajectories, sampled)
    return metrics | rl_step.rollout_metrics(sampled)


@warm
def sandbox(*, settings: Settings, tasks: str, trajectories: str, results: str) -> dict[str, float]:
    """Every trajectory's tests, one TestResult each (:func:`gagar.rl_step.evaluate`; the fan-out over
    evaluations happens inside the backend)."""
    from gagar.sandbox.base import Prediction
    from gagar.sandbox.runner import make_backend
    from gagar.schema.task import Task

    config = step_config(settings)
    backend = make_backend(config.sandbox.backend, config.sandbox.workers)
    metrics: dict[str, float] = {}
    with _timed(metrics, "sandbox"):
        outcome = rl_step.evaluate(_read(tasks, Task), _read(trajectories, Prediction), backend)
    records.write_records(results, outcome)
    return metrics | rl_step.sandbox_metrics(outcome)


def _stored_batches(storage: str, step: int, tmp: Path) -> list[tuple[Any, dict[str, float]]]:
    """Every generation batch of ``step`` in the store, in memory, with its stored metrics."""
    from gagar.schema.result import TestResult
    from gagar.schema.trajectory import Trajectory

    return [
        (
            rl_step.generation_batch(_read(files.trajectories, Trajectory), _read(files.results, TestResult)),
            json.loads(files.metrics.read_text(encoding="utf-8")),
        )
        for files in store.fetch_generation_batches(storage, step, tmp)
    ]


@warm
def gather(
    *,
    settings: Settings,
    step: int,
    gen_batch: int,
    trajectories: str,
    results: str,
    rollout_metrics: Mapping[str, float],
    sandbox_metrics: Mapping[str, float],
) -> GatherOutcome:
    """Store generation batch ``gen_batch`` of ``step`` and select (:func:`gagar.rl_step.select`) over
    every batch drawn so far.

    Returns whether the pipeline draws batch ``gen_batch + 1`` (dynamic sampling's refill): only while
    the train batch is short of ``rollout.train_batch_groups`` mixed groups and
    ``rollout.max_gen_batches`` allows another.
    """
    config = step_config(settings)
    storage = _storage(settings)
    store.put_generation_batch(
        storage, step, gen_batch, Path(trajectories), Path(results), {**rollout_metrics, **sandbox_metrics}
    )
    with tempfile.TemporaryDirectory() as tmp:
        batches = [batch for batch, _ in _stored_batches(storage, step, Path(tmp))]
    selection = rl_step.select(batches, config.rollout)
    full = selection.metrics["sampling/batch_full"] == 1.0
    more = not full and gen_batch + 1 < config.rollout.max_gen_batches
    log.info(
        "step %d batch %d: %d of %d mixed groups kept%s", step, gen_batch,
        selection.metrics["sampling/groups_kept"], config.rollout.train_batch_groups,
        ", drawing another batch" if more else "",
    )  # fmt: skip
    return GatherOutcome(short=more)


class GatherOutcome(NamedTuple):
    """What :func:`gather` hands the pipeline."""

    short: bool
    """The train batch is still short and another generation batch may be drawn."""


_SUMMED = ("perf/rollout_s", "perf/sandbox_s", "perf/adapter_swap_s")


@warm
def select(
    *, settings: Settings, step: int, trajectories: str, results: str, selection: str
) -> dict[str, float]:
    """Dynamic sampling (:func:`gagar.rl_step.select`) over every generation batch of ``step`` in the
    store (what :func:`gather` stored): the consumed batches' trajectories and results into
    ``trajectories`` and ``results``, the step's one selection into ``selection``.

    The metrics are the step's ``sampling/…`` counts, ``rollout/…`` and ``sandbox/…`` over every
    batch consumed (as the in-process step reports them) and each batch's rollout and sandbox seconds
    summed.
    """
    config = step_config(settings)
    storage = _storage(settings)
    with tempfile.TemporaryDirectory() as tmp:
        stored = _stored_batches(storage, step, Path(tmp))
    if not stored:
        raise ValueError(f"{storage}: no generation batch of step {step} is stored (did gather run?)")
    chosen = rl_step.select([batch for batch, _ in stored], config.rollout)
    records.write_records(selection, [chosen.kept_batch])
    drawn = [t for batch in chosen.batches for t in batch.trajectories]
    outcome = [r for batch in chosen.batches for r in batch.results]
    records.write_records(trajectories, drawn)
    records.write_records(results, outcome)
    timings = [row for _, row in stored[: len(chosen.batches)]]
    rows = [rl_step.rollout_metrics(b.trajectories) for b in chosen.batches]
    summed = {
        key: sum(row.get(key, 0.0) for row in timings) for key in _SUMMED if any(key in t for t in timings)
    }
    metrics = {**chosen.metrics, **rl_step.sandbox_metrics(outcome), **rl_step.merge_rollout_metrics(rows)}
    return metrics | summed


@warm
def grade(
    *, settings: Settings, tasks: str, trajectories: str, results: str, selection: str, grades: str
) -> dict[str, float]:
    """The grade phase (:func:`gagar.rl_step.grade`) over the groups the step's ``selection`` keeps:
    one Grade per group into ``grades`` when the estimator uses a grader, an empty file when not."""
    from gagar.schema.result import TestResult
    from gagar.schema.task import Task
    from gagar.schema.trajectory import Trajectory

    config = step_config(settings)
    chosen = {k.trajectory_id for k in _kept_batch(selection).kept}
    kept = [t for t in _read(trajectories, Trajectory) if t.trajectory_id in chosen]
    metrics: dict[str, float] = {}
    workspace = tempfile.TemporaryDirectory(prefix="gagar-grade-", dir=scratch_root())
    with workspace as tmp, _timed(metrics, "grade"):
        ranked, grade_metrics = rl_step.grade(
            config, rl_step.make_grader(config), _read(tasks, Task), kept, _read(results, TestResult),
            Path(tmp) / "workspace",
        )  # fmt: skip
    records.write_records(grades, ranked or [])
    return metrics | grade_metrics


@warm
def redistribute(
    *, settings: Settings, selection: str, grades: str, batch: str, credit: str
) -> dict[str, float]:
    """The advantages (:func:`gagar.rl_step.advantages`) of the grade stage's ``selection`` into
    ``batch``, with the credit table as Markdown in ``credit``; the selection's ``sampling/…``
    counts come back with the ``advantage/…`` metrics."""
    from gagar.schema.grade import Grade

    config = step_config(settings)
    kept = _kept_batch(selection)
    graded = _read(grades, Grade) if config.advantage.algo.uses_grader else None
    metrics: dict[str, float] = {}
    with _timed(metrics, "redistribute"):
        entries, advantage_metrics = rl_step.advantages(config.advantage, kept, graded)
    records.write_records(batch, entries)
    Path(credit).write_text(report.credit_table(batch), encoding="utf-8")
    return metrics | kept.metrics | advantage_metrics


def update(
    *,
    settings: Settings,
    policy: str,
    trajectories: str,
    batch: str,
    step: int,
    policy_version: str | None = None,
) -> dict[str, float]:
    """The update phase (:func:`gagar.rl_step.update`) from the store and back: fetch the step's
    policy (a checkpoint, whose optimizer state continues, or the initial one), ``trajectories`` and
    ``batch`` (local paths or store URIs), update, and publish checkpoint ``step`` (and, with LoRA,
    adapter ``policy-step-{step+1}``) to the store.

    Under torchrun every rank calls this alike; rank 0 alone publishes and writes the update's
    metrics to ``train/step-N/metrics.json`` (what a TrainJob's caller reads back).
    """
    import os

    from gagar.policy.adapter import adapter_version, is_adapter_dir, rebase_adapter
    from gagar.schema.batch import BatchEntry
    from gagar.schema.trajectory import Trajectory

    config = step_config(settings)
    storage = _storage(settings)
    main = int(os.environ.get("RANK", "0")) == 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "checkpoints"
        root.mkdir()
        initial = _reference(settings, "policy")
        reference = store.fetch_policy(initial, Path(tmp) / "base") if config.optim.loss.kl_coef > 0 else None
        if is_checkpoint(policy, storage):
            model_dir = store.restore_checkpoint(policy, root) / "model"  # its optimizer state continues
            if is_adapter_dir(model_dir):  # its base lives where the initial policy is, on this machine too
                rebase_adapter(model_dir, reference or store.fetch_policy(initial, Path(tmp) / "base"))
        else:
            model_dir = store.fetch_policy(policy, Path(tmp) / "policy")
        inputs = [store.fetch_file(ref, Path(tmp) / "inputs" / name) for ref, name in
                  ((trajectories, "trajectories.jsonl"), (batch, "batch.jsonl"))]  # fmt: skip
        metrics: dict[str, float] = {}
        with _timed(metrics, "train"):
            metrics |= rl_step.update(
                config, policy=model_dir, trajectories=_read(inputs[0], Trajectory),
                batch=_read(inputs[1], BatchEntry), checkpoints=root, step=step,
                policy_version=policy_version, reference=reference,
            )  # fmt: skip
        if main:
            checkpoint = root / f"step-{step:06d}"
            store.publish_checkpoint(checkpoint, storage, step, Path(tmp) / "staging")
            if is_adapter_dir(checkpoint / "model"):
                store.publish_adapter(
                    checkpoint / "model", storage, adapter_version(step + 1), Path(tmp) / "a"
                )
            key = f"{store.TRAIN}/step-{step:06d}/metrics.json"
            store.open_store(storage).put_bytes(key, json.dumps(metrics, sort_keys=True).encode())
    return metrics


@warm
def train(
    *,
    settings: Settings,
    policy: str,
    trajectories: str,
    results: str,
    grades: str,
    batch: str,
    step: int,
    select_metrics: Mapping[str, float],
    ends_run: bool = False,
    model: str | None = None,
    grade_metrics: Mapping[str, float],
    redistribute_metrics: Mapping[str, float],
    summary: str,
) -> dict[str, float]:
    """Update the policy, publish checkpoint ``step`` to the store, store and push the step's metrics.

    Where the update runs (``distributed``): with ``runtime`` set and Kubeflow Trainer on the
    cluster, in a TrainJob of ``nodes`` × ``procs_per_node`` processes (:mod:`gagar.train.trainjob`);
    else in this pod, under torchrun when ``procs_per_node`` > 1 (a ``runtime`` without Trainer, or
    ``nodes`` > 1 without a runtime, falls back to this one node, with a warning), or in this
    process. With the warm policy server every trajectory must carry the version the server sampled
    the step under. The earlier stages' metrics of this step, merged with the update's, go to
    ``metrics/step-N.json`` in the store, to the Pushgateway when one is set (with each sandbox run's
    and each graded group's seconds from ``results`` and ``grades`` for the histograms), and as a
    Markdown summary to ``summary``; ``model`` gets a card of the published checkpoint. The run's last
    step (``ends_run``) marks the run finished on the Pushgateway; a run that fails before it stays
    active, and its stall alert fires.
    """
    from gagar.policy.adapter import adapter_version
    from gagar.train.config import RolloutBackend

    config = step_config(settings)
    storage = _storage(settings)
    version = None
    if config.rollout.backend is RolloutBackend.SERVER:
        updates = _updates_before(policy, storage, step)
        version = adapter_version(updates) if updates > 0 else config.rollout.served_model
    d = config.distributed
    if d.runtime is not None or d.nodes > 1 or d.procs_per_node > 1:
        metrics = _distributed_update(settings, policy, trajectories, batch, step, version)
    else:
        metrics = update(
            settings=settings, policy=policy, trajectories=trajectories, batch=batch, step=step,
            policy_version=version,
        )  # fmt: skip
    store.prune_checkpoints(storage, config.keep_checkpoints)
    upstream = [select_metrics, grade_metrics, redistribute_metrics]
    merged = {**report.merge_metrics([*upstream, metrics]), "step": float(step)}
    store.write_step_metrics(storage, step, merged)
    url, job = config.metrics.pushgateway, config.metrics.job
    if url:
        from gagar.metrics import finish_run, publish_step

        run = storage.rstrip("/").rpartition("/")[2] or "gagar"
        earlier = store.read_step_metrics(storage)
        publish_step(url, job, run, merged, earlier, _observations(results, grades))
        if ends_run:  # no stall alert until the next scheduled run starts
            finish_run(url, job, {"run": run}, succeeded=True)
    Path(summary).write_text(report.step_summary(step, merged), encoding="utf-8")
    if model is not None:  # a card of the published checkpoint: the run page's Model artifact
        card = {
            "checkpoint": f"{storage}/{store.checkpoint_key(step)}",
            "step": step,
            "policy_version": version,
        }
        Path(model).write_text(json.dumps(card, sort_keys=True), encoding="utf-8")
    return metrics


def checkpoint_card(path: str) -> dict[str, Any]:
    """The Model artifact's metadata: what :func:`train` wrote at ``path`` (the checkpoint's store URI,
    its step and policy version)."""
    card = json.loads(Path(path).read_text(encoding="utf-8"))
    return {key: value for key, value in card.items() if value is not None}


def _kube_api() -> Any:
    """An API client from the pod's service account (or KUBECONFIG); None when there is no cluster."""
    try:
        from kubernetes import client
        from kubernetes import config as kube_config

        configuration = client.Configuration()
        kube_config.load_config(client_configuration=configuration)
    except Exception:  # no kubeconfig and not in a pod: no cluster to ask
        return None
    return client.ApiClient(configuration)


def _namespace() -> str:
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    return path.read_text(encoding="utf-8").strip() if path.is_file() else "default"


def _distributed_update(
    settings: Settings, policy: str, trajectories: str, batch: str, step: int, policy_version: str | None
) -> dict[str, float]:
    """Stage the update's inputs and settings in the store and run ``gagar train-update`` on every
    rank: as a Kubeflow Trainer TrainJob when ``distributed.runtime`` is set and the Trainer is
    installed, else under torchrun in this pod (one node). Returns rank 0's metrics, read back from
    the store."""
    import os
    import subprocess
    import sys
    import uuid

    from gagar.train import trainjob

    d = step_config(settings).distributed
    runtime, nodes, procs_per_node = d.runtime or "", d.nodes, d.procs_per_node
    storage = _storage(settings)
    target, prefix = store.open_store(storage), f"{store.TRAIN}/step-{step:06d}"
    target.put_file(f"{prefix}/trajectories.jsonl", trajectories)
    target.put_file(f"{prefix}/batch.jsonl", batch)
    target.put_bytes(f"{prefix}/settings.json", json.dumps(dict(settings), sort_keys=True).encode())
    target.delete(f"{prefix}/metrics.json")
    args = trainjob.update_args(
        settings=f"{storage}/{prefix}/settings.json", policy=policy, step=step,
        trajectories=f"{storage}/{prefix}/trajectories.jsonl", batch=f"{storage}/{prefix}/batch.jsonl",
        policy_version=policy_version,
    )  # fmt: skip
    api = _kube_api() if runtime else None
    if runtime and api is not None and trainjob.trainer_installed(api, _namespace()):
        env = tuple(
            (k, os.environ[k])
            for k in ("GAGAR_STORAGE__ENDPOINT", "GAGAR_STORAGE__REGION")
            if k in os.environ
        )
        spec = trainjob.TrainJobSpec(
            name=f"gagar-train-{step}-{uuid.uuid4().hex[:6]}", runtime=runtime, args=args, nodes=nodes,
            procs_per_node=procs_per_node, env=env,
        )  # fmt: skip
        trainjob.run_trainjob(trainjob.build_trainjob(spec), _namespace(), api, log=log.info)
    else:
        if runtime or nodes > 1:
            log.warning(
                "no Kubeflow Trainer (TrainJob CRD) on this cluster%s: updating on this pod's node only, "
                "%d process(es)", f" for runtime {runtime!r}" if runtime else "", procs_per_node,
            )  # fmt: skip
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={procs_per_node}", "-m", "gagar", "train-update", *args]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"torchrun update failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(target.get_bytes(f"{prefix}/metrics.json"))


def _observations(results: str, grades: str) -> dict[str, list[float]]:
    from gagar.metrics import step_observations
    from gagar.records import read_records
    from gagar.schema.grade import Grade
    from gagar.schema.result import TestResult

    graded = [g.duration_s for g in read_records(grades, Grade)]
    return step_observations(read_records(results, TestResult), graded)


@warm
def grader_sft(
    *,
    tasks: str,
    trajectories: str,
    results: str,
    out: str,
    eval_tasks: str,
    groups_per_task: int,
    epochs: int,
    seed: int,
) -> dict[str, float]:
    """Train the learned grader on noise groups and the rollout's passing groups; evaluate it on
    held-out tasks' noise groups (Kendall tau, top-1 accuracy)."""
    from gagar.grader.learned import ScorerConfig
    from gagar.grader.sft import evaluate as evaluate_grader
    from gagar.grader.sft import load_labelled_groups, train_grader

    def run() -> dict[str, float]:
        groups = load_labelled_groups(
            Path(tasks), Path(trajectories), Path(results), None, groups_per_task, seed
        )
        learned = train_grader(groups, Path(out), ScorerConfig(epochs=epochs, seed=seed), progress=False)
        held_out = load_labelled_groups(Path(eval_tasks), groups_per_task=groups_per_task, seed=seed + 1)
        report = evaluate_grader(learned, held_out, reverse_check=False)  # a deterministic scorer
        return {
            "grader_sft/train_groups": float(len(groups)),
            "grader_sft/eval_groups": float(report.groups),
            "grader_sft/kendall_tau": report.kendall_tau,
            "grader_sft/top1_accuracy": report.top1_accuracy,
        }

    return _run_timed("grader_sft", run)


@warm
def evaluate(*, settings: Settings, tasks: str, trajectories: str, results_out: str) -> dict[str, float]:
    """Run every trajectory's tests and summarise the policy's answers (pass@1, parse rate, clean fixes)."""
    from gagar.policy.evaluate import evaluate_trajectories
    from gagar.sandbox.runner import make_backend
    from gagar.schema.task import Task
    from gagar.schema.trajectory import Trajectory

    config = step_config(settings)

    def run() -> dict[str, float]:
        quality, results = evaluate_trajectories(
            _read(tasks, Task),
            _read(trajectories, Trajectory),
            make_backend(config.sandbox.backend, config.sandbox.workers),
        )
        records.write_records(results_out, results)
        summary = json.loads(quality.model_dump_json())
        flat = {f"eval/{key}": value for key, value in summary.items() if not isinstance(value, dict)}
        for key, values in summary.items():  # tool_calls_mean: one metric per command
            if isinstance(values, dict):
                flat |= {f"eval/{key}/{name.lower()}": value for name, value in values.items()}
        return {key: float(value) for key, value in flat.items() if value is not None}

    return _run_timed("evaluate", run)


RL_STAGES: dict[str, Callable[..., Any]] = {
    "prepare": prepare,
    "rollout": rollout,
    "sandbox": sandbox,
    "gather": gather,
    "select": select,
    "grade": grade,
    "redistribute": redistribute,
    "train": train,
}
"""The function of each stage of :data:`gagar.pipeline.graph.RL_STEP`, called with the graph's names:
its parameters, its inputs (artifact paths; an earlier stage's metrics as a dict) and its output
artifacts (paths) but ``metrics``, which it returns. The KFP components and the Argo entry point
both call these."""
