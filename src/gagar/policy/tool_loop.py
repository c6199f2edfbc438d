"""The multi-turn agent: a tool loop over chat messages, batched across a generation batch.

Each assistant turn starts with one command line:

- ``VIEW <path>``: show a file of the repository (the working copy, edits included)
- ``SEARCH <text>``: list ``path:line`` where the text occurs
- ``EDIT`` followed by SEARCH/REPLACE blocks: edit the working copy (parsed strictly)
- ``RUN_TESTS``: run the repository's own tests on the current patch
  (:mod:`gagar.policy.visible_tests`: never the judge's hidden tests)
- ``SUBMIT``: finish; the patch is the diff of the working copy

The answer to each command comes back as a ``tool`` message. :func:`run_tool_loops` advances every
live conversation of the batch by one turn per engine call (one ``generate`` with all of their
prompts), then runs the turn's RUN_TESTS requests together in one sandbox call. A conversation
ends on SUBMIT (``finish_reason="submit"``), after ``max_turns`` turns (``max_turns``), when its
token budget is spent (``length``), when its wall-clock budget is (``time``), or when what it
sampled does not survive decoding and re-rendering (``template``, rare: a special token mid-reply).

The trajectory records every turn: ``messages`` is the whole conversation, ``response_token_ids``
every token after the first prompt, ``loss_mask`` 1 on the tokens the policy sampled and 0 on tool
output and chat scaffolding (whose ``old_logprobs`` are 0.0), ``tool_calls`` the commands by kind.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from transformers import PreTrainedTokenizerBase

from gagar.policy.agent import COMMANDS, INVALID, AgentSettings
from gagar.policy.agent_format import relevant_files, resolve_paths
from gagar.policy.generation import GenerationBackend, Sample
from gagar.sandbox.edits import apply_edit_blocks, parse_edit_blocks
from gagar.schema.task import Task
from gagar.schema.trajectory import Message, SamplingParams, Trajectory
from gagar.tasks.diffs import make_diff

__all__ = [
    "COMMANDS",
    "INVALID",
    "SYSTEM_PROMPT",
    "CommandKit",
    "ConversationTools",
    "TestRunner",
    "ToolKit",
    "ToolWorkspace",
    "check_append_only",
    "command_of",
    "first_prompt",
    "run_tool_loop",
    "run_tool_loops",
]

SYSTEM_PROMPT = (
    "You fix bugs in a repository. Start every reply with one command: VIEW <path>, SEARCH <text>, "
    "EDIT (then SEARCH/REPLACE blocks), RUN_TESTS or SUBMIT."
)
log = logging.getLogger(__name__)


TestRunner = Callable[[Sequence[tuple[Task, str]]], list[str]]
"""Runs the visible tests of each (task, patch) and returns one short report each, in order."""


def command_of(reply: str) -> str:
    """The command a reply starts with, or :data:`INVALID`."""
    words = reply.lstrip().split(maxsplit=1)
    return words[0] if words and words[0] in COMMANDS else INVALID


class ConversationTools(Protocol):
    """What one conversation acts on: the tool loop's in-memory working copy, or a sandboxed session."""

    submitted: bool
    infra_error: str | None
    """Why the platform cannot go on with the conversation (its session did not start or was lost);
    None while the tools work. The conversation then ends (``sandbox``), its trajectory an infra error."""

    @property
    def patch(self) -> str:
        """The diff of the working copy against the task's repository."""
        ...

    @property
    def edits_reverted(self) -> int:
        """Applied edits whose replacement no longer stands in the working copy."""
        ...

    def close(self) -> None:
        """Release what the conversation holds (its patch stays readable); idempotent."""
        ...


class ToolKit(Protocol):
    """How a multi-turn agent's conversations start, render and get their tool answers
    (:class:`CommandKit` for the tool loop, :class:`gagar.policy.tool_calls.ToolCallKit` for native calls)."""

    submit_kind: str
    """The ``tool_calls`` key of the call that ends a conversation."""

    def first_messages(self, task: Task) -> list[Message]:
        """The system and user messages a conversation starts from."""
        ...

    def render(
        self, tokenizer: PreTrainedTokenizerBase, messages: list[Message], generation_prompt: bool
    ) -> str:
        """The conversation as the model reads it."""
        ...

    def open(self, task: Task) -> ConversationTools:
        """The tools of a new conversation (called as it goes live)."""
        ...

    def kind_of(self, reply: str) -> str:
        """The ``tool_calls`` key of ``reply``."""
        ...

    def answer(self, turn: Sequence[tuple[ConversationTools, str]]) -> list[str]:
        """The tool answer to each (conversation's tools, reply) of one engine call, in order."""
        ...


