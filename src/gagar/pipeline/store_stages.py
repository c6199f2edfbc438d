"""What each pipeline component does: artifact-store I/O around one call into :mod:`gagar.stages`.

A component body is one call into this module, so the components stay declarations (inputs,
outputs, image) and everything here runs and is tested without KFP. Each function returns the
stage's metrics plus ``perf/<stage>_s``, the seconds the stage function itself took: the rest of a
task's wall time (process start, imports, KFP's executor, store transfers) is orchestration overhead.

KFP parameters cannot be unset, so an empty string or 0 stands for "unset" in the pipeline
parameters; :func:`unset` turns them back into None at this boundary.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

from gagar.pipeline.warm_stages import LazyModule, warm
from gagar.scratch import scratch_root

# Imported on first use: a task that hands its call to the warm stage server never needs them.
stages = LazyModule("gagar.stages")
store = LazyModule("gagar.pipeline.store")
report = LazyModule("gagar.pipeline.report")

__all__ = [
    "RL_STAGES",
    "GatherOutcome",
    "MetricsSink",
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
    "train",
    "unset",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


class MetricsSink(Protocol):
    """What KFP's ``Output[Metrics]`` offers: one scalar per name."""

    def log_metric(self, metric: str, value: float) -> None: ...


def unset(value: T) -> T | None:
    """None for a KFP parameter left at its "unset" value ("" or 0), else the value."""
    return None if value in ("", 0) else value


def log_metrics(sink: MetricsSink, metrics: Mapping[str, float]) -> None:
    """Log every finite metric on a KFP ``Output[Metrics]`` (NaN and inf are not JSON numbers)."""
    for key, value in sorted(metrics.items()):
        if math.isfinite(float(value)):
            sink.log_metric(key, float(value))


def _timed(name: str, call: Callable[[], dict[str, float]]) -> dict[str, float]:
    start = time.perf_counter()
    metrics = dict(call())
    metrics[f"perf/{name}_s"] = time.perf_counter() - start
    return metrics


@warm
def prepare(*, storage: str, model: str, tasks_uri: str, tasks: str) -> store.StepStart:
    """Copy the tasks into ``tasks`` as JSONL (validated) and find the step's start in the store."""
    from gagar.records import write_records
    from gagar.tasks.loaders import load_tasks

    with tempfile.TemporaryDirectory() as tmp:
        local = store.fetch_file(tasks_uri, Path(tmp) / Path(tasks_uri).name)
        write_records(tasks, load_tasks(local))
    start = store.resolve_start(store.normalise_storage(storage), model)
    log.info("step %d samples from %s", start.step, start.policy)
    return start


def is_checkpoint(policy: str, storage: str) -> bool:
    """Whether ``policy`` (prepare's output) is one of the run's published checkpoints."""
    return policy.startswith(f"{storage.rstrip('/')}/{store.CHECKPOINTS}/")


def served_version(*, policy: str, storage: str, step: int, served_model: str) -> str:
    """The policy version the warm server samples step ``step`` under: its base model
    (``served_model``) before any update, then ``policy-step-N`` (N updates done, N = ``step``): the
    adapter of checkpoint ``step-(N-1)``, which the train stage published. The same names the
    in-process trainer uses."""
    from gagar.policy.adapter import adapter_version

    return adapter_version(step) if is_checkpoint(policy, store.normalise_storage(storage)) else served_model


ADAPTER_WAIT_S = 300.0
"""How long the rollout waits for the policy server to be able to load a freshly published adapter."""


