"""Multi-turn SFT demonstrations of the tool-call agent, replayed through real sessions.

Each demonstration is a script of native tool calls (:mod:`gagar.policy.tool_calls`) replayed through
the real conversation loop and a real sandboxed session per task (:mod:`gagar.sandbox.session`), so
every tool answer (the numbered view, the editor's refusal, the test run's output), the template's
rendering and the loss mask are exactly a rollout's::

    str_replace_editor view <the file in a wrong folder>     (wrong_path_share of them: refused, naming...)
    str_replace_editor view <the file the answer changes>    (...the file, which is then viewed)
    str_replace_editor str_replace <a misquoted old_str>     (refusal_share of them: refused, the refusal
                                                             showing the most similar lines...)
    str_replace_editor view <the lines around the edit>      (...viewed again only when those are others)
    str_replace_editor str_replace <old_str> <new_str>       one per edit block (create for a new file)
    bash python -m pytest -q                                 the repository's own tests, really run
    submit

The calls made wrong on purpose (the wrong folder, the misquote) stay in the context, so the model
learns to recover from the refusal, but carry no loss, so it does not learn to make them (trained on,
the misquote was learned: docs/results/tool-call-agent.md).

A demonstration is kept only when it ends on submit within the budgets and its working tree's diff is
the answer's. Building them needs the local sandbox (root, bubblewrap), as a rollout of this agent does.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Sequence
from typing import NamedTuple

from transformers import PreTrainedTokenizerBase

from gagar.policy.agent import AgentSettings, CallFormat
from gagar.policy.demos import DemoAnswer, Demonstration
from gagar.policy.tool_calls import ToolCallKit, call_text
from gagar.policy.tool_demos import ReplayBackend, replay_refusal
from gagar.policy.tool_loop import check_append_only, run_tool_loops
from gagar.sandbox.edits import EditBlock, parse_edit_blocks
from gagar.sandbox.session_editor import closest_lines
from gagar.schema.trajectory import SamplingParams

__all__ = [
    "REFUSAL_SHARE",
    "WRONG_PATH_SHARE",
    "DemoScript",
    "demo_calls",
    "misquote",
    "tool_call_demos",
    "untrained_turns",
    "wrong_folder",
]

REFUSAL_SHARE = 0.3
"""Share of demonstrations whose first edit misquotes the file, is refused, and is redone after a view."""
WRONG_PATH_SHARE = 0.2
"""Share of demonstrations whose first view names the file in a folder that does not exist, and whose
next view follows the editor's refusal to the file of that name (the tool-call agent's commonest
refused call: docs/results/tool-call-agent.md)."""


class DemoScript(NamedTuple):
    """The assistant turns of one demonstration."""

    calls: list[str]
    mistakes: frozenset[int]
    """Indices of the calls made wrong on purpose: in the context, not under the loss."""


def misquote(search: str) -> str | None:
    """``search`` with its first indented line's indentation changed (a typical misquote), or None."""
    lines = search.split("\n")
    for i, line in enumerate(lines):
        stripped = line.lstrip(" ")
        if stripped and len(stripped) < len(line):
            lines[i] = " " * (len(line) - len(stripped) + 1) + stripped
            return "\n".join(lines)
    return None


def wrong_folder(path: str, files: Sequence[str]) -> str | None:
    """``path`` in a folder of the tree it is not in, when the tree holds no other file of its name (so
    the editor's refusal names exactly ``path``): at the top for a file in a folder, else under ``src/``."""
    name = path.rsplit("/", 1)[-1]
    if sum(f.rsplit("/", 1)[-1] == name for f in files) != 1:
        return None
    wrong = name if "/" in path else f"src/{name}"
    return None if wrong in files else wrong


def _edit_call(block: EditBlock, call_format: CallFormat) -> str:
    if not block.search:
        return call_text(
            "str_replace_editor", call_format, command="create", path=block.path, file_text=block.replace
        )
    return call_text(
        "str_replace_editor",
        call_format,
        command="str_replace",
        path=block.path,
        old_str=block.search,
        new_str=block.replace,
    )


def untrained_turns(mask: Sequence[bool | int], turns: Collection[int]) -> list[bool]:
    """``mask`` with the trained runs numbered in ``turns`` (0-based: the assistant turns, in order, each a
    run of trained tokens between untrained tool answers and scaffolding) set untrained."""
    out, turn = [], -1
    for i, trained in enumerate(mask):
        if trained and (i == 0 or not mask[i - 1]):
            turn += 1
        out.append(bool(trained) and turn not in turns)
    return out