class ToolWorkspace:
    """The working copy a conversation edits, and the commands acting on it (RUN_TESTS aside: it
    needs the batch's test runner, see :func:`run_tool_loops`)."""

    def __init__(self, task: Task, max_tool_chars: int = 1500) -> None:
        if task.snapshot is None:
            raise ValueError(f"{task.instance_id}: the tool loop needs a bundled snapshot")
        self.task, self.max_tool_chars = task, max_tool_chars
        self.files = dict(task.snapshot)
        self.submitted = False
        self.infra_error: str | None = None  # an in-memory copy does not fail
        self.edits: list[tuple[str, str]] = []
        self.close = lambda: None  # nothing to release: the working copy is in memory
        """(path, replace text) of every applied edit block, in order."""

    @property
    def patch(self) -> str:
        """Unified diff of the working copy against the task's repository."""
        return make_diff(self.task.snapshot or {}, self.files)

    @property
    def edits_reverted(self) -> int:
        """Applied edit blocks whose replacement text no longer stands in the working copy."""
        return sum(bool(r.strip()) and r not in self.files.get(p, "") for p, r in self.edits)

    def _resolve(self, path: str) -> str | None:
        """``path``, or the one file with its file name when it does not exist (a small model often
        gets the package directory wrong and the module right: as the single-shot parser, and as the
        edit blocks here, :func:`gagar.policy.agent_format.resolve_paths`)."""
        if path in self.files:
            return path
        name = path.rsplit("/", 1)[-1]
        same = [p for p in self.files if p.rsplit("/", 1)[-1] == name]
        return same[0] if len(same) == 1 and name else None

    def _cut(self, text: str) -> str:
        limit = self.max_tool_chars
        return text if len(text) <= limit else text[: limit - 14] + "\n[… truncated]"

    def execute(self, reply: str) -> str:
        """Run the command that starts ``reply`` (not RUN_TESTS); returns the tool message text."""
        head, _, body = reply.lstrip().partition("\n")
        command, _, arg = head.strip().partition(" ")
        if command == "VIEW":
            path = self._resolve(arg.strip())
            if path is None:
                return f"no file {arg.strip()!r}"
            shown = self._cut(self.files[path])
            return shown if path == arg.strip() else f"(no file {arg.strip()!r}; showing {path})\n{shown}"
        if command == "SEARCH":
            if not arg.strip():
                return "SEARCH needs a text"
            lines = (
                (p, n, line)
                for p, t in sorted(self.files.items())
                for n, line in enumerate(t.splitlines(), 1)
            )
            hits = [f"{p}:{n}" for p, n, line in lines if arg.strip() in line]
            return self._cut("\n".join(hits[:50])) or "no match"
        if command == "EDIT":
            try:
                blocks = resolve_paths(parse_edit_blocks(body), self.files)
                self.files = apply_edit_blocks(self.files, blocks)
            except ValueError as exc:
                return self._cut(f"edit refused: {exc}")
            self.edits += [(b.path, b.replace) for b in blocks]
            return "edit applied"
        if command == "RUN_TESTS":
            return "no test runner available"
        if command == "SUBMIT":
            self.submitted = True
            return "submitted"
        return f"unknown command {head.strip()[:80]!r}: start with VIEW, SEARCH, EDIT, RUN_TESTS or SUBMIT"


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[Message], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        [m.model_dump(include={"role", "content"}) for m in messages],
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )


