"""The in-process RL loop: runs :func:`gagar.rl_step.run_step` each step, checkpoints and logs around it.

One step, top to bottom (the same stages the Kubeflow pipeline runs as components; the trainer keeps
each step's files under ``steps/step-N``):

1. rollout + sandbox, one generation batch at a time, until dynamic sampling has
   ``train_batch_groups`` mixed groups or ``max_gen_batches`` ran out (with ``rollout.backend:
   server`` the warm policy server is first swapped to the step's adapter version);
2. grade the kept groups (GAGAR only);
3. redistribute: GRPO advantages, then GAGAR's rank-weighted rescaling;
4. train: PPO-clip update, checkpoint ``step-N`` written atomically; with ``lora.enabled`` the
   update trains an adapter, published as version ``policy-step-{N+1}`` under ``adapters/``;
5. log: one line in ``metrics.jsonl``, a Pushgateway push, the plot.

A killed run resumes from the last complete checkpoint with ``resume=True``: the metrics log is
trimmed to that step and the interrupted step is redone from its start. A step's checkpoint is
written before its metrics line (the update's metrics come out of the stage that writes it), so a
kill between the two leaves a checkpointed step without a line: its line is rebuilt on resume from
``pending-step.json`` (the step's metrics before the update, written just before it) and the update
metrics stored in the checkpoint; only its ``perf/train_s`` and ``perf/step_s`` are lost.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gagar import rl_step
from gagar.policy.adapter import adapter_version, prune_adapters, publish_adapter
from gagar.records import atomic_write_text, write_records
from gagar.sandbox.runner import BackendName
from gagar.schema.selection import GeneratedBatch
from gagar.scratch import scratch_root
from gagar.train.checkpoint import Checkpoint, CheckpointManager, MetricsLog, read_extra_state
from gagar.train.config import RolloutBackend, TrainConfig

__all__ = ["PENDING_STEP", "Trainer", "train"]

log = logging.getLogger(__name__)

PENDING_STEP = "pending-step.json"
"""Under the run directory: the metrics of the step being updated, before its update ran."""


class Trainer:
    """Runs the steps of one training run under ``config.run_dir``."""

    def __init__(self, config: TrainConfig, *, progress: bool = True) -> None:
        d = config.distributed
        if d.nodes > 1 or d.procs_per_node > 1 or d.runtime is not None:
            raise ValueError(
                "distributed: gagar train updates in its own process; several processes or nodes update "
                "through the pipeline's train stage (gagar run, Kubeflow, Argo)"
            )
        self.config = config
        self.progress = progress
        self.run_dir = Path(config.run_dir)
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", keep_last=config.keep_checkpoints)
        self.metrics_log = MetricsLog(self.run_dir / "metrics.jsonl")
        self._observations: dict[int, dict[str, list[float]]] = {}
        """Histogram samples of each step not yet published (per sandbox run, per graded group)."""

    # ----------------------------------------------------------------------------- the loop

    def run(
        self, *, resume: bool = False, on_step: Callable[[dict[str, Any]], None] | None = None
    ) -> list[dict]:
        """Run the remaining steps; returns every step's metrics (resumed ones included)."""
        start = self._start_step(resume)
        try:
            for step in range(start, self.config.steps):
                metrics = self.step(step)
                self.metrics_log.append(step, metrics)
                self._publish(step, metrics)
                if on_step is not None:
                    on_step(metrics)
        except BaseException:
            self._finish(succeeded=False)
            raise
        self._finish(succeeded=True)
        return self.metrics_log.read()

    def _finish(self, *, succeeded: bool) -> None:
        """Mark the run finished on the Pushgateway (no stall alert after it; a failed-run alert)."""
        url = self.config.metrics.pushgateway
        if url:
            from gagar.metrics import finish_run

            finish_run(url, self.config.metrics.job, {"run": self.run_dir.name}, succeeded=succeeded)

    def _start_step(self, resume: bool) -> int:
        latest = self.checkpoints.latest()
        if latest is not None and not resume:
            raise ValueError(
                f"{self.run_dir} already holds checkpoint step {latest.step}: pass --resume to continue it, "
                "or choose another run directory"
            )
        self.checkpoints.remove_partial()
        last = latest.step if latest is not None else -1
        kept = self.metrics_log.truncate(last)
        if latest is not None and (not kept or kept[-1]["step"] != last):
            self._recover_record(latest)
        return last + 1

    def _recover_record(self, ckpt: Checkpoint) -> None:
        """Log the line of a step killed after its checkpoint was written and before its line was."""
        pending_path = self.run_dir / PENDING_STEP
        pending = json.loads(pending_path.read_text(encoding="utf-8")) if pending_path.exists() else {}
        if pending.get("step") != ckpt.step:
            log.warning(
                "%s: no pre-update metrics of step %d; its recovered line holds only the update's",
                pending_path,
                ckpt.step,
            )
            pending = {"step": ckpt.step, "policy": str(self.policy_for(ckpt.step))}
        metrics = {**pending, **read_extra_state(ckpt).get("metrics", {})}
        log.warning("step %d was checkpointed but not logged (killed in between): line recovered", ckpt.step)
        self.metrics_log.append(ckpt.step, metrics)
        self._publish(ckpt.step, metrics)

    def policy_for(self, step: int) -> Path:
        """Weights step ``step`` samples from: the latest checkpoint before it, else the initial policy.

        With LoRA the checkpoint's ``model/`` is an adapter directory (it names its base).
        """
        before = self._checkpoint_before(step)
        return before.path / "model" if before else Path(self.config.policy)

    def _checkpoint_before(self, step: int) -> Checkpoint | None:
        before = [c for c in self.checkpoints.checkpoints() if c.step < step]
        return before[-1] if before else None

    # ----------------------------------------------------------------------------- adapters

    @property
    def adapters_dir(self) -> Path:
        """Where each update's adapter is published: ``adapters/policy-step-N`` (LoRA only)."""
        return self.run_dir / "adapters"

    def publish_adapter(self, ckpt: Checkpoint) -> Path:
        """Publish the adapter of checkpoint ``ckpt`` (update ``ckpt.step + 1``) locally and to the store.

        Idempotent: an adapter already published (a resumed run) is left as it is.
        """
        version = adapter_version(ckpt.step + 1)
        path = publish_adapter(ckpt.path / "model", self.adapters_dir, version)
        uri = self.config.lora.publish_uri
        if uri is not None:
            from gagar.storage import open_store

            store = open_store(uri)
            if store.read_manifest(version) is None:
                store.publish_dir(path, version, step=ckpt.step + 1)
        return path

    def _serve_version(self, step: int) -> tuple[str, float]:
        """Make the policy server serve the weights of step ``step`` and no other version (the
        adapter of the checkpoint before it, published first); their version and the swap's seconds."""
        from gagar.policy.vllm_server import serve_step_version

        before = self._checkpoint_before(step)
        if before is not None:  # an adapter already published (a resumed run) is kept
            self.publish_adapter(before)
        rollout = self.config.rollout
        return serve_step_version(
            rollout.endpoint or "",
            before.step + 1 if before is not None else 0,
            rollout.served_model,
            self.adapters_dir,
        )

    def step(self, step: int) -> dict[str, Any]:
        """One RL step (:func:`gagar.rl_step.run_step`), its artifacts under ``steps/step-N``; its metrics."""
        from gagar.metrics import step_observations
        from gagar.policy.rollout import make_backend
        from gagar.sandbox.runner import make_backend as make_sandbox
        from gagar.tasks.loaders import load_tasks

        c = self.config
        step_dir = self.run_dir / "steps" / f"step-{step:06d}"
        if step_dir.exists():
            shutil.rmtree(step_dir)  # an interrupted attempt: redo the step from its start
        step_dir.mkdir(parents=True)
        policy = self.policy_for(step)
        started = time.perf_counter()
        timings: dict[str, float] = {}
        metrics: dict[str, Any] = {"step": step, "policy": str(policy)}
        server = c.rollout.backend is RolloutBackend.SERVER
        version = str(policy)  # what the in-process backends record as the trajectories' version
        if server:
            version, timings["perf/adapter_swap_s"] = self._serve_version(step)
            metrics["policy_version"] = version
        torch_threads = _share_cores_with_the_sandbox(
            c.sandbox.workers if c.sandbox.backend is BackendName.LOCAL else 0
        )
        with rl_step.timed(timings, "perf/rollout_s"):
            generator, tokenizer = make_backend(
                str(policy),
                RolloutBackend.OPENAI.value if server else c.rollout.backend.value,
                endpoint=c.rollout.endpoint,
                model_name=version if server else None,
                agent=c.rollout.agent,
            )
        inputs = rl_step.StepInputs(
            step=step,
            policy=policy,
            policy_version=version,
            tasks=load_tasks(c.tasks),
            generator=generator,
            tokenizer=tokenizer,
            sandbox=make_sandbox(c.sandbox.backend, c.sandbox.workers),
            grader=rl_step.make_grader(c),
            workspace=Path(tempfile.mkdtemp(prefix="gagar-grade-", dir=scratch_root())),
            checkpoints=self.checkpoints.root,
        )

        def save_generation(b: int, batch: GeneratedBatch) -> None:
            write_records(step_dir / f"trajectories-{b}.jsonl", batch.trajectories)
            write_records(step_dir / f"results-{b}.jsonl", batch.results)

        def save_before_update(out: rl_step.StepOutput) -> None:
            if out.grades is not None:
                write_records(step_dir / "grades.jsonl", out.grades)
            write_records(step_dir / "batch.jsonl", out.batch)
            shutil.rmtree(inputs.workspace, ignore_errors=True)
            torch.set_num_threads(torch_threads)  # the update has the cores to itself
            pending = metrics | out.metrics | _added(timings, out.timings)
            atomic_write_text(self.run_dir / PENDING_STEP, json.dumps(pending, sort_keys=True))

        try:
            out = rl_step.run_step(
                inputs, c, on_generated=save_generation, before_update=save_before_update,
                progress=self.progress,
            )  # fmt: skip
        finally:
            shutil.rmtree(inputs.workspace, ignore_errors=True)
            torch.set_num_threads(torch_threads)
        metrics |= out.metrics
        self._observations[step] = step_observations(
            [r for b in out.selection.batches for r in b.results], [g.duration_s for g in out.grades or []]
        )
        if c.lora.enabled:
            adapter = self.publish_adapter(Checkpoint(step, self.checkpoints.path_for(step)))
            metrics["lora/adapter_bytes"] = float(sum(p.stat().st_size for p in adapter.iterdir()))
            if c.lora.keep_adapters is not None:
                prune_adapters(self.adapters_dir, c.lora.keep_adapters)
        if not c.keep_step_artifacts:
            shutil.rmtree(step_dir, ignore_errors=True)
        metrics.update(_added(timings, out.timings))
        metrics["perf/step_s"] = time.perf_counter() - started
        return metrics

    # ----------------------------------------------------------------------------- outputs

    def _publish(self, step: int, metrics: dict[str, Any]) -> None:
        from gagar.train.plots import plot_run

        plot_run(self.metrics_log.read(), self.run_dir / "training.png")
        url = self.config.metrics.pushgateway
        if url:
            from gagar.metrics import publish_step

            earlier = [row for row in self.metrics_log.read() if row["step"] < step]
            publish_step(
                url,
                self.config.metrics.job,
                self.run_dir.name,
                metrics,
                earlier,
                self._observations.pop(step, {}),
            )


def _share_cores_with_the_sandbox(workers: int | None) -> int:
    """Give torch the cores the sandbox's workers on this machine (``workers``; None: one a core, as
    the local backend defaults; 0 for a remote sandbox) leave free, at least one, while the step
    samples, unless OMP_NUM_THREADS says otherwise; returns torch's thread count before.

    The sandbox evaluates while the policy samples, and torch's threads spin-wait, so on a busy core
    they slow both (two threads on two cores beside two workers: several times slower).
    """
    before = torch.get_num_threads()
    if "OMP_NUM_THREADS" not in os.environ:
        cores = os.cpu_count() or 1
        torch.set_num_threads(max(1, cores - (cores if workers is None else workers)))
    return before


def _added(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """The two timing dicts with the seconds of shared keys added."""
    return {key: a.get(key, 0.0) + b.get(key, 0.0) for key in a.keys() | b.keys()}


def train(config: TrainConfig, *, resume: bool = False, progress: bool = True) -> list[dict]:
    """Run (or resume) the training run described by ``config``; returns every step's metrics."""
    return Trainer(config, progress=progress).run(resume=resume)
