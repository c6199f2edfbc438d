"""The GRPO-vs-GAGAR experiment's settings (issue #8), read from a YAML file like ``configs/experiment.yaml``.

Every arm trains from the same SFT checkpoint on the same tasks, seeds and number of steps; only the
advantage estimator, the grader and the arm's own ``train`` settings differ. ``train`` passes any other
:class:`~gagar.train.config.TrainConfig` setting (rollout, sandbox, optim, the advantage's decay ...)
through to every run; an arm's own ``train`` is merged over it, section by section, for that arm's runs
(an ablation of ``advantage.gamma``, say).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gagar.advantage import Estimator
from gagar.grader.run import GraderKind
from gagar.grader.sft import LEARNED_MISLEADING_PER_TASK
from gagar.policy.agent import AgentSettings
from gagar.schema.trajectory import MaxNewTokens, Temperature, TopP
from gagar.train.config import SandboxSettings, TrainConfig, read_yaml_mapping

__all__ = [
    "ArmConfig",
    "EvalSettings",
    "ExperimentConfig",
    "GraderSFTSettings",
    "GreedyEvalSettings",
    "default_arms",
    "greedy_points",
    "load_experiment_config",
]

_RESERVED_TRAIN_KEYS = ("run_dir", "tasks", "policy", "steps", "seed", "grader")
"""TrainConfig settings the experiment itself sets for every run; ``train`` may not override them."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArmConfig(_Section):
    """One arm: an advantage estimator and, for GAGAR, the grader that ranks the passing answers."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    """Short name; also the folder of the arm's runs."""
    algo: Estimator
    """grpo, dr_grpo, gagar, gagar-tiered or gagar-no-restore."""
    grader: GraderKind | None = None
    """heuristic or learned (the estimators that use a grader only)."""
    grader_model: Path | None = None
    """Learned grader directory; None lets the harness train one on the training tasks."""
    grader_endpoint: str | None = None
    """The llm grader's OpenAI-compatible base URL (``gagar serve grader --model DIR`` prints it)."""
    train: dict[str, Any] = Field(default_factory=dict)
    """This arm's own TrainConfig settings, merged over the experiment's ``train`` section by section
    (``{advantage: {gamma: 0.25}}`` changes the decay ratio and keeps the shared decay)."""

    @model_validator(mode="after")
    def _grader_matches_algo(self) -> ArmConfig:
        if self.algo.uses_grader and self.grader is None:
            raise ValueError(
                f"arm {self.name!r}: algo {self.algo.value} needs a grader (heuristic or learned)"
            )
        if not self.algo.uses_grader and self.grader is not None:
            raise ValueError(
                f"arm {self.name!r}: algo {self.algo.value} uses no grader, got {self.grader.value!r}"
            )
        if self.grader is GraderKind.LLM and self.grader_endpoint is None:
            raise ValueError(
                f"arm {self.name!r}: the llm grader needs grader_endpoint, the URL that "
                "`gagar serve grader --model DIR` prints"
            )
        if self.grader_endpoint is not None and self.grader is not GraderKind.LLM:
            raise ValueError(f"arm {self.name!r}: grader_endpoint is only for the llm grader")
        if self.grader_model is not None and self.grader is not GraderKind.LEARNED:
            raise ValueError(f"arm {self.name!r}: grader_model is only for the learned grader")
        return self


def default_arms() -> list[ArmConfig]:
    """GRPO, GAGAR with the heuristic grader, GAGAR with the learned grader (trained by the harness)."""
    return [
        ArmConfig(name="grpo", algo=Estimator.GRPO),
        ArmConfig(name="gagar-heuristic", algo=Estimator.GAGAR, grader=GraderKind.HEURISTIC),
        ArmConfig(name="gagar-learned", algo=Estimator.GAGAR, grader=GraderKind.LEARNED),
    ]


class GraderSFTSettings(_Section):
    """How the harness trains the learned grader when an arm names none (``gagar grader sft``)."""

    groups_per_task: int = Field(default=3, ge=1)
    """Noise groups built per training task."""
    misleading_per_task: int = Field(default=LEARNED_MISLEADING_PER_TASK, ge=0)
    """Groups per training task where size misleads (``gagar grader sft --misleading-per-task``)."""
    epochs: int = Field(default=300, ge=1)
    """Full-batch training epochs."""
    seed: int = 0
    """Seed of the noise groups and the scorer."""


