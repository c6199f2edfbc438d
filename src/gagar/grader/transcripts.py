"""Teacher transcripts: the agentic loop the LLM grader should run on a group, built from the oracle.

For each labelled group the teacher lays out the shared workspace, presents the candidates under
aliases in an order shuffled per example, calls the inspection tools through the very session the
:class:`~gagar.grader.llm.LLMGrader` uses (so every tool output is the real one from the workspace),
and ends with a note per candidate per axis, from the oracle
(:func:`gagar.tasks.oracle.score_patch`), and the final JSON: a score per candidate, minus the
note's penalty, in alias order (copying numbers row by row is what a small model does well; sorting
them is left to the grader's code). Tool outputs are the compact all-candidates form and pairwise
diffs are cut short, so a transcript stays a few hundred tokens.

:func:`render` gives a transcript as the chat messages (chat API) and as the model's chat template
applied to them (completions API), and :func:`transcript_demos` tokenizes it for SFT with the loss on
the assistant turns only.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from gagar.grader.llm import SYSTEM_PROMPT, ToolCall, _Session, user_prompt
from gagar.grader.sft import LabelledGroup
from gagar.policy.demos import Demonstration
from gagar.sandbox.base import SandboxBackend
from gagar.tasks.oracle import PatchQuality, score_patch

__all__ = ["Transcript", "axis_note", "render", "teacher_transcript", "transcript_demos"]

OVERVIEW_TOOLS = ("diff_stats", "functions_touched", "out_of_scope_edits", "lint_delta")
"""What the teacher asks about every candidate at once, in this order."""
PAIRWISE_CHARS = 600
"""Pairwise diffs are cut at this many characters."""


@dataclass(frozen=True)
class Transcript:
    """One teacher conversation: chat messages (system, user, then assistant/user turns) and the aliases."""

    group_id: str
    messages: list[dict[str, str]]
    aliases: dict[str, str]
    """alias (c1..) -> trajectory id."""
    ranking: list[list[str]]
    """The teacher's tiers of aliases, best first."""

    def record(self, tokenizer: PreTrainedTokenizerBase | None = None) -> dict[str, Any]:
        """A JSON-able record: the chat messages and, given the tokenizer, the completions text."""
        out: dict[str, Any] = {"group_id": self.group_id, "aliases": self.aliases, "messages": self.messages}
        if tokenizer is not None:
            out["text"] = render(self, tokenizer)
        return out


def axis_note(alias: str, q: PatchQuality) -> str:
    """One line: the oracle's axes of one candidate and its penalty (no braces: the JSON comes after)."""
    a = q.axes
    fit = "yes" if a.solution_fit == 1.0 else f"{a.solution_fit:.0%}"
    penalty = 1.0 / q.quality - 1.0
    flags = f", flags {len(q.hack_flags)}" if q.hack_flags else ""
    return (
        f"{alias}: fit {fit}, precision +{a.implementation_precision}, size +{a.minimal_change}, "
        f"scope {a.out_of_scope}, style {a.code_style}{flags}; penalty {penalty:.1f}"
    )


def _tiers(labels: dict[str, float]) -> list[list[str]]:
    by_value: dict[float, list[str]] = {}
    for alias, value in labels.items():
        by_value.setdefault(round(value, 9), []).append(alias)
    return [sorted(by_value[v], key=lambda a: int(a[1:])) for v in sorted(by_value, reverse=True)]


def teacher_transcript(
    group: LabelledGroup,
    root: Path,
    rng: random.Random,
    backend: SandboxBackend | None = None,
    tool_output_chars: int = 1200,
) -> Transcript:
    """The teacher's conversation for ``group``, its workspace laid out under ``root``.

    Candidates get aliases in an order drawn from ``rng``. With a sandbox ``backend`` the teacher also
    re-runs the failing tests on its best candidate.

    Raises:
        ValueError: the task bundles no files (the oracle needs them).
    """
    if group.task.snapshot is None:
        raise ValueError(f"group {group.group_id}: the task bundles no files; the oracle cannot note it")
    ws = group.workspace(root)
    order = list(ws.passing_ids)
    rng.shuffle(order)
    aliases = {f"c{i}": tid for i, tid in enumerate(order, start=1)}
    patches = {c.trajectory_id: c.patch for c in group.candidates}
    quality = {a: score_patch(group.task, patches[t]) for a, t in aliases.items()}
    session = _Session(ws, aliases, backend, tool_output_chars, {a: [] for a in aliases})
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_prompt(ws, aliases)},
    ]
    tiers = _tiers({a: q.quality for a, q in quality.items()})
    best = [a for tier in tiers for a in tier]
    calls = [ToolCall(tool=t) for t in OVERVIEW_TOOLS]
    calls.append(ToolCall(tool="pairwise_diff", args={"a": best[0], "b": best[1]}))
    if backend is not None and group.task.FAIL_TO_PASS:
        calls.append(
            ToolCall(tool="run_tests", args={"candidate": best[0], "tests": group.task.FAIL_TO_PASS[:3]})
        )
    for call in calls:
        result = session.call(call)
        if call.tool == "pairwise_diff" and len(result) > PAIRWISE_CHARS:
            result = result[:PAIRWISE_CHARS] + "\n..."
        messages.append(
            {"role": "assistant", "content": json.dumps(call.model_dump(), separators=(", ", ": "))}
        )
        messages.append({"role": "user", "content": f"TOOL RESULT {call.tool}: {result}"})
    notes = "\n".join(axis_note(a, quality[a]) for a in aliases)
    scores = {a: -round(1.0 / quality[a].quality - 1.0, 1) for a in aliases}  # minus the penalty of the note
    messages.append({"role": "assistant", "content": f"{notes}\n{json.dumps({'scores': scores})}"})
    return Transcript(group.group_id, messages, aliases, tiers)


def render(transcript: Transcript, tokenizer: PreTrainedTokenizerBase) -> str:
    """The whole conversation in the model's chat template (what a completions API is sent and returns)."""
    return tokenizer.apply_chat_template(transcript.messages, tokenize=False)


def _assistant_spans(text: str, messages: Sequence[dict[str, str]], end_marker: str) -> list[tuple[int, int]]:
    """Character spans of each assistant message's content plus the template's end marker after it."""
    spans, cursor = [], 0
    for m in messages:
        start = text.index(m["content"], cursor)
        cursor = start + len(m["content"])
        if m["role"] == "assistant":
            end = cursor + len(end_marker) if text.startswith(end_marker, cursor) else cursor
            spans.append((start, end))
    return spans


def transcript_demos(
    transcripts: Sequence[Transcript], tokenizer: PreTrainedTokenizerBase, max_tokens: int
) -> tuple[list[Demonstration], int]:
    """Tokenized transcripts with the loss on the assistant turns (and the end-of-turn token after each),
    and how many were dropped for exceeding ``max_tokens``."""
    end_marker = tokenizer.eos_token or ""
    demos, dropped = [], 0
    for t in transcripts:
        text = render(t, tokenizer)
        spans = _assistant_spans(text, t.messages, end_marker)
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        if len(ids) > max_tokens:
            dropped += 1
            continue
        mask = [any(s <= lo and hi <= e and hi > lo for s, e in spans) for lo, hi in offsets]
        first = mask.index(True)
        demos.append(
            Demonstration(
                t.group_id, list(ids[:first]), list(ids[first:]), noisy=False, answer_mask=mask[first:]
            )
        )
    return demos, dropped
