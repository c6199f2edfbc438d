"""The multi-turn agent format: a tool loop over chat messages, for models able to use it.

Each assistant turn starts with one command line:

- ``VIEW <path>``: show a file of the repository (the working copy, edits included)
- ``SEARCH <text>``: list ``path:line`` where the text occurs
- ``EDIT`` followed by SEARCH/REPLACE blocks: edit the working copy (parsed strictly)
- ``RUN_TESTS``: run the task's tests on the current patch (when a test runner is given)
- ``SUBMIT``: finish; the patch is the diff of the working copy

The answer to each command comes back as a ``tool`` message. The trajectory records every turn:
``response_token_ids`` is the whole conversation after the first prompt, ``loss_mask`` is 1 on the
tokens the policy sampled and 0 on tool output and chat scaffolding (whose ``old_logprobs`` are 0.0).
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

from gagar.policy.generation import GenerationBackend
from gagar.sandbox.edits import apply_edit_blocks, parse_edit_blocks
from gagar.schema.task import Task
from gagar.schema.trajectory import Message, SamplingParams, Trajectory
from gagar.tasks.diffs import make_diff

__all__ = ["SYSTEM_PROMPT", "TestRunner", "ToolWorkspace", "run_tool_loop"]

SYSTEM_PROMPT = (
    "You fix bugs in a repository. Start every reply with one command: VIEW <path>, SEARCH <text>, "
    "EDIT (then SEARCH/REPLACE blocks), RUN_TESTS or SUBMIT."
)

TestRunner = Callable[[Task, str], str]
"""Runs a task's tests on a patch and returns a short report for the model."""


class ToolWorkspace:
    """The working copy a tool loop edits, and the commands acting on it."""

    def __init__(self, task: Task, run_tests: TestRunner | None = None, max_view_chars: int = 4000) -> None:
        if task.snapshot is None:
            raise ValueError(f"{task.instance_id}: the tool loop needs a bundled snapshot")
        self.task, self.run_tests, self.max_view_chars = task, run_tests, max_view_chars
        self.files = dict(task.snapshot)
        self.submitted = False

    @property
    def patch(self) -> str:
        """Unified diff of the working copy against the task's repository."""
        return make_diff(self.task.snapshot or {}, self.files)

    def execute(self, reply: str) -> str:
        """Run the command that starts ``reply``; returns the tool message text."""
        head, _, body = reply.partition("\n")
        command, _, arg = head.strip().partition(" ")
        if command == "VIEW":
            text = self.files.get(arg.strip())
            return f"no file {arg.strip()!r}" if text is None else text[: self.max_view_chars]
        if command == "SEARCH":
            if not arg.strip():
                return "SEARCH needs a text"
            lines = (
                (p, n, line)
                for p, t in sorted(self.files.items())
                for n, line in enumerate(t.splitlines(), 1)
            )
            hits = [f"{p}:{n}" for p, n, line in lines if arg.strip() in line]
            return "\n".join(hits[:50]) or "no match"
        if command == "EDIT":
            try:
                self.files = apply_edit_blocks(self.files, parse_edit_blocks(body))
            except ValueError as exc:
                return f"edit refused: {exc}"
            return "edit applied"
        if command == "RUN_TESTS":
            return (
                "no test runner available"
                if self.run_tests is None
                else self.run_tests(self.task, self.patch)
            )
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


def run_tool_loop(
    task: Task,
    backend: GenerationBackend,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    trajectory_id: str,
    group_id: str,
    step: int = 0,
    max_turns: int = 8,
    max_total_tokens: int = 4096,
    run_tests: TestRunner | None = None,
    policy_version: str | None = None,
) -> Trajectory:
    """Sample one multi-turn trajectory for ``task`` (ends on SUBMIT, ``max_turns`` or the token limit)."""
    workspace = ToolWorkspace(task, run_tests)
    files = "\n".join(sorted(workspace.files))
    messages = [
        Message(role="system", content=SYSTEM_PROMPT),
        Message(role="user", content=f"{task.problem_statement.strip()}\n\nFiles:\n{files}"),
    ]
    rendered = _render(tokenizer, messages, True)
    prompt_ids = tokenizer.encode(rendered, add_special_tokens=False)
    response_ids: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    turns, reason, text = 0, "length", rendered
    while turns < max_turns and len(prompt_ids) + len(response_ids) < max_total_tokens:
        [[sample]] = backend.generate([prompt_ids + response_ids], params, 1)
        turns += 1
        response_ids += sample.token_ids
        logprobs += sample.logprobs
        mask += [1] * len(sample.token_ids)
        reply = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        text += tokenizer.decode(sample.token_ids)
        messages.append(Message(role="assistant", content=reply))
        messages.append(Message(role="tool", content=workspace.execute(reply)))
        if workspace.submitted:
            reason = "submit"
            break
        # The rest of the rendered conversation (end of turn, tool output, next generation prompt)
        # follows what the model sampled and is masked from the loss.
        after = _render(tokenizer, messages, True)
        if not after.startswith(text):
            raise ValueError(
                "the chat template rewrites earlier turns; the tool loop needs an append-only one"
            )
        scaffold = tokenizer.encode(after[len(text) :], add_special_tokens=False)
        text = after
        response_ids += scaffold
        logprobs += [0.0] * len(scaffold)
        mask += [0] * len(scaffold)
    patch = workspace.patch
    error = None if workspace.submitted and patch else ("empty patch" if workspace.submitted else "no SUBMIT")
    return Trajectory(
        trajectory_id=trajectory_id,
        instance_id=task.instance_id,
        group_id=group_id,
        step=step,
        messages=messages,
        prompt=rendered,
        response=tokenizer.decode(response_ids),
        prompt_token_ids=prompt_ids,
        response_token_ids=response_ids,
        old_logprobs=logprobs,
        loss_mask=mask,
        model_patch=patch if workspace.submitted else "",
        parse_error=error,
        turns=turns,
        n_prompt_tokens=len(prompt_ids),
        n_response_tokens=len(response_ids),
        finish_reason=reason,
        policy_version=policy_version,
        sampling=params,
    )
