"""Which agent samples trajectories, and the budgets of the multi-turn one (one settings model for
every sampling path: ``gagar rollout``, ``gagar train``, ``gagar policy eval``, the pipelines).

- ``single``: one SEARCH/REPLACE answer to a compact prompt (:mod:`gagar.policy.agent_format`);
- ``tool-loop``: a conversation of VIEW, SEARCH, EDIT, RUN_TESTS and SUBMIT turns
  (:mod:`gagar.policy.tool_loop`), bounded by ``max_turns``, ``max_tokens`` and ``max_seconds``;
- ``tool-call``: a conversation of native tool calls (``bash``, ``str_replace_editor``, ``submit``)
  rendered by the model's chat template, run in a sandboxed session per trajectory
  (:mod:`gagar.policy.tool_calls`), under the same budgets.
"""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "COMMANDS",
    "INVALID",
    "RAN_TESTS_KINDS",
    "SFT_CONFIG_FILE",
    "TOOL_CALL_KINDS",
    "AgentKind",
    "AgentSettings",
    "CallFormat",
    "fine_tuned_agent",
    "ran_tests",
]

COMMANDS = ("VIEW", "SEARCH", "EDIT", "RUN_TESTS", "SUBMIT")
"""The tool loop's commands; each assistant turn starts with one."""
INVALID = "invalid"
"""The ``tool_calls`` key of a reply that starts with no known command."""
TOOL_CALL_KINDS = (
    "bash",
    "bash_tests",
    "view",
    "create",
    "str_replace",
    "insert",
    "undo_edit",
    "submit",
    "malformed",
)
"""The ``tool_calls`` keys of the tool-call agent: ``bash_tests`` is a ``bash`` call that runs the
tests, the editor's commands count by name, ``malformed`` a reply whose call did not parse or validate."""
RAN_TESTS_KINDS = ("RUN_TESTS", "bash_tests")
"""``tool_calls`` keys that ran the repository's visible tests, one per multi-turn agent."""


def ran_tests(tool_calls: dict[str, int]) -> bool:
    """Whether a trajectory with these ``tool_calls`` ran the visible tests (before it ended)."""
    return any(tool_calls.get(kind, 0) > 0 for kind in RAN_TESTS_KINDS)


class AgentKind(StrEnum):
    """How the policy answers a task."""

    SINGLE = "single"
    """One SEARCH/REPLACE answer to a compact prompt."""
    TOOL_LOOP = "tool-loop"
    """A multi-turn conversation over tools, ending on SUBMIT."""
    TOOL_CALL = "tool-call"
    """A multi-turn conversation of native tool calls in a sandboxed session, ending on submit."""


class CallFormat(StrEnum):
    """How a tool call is written, where the chat template does not render tools itself."""

    JSON = "json"
    """Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, code JSON-escaped."""
    XML = "xml"
    """Qwen3-Coder: ``<tool_call><function=NAME><parameter=KEY>value</parameter></function></tool_call>``,
    each value written as it is (code unescaped)."""


class AgentSettings(BaseModel):
    """The agent and its per-trajectory budgets (the budgets apply to the multi-turn agents only)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: AgentKind = AgentKind.SINGLE
    """single (one SEARCH/REPLACE answer), tool-loop (multi-turn, own commands, SUBMIT) or tool-call
    (multi-turn, native tool calls in a sandboxed session, submit)."""
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
    call_format: CallFormat = CallFormat.JSON
    """Tool-call agent: the call format the tools section asks for when the chat template does not
    render tools (SmolLM2's); replies are read in either. Demonstrations are written in it, so a policy
    is sampled with the format it was fine-tuned on."""
    show_definition: bool = False
    """Tool-call agent: the first message also shows the definition of the function the statement
    names, as the single-turn prompt does (localisation up front, as Agentless starts); the agent still
    reads and edits through its tools."""
    command_timeout_s: float = Field(default=30.0, gt=0)
    """Wall-clock limit of one ``bash`` call of the tool-call agent; a call that overruns is killed
    with its session's processes and answered as timed out (the working tree stays)."""

    def prompt_differences(self, other: AgentSettings) -> dict[str, tuple[str, str]]:
        """The settings that change what the model reads and is asked to write (its prompts, tools
        section and call format) in which ``other`` differs from these: name to (this, other) value.
        Budgets are left out: a policy may be sampled with other budgets than it was fine-tuned with."""
        if self.kind is not other.kind:
            return {"kind": (self.kind.value, other.kind.value)}
        shaping = ["call_format", "show_definition"] if self.kind is AgentKind.TOOL_CALL else []
        return {
            name: (str(mine).lower(), str(theirs).lower())
            for name in shaping
            if (mine := getattr(self, name)) != (theirs := getattr(other, name))
        }


SFT_CONFIG_FILE = "sft_config.json"
"""What ``gagar policy sft`` records in the policy directory: its settings, the agent among them."""


def fine_tuned_agent(policy: str | os.PathLike[str]) -> AgentSettings | None:
    """The agent a policy directory was fine-tuned for (its :data:`SFT_CONFIG_FILE`); None where none
    is recorded or readable (a pretrained model, an RL checkpoint, an older SFT run)."""
    try:
        recorded = json.loads((Path(policy) / SFT_CONFIG_FILE).read_text())["agent"]
        return AgentSettings.model_validate(recorded)
    except (OSError, ValueError, KeyError, TypeError):  # a ValidationError is a ValueError
        return None