@warm
def rollout(
    *,
    policy: str,
    tasks: str,
    trajectories: str,
    step: int,
    gen_batch: int = 0,
    backend: str = "hf",
    endpoint: str = "",
    storage: str = "",
    served_model: str = "policy",
    adapters_dir: str = "",
    agent: str = "single",
    max_turns: int = 8,
    max_trajectory_tokens: int = 2048,
    max_trajectory_seconds: float = 600.0,
    max_live_conversations: int = 0,
    sandbox: str = "local",
    sandbox_workers: int = 0,
    **options: Any,
) -> dict[str, float]:
    """Download the policy and sample generation batch ``gen_batch`` of ``step`` into ``trajectories``
    with ``agent`` (the tool loop bounded by ``max_turns`` and the trajectory budgets, ``0`` seconds:
    none, at most ``max_live_conversations`` advancing together, ``0``: all, its RUN_TESTS in the
    ``sandbox`` backend).

    With ``backend`` ``server`` the warm policy server at ``endpoint`` samples: it is first made to
    serve the step's version (:func:`served_version`; the adapter read from ``adapters_dir``, empty:
    the local store's ``adapters/``) and nothing newer or older, and every trajectory records that
    version, so the train stage refuses samples of any other. ``options`` are
    :func:`gagar.stages.rollout_stage`'s (groups, group_size, seed, temperature, …).
    """
    from gagar.policy.agent import AgentKind, AgentSettings

    settings = AgentSettings(
        kind=AgentKind(agent), max_turns=max_turns, max_tokens=max_trajectory_tokens,
        max_seconds=unset(max_trajectory_seconds), max_live=unset(max_live_conversations),
    )  # fmt: skip
    metrics: dict[str, float] = {}
    model_name = None
    if backend == "server":
        from gagar.policy.vllm_server import PolicyServerClient, serve_only

        if not endpoint or not storage:
            raise ValueError(
                "rollout backend 'server' needs policy_endpoint (the server's /v1 URL) and storage"
            )
        model_name = served_version(policy=policy, storage=storage, step=step, served_model=served_model)
        adapters = (
            Path(adapters_dir) if adapters_dir else Path(store.normalise_storage(storage)) / store.ADAPTERS
        )
        path = None if model_name == served_model else adapters / model_name
        seconds = serve_only(PolicyServerClient(endpoint), model_name, path, wait_s=ADAPTER_WAIT_S)
        metrics["perf/adapter_swap_s"] = seconds
        log.info("policy server %s serves %s (%.2f s)", endpoint, model_name, seconds)
        backend = "openai"
    import gagar.policy.rollout  # noqa: F401 (torch, transformers: start-up, outside the stage's time)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = store.fetch_policy(policy, Path(tmp) / "policy")
        return metrics | _timed(
            "rollout",
            lambda: stages.rollout_stage(
                policy=model_dir,
                tasks=tasks,
                out=trajectories,
                step=step,
                gen_batch=gen_batch,
                backend=backend,
                endpoint=unset(endpoint),
                model_name=model_name,
                progress=False,
                agent=settings,
                sandbox=sandbox,
                sandbox_workers=unset(sandbox_workers),
                **options,
            ),
        )


@warm
def sandbox(*, tasks: str, trajectories: str, results: str, backend: str, workers: int) -> dict[str, float]:
    """Run every trajectory's tests (the fan-out over evaluations happens inside the stage)."""
    return _timed(
        "sandbox",
        lambda: stages.sandbox_stage(
            tasks=tasks,
            trajectories=trajectories,
            out=results,
            backend=backend,
            workers=unset(workers),
            progress=False,
        ),
    )


@warm
def gather(
    *,
    storage: str,
    step: int,
    gen_batch: int,
    trajectories: str,
    results: str,
    rollout_metrics: Mapping[str, float],
    sandbox_metrics: Mapping[str, float],
    train_batch_groups: int,
) -> GatherOutcome:
    """Store generation batch ``gen_batch`` of ``step`` and select over every batch drawn so far.

    Returns whether the train batch is still short of ``train_batch_groups`` mixed groups: the
    pipeline draws batch ``gen_batch + 1`` only then (dynamic sampling's refill).
    """
    storage = store.normalise_storage(storage)
    store.put_generation_batch(
        storage, step, gen_batch, Path(trajectories), Path(results), {**rollout_metrics, **sandbox_metrics}
    )
    with tempfile.TemporaryDirectory() as tmp:
        batches = store.fetch_generation_batches(storage, step, Path(tmp))
        metrics = stages.select_stage(
            trajectories=[b.trajectories for b in batches],
            results=[b.results for b in batches],
            out=Path(tmp) / "selection.jsonl",
            train_batch_groups=train_batch_groups,
        )
    short = metrics["sampling/batch_full"] == 0.0
    log.info(
        "step %d batch %d: %d of %d mixed groups kept%s", step, gen_batch, metrics["sampling/groups_kept"],
        train_batch_groups, ", drawing another batch" if short else "",
    )  # fmt: skip
    return GatherOutcome(short=short)


