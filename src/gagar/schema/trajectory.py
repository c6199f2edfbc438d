"""The Trajectory record (DESIGN.md §3): one sampled answer to one task, with what training needs.

A trajectories file is also a predictions file for the sandbox: every record carries
``instance_id``, ``model_patch`` and ``trajectory_id``.

Log-prob convention: ``old_logprobs[t]`` is ``log softmax(logits_t / temperature)[token_t]``, the
log-probability of the sampled token under the sampling distribution *before* top-p/top-k
truncation. The trainer recomputes ``log π_θ`` from ``logits / sampling.temperature`` the same way, so
the PPO ratio ``exp(log π_θ − old_logprobs)`` is exactly 1 for an unchanged policy. At temperature 1
(the default for RL rollouts) this is the policy's own unscaled distribution.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gagar.records import Record

__all__ = ["MaxNewTokens", "Message", "SamplingParams", "Temperature", "TopP", "Trajectory"]

# The sampling knobs, each with its bounds and its one default. Every settings model that offers a knob
# (SamplingParams here, ``rollout.*`` of the training config, the experiment's ``evaluation.*``) types its
# field with these and declares no default of its own; one that needs another value overrides it
# explicitly, saying why.

Temperature = Annotated[float, Field(default=1.0, gt=0.0)]
"""Softmax temperature of sampling; 1.0 samples (and takes log-probs) from the policy's own distribution."""
TopP = Annotated[float, Field(default=1.0, gt=0.0, le=1.0)]
"""Nucleus sampling mass; 1.0 samples from the full distribution."""
MaxNewTokens = Annotated[int, Field(default=256, ge=1)]
"""Most tokens one answer (or one turn of a multi-turn agent) may have."""


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str


class SamplingParams(BaseModel):
    """How answers are sampled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: Temperature
    """Softmax temperature; log-probs are taken at this temperature (see module docstring)."""
    top_p: TopP
    """Nucleus sampling mass; 1.0 samples from the full distribution."""
    max_new_tokens: MaxNewTokens
    """Most tokens one answer (or one turn) may have."""
    seed: int | None = None
    """Seed of the sampler; None leaves the generator's state as it is."""


class Trajectory(Record):
    """One trajectory: the prompt, the sampled response, token ids, old log-probs and the patch."""

    trajectory_id: str = Field(min_length=1)
    instance_id: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    step: int = Field(default=0, ge=0)
    messages: list[Message] = Field(default_factory=list)
    """The conversation; the last assistant message(s) are the response."""
    prompt: str = ""
    """The prompt text as the model saw it (chat template applied)."""
    response: str = ""
    """The decoded response (all turns, tool output included, for multi-turn)."""
    prompt_token_ids: list[int] = Field(default_factory=list)
    response_token_ids: list[int] = Field(default_factory=list)
    old_logprobs: list[float] = Field(default_factory=list)
    """Per response token: log-prob under the sampling policy (0.0 where loss_mask is 0)."""
    loss_mask: list[int] = Field(default_factory=list)
    """Per response token: 1 for tokens the policy produced, 0 for tool output."""
    model_patch: str = ""
    """Unified diff of the answer; empty if the answer did not parse."""
    parse_error: str | None = None
    """Why the answer did not parse; None when it did."""
    turns: int = Field(default=1, ge=1)
    """Assistant turns: 1 for a single-shot answer."""
    tool_calls: dict[str, int] = Field(default_factory=dict)
    """Multi-turn: the commands of the assistant turns by kind (VIEW, SEARCH, EDIT, RUN_TESTS,
    SUBMIT, ``invalid``); empty for a single-shot answer."""
    edits_reverted: int = Field(default=0, ge=0)
    """Multi-turn: applied edit blocks whose replacement text a later edit took out again."""
    n_prompt_tokens: int = Field(default=0, ge=0)
    n_response_tokens: int = Field(default=0, ge=0)
    finish_reason: str | None = None
    """Single-shot: ``stop`` (end token) or ``length`` (hit max_new_tokens). Multi-turn: ``submit``,
    ``max_turns``, ``length`` (token budget), ``time`` (wall-clock budget), ``template`` or ``sandbox``
    (its session failed: see ``infra_error``)."""
    infra_error: str | None = None
    """Why the platform, not the policy, ended this trajectory (a tool session that did not start or
    was lost); None when nothing failed. Such a trajectory is judged ``infra_error`` without running
    its patch, and leaves its group as any infra error does."""
    policy_version: str | None = None
    """Which weights sampled it (a checkpoint path or adapter name)."""
    sampling: SamplingParams = Field(default_factory=SamplingParams)

    @model_validator(mode="after")
    def _per_token_lists_align(self) -> Trajectory:
        n = len(self.response_token_ids)
        for name in ("old_logprobs", "loss_mask"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} response tokens")
        if self.n_response_tokens != n or self.n_prompt_tokens != len(self.prompt_token_ids):
            raise ValueError("n_prompt_tokens/n_response_tokens disagree with the token id lists")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask entries must be 0 or 1")
        return self