class EvalSettings(_Section):
    """How each final policy (and the SFT start) is sampled on the held-out tasks."""

    samples_per_task: int = Field(default=4, ge=1)
    """Answers sampled per held-out task."""
    temperature: Temperature
    """Sampling temperature."""
    top_p: TopP
    """Nucleus sampling mass."""
    # An override, not a second default: the held-out answers have had a shorter budget than the
    # rollout's MaxNewTokens since the experiment was written (84e9e32, which records no reason);
    # configs/experiment.yaml sets 128 for both anyway.
    max_new_tokens: MaxNewTokens = 160
    """Longest answer."""
    backend: str = "hf"
    """Generation backend: hf (in process) or vllm."""
    agent: AgentSettings = Field(default_factory=AgentSettings)
    """The agent sampled (single or tool-loop) and the tool loop's budgets."""
    seed_offset: int = 10_000
    """The run of seed s is evaluated with sampling seed ``seed_offset + s`` (the SFT row: the first seed)."""


class GreedyEvalSettings(_Section):
    """Greedy held-out evaluations during training: the held-out curves, and how far each run moved
    from the start (the share of held-out tasks whose greedy answer is no longer the starting policy's).

    Greedy answers are deterministic, so a changed answer is the policy's doing, not the sampler's.
    Answer length and the generation backend are those of ``evaluation``.
    """

    every: int | None = Field(default=None, ge=1)
    """Steps between greedy evaluations, which also run at the start and after the last step;
    None runs none."""
    tasks: int | None = Field(default=None, ge=1)
    """Evaluate on the first this many held-out tasks; None: all of them."""


def greedy_points(steps: int, every: int | None) -> list[int]:
    """0, ``every``, ``2·every``, ... below ``steps``, then ``steps``; empty when ``every`` is None."""
    return [] if every is None else sorted({*range(0, steps, every), steps})