def demo_calls(
    demo: DemoAnswer,
    rng: random.Random,
    refusal_share: float,
    wrong_path_share: float = 0.0,
    call_format: CallFormat = CallFormat.JSON,
    shown: tuple[str, int, str] | None = None,
) -> DemoScript:
    """The assistant turns of one demonstration (module docstring), its calls written in ``call_format``;
    without the first view when the first message shows (``shown``: file, first line, text) the lines
    it edits.

    Raises:
        ValueError: the answer has no edit block.
    """
    blocks = parse_edit_blocks(demo.answer)
    if not blocks:
        raise ValueError(f"{demo.task.instance_id}: the answer has no edit")
    first = blocks[0]
    snapshot = demo.task.snapshot or {}
    script, mistakes = [], set()
    seen = shown is not None and shown[0] == first.path and bool(first.search) and first.search in shown[2]
    wrong_path = wrong_folder(first.path, list(snapshot)) if first.path in snapshot and not seen else None
    if wrong_path is not None and rng.random() < wrong_path_share:
        mistakes.add(len(script))
        script.append(call_text("str_replace_editor", call_format, command="view", path=wrong_path))
    if not seen:
        script.append(call_text("str_replace_editor", call_format, command="view", path=first.path))
    text = snapshot.get(first.path, "")
    wrong = misquote(first.search) if first.search else None
    if wrong is not None and wrong not in text and first.search in text and rng.random() < refusal_share:
        line = text[: text.index(first.search)].count("\n") + 1
        last = line + first.search.count("\n") + 1
        mistakes.add(len(script))
        script.append(_edit_call(EditBlock(first.path, wrong, first.replace), call_format))
        if closest_lines(text, wrong) != (line, first.search.strip("\n")):  # the refusal shows other lines
            around = [max(line - 2, 1), last + 1]
            view = call_text(
                "str_replace_editor", call_format, command="view", path=first.path, view_range=around
            )
            script.append(view)
    script += [_edit_call(b, call_format) for b in blocks]
    calls = [
        *script,
        call_text("bash", call_format, command="python -m pytest -q"),
        call_text("submit", call_format),
    ]
    return DemoScript(calls, frozenset(mistakes))


def tool_call_demos(
    answers: Sequence[DemoAnswer],
    tokenizer: PreTrainedTokenizerBase,
    agent: AgentSettings,
    seed: int,
    sandbox: object | None = None,
    refusal_share: float = REFUSAL_SHARE,
    wrong_path_share: float = WRONG_PATH_SHARE,
) -> tuple[list[Demonstration], Counter[str]]:
    """One demonstration per answer, replayed in a session of ``sandbox`` (default: the local backend);
    the loss on the assistant turns only.

    Returns the demonstrations and counts: ``recovered`` (a call made wrong on purpose, refused, then
    the right one), ``dropped_too_long`` (no submit within ``agent``'s budgets), ``skipped`` (no script,
    or the replay did not reproduce the answer).
    """
    from gagar.sandbox.local import LocalBackend
    from gagar.sandbox.session import open_session

    box = sandbox if sandbox is not None else LocalBackend(workers=1)
    rng = random.Random(seed)
    kit = ToolCallKit(tokenizer, agent, lambda task: open_session(box, task, agent.max_tool_chars))
    demos: list[Demonstration] = []
    counts: Counter[str] = Counter()
    budget = agent.model_copy(update={"max_seconds": None})
    if answers:
        check_append_only(tokenizer, answers[0].task, kit)
    for demo in answers:
        try:
            shown = kit.shown_definition(demo.task)
            script = demo_calls(demo, rng, refusal_share, wrong_path_share, agent.call_format, shown)
        except ValueError:
            counts["skipped"] += 1
            continue
        job = (demo.task, demo.task.instance_id, demo.task.instance_id)
        try:
            [t] = run_tool_loops(
                [job], ReplayBackend(tokenizer, script.calls), tokenizer,
                SamplingParams(max_new_tokens=agent.max_tokens),
                budget.model_copy(update={"max_turns": len(script.calls)}), kit=kit,
            )  # fmt: skip
        except ValueError:
            counts["dropped_too_long"] += 1
            continue
        if (refused := replay_refusal(t, demo)) is not None:
            counts[refused] += 1
            continue
        counts["recovered"] += bool(script.mistakes)
        demos.append(
            Demonstration(
                demo.task.instance_id, t.prompt_token_ids, t.response_token_ids, demo.noisy,
                answer_mask=untrained_turns(t.loss_mask, script.mistakes),
            )
        )  # fmt: skip
    return demos, counts
