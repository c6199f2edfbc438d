"""The grader's workspace shows how a multi-turn agent reached its patch: turns, test runs, reverted edits."""

from __future__ import annotations

from pathlib import Path

from grader_fixtures import GOLD, task

from fixtures.policy import ScriptBackend
from gagar.grader.heuristic import HeuristicGrader
from gagar.grader.llm import ToolCall, _Session
from gagar.grader.workspace import CONVERSATION, CandidateInput, build_group_workspace
from gagar.policy.agent import AgentSettings
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.tool_loop import run_tool_loops
from gagar.schema.trajectory import SamplingParams, Trajectory
from gagar.tasks.diffs import apply_diff


def _edit(search: str, replace: str) -> str:
    return f"EDIT\npkg/calc.py\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def test_the_workspace_holds_the_conversation(tmp_path: Path) -> None:
    t = task()
    tokenizer = train_tokenizer([*t.snapshot.values(), GOLD], 400)
    wrong = _edit("    return a + b + 1", "    return a + b + 0")
    right = _edit("    return a + b + 0", "    return a + b")
    script = ScriptBackend(
        tokenizer, [["VIEW pkg/calc.py", wrong, "RUN_TESTS", right, "RUN_TESTS", "SUBMIT"]]
    )
    [agent] = run_tool_loops(
        [(t, "agent", "group/1")], script, tokenizer, SamplingParams(), AgentSettings(),
        lambda jobs: ["1 passed"] * len(jobs),
    )  # fmt: skip
    single = Trajectory(
        trajectory_id="single", instance_id=t.instance_id, group_id="group/1", model_patch=GOLD
    )
    assert apply_diff(t.snapshot, agent.model_patch) == apply_diff(t.snapshot, GOLD)
    ws = build_group_workspace(
        tmp_path, "group/1", t, [CandidateInput.of(agent, None), CandidateInput.of(single, None)],
        {"agent": True, "single": True},
    )  # fmt: skip
    entry = ws.entry("agent")
    assert (entry.turns, entry.tests_run, entry.edits_reverted) == (6, 2, 1)
    assert (ws.entry("single").turns, ws.entry("single").tests_run) == (1, 0)
    text = (ws.folder("agent") / CONVERSATION).read_text()
    assert text.count("## assistant") == 6
    assert "a + b + 0" in text
    assert not (ws.folder("single") / CONVERSATION).exists()
    ranking = HeuristicGrader().rank(ws, ws.passing_ids)
    assert "6 turns, 2 test runs, 1 edits reverted" in ranking.evidence["agent"]
    session = _Session(ws, {"c1": "agent", "c2": "single"}, None, 4000, {"c1": [], "c2": []})
    answer = session.call(ToolCall(tool="read_conversation", args={"candidate": "c1"}))
    assert answer.startswith("6 turns, 2 test runs, 1 edits reverted")
    assert "RUN_TESTS" in answer
    assert "single-shot" in session.call(ToolCall(tool="read_conversation", args={"candidate": "c2"}))