class CommandKit:
    """The tool loop's commands: an in-memory working copy per conversation, each turn's RUN_TESTS run
    together in one ``run_tests`` call."""

    submit_kind = "SUBMIT"

    def __init__(self, run_tests: TestRunner | None, max_tool_chars: int) -> None:
        self.run_tests, self.max_tool_chars = run_tests, max_tool_chars

    def first_messages(self, task: Task) -> list[Message]:
        return first_prompt(task)

    def render(
        self, tokenizer: PreTrainedTokenizerBase, messages: list[Message], generation_prompt: bool
    ) -> str:
        return _render(tokenizer, messages, generation_prompt)

    def open(self, task: Task) -> ToolWorkspace:
        return ToolWorkspace(task, self.max_tool_chars)

    def kind_of(self, reply: str) -> str:
        return command_of(reply)

    def answer(self, turn: Sequence[tuple[ConversationTools, str]]) -> list[str]:
        answers: list[str | None] = [None] * len(turn)
        testing = [i for i, (_, reply) in enumerate(turn) if command_of(reply) == "RUN_TESTS"]
        if self.run_tests is not None and testing:
            jobs = [(turn[i][0], turn[i][0].patch) for i in testing]
            reports = self.run_tests([(ws.task, patch) for ws, patch in jobs])  # type: ignore[attr-defined]
            for i, report in zip(testing, reports, strict=True):
                answers[i] = report
        return [
            a if a is not None else ws.execute(reply)  # type: ignore[attr-defined]
            for a, (ws, reply) in zip(answers, turn, strict=True)
        ]


def first_prompt(task: Task) -> list[Message]:
    """The system and user messages a conversation starts from: the statement, the file list and,
    last, the file the statement most likely concerns (:func:`gagar.policy.agent_format.relevant_files`,
    as the single-shot prompt picks it; a small model copies a path best from right before its answer)."""
    files = "\n".join(sorted(task.snapshot or {}))
    likely = relevant_files(task)
    hint = f"\n\nMost relevant: {likely[0]}" if likely else ""
    return [
        Message(role="system", content=SYSTEM_PROMPT),
        Message(role="user", content=f"{task.problem_statement.strip()}\n\nFiles:\n{files}{hint}"),
    ]


@dataclass
class _Conversation:
    """One live conversation: what the model saw so far and what training will need."""

    task: Task
    trajectory_id: str
    group_id: str
    messages: list[Message]
    prompt: str
    prompt_ids: list[int]
    text: str
    """The rendered conversation so far, as the model saw it."""
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: int = 0
    tool_calls: Counter[str] = field(default_factory=Counter)
    finish: str | None = None
    """Why it ended; None while it is live."""
    deadline: float | None = None
    """When its wall-clock budget ends (clock time, set as it joins the live ones); None: no limit."""
    tools: ConversationTools | None = None
    """What it acts on, opened as it joins the live ones."""

    @property
    def workspace(self) -> ConversationTools:
        assert self.tools is not None, "a conversation's tools open as it goes live"
        return self.tools

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def append(self, ids: list[int], logprobs: list[float] | None) -> None:
        """Sampled tokens (with their log-probs, mask 1) or scaffolding (``logprobs=None``, mask 0)."""
        self.response_ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [int(logprobs is not None)] * len(ids)


def _start(
    task: Task,
    trajectory_id: str,
    group_id: str,
    tokenizer: PreTrainedTokenizerBase,
    agent: AgentSettings,
    kit: ToolKit,
) -> _Conversation:
    if task.snapshot is None and isinstance(kit, CommandKit):
        raise ValueError(f"{task.instance_id}: the tool loop needs a bundled snapshot")
    messages = kit.first_messages(task)
    rendered = kit.render(tokenizer, messages, True)
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    if len(ids) >= agent.max_tokens:
        raise ValueError(
            f"{task.instance_id}: the first prompt has {len(ids)} tokens, max_tokens is {agent.max_tokens}"
        )
    return _Conversation(task, trajectory_id, group_id, messages, rendered, ids, rendered)


def _answer(
    c: _Conversation, answer: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int, kit: ToolKit
) -> None:
    """Append the tool answer and the next generation prompt (masked); end the conversation when
    it is over or its budget would be spent."""
    c.messages.append(Message(role="tool", content=answer))
    if c.workspace.submitted:
        c.finish = "submit"
        return
    after = kit.render(tokenizer, c.messages, True)
    if not after.startswith(c.text):  # the sampled text does not survive decoding and re-rendering
        log.warning("%s: the rendered conversation no longer starts with what was sampled", c.trajectory_id)
        c.finish = "template"
        return
    scaffold = tokenizer.encode(after[len(c.text) :], add_special_tokens=False)
    if c.n_tokens + len(scaffold) >= max_tokens:
        c.finish = "length"
        return
    c.text = after
    c.append(scaffold, None)