class GatherOutcome(NamedTuple):
    """What :func:`gather` hands the pipeline."""

    short: bool
    """The batch drawn so far holds fewer than ``train_batch_groups`` mixed groups."""


_SUMMED = ("perf/rollout_s", "perf/sandbox_s", "perf/adapter_swap_s")


@warm
def select(
    *,
    storage: str,
    step: int,
    train_batch_groups: int,
    trajectories: str,
    results: str,
    selection: str,
) -> dict[str, float]:
    """Dynamic sampling over every generation batch of ``step`` in the store (what :func:`gather`
    stored): the consumed batches' trajectories and results into ``trajectories`` and ``results``,
    the step's one selection into ``selection``.

    The metrics are the step's ``sampling/…`` counts, ``rollout/…`` and ``sandbox/…`` over every
    batch consumed (as the in-process step reports them) and each batch's rollout and sandbox seconds
    summed.
    """
    from gagar import rl_step
    from gagar.records import read_records, write_records
    from gagar.schema.result import TestResult
    from gagar.schema.trajectory import Trajectory

    storage = store.normalise_storage(storage)
    with tempfile.TemporaryDirectory() as tmp:
        batches = store.fetch_generation_batches(storage, step, Path(tmp))
        if not batches:
            raise ValueError(f"{storage}: no generation batch of step {step} is stored (did gather run?)")
        metrics = stages.select_stage(
            trajectories=[b.trajectories for b in batches],
            results=[b.results for b in batches],
            out=selection,
            train_batch_groups=train_batch_groups,
        )
        consumed = batches[: int(metrics["sampling/gen_batches"])]
        drawn = [read_records(b.trajectories, Trajectory) for b in consumed]
        outcome = [read_records(b.results, TestResult) for b in consumed]
        timings = [json.loads(b.metrics.read_text(encoding="utf-8")) for b in consumed]
    write_records(trajectories, [t for batch in drawn for t in batch])
    write_records(results, [r for batch in outcome for r in batch])
    metrics |= rl_step.sandbox_metrics([r for batch in outcome for r in batch])
    metrics |= rl_step.rollout_metrics([t for batch in drawn for t in batch])
    metrics |= {
        key: sum(row.get(key, 0.0) for row in timings) for key in _SUMMED if any(key in r for r in timings)
    }
    return metrics


@warm
def grade(
    *,
    algo: str,
    tasks: str,
    trajectories: str,
    results: str,
    selection: str,
    grades: str,
    grader: str,
    grader_model: str,
    endpoint: str,
    max_steps: int = 8,
    position_guard: float = 0.0,
) -> dict[str, float]:
    """Grade the groups the step's ``selection`` (the select stage's) keeps; with an algo other than
    gagar, write no grades.

    A ``position_guard`` of 0 grades each group once.
    """
    if algo != "gagar":
        Path(grades).write_text("", encoding="utf-8")
        return {"grader/skipped": 1.0, "perf/grade_s": 0.0}
    with tempfile.TemporaryDirectory(prefix="gagar-grade-", dir=scratch_root()) as tmp:
        return _timed(
            "grade",
            lambda: stages.grade_stage(
                tasks=tasks,
                trajectories=[trajectories],
                results=[results],
                selection=selection,
                out=grades,
                workspace=Path(tmp) / "workspace",
                grader=grader,
                grader_model=unset(grader_model),
                endpoint=unset(endpoint),
                max_steps=max_steps,
                position_guard=unset(position_guard),
                progress=False,
            ),
        )


@warm
def redistribute(*, selection: str, grades: str, batch: str, credit: str, **options: Any) -> dict[str, float]:
    """Advantages of the grade stage's ``selection`` (``options`` as
    :func:`gagar.stages.redistribute_stage`) into ``batch``; writes the credit table as Markdown to
    ``credit``."""
    metrics = _timed(
        "redistribute",
        lambda: stages.redistribute_stage(selection=selection, grades=grades, out=batch, **options),
    )
    Path(credit).write_text(report.credit_table(batch), encoding="utf-8")
    return metrics


