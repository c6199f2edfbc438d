"""The tool-call agent through the common rollout path, with real sessions in the local sandbox:
every conversation's session is gone when the rollout returns, and the judge sees its working tree's diff."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

from gagar.policy.agent import AgentSettings
from gagar.policy.generation import Sample
from gagar.policy.rollout import agent_for, rollout
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.tool_calls import call_text
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.sandbox.process import live_pids_of
from gagar.schema.trajectory import SamplingParams
from gagar.tasks.diffs import apply_diff

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sessions drop to a sandbox uid: needs root")

AGENT = AgentSettings(kind="tool-call", max_tokens=4096, max_turns=5)
FIX = {"old_str": "    return a - b\n", "new_str": "    return a + b\n"}


class Scripted:
    """Turn ``k`` of one of two scripts at engine call ``k``: the second for the second conversation
    (told apart, once it has acted, by its first command in its prompt)."""

    def __init__(self, tokenizer, first: list[str], second: list[str], mark: str) -> None:
        self.tokenizer, self.first, self.second, self.mark, self.calls = tokenizer, first, second, mark, 0
        self.stop_token_ids = (tokenizer.eos_token_id,)

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        out = []
        for i, prompt in enumerate(prompts):
            second = i == 1 if self.calls == 0 else self.mark in self.tokenizer.decode(prompt)
            text = (self.second if second else self.first)[self.calls]
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
            out.append([Sample(ids, [-0.1] * len(ids), "stop")])
        self.calls += 1
        return out


def test_rollout_runs_calls_in_sessions_and_leaves_none(tasks, tmp_path) -> None:
    task = tasks[0]  # add subtracts
    tokenizer = train_tokenizer([*task.snapshot.values(), *agent_for(AGENT).vocabulary()], vocab_size=600)
    fixes = [
        call_text("str_replace_editor", command="view", path="calc/ops.py", view_range=[5, 7]),
        call_text("str_replace_editor", command="str_replace", path="calc/ops.py", **FIX),
        call_text("bash", command="python -m pytest -q -p no:cacheprovider"),
        call_text("submit"),
    ]
    wanders = [
        call_text("bash", command="ls; sleep 100 &"),
        "no call here",
        call_text("bash", command="pwd"),
    ] * 2
    settings = LocalSandboxSettings(base_uid=63200, uid_count=8, uid_lock_dir=tmp_path / "locks")
    sandbox = LocalBackend(settings=settings, workers=1)
    backend = Scripted(tokenizer, fixes, wanders, "sleep 100")
    sampled = rollout([task], backend, tokenizer, 2, SamplingParams(), agent=AGENT, sandbox=sandbox)
    trajectories = list(sampled)
    fixed, wandered = trajectories
    assert fixed.finish_reason == "submit"
    assert fixed.tool_calls == {"view": 1, "str_replace": 1, "bash_tests": 1, "submit": 1}
    assert "1 passed" in fixed.messages[7].content  # the repository's own test, run in the session
    assert apply_diff(task.snapshot, fixed.model_patch) == apply_diff(task.snapshot, task.patch)
    assert wandered.finish_reason == "max_turns"
    assert wandered.model_patch == ""
    assert wandered.tool_calls == {"bash": 3, "malformed": 2}
    assert all(live_pids_of(uid) == [] for uid in range(63200, 63208))  # the background sleep died too
