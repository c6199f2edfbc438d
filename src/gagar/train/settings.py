"""The settings of the policy update, torch-free: the loss, the optimizer, LoRA and the processes it
runs on. They are sections of :class:`gagar.train.config.TrainConfig`; the modules that use them
(:mod:`gagar.train.loss`, :mod:`gagar.train.update`, :mod:`gagar.train.lora`,
:mod:`gagar.train.distributed`) re-export them. Kept apart so the config, and the pipelines built
from it, import without torch (``gagar pipeline compile`` from a wheel with the kfp extra only).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "QWEN2_TARGET_MODULES",
    "DistributedSettings",
    "KLEstimator",
    "LoraSettings",
    "OptimConfig",
    "PolicyLossConfig",
    "Strategy",
]

KLEstimator = Literal["k1", "k2", "k3"]


class PolicyLossConfig(BaseModel):
    """Hyper-parameters of the policy loss (DESIGN.md §4 defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    clip_low: float = Field(default=0.2, gt=0.0, lt=1.0)
    """ε_low: the ratio is clipped below at 1 − ε_low."""
    clip_high: float = Field(default=0.28, gt=0.0)
    """ε_high: the ratio is clipped above at 1 + ε_high (clip-higher, DAPO)."""
    kl_coef: float = Field(default=0.0, ge=0.0)
    """β, the weight of the KL penalty to the reference policy; 0 disables it."""
    kl_estimator: KLEstimator = "k3"
    """Estimator of KL[π_θ ‖ π_ref] per token: ``k1`` (log-ratio), ``k2`` (half squared), ``k3``."""

    @model_validator(mode="after")
    def _check_clip(self) -> PolicyLossConfig:
        if self.clip_high < self.clip_low:
            raise ValueError(f"clip_high ({self.clip_high}) must be >= clip_low ({self.clip_low})")
        return self


class OptimConfig(BaseModel):
    """How the policy is updated each step."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    lr: float = Field(default=2e-5, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    epochs: int = Field(default=1, ge=1)
    """Passes over the step's batch."""
    minibatch_size: int = Field(default=16, ge=1)
    """Trajectories per optimizer step."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradient clipping by global norm."""
    micro_batch_tokens: int | None = Field(default=None, ge=1)
    """Most padded tokens (prompt and response, times the rows) in one forward and backward pass: a
    process's rows of a minibatch beyond it are split into micro-batches whose gradients add up before
    the minibatch's one optimizer step, so the update is the same and its activation memory bounded
    (long multi-turn trajectories); a row longer than this runs alone. Unset: a process's rows at once."""
    loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)
    """Clip range, KL coefficient and estimator."""


QWEN2_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP projections of a Qwen2 decoder layer."""


class LoraSettings(BaseModel):
    """Whether the update trains a LoRA adapter instead of all weights, and its shape."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Train a LoRA adapter on the frozen SFT checkpoint; False updates every weight."""
    rank: int = Field(default=8, ge=1)
    """Rank r of each low-rank update."""
    alpha: float = Field(default=16.0, gt=0)
    """Scale numerator: the update is ``(alpha / rank) · B A``."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter's input during training (0 keeps the PPO ratio exactly 1 at the start)."""
    target_modules: list[str] = Field(default_factory=lambda: list(QWEN2_TARGET_MODULES), min_length=1)
    """Module names the adapter wraps (Qwen2 attention and MLP projections by default)."""
    publish_uri: str | None = None
    """Artifact store (``s3://bucket/prefix`` or a directory) each adapter is also published to."""
    keep_adapters: int | None = Field(default=3, ge=2)
    """Newest adapters kept under ``{run_dir}/adapters`` (unset: all). At least 2: the server may still
    serve the previous one while the newest loads. The store's copies are never pruned."""


class Strategy(StrEnum):
    """How the model is replicated across the update's processes."""

    DDP = "ddp"
    """Every process holds the whole model; gradients are all-reduced (DistributedDataParallel)."""
    FSDP = "fsdp"
    """Parameters, gradients and optimizer state are sharded across processes (fully_shard)."""


class DistributedSettings(BaseModel):
    """How many processes the policy update runs on, and where."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    nodes: int = Field(default=1, ge=1)
    """Nodes the policy update runs on (a Kubeflow Trainer TrainJob's numNodes)."""
    procs_per_node: int = Field(default=1, ge=1)
    """Training processes per node, one per GPU (torchrun's --nproc-per-node)."""
    strategy: Strategy = Strategy.DDP
    """ddp replicates the model on every process; fsdp shards it (models that do not fit one device)."""
    runtime: str | None = None
    """ClusterTrainingRuntime the train stage's TrainJob uses (the chart installs gagar-torch); unset:
    updates inside the train stage's own pod."""
