"""The multi-turn tool loop: commands act on a working copy; tool output is masked from the loss."""

from __future__ import annotations

from collections.abc import Sequence

from gagar.policy.agent import AgentSettings
from gagar.policy.generation import Sample
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.tool_loop import ToolWorkspace, run_tool_loop
from gagar.schema.trajectory import SamplingParams
from gagar.tasks.diffs import apply_diff


class ReplayBackend:
    """Replies with a fixed script, one reply a call: stands in for a model that can use tools."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies = tokenizer, list(replies)
        self.stop_token_ids = (tokenizer.eos_token_id,)
        self.seen: list[list[int]] = []

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        self.seen.append(list(prompts[0]))
        ids = [
            *self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False),
            self.tokenizer.eos_token_id,
        ]
        return [[Sample(ids, [-0.5] * len(ids), "stop")]]


def test_workspace_commands(tasks) -> None:
    ws = ToolWorkspace(tasks[0])
    assert "def add" in ws.execute("VIEW calc/ops.py")
    assert ws.execute("SEARCH return a - b") == "calc/ops.py:6"
    assert ws.execute("VIEW nope.py") == "no file 'nope.py'"
    assert ws.execute("VIEW other/ops.py").startswith("(no file 'other/ops.py'; showing calc/ops.py)")
    wrong_dir = (
        "EDIT\nother/ops.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n"
    )
    assert ws.execute(wrong_dir) == "edit applied"  # the one ops.py holding the SEARCH text
    ws.files = dict(tasks[0].snapshot)
    assert ws.execute("EDIT\ncalc/ops.py\n<<<<<<< SEARCH\nmissing\n=======\nx\n>>>>>>> REPLACE\n").startswith(
        "edit refused"
    )
    assert ws.execute("DANCE").startswith("unknown command")
    assert ws.patch == ""
    assert ws.execute("RUN_TESTS") == "no test runner available"


def test_tool_loop_records_turns_and_masks_tool_output(tasks) -> None:
    task = tasks[0]
    tokenizer = train_tokenizer([*task.snapshot.values(), task.problem_statement], vocab_size=400)
    edit = "EDIT\ncalc/ops.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n"
    replies = ["VIEW calc/ops.py", "SEARCH return a - b", edit, "SUBMIT"]
    backend = ReplayBackend(tokenizer, replies)
    traj = run_tool_loop(task, backend, tokenizer, SamplingParams(), "t0", "g0")
    assert traj.turns == 4
    assert traj.finish_reason == "submit"
    assert traj.parse_error is None
    assert apply_diff(task.snapshot, traj.model_patch) == apply_diff(task.snapshot, task.patch)
    assert [m.role for m in traj.messages] == ["system", "user"] + ["assistant", "tool"] * 4
    sampled = [t for t, m in zip(traj.response_token_ids, traj.loss_mask, strict=True) if m]
    assert tokenizer.decode(sampled, skip_special_tokens=True) == "".join(replies)
    assert all(lp == 0.0 for lp, m in zip(traj.old_logprobs, traj.loss_mask, strict=True) if not m)
    masked = tokenizer.decode(
        [t for t, m in zip(traj.response_token_ids, traj.loss_mask, strict=True) if not m]
    )
    assert "def add(a, b):" in masked  # the VIEW output is in the context but not in the loss
    # What the model saw at each turn is the recorded conversation so far.
    full = traj.prompt_token_ids + traj.response_token_ids
    for seen in backend.seen:
        assert full[: len(seen)] == seen
    assert tokenizer.decode(full) == tokenizer.apply_chat_template(
        [m.model_dump(include={"role", "content"}) for m in traj.messages[:-1]], tokenize=False
    ).removesuffix("\n")


def test_tool_loop_without_submit_has_no_patch(tasks) -> None:
    task = tasks[0]
    tokenizer = train_tokenizer(list(task.snapshot.values()), vocab_size=400)
    backend = ReplayBackend(tokenizer, ["VIEW calc/ops.py"] * 2)
    traj = run_tool_loop(task, backend, tokenizer, SamplingParams(), "t", "g", AgentSettings(max_turns=2))
    assert traj.parse_error == "no SUBMIT"
    assert traj.finish_reason == "max_turns"
    assert traj.model_patch == ""
    assert traj.turns == 2