def update(
    *,
    storage: str,
    policy: str,
    model: str,
    trajectories: str,
    batch: str,
    step: int,
    seed: int = 0,
    optim: Any = None,
    lora: Any = None,
    policy_version: str | None = None,
    strategy: str = "ddp",
) -> dict[str, float]:
    """One policy update from the store and back: fetch the step's policy (a checkpoint, whose
    optimizer state continues, or the initial ``model``), ``trajectories`` and ``batch`` (local paths
    or store URIs), update, and publish checkpoint ``step`` (and, with LoRA, adapter
    ``policy-step-{step+1}``) to ``storage``.

    Under torchrun every rank calls this alike; rank 0 alone publishes and writes the update's
    metrics to ``train/step-N/metrics.json`` (what a TrainJob's caller reads back).
    """
    import os

    from gagar.policy.adapter import adapter_version, is_adapter_dir, rebase_adapter

    storage = store.normalise_storage(storage)
    main = int(os.environ.get("RANK", "0")) == 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "checkpoints"
        root.mkdir()
        if is_checkpoint(policy, storage):
            model_dir = store.restore_checkpoint(policy, root) / "model"  # its optimizer state continues
            if is_adapter_dir(model_dir):  # its base lives where the initial model is, on this machine too
                rebase_adapter(model_dir, store.fetch_policy(model, Path(tmp) / "base"))
        else:
            model_dir = store.fetch_policy(policy, Path(tmp) / "policy")
        inputs = [store.fetch_file(ref, Path(tmp) / "inputs" / name) for ref, name in
                  ((trajectories, "trajectories.jsonl"), (batch, "batch.jsonl"))]  # fmt: skip
        metrics = _timed(
            "train",
            lambda: stages.train_stage(
                policy=model_dir, trajectories=[inputs[0]], batch=inputs[1], checkpoints=root, step=step,
                seed=seed, optim=optim, lora=lora, policy_version=policy_version, strategy=strategy,
            ),
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
    storage: str,
    policy: str,
    trajectories: str,
    results: str,
    grades: str,
    batch: str,
    step: int,
    seed: int,
    lr: float,
    epochs: int,
    minibatch_size: int,
    keep_checkpoints: int,
    select_metrics: Mapping[str, float],
    grade_metrics: Mapping[str, float],
    redistribute_metrics: Mapping[str, float],
    summary: str,
    pushgateway: str = "",
    model: str = "",
    lora: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    rollout_backend: str = "hf",
    served_model: str = "policy",
    nodes: int = 1,
    procs_per_node: int = 1,
    strategy: str = "ddp",
    runtime: str = "",
) -> dict[str, float]:
    """Update the policy, publish checkpoint ``step`` to the store, store and push the step's metrics.

    Where the update runs: with ``runtime`` set and Kubeflow Trainer on the cluster, in a TrainJob of
    ``nodes`` × ``procs_per_node`` processes (:mod:`gagar.train.trainjob`); else in this pod, under
    torchrun when ``procs_per_node`` > 1 (a ``runtime`` without Trainer, or ``nodes`` > 1 without a
    runtime, falls back to this one node, with a warning), or in this process. With the warm policy
    server (``rollout_backend`` server) every trajectory must carry the version the server sampled
    the step under. The earlier stages' metrics of this step, merged with the update's, go to
    ``metrics/step-N.json`` in the store, to the Pushgateway when one is given (with each sandbox
    run's and each graded group's seconds from ``results`` and ``grades`` for the histograms), and
    as a Markdown summary to ``summary``.
    """
    from gagar.train.lora import LoraSettings
    from gagar.train.update import OptimConfig

    optim = OptimConfig(lr=lr, epochs=epochs, minibatch_size=minibatch_size)
    settings = LoraSettings(enabled=lora, rank=lora_rank, alpha=lora_alpha)
    upstream = [select_metrics, grade_metrics, redistribute_metrics]
    storage = store.normalise_storage(storage)
    version = (
        served_version(policy=policy, storage=storage, step=step, served_model=served_model)
        if rollout_backend == "server"
        else None
    )
    common = {"storage": storage, "policy": policy, "model": model or policy, "step": step}
    options = {"seed": seed, "lr": lr, "epochs": epochs, "minibatch_size": minibatch_size,
               "lora_rank": lora_rank, "lora_alpha": lora_alpha, "strategy": strategy}  # fmt: skip
    flags = (("--lora",) if lora else ()) + (("--policy-version", version) if version else ())
    if runtime or nodes > 1 or procs_per_node > 1:
        metrics = _distributed_update(
            trajectories,
            batch,
            common,
            options,
            flags,
            runtime=runtime,
            nodes=nodes,
            procs_per_node=procs_per_node,
        )
    else:
        metrics = update(
            **common, trajectories=trajectories, batch=batch, seed=seed, optim=optim, lora=settings,
            policy_version=version, strategy=strategy,
        )  # fmt: skip
    store.prune_checkpoints(storage, keep_checkpoints)
    merged = {**report.merge_metrics([*upstream, metrics]), "step": float(step)}
    store.write_step_metrics(storage, step, merged)
    if pushgateway:
        _push(pushgateway, storage, merged, _observations(results, grades))
    Path(summary).write_text(report.step_summary(step, merged), encoding="utf-8")
    return metrics


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
    trajectories: str,
    batch: str,
    common: Mapping[str, Any],
    options: Mapping[str, Any],
    flags: tuple[str, ...],
    *,
    runtime: str,
    nodes: int,
    procs_per_node: int,
) -> dict[str, float]:
    """Stage the update's inputs in the store and run ``gagar train-update`` on every rank: as a
    Kubeflow Trainer TrainJob when ``runtime`` is set and the Trainer is installed, else under
    torchrun in this pod (one node). Returns rank 0's metrics, read back from the store."""
    import os
    import subprocess
    import sys
    import uuid

    from gagar.train import trainjob

    storage, step = common["storage"], common["step"]
    target, prefix = store.open_store(storage), f"{store.TRAIN}/step-{step:06d}"
    target.put_file(f"{prefix}/trajectories.jsonl", trajectories)
    target.put_file(f"{prefix}/batch.jsonl", batch)
    target.delete(f"{prefix}/metrics.json")
    staged = {
        "trajectories": f"{storage}/{prefix}/trajectories.jsonl",
        "batch": f"{storage}/{prefix}/batch.jsonl",
    }
    args = trainjob.update_args(**common, options={**staged, **options}, flags=flags)
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


