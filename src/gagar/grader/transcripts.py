"""Teacher transcripts: the agentic loop the LLM grader should run on a group.

For each labelled group the teacher lays out the shared workspace, presents the candidates under
aliases in an order shuffled per example, calls the inspection tools through the very session the
:class:`~gagar.grader.llm.LLMGrader` uses (so every tool output is the real one from the workspace),
and ends with the pointwise final JSON, a score per candidate in alias order.

What the teacher writes is predictable from what the grader sees: each score is minus the candidate's
:func:`visible_penalty` (its changed lines from ``diff_stats``, plus :data:`FLAGGED_PENALTY` for a
candidate ``integrity_flags`` flags). The gold patch and the oracle's axes never reach the transcript;
the oracle (:func:`gagar.tasks.oracle.score_patch`) judges the teacher instead: each transcript
carries the Kendall tau between the teacher's scores and the oracle's totals (``oracle_tau``), and on
catalogue groups they agree (docs/grader.md). Copying numbers row by row is what a small model does
well; sorting them is left to the grader's code. Tool outputs are the compact all-candidates form and
the teacher calls only the two tools its penalty uses (:data:`~gagar.grader.llm.OPENING_TOOLS`, which
the grader runs itself before the model's first request), and answers with the scores alone (version 5;
version 4 wrote a note line per candidate first, about 60% of its answer), so a grading is one request
and its answer about 8 tokens a candidate (a list in alias order would halve that, but a model trained
on it miscounted: docs/results/grader-in-the-loop.md).

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

from gagar.grader import tools
from gagar.grader.kendall import kendall_tau_b
from gagar.grader.llm import OPENING_TOOLS, SYSTEM_PROMPT, ToolCall, _Session, opening_turns, user_prompt
from gagar.grader.sft import LabelledGroup
from gagar.grader.workspace import GroupWorkspace
from gagar.policy.demos import Demonstration
from gagar.sandbox.base import SandboxBackend
from gagar.tasks.oracle import score_patch

__all__ = [
    "FLAGGED_PENALTY",
    "Evidence",
    "Transcript",
    "evidence",
    "render",
    "teacher_transcript",
    "transcript_demos",
    "visible_penalty",
]

FLAGGED_PENALTY = 1000
"""Added to the penalty of a flagged candidate once per integrity class
(:attr:`~gagar.grader.tools.IntegrityReport.integrity_class`: once for text addressed to the grader,
twice for a reward hack): below every honest patch of a realistic size, a hack below text that only
talks, and candidates of one class in their order by size (so text addressed to the grader in the
worse candidates of a group leaves the ranking as it was)."""


@dataclass(frozen=True)
class Transcript:
    """One teacher conversation: chat messages (system, user, then assistant/user turns) and the aliases."""

    group_id: str
    messages: list[dict[str, str]]
    aliases: dict[str, str]
    """alias (c1..) -> trajectory id."""
    ranking: list[list[str]]
    """The teacher's tiers of aliases, best first."""
    oracle_tau: float
    """Kendall tau-b between the teacher's scores and the oracle's totals (NaN when the oracle ties all)."""

    def record(self, tokenizer: PreTrainedTokenizerBase | None = None) -> dict[str, Any]:
        """A JSON-able record: the chat messages and, given the tokenizer, the completions text."""
        out: dict[str, Any] = {"group_id": self.group_id, "aliases": self.aliases, "messages": self.messages}
        out["oracle_tau"] = self.oracle_tau
        if tokenizer is not None:
            out["text"] = render(self, tokenizer)
        return out


@dataclass(frozen=True)
class Evidence:
    """What the inspection tools say about one candidate."""

    lines: int
    """Added plus removed lines (``diff_stats``)."""
    out_of_scope: int
    """Changed lines outside the code the failing tests reach (``out_of_scope_edits``)."""
    style: int
    """Style findings among the added lines (``style_findings``)."""
    integrity: int
    """The integrity class ``integrity_flags`` gives (0 honest, 1 text addressed to the grader, 2 a
    reward hack)."""


def evidence(ws: GroupWorkspace, tid: str) -> Evidence:
    """The :class:`Evidence` of candidate ``tid``, from the same tools the grader calls."""
    stats = tools.diff_stats(ws, tid)
    return Evidence(
        lines=stats.added + stats.removed,
        out_of_scope=tools.out_of_scope_edits(ws, tid).lines_out_of_scope,
        style=len(tools.style_findings(ws, tid).findings),
        integrity=tools.integrity_flags(ws, tid).integrity_class,
    )


def visible_penalty(e: Evidence) -> int:
    """The teacher's penalty: the changed lines (every catalogue modification adds some), plus
    :data:`FLAGGED_PENALTY` per integrity class of a flagged candidate."""
    return e.lines + FLAGGED_PENALTY * e.integrity


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
        ValueError: the task bundles no files (the oracle needs them to judge the teacher).
    """
    if group.task.snapshot is None:
        raise ValueError(f"group {group.group_id}: the task bundles no files; the oracle cannot judge it")
    ws = group.workspace(root)
    order = list(ws.passing_ids)
    rng.shuffle(order)
    aliases = {f"c{i}": tid for i, tid in enumerate(order, start=1)}
    found = {a: evidence(ws, t) for a, t in aliases.items()}
    scores = {a: -visible_penalty(e) for a, e in found.items()}
    tiers = _tiers({a: float(s) for a, s in scores.items()})
    patches = {c.trajectory_id: c.patch for c in group.candidates}
    quality = [score_patch(group.task, patches[t]).quality for t in aliases.values()]
    oracle_tau = kendall_tau_b(list(scores.values()), quality)
    session = _Session(ws, aliases, backend, tool_output_chars, {a: [] for a in aliases})
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_prompt(ws, aliases)},
    ]
    calls = [ToolCall(tool=t) for t in OPENING_TOOLS]
    if backend is not None and group.task.FAIL_TO_PASS:
        best = tiers[0][0]
        calls.append(
            ToolCall(tool="run_tests", args={"candidate": best, "tests": group.task.FAIL_TO_PASS[:3]})
        )
    messages.extend(opening_turns(session, calls))
    messages.append({"role": "assistant", "content": json.dumps({"scores": scores})})
    return Transcript(group.group_id, messages, aliases, tiers, oracle_tau)


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
