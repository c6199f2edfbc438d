"""Which agent samples trajectories, and the budgets of the multi-turn one (one settings model for
every sampling path: ``gagar rollout``, ``gagar train``, ``gagar policy eval``, the pipelines).

- ``single``: one SEARCH/REPLACE answer to a compact prompt (:mod:`gagar.policy.agent_format`);
- ``tool-loop``: a conversation of VIEW, SEARCH, EDIT, RUN_TESTS and SUBMIT turns
  (:mod:`gagar.policy.tool_loop`), bounded by ``max_turns``, ``max_tokens`` and ``max_seconds``.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["COMMANDS", "INVALID", "AgentKind", "AgentSettings"]

COMMANDS = ("VIEW", "SEARCH", "EDIT", "RUN_TESTS", "SUBMIT")
"""The tool loop's commands; each assistant turn starts with one."""
INVALID = "invalid"
"""The ``tool_calls`` key of a reply that starts with no known command."""


class AgentKind(StrEnum):
    """How the policy answers a task."""

    SINGLE = "single"
    """One SEARCH/REPLACE answer to a compact prompt."""
    TOOL_LOOP = "tool-loop"
    """A multi-turn conversation over tools, ending on SUBMIT."""


class AgentSettings(BaseModel):
    """The agent and its per-trajectory budgets (the budgets apply to ``tool-loop`` only)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: AgentKind = AgentKind.SINGLE
    """single (one SEARCH/REPLACE answer) or tool-loop (multi-turn, tools, SUBMIT)."""
    max_turns: int = Field(default=8, ge=1)
    """Most assistant turns of one conversation."""
    max_tokens: int = Field(default=2048, ge=16)
    """Most tokens of one conversation: first prompt, every turn and every tool answer together
    (keep it within the model's context length)."""
    max_seconds: float | None = Field(default=600.0, gt=0)
    """Wall-clock budget of one conversation, counted from its first engine call (its turns wait on
    the engine calls and test runs of every live conversation); unset: no limit."""
    max_live: int | None = Field(default=None, ge=1)
    """Most conversations advanced together, one engine call a turn; the rest of a generation batch
    waits and joins as conversations end, its clock not yet started. Unset: the whole batch at once
    (the most throughput; with a slow engine a turn then takes as long as the whole batch's)."""
    max_tool_chars: int = Field(default=1500, ge=80)
    """Most characters of one tool answer (a viewed file, search hits, a test report); the rest is cut."""