def _push(
    url: str, storage: str, metrics: Mapping[str, float], observations: Mapping[str, list[float]]
) -> None:
    from prometheus_client import CollectorRegistry

    from gagar.metrics import build_metrics, push_step, record_step

    collectors = build_metrics(CollectorRegistry())
    record_step(collectors, metrics, observations)
    run = storage.rstrip("/").rpartition("/")[2] or "gagar"
    push_step(url, "gagar-pipeline", collectors.registry, {"run": run})


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

    return _timed("grader_sft", run)


@warm
def evaluate(
    *, tasks: str, trajectories: str, results_out: str, backend: str, workers: int
) -> dict[str, float]:
    """Run every trajectory's tests and summarise the policy's answers (pass@1, parse rate, clean fixes)."""
    from gagar.policy.evaluate import evaluate_trajectories
    from gagar.records import read_records, write_records
    from gagar.sandbox.runner import BackendName, make_backend
    from gagar.schema.task import Task
    from gagar.schema.trajectory import Trajectory

    def run() -> dict[str, float]:
        quality, results = evaluate_trajectories(
            read_records(tasks, Task),
            read_records(trajectories, Trajectory),
            make_backend(BackendName(backend), unset(workers)),
        )
        write_records(results_out, results)
        summary = json.loads(quality.model_dump_json())
        flat = {f"eval/{key}": value for key, value in summary.items() if not isinstance(value, dict)}
        for key, values in summary.items():  # tool_calls_mean: one metric per command
            if isinstance(values, dict):
                flat |= {f"eval/{key}/{name.lower()}": value for name, value in values.items()}
        return {key: float(value) for key, value in flat.items() if value is not None}

    return _timed("evaluate", run)


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