class ExperimentConfig(_Section):
    """The whole experiment: shared inputs, arms, seeds, steps, training and evaluation knobs."""

    policy: Path
    """The SFT checkpoint every arm starts from (a Hugging Face model directory)."""
    train_tasks: Path
    """RL training tasks (JSONL or parquet); also the learned grader's training tasks."""
    heldout_tasks: Path
    """Evaluation tasks, from repositories never seen in training."""
    out_dir: Path = Path("runs/experiment")
    """Where runs, evaluations, the learned grader, the report and plots go."""
    arms: list[ArmConfig] = Field(default_factory=default_arms, min_length=1)
    """The compared arms; the first GRPO arm is the baseline of the paired differences."""
    seeds: list[int] = Field(default=[0, 1, 2], min_length=1)
    """Training seeds; every arm runs every seed."""
    steps: int = Field(default=8, ge=1)
    """RL steps of every run."""
    train: dict[str, Any] = Field(default_factory=dict)
    """Other TrainConfig settings for every run (rollout, sandbox, optim, advantage decay, ...)."""
    grader_sft: GraderSFTSettings = Field(default_factory=GraderSFTSettings)
    evaluation: EvalSettings = Field(default_factory=EvalSettings)
    greedy_eval: GreedyEvalSettings = Field(default_factory=GreedyEvalSettings)

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        return seeds

    @model_validator(mode="after")
    def _arms_and_train_settings(self) -> ExperimentConfig:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names) or "sft" in names:
            raise ValueError(f"arm names must be distinct and not 'sft' (the baseline row), got {names}")
        sections = [("train", self.train)] + [(f"arm {a.name!r}: train", a.train) for a in self.arms]
        for where, train in sections:
            if reserved := _reserved_keys(train):
                raise ValueError(f"{where}: {', '.join(reserved)} are set by the experiment per arm and seed")
        for arm in self.arms:  # refuse a bad training setting now, not after hours of other runs
            self.train_config(arm, self.seeds[0], grader_model=arm.grader_model or Path("grader"))
        return self

    @property
    def baseline(self) -> ArmConfig | None:
        """The arm the others are compared with: the first GRPO arm, if any."""
        return next((a for a in self.arms if a.algo is Estimator.GRPO), None)

    @property
    def greedy_points(self) -> list[int]:
        """The numbers of updates after which a run is evaluated greedily: 0 (the start), every
        ``greedy_eval.every`` steps, and ``steps``; empty when ``greedy_eval.every`` is None."""
        return greedy_points(self.steps, self.greedy_eval.every)

    @property
    def sandbox(self) -> SandboxSettings:
        """Where tests run, for training and evaluation alike (``train.sandbox``)."""
        return SandboxSettings(**(self.train.get("sandbox") or {}))

    def run_dir(self, arm: ArmConfig, seed: int) -> Path:
        """The trainer's run directory of ``arm`` at ``seed``."""
        return self.out_dir / "runs" / arm.name / f"seed-{seed}"

    def eval_dir(self, arm: str, seed: int | None) -> Path:
        """Where the evaluation of ``arm`` at ``seed`` goes (``sft`` has no seed)."""
        base = self.out_dir / "eval" / arm
        return base if seed is None else base / f"seed-{seed}"

    def greedy_dir(self, arm: str, seed: int | None, updates: int) -> Path:
        """Where the greedy evaluation of ``arm`` at ``seed`` after ``updates`` updates goes (the start:
        ``sft``, no seed, 0 updates)."""
        base = self.out_dir / "greedy" / arm
        return (base if seed is None else base / f"seed-{seed}") / f"after-{updates:04d}"

    def train_config(
        self, arm: ArmConfig, seed: int, grader_model: Path | None, steps: int | None = None
    ) -> TrainConfig:
        """The TrainConfig of one run: shared ``train`` settings, then this arm's estimator and grader.

        ``steps`` (default: the experiment's) stops the run earlier, to evaluate it there; a later
        call with more steps resumes it.

        Raises:
            ValueError: a ``train`` setting TrainConfig refuses, naming it.
        """
        train = _merged(self.train, arm.train)
        advantage = {**(train.get("advantage") or {}), "algo": arm.algo.value}
        grader = {
            "kind": (arm.grader or GraderKind.HEURISTIC).value,
            "model": grader_model,
            "endpoint": arm.grader_endpoint,
        }
        values = {
            **train,
            "run_dir": self.run_dir(arm, seed),
            "tasks": self.train_tasks,
            "policy": self.policy,
            "steps": self.steps if steps is None else steps,
            "seed": seed,
            "advantage": advantage,
            "grader": grader,
        }
        try:
            return TrainConfig(**values)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"arm {arm.name!r}: invalid train settings: {problems}") from None


def _reserved_keys(train: dict[str, Any]) -> list[str]:
    """The settings in ``train`` that the experiment sets itself."""
    reserved = [k for k in _RESERVED_TRAIN_KEYS if k in train]
    if "algo" in (train.get("advantage") or {}):
        reserved.append("advantage.algo")
    return reserved


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``; where both hold a mapping under a key, merged key by key."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def _resolve_paths(values: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative paths of the file are relative to the file's folder."""

    def resolve(value: Any) -> Any:
        if isinstance(value, str) and not Path(value).is_absolute():
            return str((base / value).resolve())
        return value

    out = dict(values)
    for key in ("policy", "train_tasks", "heldout_tasks", "out_dir"):
        if key in out:
            out[key] = resolve(out[key])
    if isinstance(out.get("arms"), list):
        out["arms"] = [
            {**arm, "grader_model": resolve(arm.get("grader_model"))} if isinstance(arm, dict) else arm
            for arm in out["arms"]
        ]
    return out


def load_experiment_config(
    path: str | os.PathLike[str], overrides: dict[str, Any] | None = None
) -> ExperimentConfig:
    """The experiment described by the YAML file at ``path``, with ``overrides`` (command line) on top.

    Raises:
        ValueError: naming the file and the setting that is wrong.
    """
    values = _resolve_paths(read_yaml_mapping(path, "experiment config"), Path(path).resolve().parent)
    try:
        return ExperimentConfig(**(values | (overrides or {})))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ValueError(f"{path}: invalid experiment config: {problems}") from None
