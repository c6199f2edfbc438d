"""Tool-call SFT demonstrations: replayed through real sessions, a refused edit and its recovery included."""

from __future__ import annotations

import os
import random

import pytest

from gagar.policy.agent import AgentSettings
from gagar.policy.agent_format import answer_from_patch
from gagar.policy.demos import DemoAnswer
from gagar.policy.rollout import agent_for
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.tool_call_demos import demo_calls, tool_call_demos

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sessions drop to a sandbox uid: needs root")

AGENT = AgentSettings(kind="tool-call", max_tokens=4096)


def _answers(tasks) -> list[DemoAnswer]:
    return [DemoAnswer(t, answer_from_patch(t.snapshot, t.patch), False) for t in tasks]


def test_demonstrations_show_a_refused_edit_then_the_fix(tasks) -> None:
    answers = _answers(tasks)
    corpus = [s for t in tasks for s in (*t.snapshot.values(), t.problem_statement)]
    tokenizer = train_tokenizer([*corpus, *agent_for(AGENT).vocabulary()], vocab_size=600)
    demos, counts = tool_call_demos(answers, tokenizer, AGENT, seed=0, refusal_share=1.0)
    assert len(demos) == len(tasks)
    assert counts["recovered"] == len(tasks)
    script = demo_calls(answers[0], random.Random(0), 1.0)
    assert [s.split('"command": "')[1].split('"')[0] for s in script[:-1]] == [
        "view", "str_replace", "view", "str_replace", "python -m pytest -q",
    ]  # fmt: skip
    for demo in demos:
        text = tokenizer.decode(demo.answer_ids)
        trained = tokenizer.decode([t for t, m in zip(demo.answer_ids, demo.answer_mask, strict=True) if m])
        assert "old_str was not found verbatim" in text  # the real editor's refusal, in context...
        assert "passed" in text  # ...and the real test run
        assert "not found" not in trained  # ...neither of them trained on
        assert "passed" not in trained
        assert trained.count("<tool_call>") == 6
