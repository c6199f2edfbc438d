"""The training run's settings: one typed model per concern, read from YAML, the environment and the CLI.

Precedence: command line > environment (``GAGAR_…``, nested with ``__``, e.g.
``GAGAR_ROLLOUT__GROUP_SIZE=4``) > config file > defaults.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextvars import ContextVar
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gagar.advantage import AdvantageConfig, Decay, Estimator, TierFactors
from gagar.grader.llm import MAX_TURNS
from gagar.grader.run import GraderKind
from gagar.policy.agent import AgentSettings
from gagar.sandbox.runner import BackendName
from gagar.schema.trajectory import MaxNewTokens, Temperature, TopP
from gagar.train.settings import DistributedSettings, LoraSettings, OptimConfig

__all__ = [
    "EMBEDDED_RUN",
    "AdvantageSettings",
    "GraderSettings",
    "LoraSettings",
    "MetricsSettings",
    "RolloutBackend",
    "RolloutSettings",
    "SandboxSettings",
    "TrainConfig",
    "load_config",
    "parse_overrides",
    "read_yaml_mapping",
    "setting_field",
    "setting_leaves",
]


EMBEDDED_RUN = Path(__file__).resolve().parent.parent / "data" / "embedded-run.yaml"
"""The RL run of the embedded default (``make run``): the sections it changes from the defaults."""


class RolloutBackend(StrEnum):
    """Where the rollout's answers are generated."""

    HF = "hf"
    """Hugging Face ``generate`` in process."""
    VLLM = "vllm"
    """vLLM in process (GPU)."""
    OPENAI = "openai"
    """An OpenAI-compatible server at ``rollout.endpoint``."""
    SERVER = "server"
    """A warm ``gagar serve policy`` server that loads each step's LoRA adapter."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class RolloutSettings(_Section):
    """How trajectories are sampled and how many the step needs."""

    group_size: int = Field(default=8, ge=1)
    """Trajectories per task (the GRPO group; training needs at least 2)."""
    train_batch_groups: int = Field(default=8, ge=1)
    """Mixed groups the update trains on; dynamic sampling refills until it has them."""
    gen_batch_groups: int = Field(default=16, ge=1)
    """Tasks sampled per generation batch."""
    max_gen_batches: int = Field(default=3, ge=1)
    """Generation batches one step may use before it trains on what it has."""
    temperature: Temperature
    """Sampling temperature (the log-probs are taken at it)."""
    top_p: TopP
    """Nucleus sampling mass."""
    max_new_tokens: MaxNewTokens
    """Longest answer."""
    backend: RolloutBackend = RolloutBackend.HF
    """Generation backend: hf (in process), vllm (GPU, in process), openai (a server) or server
    (a warm ``gagar serve policy`` server that loads each step's LoRA adapter)."""
    endpoint: str | None = None
    """Base URL of the server for the openai and server backends (``http://host:port/v1``)."""
    served_model: str = "policy"
    """The server's ``--served-model-name``: the SFT base, version ``base``, sampled before any update."""
    agent: AgentSettings = Field(default_factory=AgentSettings)
    """The agent (``kind``: single or tool-loop) and the tool loop's per-trajectory budgets
    (``max_turns``, ``max_tokens``, ``max_seconds``, ``max_tool_chars``); ``max_new_tokens`` bounds
    one turn."""


class SandboxSettings(_Section):
    """Where the tests run (the backends' own settings: ``GAGAR_LOCAL_SANDBOX__*``,
    ``GAGAR_KUBERNETES__*``, ``GAGAR_LIMITS__*``)."""

    backend: BackendName = BackendName.LOCAL
    """Where the tests run: local (bubblewrap on this machine) or kubernetes (sandbox pods)."""
    workers: int | None = Field(default=None, ge=1)
    """Evaluations run in parallel; unset: one per core."""


class GraderSettings(_Section):
    """Who ranks the passing trajectories (GAGAR only)."""

    kind: GraderKind = GraderKind.HEURISTIC
    """heuristic, learned or llm."""
    model: Path | None = None
    """Directory of the learned grader."""
    endpoint: str | None = None
    """OpenAI-compatible base URL of the LLM grader."""
    max_turns: int = Field(default=MAX_TURNS, ge=1)
    """Most tool-calling turns of the LLM grader per group."""
    position_guard: float | None = Field(default=None, ge=0)
    """Grade twice in opposite orders and tie a group whose rankings are further apart (Kendall
    distance) than this; unset: grade once."""


class AdvantageSettings(_Section):
    """Which estimator and how ranks become weights."""

    algo: Estimator = Estimator.GAGAR
    """grpo, dr_grpo, gagar, gagar-tiered (the paper's form) or gagar-no-restore (ablation)."""
    decay: Decay = Decay.GEOMETRIC
    """geometric, linear or score."""
    gamma: float = Field(default=0.5, gt=0, le=1)
    """Geometric weight ratio between consecutive ranks."""
    floor: float = Field(default=0.1, gt=0, le=1)
    """Smallest weight of linear and score decay."""
    norm_std: bool = True
    """Divide by the group std (GRPO); False centres only (Dr. GRPO)."""
    tiers: TierFactors = Field(default_factory=TierFactors)
    """Tier factors, tier cutoffs and lambda_max of gagar-tiered."""

    def estimator_config(self) -> AdvantageConfig:
        """What the estimator registry takes: every field of this section, none dropped."""
        return AdvantageConfig(
            norm_std=self.norm_std, decay=self.decay, gamma=self.gamma, floor=self.floor, tiers=self.tiers
        )


class MetricsSettings(_Section):
    """Where per-step metrics go besides the run's metrics.jsonl."""

    pushgateway: str | None = None
    """Prometheus Pushgateway URL the step metrics are pushed to; unset: push nothing."""
    job: str = "gagar-train"
    """Pushgateway job name."""


class TrainConfig(BaseSettings):
    """A training run."""

    model_config = SettingsConfigDict(
        env_prefix="GAGAR_",
        env_nested_delimiter="__",
        extra="forbid",
        nested_model_default_partial_update=True,
        use_attribute_docstrings=True,
    )

    run_dir: Path = Path("runs/train")
    """Where checkpoints, per-step artifacts, metrics.jsonl and plots go."""
    tasks: Path
    """Training tasks (JSONL or parquet): a file, or for a pipeline also a store URI (s3://…)."""
    policy: Path
    """Initial policy, the SFT checkpoint: a Hugging Face model directory, or for a pipeline also a
    store reference (s3://…)."""
    steps: int = Field(default=4, ge=1)
    """RL steps of the run."""
    seed: int = 0
    """Seeds task selection, sampling and minibatch order of every step."""
    keep_checkpoints: int = Field(default=3, ge=1)
    """Checkpoints kept (the newest complete one is never deleted)."""
    keep_step_artifacts: bool = True
    """Keep each step's trajectories, results, grades and batch files."""
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    grader: GraderSettings = Field(default_factory=GraderSettings)
    advantage: AdvantageSettings = Field(default_factory=AdvantageSettings)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    distributed: DistributedSettings = Field(default_factory=DistributedSettings)

    @model_validator(mode="after")
    def _server_rollout_trains_adapters(self) -> TrainConfig:
        if self.rollout.backend is RolloutBackend.SERVER:
            if self.rollout.endpoint is None:
                raise ValueError("rollout.backend 'server' needs rollout.endpoint (the policy server's URL)")
            if not self.lora.enabled:
                raise ValueError(
                    "rollout.backend 'server' needs lora.enabled: the warm server loads adapters; "
                    "full-weight updates need an engine restart per step"
                )
        return self

    @model_validator(mode="after")
    def _groups_can_mix(self) -> TrainConfig:
        if self.rollout.group_size < 2:
            raise ValueError(
                "rollout.group_size must be at least 2: a group of one never mixes pass and fail"
            )
        return self

    @model_validator(mode="after")
    def _grader_is_configured(self) -> TrainConfig:
        if (
            self.advantage.algo.uses_grader
            and self.grader.kind is GraderKind.LEARNED
            and self.grader.model is None
        ):
            raise ValueError("grader.kind 'learned' needs grader.model (the learned grader's directory)")
        if (
            self.advantage.algo.uses_grader
            and self.grader.kind is GraderKind.LLM
            and self.grader.endpoint is None
        ):
            raise ValueError("grader.kind 'llm' needs grader.endpoint (the grader server's /v1 URL)")
        return self

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> TrainConfig:
        """The config ``values`` describe, alone: no environment, no file (a pipeline's parameters)."""
        return cls.model_validate(values)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _FileSource(settings_cls)


def setting_field(path: str) -> FieldInfo:
    """The :class:`TrainConfig` field at a dotted ``path`` (``rollout.group_size``).

    Raises:
        ValueError: no field has that path.
    """
    model: type[BaseModel] = TrainConfig
    *sections, name = path.split(".")
    try:
        for section in sections:
            model = model.model_fields[section].annotation  # type: ignore[assignment]
        return model.model_fields[name]
    except (KeyError, AttributeError):
        import difflib

        close = difflib.get_close_matches(path, [leaf for leaf, _ in setting_leaves()], n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"the training config has no setting {path!r}{hint}") from None


def setting_leaves(model: type[BaseModel] = TrainConfig, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every setting of ``model`` that is not a section, by dotted path (``rollout.agent.kind``), in
    declaration order: what the pipelines' parameters and the ``--set`` hints are made of."""
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from setting_leaves(annotation, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", info


_FILE_VALUES: ContextVar[dict[str, Any] | None] = ContextVar("gagar_config_file_values", default=None)


class _FileSource(PydanticBaseSettingsSource):
    """The config file's values, below the environment (sources are deep-merged section by section)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_VALUES.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_VALUES.get() or {})


def read_yaml_mapping(path: str | os.PathLike[str], what: str = "config") -> dict[str, Any]:
    """The settings of the YAML file at ``path`` (empty for an empty file).

    Raises:
        ValueError: naming the file (and ``what`` it holds) when it cannot be read or is not a mapping.
    """
    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read the {what} ({exc})") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ValueError(f"{path}: the {what} must be a mapping of settings")
    return dict(loaded or {})


def _read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    values = read_yaml_mapping(path)
    base = Path(path).resolve().parent
    for key in ("tasks", "policy", "run_dir"):  # relative paths are relative to the file
        if isinstance(values.get(key), str) and not Path(values[key]).is_absolute():
            values[key] = str((base / values[key]).resolve())
    return values


def _problem(loc: tuple[Any, ...], message: str, overrides: dict[str, Any]) -> str:
    """``rollout.group_size: <message>``, saying when the value came from the command line."""
    message = message.removeprefix("Value error, ")
    if not loc:
        return message
    value: Any = overrides
    for part in loc:
        value = value.get(part) if isinstance(value, dict) else None
    source = " (set on the command line)" if value is not None else ""
    return f"{'.'.join(map(str, loc))}{source}: {message}"


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None
) -> TrainConfig:
    """The run's settings: ``overrides`` (command line) > environment > YAML file at ``path`` > defaults.

    Raises:
        ValueError: naming the file and the setting that is wrong.
    """
    from gagar.settings_env import check_environment

    check_environment(TrainConfig)
    token = _FILE_VALUES.set(_read_file(path) if path is not None else {})
    try:
        return TrainConfig(**(overrides or {}))
    except ValidationError as exc:
        problems = "; ".join(_problem(e["loc"], e["msg"], overrides or {}) for e in exc.errors())
        where = f"{path}: " if path else ""
        raise ValueError(f"{where}invalid training config: {problems}") from None
    finally:
        _FILE_VALUES.reset(token)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["rollout.group_size=8", ...]`` -> ``{"rollout": {"group_size": "8"}}``: command-line settings
    by their dotted path, values as text (the config validates them; lists as JSON).

    Raises:
        ValueError: an item that is not path=value, a path that names no setting, or one given twice.
    """
    import json

    nested: dict[str, Any] = {}
    for item in items:
        path, sep, text = item.partition("=")
        path = path.strip()
        if not sep or not path:
            raise ValueError(f"--set {item!r}: use path=value, e.g. rollout.group_size=8")
        setting_field(path)  # names the setting, or raises naming it
        *sections, leaf = path.split(".")
        target = nested
        for section in sections:
            target = target.setdefault(section, {})
        if leaf in target:
            raise ValueError(f"--set {path} is given twice")
        value: Any = text
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise ValueError(f"--set {path}: {text!r} is not a JSON list") from None
        target[leaf] = value
    return nested