def check_append_only(tokenizer: PreTrainedTokenizerBase, task: Task, kit: ToolKit | None = None) -> None:
    """Raises ValueError unless the chat template renders a conversation by appending to it: the
    tool loop keeps the tokens the model saw and appends each turn's scaffolding."""
    kit = kit or CommandKit(None, 1500)
    messages = [*kit.first_messages(task), Message(role="assistant", content="VIEW README.md")]
    before = kit.render(tokenizer, messages, False)
    after = kit.render(tokenizer, [*messages, Message(role="tool", content="text")], True)
    if not after.startswith(before):
        raise ValueError("the chat template rewrites earlier turns; the tool loop needs an append-only one")


def _trajectory(
    c: _Conversation,
    tokenizer: PreTrainedTokenizerBase,
    step: int,
    params: SamplingParams,
    policy_version: str | None,
) -> Trajectory:
    submitted, patch = c.workspace.submitted, c.workspace.patch  # reading the patch may fail the session
    error = None if submitted and patch else ("empty patch" if submitted else "no SUBMIT")
    return Trajectory(
        trajectory_id=c.trajectory_id,
        instance_id=c.task.instance_id,
        group_id=c.group_id,
        step=step,
        messages=c.messages,
        prompt=c.prompt,
        response=tokenizer.decode(c.response_ids),
        prompt_token_ids=c.prompt_ids,
        response_token_ids=c.response_ids,
        old_logprobs=c.logprobs,
        loss_mask=c.mask,
        model_patch=patch if submitted else "",
        parse_error=error,
        turns=max(c.turns, 1),
        n_prompt_tokens=len(c.prompt_ids),
        n_response_tokens=len(c.response_ids),
        finish_reason=c.finish if c.workspace.infra_error is None else "sandbox",
        infra_error=c.workspace.infra_error,
        policy_version=policy_version,
        sampling=params,
        tool_calls=dict(c.tool_calls),
        edits_reverted=c.workspace.edits_reverted,
    )


def _sample_turn(
    backend: GenerationBackend, live: list[_Conversation], params: SamplingParams, max_tokens: int
) -> list[Sample]:
    """One sample per live conversation: one engine call for every conversation with a whole turn
    (``params.max_new_tokens``) of its token budget left, one more per shorter remainder, so that no
    request asks a server for more than the conversation's budget (vLLM refuses a prompt plus
    ``max_tokens`` beyond its ``--max-model-len``)."""
    caps = [min(params.max_new_tokens, max_tokens - c.n_tokens) for c in live]
    out: list[Sample | None] = [None] * len(live)
    for cap in sorted(set(caps), reverse=True):
        rows = [i for i, c in enumerate(caps) if c == cap]
        call = params if cap == params.max_new_tokens else params.model_copy(update={"max_new_tokens": cap})
        prompts = [live[i].prompt_ids + live[i].response_ids for i in rows]
        for i, [sample] in zip(rows, backend.generate(prompts, call, 1), strict=True):
            out[i] = sample
    return [s for s in out if s is not None]


