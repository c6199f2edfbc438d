"""Run the RL pipeline on this machine through ``kfp.local`` (the embedded default, no cluster).

Every component runs as a local Python process (``SubprocessRunner``, this interpreter), or with
``container=ContainerSettings(...)`` in its stage image through ``DockerRunner`` (a Docker API
socket: dockerd or ``podman system service``; the images of ``make images``). The tasks'
artifacts land under ``<out>/kfp-root`` and the RL state (checkpoints, step metrics) in the
``storage`` store; in containers only ``<out>/kfp-root`` is mounted (at the same path), so the
store, the policy and the tasks must lie under it (made readable to the images' uid 1000).

The report splits the wall time into the stage functions' own time and the rest: orchestration
overhead (process starts, imports, KFP's executor, artifact and store copies).
"""

from __future__ import annotations

import re
import time
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gagar.pipeline.build import build_pipeline
from gagar.pipeline.platform import PlatformOptions
from gagar.pipeline.store import normalise_storage, read_step_metrics
from gagar.pipeline.warm_stages import warm_stages

__all__ = ["STAGE_TIMERS", "ContainerSettings", "LocalRun", "run_local"]

STAGE_TIMERS = ("perf/rollout_s", "perf/sandbox_s", "perf/grade_s", "perf/redistribute_s", "perf/train_s")
"""The metric keys holding each stage function's own duration."""


@dataclass(frozen=True)
class ContainerSettings:
    """How ``DockerRunner`` runs each task's container."""

    image_variant: str | None = "cpu"
    """Which stage images the tasks name (``cpu``: the CPU variants ``make images`` builds)."""
    network_mode: str = "bridge"
    """Docker network of the containers (``host`` where a task must reach a loopback API server)."""
    environment: tuple[tuple[str, str], ...] = ()
    """Variables every container gets, e.g. ``KUBECONFIG`` of the Kubernetes sandbox backend."""


@dataclass(frozen=True)
class LocalRun:
    """What one local pipeline run did and how long it took."""

    wall_s: float
    """Seconds from the first task's start to the last task's end."""
    steps: list[dict[str, float]]
    """The stored metrics of each step this run completed."""
    pipeline_root: Path
    """Where the tasks' KFP artifacts are."""
    warm_start_s: float = 0.0
    """Seconds the warm stage server took to get ready, once for the run, before ``wall_s`` began
    (0: cold stages)."""

    @property
    def stage_s(self) -> float:
        """Seconds spent inside the stage functions, over every step."""
        return sum(row.get(key, 0.0) for row in self.steps for key in STAGE_TIMERS)

    @property
    def overhead_s(self) -> float:
        """Wall seconds not spent inside a stage function."""
        return self.wall_s - self.stage_s

    @property
    def overhead_share(self) -> float:
        """Orchestration overhead as a share of the wall time."""
        return self.overhead_s / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> str:
        """One line: steps, wall time, stage time, overhead."""
        warm = f" (after {self.warm_start_s:.1f} s starting the warm stages)" if self.warm_start_s else ""
        return (
            f"{len(self.steps)} step(s) in {self.wall_s:.1f} s{warm}: stages {self.stage_s:.1f} s, "
            f"orchestration overhead {self.overhead_s:.1f} s ({self.overhead_share:.0%})"
        )


def _runner(container: ContainerSettings | None, root: Path, arguments: dict[str, Any]) -> Any:
    from kfp import local

    if container is None:
        return local.SubprocessRunner(use_venv=False)
    for key in ("storage", "model", "tasks"):
        value = arguments.get(key)
        if value and "://" not in str(value) and not Path(value).resolve().is_relative_to(root):
            raise ValueError(f"{key} {value} is not under {root}: the containers see only that folder")
    # the stage images run as uid 1000: the root writable, what is already under it readable
    root.chmod(0o777)
    for path in root.rglob("*"):
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
    return local.DockerRunner(network_mode=container.network_mode, environment=dict(container.environment))


def run_local(
    arguments: dict[str, Any],
    *,
    out: str | Path,
    steps: int = 1,
    max_gen_batches: int | None = None,
    container: ContainerSettings | None = None,
    warm: bool = True,
    log_file: Path | None = None,
) -> LocalRun:
    """Run ``steps`` RL steps of the pipeline with ``arguments`` (its parameters) through ``kfp.local``,
    each drawing at most ``max_gen_batches`` generation batches (None: the pipeline's default).

    ``arguments["storage"]`` is made absolute. KFP logs each task's start, output and end to stdout,
    or with ``log_file`` to that file while one line per finished task is printed
    (:func:`gagar.pipeline.progress.logged_to`).
    ``container``: run each task in its stage image (see the module docstring); None runs them as
    local processes, and with ``warm`` each task's stage function in a fork of one interpreter that
    imported torch and gagar once (:mod:`gagar.pipeline.warm_stages`).

    Raises:
        RuntimeError: a task failed (KFP names it in the message); with ``log_file`` a
            :class:`gagar.errors.UserError` naming the task, its error and the log.
        ValueError: with ``container``, a local store, policy or tasks path outside ``<out>/kfp-root``.
    """
    from kfp import local

    root = Path(out).resolve() / "kfp-root"
    root.mkdir(parents=True, exist_ok=True)
    arguments = {**arguments, "storage": normalise_storage(arguments["storage"])}
    done = {row["step"] for row in read_step_metrics(arguments["storage"])}
    local.init(runner=_runner(container, root, arguments), pipeline_root=str(root), raise_on_error=True)
    # kfp.local honours retries; a local failure is not transient, so fail at once.
    options = PlatformOptions(retries=0, image_variant=container.image_variant if container else None)
    pipeline = build_pipeline("rl", steps_per_run=steps, options=options, max_gen_batches=max_gen_batches)
    with ExitStack() as stack:
        warm_start = 0.0
        if warm and container is None:
            began = time.perf_counter()
            stack.enter_context(warm_stages())
            warm_start = time.perf_counter() - began
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*non-Python base image.*", category=RuntimeWarning)
            warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
            if log_file is None:
                pipeline(**arguments)
            else:
                _run_logged(pipeline, arguments, log_file)
        wall = time.perf_counter() - start
    rows = [row for row in read_step_metrics(arguments["storage"]) if row["step"] not in done]
    return LocalRun(wall_s=wall, steps=rows, pipeline_root=root, warm_start_s=warm_start)


def _run_logged(pipeline: Any, arguments: dict[str, Any], log_file: Path) -> None:
    """Run ``pipeline`` with its output in ``log_file``; a failed task becomes one line naming it."""
    from gagar.errors import UserError
    from gagar.pipeline.progress import logged_to

    offset = log_file.stat().st_size if log_file.exists() else 0
    try:
        with logged_to(log_file):
            pipeline(**arguments)
    except RuntimeError as exc:
        failed = re.search(r"Inner task failed: \W*'?([\w-]+)", _ANSI.sub("", str(exc)))
        task = failed.group(1) if failed else "a task"
        raise UserError(
            f"the pipeline failed at {task}: {_last_error(log_file, offset)} (log: {log_file})"
        ) from None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _last_error(log_file: Path, offset: int) -> str:
    """The last exception line this run wrote to ``log_file`` (``ValueError: …``)."""
    with open(log_file, encoding="utf-8", errors="replace") as log:
        log.seek(offset)
        lines = [_ANSI.sub("", line).strip() for line in log]
    errors = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b:?", line)]
    return errors[-1] if errors else "see its log"
