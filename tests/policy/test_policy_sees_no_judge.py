"""A policy cannot see its judge: no FAIL_TO_PASS test text reaches anything the policy is shown.

For every generated task of 300 (both splits, both bug families) this renders what a policy reads,
every way the project renders it: the single-turn prompt as rollouts and SFT build it, the same with
every non-test file shown whole, and the tool loop's first prompt; the tool loop can also VIEW and
SEARCH any file of the snapshot, so the snapshot itself is checked too.

The judge's text is what ``test_patch`` adds (its ``+`` lines, whole test functions):

- the name of every test it defines (each FAIL_TO_PASS test is one of them, checked);
- every added line, stripped, of at least ``MIN_LINE`` characters. Shorter lines are syntax any
  Python text holds (``)``, ``pass``, ``else:``); every line that states a test's input or
  expectation is longer (the shortest, ``assert _same(f(0), 0)``, has 21 characters). One exemption,
  by design of the task: the problem statement is the issue report, and it quotes the one failing
  call it reports, so a ``pytest.raises`` body that is exactly that quoted call is not judge text;
- the calls of the held-out checks (``f(249.99, 0.35)``): their inputs must appear nowhere at all.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

import pytest

from gagar.policy.agent import AgentSettings
from gagar.policy.agent_format import build_prompt
from gagar.policy.generation import Sample
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.tool_loop import run_tool_loop
from gagar.schema.task import Task
from gagar.schema.trajectory import SamplingParams
from gagar.tasks.diffs import parse_diff
from gagar.tasks.generate import generate_tasks

MIN_LINE = 8
PER_FAMILY = 75


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    families = [(s, m) for s in ("train", "heldout") for m in ("catalogue", "all")]
    return [t for s, m in families for t in generate_tasks(PER_FAMILY, 41, s, verify=False, mutations=m)]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tokenizer(tasks: list[Task]):
    return train_tokenizer([t for task in tasks[:: len(tasks) // 20] for t in task.snapshot.values()], 600)


class SubmitBackend:
    """A model that submits at once: the tool loop renders its first prompt and stops."""

    def __init__(self, tokenizer) -> None:
        self.ids = [*tokenizer.encode("SUBMIT", add_special_tokens=False), tokenizer.eos_token_id]
        self.stop_token_ids = (tokenizer.eos_token_id,)

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        return [[Sample(self.ids, [0.0] * len(self.ids), "stop")] for _ in prompts]


def judge_text(task: Task) -> tuple[set[str], set[str], set[str]]:
    """(test names, lines, held-out calls) that ``task.test_patch`` adds (module docstring)."""
    added = "".join(
        text
        for fp in parse_diff(task.test_patch)
        for hunk in fp.hunks
        for tag, text in hunk.lines
        if tag == "+"
    )
    tests = [node for node in ast.parse(added).body if isinstance(node, ast.FunctionDef)]
    names = {node.name for node in tests}
    reported = set(re.findall(r"`([^`\n]+)`", task.problem_statement))
    lines = {line.strip() for line in added.splitlines() if len(line.strip()) >= MIN_LINE}
    assert len(lines & reported) <= 1, lines & reported  # at most the one reported call
    held_out = {test.split("::")[1] for test in task.held_out_checks}
    function = task.bug_location.rsplit("::", 1)[1]
    calls = {
        ast.get_source_segment(added, call)
        for node in tests
        if node.name in held_out
        for call in ast.walk(node)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == function
    }
    assert {t.split("::")[1] for t in task.FAIL_TO_PASS} <= names  # the check is not vacuous
    assert len(calls) == len(held_out) > 0
    return names, lines - reported, {c for c in calls if c}


def shown_texts(task: Task, tokenizer) -> list[str]:
    """Every rendering of the task a policy is given."""
    default, _ = build_prompt(task, tokenizer)
    whole, _ = build_prompt(task, tokenizer, max_prompt_tokens=10**6, max_files=100, scope="file")
    traj = run_tool_loop(
        task, SubmitBackend(tokenizer), tokenizer, SamplingParams(), "t", "g", AgentSettings(max_turns=1)
    )
    return [default[0].content, whole[0].content, traj.prompt]


def test_no_prompt_shows_a_fail_to_pass_test(tasks: list[Task], tokenizer) -> None:
    assert len(tasks) == 4 * PER_FAMILY
    for task in tasks:
        names, lines, calls = judge_text(task)
        for text in shown_texts(task, tokenizer):
            assert not [n for n in names if n in text], task.instance_id
            assert not [line for line in lines if line in text], task.instance_id
            assert not [c for c in calls if c in text], task.instance_id


def test_the_snapshot_the_tools_read_holds_no_judge_test(tasks: list[Task]) -> None:
    for task in tasks:
        names, lines, calls = judge_text(task)
        asserts = {line for line in lines if line.startswith("assert ")}
        for path, text in task.snapshot.items():
            assert not [n for n in names if re.search(rf"\b{n}\b", text)], (task.instance_id, path)
            assert not [a for a in asserts if a in text], (task.instance_id, path)
            assert not [c for c in calls if c in text], (task.instance_id, path)
