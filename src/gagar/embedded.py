"""The embedded default: everything the main job needs on one CPU machine, built once and cached.

``prepare(work_dir)`` lays out, under ``work_dir``:

- ``sft-tasks.jsonl``: generated train-split tasks for SFT demonstrations (unverified: their test
  lists are never used, so no pytest run is needed to make them);
- ``rl-tasks.jsonl``: other train-split tasks for RL, verified with real pytest runs;
- ``heldout-tasks.jsonl``: held-out tasks (repositories never seen in training), verified;
- ``policy/``: the pre-RL SFT checkpoint (``gagar policy sft`` with its default settings).

Each piece is reused when it is already there, and the SFT resumes from its last checkpoint when
a previous preparation was interrupted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gagar.policy.sft import SFTConfig

__all__ = ["EmbeddedDefault", "EmbeddedSettings", "prepare"]

log = logging.getLogger(__name__)


class EmbeddedSettings(BaseModel):
    """Sizes of the embedded default."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    """Seeds every generated task set and the SFT run."""
    sft_tasks: int = Field(default=4000, ge=1)
    """Tasks whose gold patches become SFT demonstrations."""
    rl_tasks: int = Field(default=48, ge=1)
    """Tasks the RL steps sample from."""
    heldout_tasks: int = Field(default=0, ge=0)
    """Held-out tasks for evaluation (0: none; the experiment makes its own)."""
    workers: int = Field(default=2, ge=1)
    """Processes generating verified tasks."""
    sft: SFTConfig = Field(default_factory=SFTConfig)
    """The pre-RL SFT run (``gagar policy sft`` defaults; its seed is ``seed``)."""


@dataclass(frozen=True)
class EmbeddedDefault:
    """Paths of a prepared embedded default."""

    sft_tasks: Path
    rl_tasks: Path
    heldout_tasks: Path | None
    policy: Path


# RL and held-out task sets draw from seed namespaces far from the SFT set's.
_RL_SEED_OFFSET = 1_000
_HELDOUT_SEED_OFFSET = 2_000


def _tasks(path: Path, n: int, seed: int, split: str, *, verify: bool, workers: int) -> Path:
    from gagar.tasks.generate import generate_tasks
    from gagar.tasks.loaders import write_tasks

    if not path.exists():
        log.info("generating %d %s tasks into %s", n, split, path)
        write_tasks(path, generate_tasks(n, seed, split, workers=workers, verify=verify))  # type: ignore[arg-type]
    return path


def prepare(
    work_dir: str | Path, settings: EmbeddedSettings | None = None, *, progress: bool = True
) -> EmbeddedDefault:
    """Build (or reuse) the task sets and the SFT policy of the embedded default under ``work_dir``."""
    from gagar.policy.sft import train_sft
    from gagar.records import read_records
    from gagar.schema.task import Task

    s = settings or EmbeddedSettings()
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    sft = _tasks(work / "sft-tasks.jsonl", s.sft_tasks, s.seed, "train", verify=False, workers=1)
    rl = _tasks(
        work / "rl-tasks.jsonl", s.rl_tasks, s.seed + _RL_SEED_OFFSET, "train", verify=True, workers=s.workers
    )
    heldout = None
    if s.heldout_tasks:
        heldout = _tasks(
            work / "heldout-tasks.jsonl",
            s.heldout_tasks,
            s.seed + _HELDOUT_SEED_OFFSET,
            "heldout",
            verify=True,
            workers=s.workers,
        )
    policy = work / "policy"
    if not (policy / "config.json").is_file():
        log.info("training the pre-RL SFT policy into %s", policy)
        config = s.sft.model_copy(update={"seed": s.seed})
        train_sft(read_records(sft, Task), policy, config, resume=True, progress=progress)
    return EmbeddedDefault(sft_tasks=sft, rl_tasks=rl, heldout_tasks=heldout, policy=policy)