def run_tool_loops(
    jobs: Sequence[tuple[Task, str, str]],
    backend: GenerationBackend,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    agent: AgentSettings,
    run_tests: TestRunner | None = None,
    step: int = 0,
    policy_version: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    kit: ToolKit | None = None,
) -> list[Trajectory]:
    """One multi-turn trajectory per ``(task, trajectory_id, group_id)`` job, in job order.

    Each engine call advances every live conversation by one turn; call ``k`` is seeded
    ``params.seed + 10_007 * k`` when a seed is set. At most ``agent.max_live`` conversations are
    live at once: the others wait in job order and join as conversations end, and a conversation's
    wall-clock budget (``agent.max_seconds``) counts from its first engine call. With every
    conversation live (the default), call ``k`` is everyone's turn ``k``.
    ``params.max_new_tokens`` bounds one turn; ``agent`` bounds the conversation. Without
    ``run_tests``, RUN_TESTS answers that no test runner is available. ``kit`` (default: the tool
    loop's commands, :class:`CommandKit`) renders the conversations and answers their turns; every
    conversation's tools are closed as it ends, and all of them on any exit (an exception included).

    Raises:
        ValueError: a task without a snapshot, a first prompt over ``agent.max_tokens``, or a chat
            template that rewrites earlier turns.
    """
    kit = kit or CommandKit(run_tests, agent.max_tool_chars)
    if jobs:
        check_append_only(tokenizer, jobs[0][0], kit)
    convs = [_start(task, tid, gid, tokenizer, agent, kit) for task, tid, gid in jobs]
    try:
        _advance(convs, backend, tokenizer, params, agent, kit, clock)
    finally:
        for c in convs:
            if c.tools is not None:
                c.tools.close()
    return [_trajectory(c, tokenizer, step, params, policy_version) for c in convs]


def _retire(live: list[_Conversation]) -> list[_Conversation]:
    """The conversations still live; the tools of those that ended are closed."""
    for c in live:
        if c.finish is not None and c.tools is not None:
            c.tools.close()
    return [c for c in live if c.finish is None]


def _advance(
    convs: list[_Conversation],
    backend: GenerationBackend,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    agent: AgentSettings,
    kit: ToolKit,
    clock: Callable[[], float],
) -> None:
    """Run every conversation to its end (:func:`run_tool_loops`)."""
    stops = set(backend.stop_token_ids)
    waiting = deque(convs)
    live: list[_Conversation] = []
    for call in itertools.count():
        while waiting and (agent.max_live is None or len(live) < agent.max_live):
            c = waiting.popleft()
            c.tools = kit.open(c.task)
            live.append(c)
            if agent.max_seconds is not None:
                c.deadline = clock() + agent.max_seconds
        now = None if agent.max_seconds is None else clock()
        for c in live:
            if c.turns >= agent.max_turns:
                c.finish = "max_turns"
            elif c.deadline is not None and now is not None and now >= c.deadline:
                c.finish = "time"
        live = _retire(live)
        if not live:
            if waiting:
                continue
            break
        call_params = (
            params if params.seed is None else params.model_copy(update={"seed": params.seed + 10_007 * call})
        )
        samples = _sample_turn(backend, live, call_params, agent.max_tokens)
        acting: list[tuple[_Conversation, str]] = []
        for c, sample in zip(live, samples, strict=True):
            c.turns += 1
            room = agent.max_tokens - c.n_tokens
            ids, logprobs = sample.token_ids[:room], sample.logprobs[:room]
            c.append(ids, logprobs)
            c.text += tokenizer.decode(ids)
            content = ids[:-1] if ids and ids[-1] in stops else ids
            reply = tokenizer.decode(content)
            c.messages.append(Message(role="assistant", content=reply))
            command = kit.kind_of(reply)
            c.tool_calls[command] += 1
            if c.n_tokens >= agent.max_tokens and not (
                command == kit.submit_kind and sample.finish_reason == "stop"
            ):
                c.finish = "length"  # the budget is spent: the command is not run
            else:
                acting.append((c, reply))
        answers = kit.answer([(c.workspace, reply) for c, reply in acting])
        for (c, _), answer in zip(acting, answers, strict=True):
            if c.workspace.infra_error is not None:
                c.finish = "sandbox"  # the platform failed, not the model: nothing more is shown or judged
            else:
                _answer(c, answer, tokenizer, agent.max_tokens, kit)
        live = _retire(live)


def run_tool_loop(
    task: Task,
    backend: GenerationBackend,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    trajectory_id: str,
    group_id: str,
    agent: AgentSettings | None = None,
    run_tests: TestRunner | None = None,
    step: int = 0,
    policy_version: str | None = None,
) -> Trajectory:
    """One conversation for ``task`` (:func:`run_tool_loops` with one job)."""
    [trajectory] = run_tool_loops(
        [(task, trajectory_id, group_id)], backend, tokenizer, params, agent or AgentSettings(),
        run_tests, step, policy_version,
    )  # fmt: skip
    return trajectory
