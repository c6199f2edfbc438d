"""Tool-call SFT demonstrations: replayed through real sessions, a refused edit and its recovery included."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gagar.policy import tool_call_demos as tool_call_demos_module
from gagar.policy.agent import AgentSettings
from gagar.policy.agent_format import answer_from_patch
from gagar.policy.demos import DemoAnswer
from gagar.policy.rollout import agent_for
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.tool_call_demos import demo_calls, tool_call_demos, untrained_turns, wrong_folder
from gagar.policy.tool_calls import ToolCallKit

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sessions drop to a sandbox uid: needs root")

AGENT = AgentSettings(kind="tool-call", max_tokens=4096)


def _answers(tasks) -> list[DemoAnswer]:
    return [DemoAnswer(t, answer_from_patch(t.snapshot, t.patch), False) for t in tasks]


def _tokenizer(tasks):
    corpus = [s for t in tasks for s in (*t.snapshot.values(), t.problem_statement)]
    return train_tokenizer([*corpus, *agent_for(AGENT).vocabulary()], vocab_size=600)


def _decoded(tokenizer, demo) -> tuple[str, str]:
    """The demonstration's whole text and the part under the loss."""
    trained = [t for t, m in zip(demo.answer_ids, demo.answer_mask, strict=True) if m]
    return tokenizer.decode(demo.answer_ids), tokenizer.decode(trained)


@needs_root
def test_demonstrations_show_a_refused_edit_then_the_fix(tasks) -> None:
    answers, tokenizer = _answers(tasks), _tokenizer(tasks)
    demos, counts = tool_call_demos(
        answers, tokenizer, AGENT, seed=0, refusal_share=1.0, wrong_path_share=0.0
    )
    assert len(demos) == len(tasks)
    assert counts["recovered"] == len(tasks)
    script = demo_calls(answers[0], random.Random(0), 1.0)
    assert [s.split('"command": "')[1].split('"')[0] for s in script.calls[:-1]] == [
        "view", "str_replace", "str_replace", "python -m pytest -q",
    ]  # fmt: skip
    assert script.mistakes == {1}
    for demo in demos:
        text, trained = _decoded(tokenizer, demo)
        # the real editor's refusal shows the lines the misquote meant, which the next call quotes...
        assert "the most similar lines are below" in text
        assert "passed" in text  # ...and the real test run
        assert "not found" not in trained  # ...neither of them trained on
        assert "passed" not in trained
        assert text.count('"command": "str_replace"') == 2
        assert trained.count('"command": "str_replace"') == 1  # nor the misquote: only its recovery
        assert trained.count("<tool_call>") == 4


@needs_root
def test_demonstrations_in_the_qwen3_coder_format_replay_to_the_same_patches(tasks) -> None:
    agent = AGENT.model_copy(update={"call_format": "xml"})
    answers, tokenizer = _answers(tasks), _tokenizer(tasks)
    demos, counts = tool_call_demos(answers, tokenizer, agent, seed=0, refusal_share=1.0)
    assert len(demos) == len(tasks)  # each replay's working tree gave its answer's diff
    assert counts["recovered"] == len(tasks)
    for demo in demos:
        text, trained = _decoded(tokenizer, demo)
        assert "<parameter=old_str>" in trained
        assert '"arguments"' not in text
        assert trained.count("<function=str_replace_editor>") == 2  # the view and the fix, not the misquote


@needs_root
def test_demonstrations_edit_first_when_the_prompt_shows_the_definition(tasks) -> None:
    agent = AGENT.model_copy(update={"show_definition": True})
    answers, tokenizer = _answers(tasks), _tokenizer(tasks)
    demos, _ = tool_call_demos(answers, tokenizer, agent, seed=0, refusal_share=0.0, wrong_path_share=1.0)
    assert len(demos) == len(tasks)
    for demo in demos:
        text, trained = _decoded(tokenizer, demo)
        assert '"command": "view"' not in text  # neither the file nor a wrong folder is viewed
        assert trained.count("<tool_call>") == 3  # the edit, the tests, submit
    kit = ToolCallKit(tokenizer, agent, lambda t: None)
    elsewhere = ("calc/ops.py", 1, '"""Small arithmetic helpers."""\n')  # shown lines without the edit's
    script = demo_calls(answers[0], random.Random(0), 0.0, shown=elsewhere)
    assert '"command": "view"' in script.calls[0]
    assert kit.shown_definition(answers[0].task)[0] == "calc/ops.py"


def test_a_refusal_that_shows_other_lines_is_followed_by_a_view(tasks, monkeypatch) -> None:
    monkeypatch.setattr(tool_call_demos_module, "closest_lines", lambda text, old: None)
    script = demo_calls(_answers(tasks)[0], random.Random(0), 1.0)
    assert [s.split('"command": "')[1].split('"')[0] for s in script.calls[:-1]] == [
        "view", "str_replace", "view", "str_replace", "python -m pytest -q",
    ]  # fmt: skip
    assert script.mistakes == {1}


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 4)), max_size=8), st.data())
def test_untrained_turns_take_exactly_the_named_turns_out_of_the_loss(
    turns: list[tuple[int, int]], data: st.DataObject
) -> None:
    """Each turn: its trained tokens, then the untrained tool answer and scaffolding after it."""
    named = data.draw(st.sets(st.integers(0, max(len(turns) - 1, 0))))
    mask = [m for trained, untrained in turns for m in [True] * trained + [False] * untrained]
    expected = [
        m
        for k, (trained, untrained) in enumerate(turns)
        for m in [k not in named] * trained + [False] * untrained
    ]
    assert untrained_turns(mask, named) == expected
    assert untrained_turns([int(m) for m in mask], set()) == mask


@needs_root
def test_demonstrations_follow_a_refused_view_to_the_file_of_its_name(tasks) -> None:
    answers, tokenizer = _answers(tasks), _tokenizer(tasks)
    demos, counts = tool_call_demos(
        answers, tokenizer, AGENT, seed=0, refusal_share=0.0, wrong_path_share=1.0
    )
    assert len(demos) == len(tasks)
    assert counts["recovered"] == len(tasks)
    for demo, answer in zip(demos, answers, strict=True):
        text, trained = _decoded(tokenizer, demo)
        right = answer.task.patch.split("\n", 1)[0].split(" b/", 1)[1]
        assert f"files of that name: {right}" in text  # the real editor's refusal names the file...
        assert "does not exist" not in trained  # ...and is not trained on
        assert text.count('"command": "view"') == 2
        assert trained.count('"command": "view"') == 1  # nor the wrong folder's view: only the right one
        assert trained.count("<tool_call>") == 4


def test_a_wrong_folder_is_one_the_refusal_can_name() -> None:
    assert wrong_folder("pkg/mod.py", ["pkg/mod.py", "pkg/util.py"]) == "mod.py"
    assert wrong_folder("mod.py", ["mod.py", "tests/test_mod.py"]) == "src/mod.py"
    assert wrong_folder("pkg/mod.py", ["pkg/mod.py", "tests/mod.py"]) is None  # two files of the name
    assert wrong_folder("src/mod.py", ["src/mod.py"]) == "mod.py"
