"""The LLM grader's tool loop over real HTTP, against a scripted OpenAI-compatible server process
and the project's own policy server; every fallback path with malformed answers."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from grader_fixtures import group

from gagar.grader.base import GraderMetrics, PositionGuard, grade_group
from gagar.grader.llm import OPENING_TOOLS, LLMGrader
from gagar.grader.llm_client import ChatClient
from gagar.grader.workspace import GroupWorkspace

SERVER = Path(__file__).with_name("scripted_server.py")
# The group's passing candidates in manifest order: c1 gold, c2 printy, c3 wide, c4 readme.
SCORES = {"c1": 1, "c2": 0.5, "c3": 0.2, "c4": 0.2}
GOOD = json.dumps({"ranking": [["c1"], ["c2"], ["c3", "c4"]], "scores": SCORES})


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{line.split()[1]}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> GroupWorkspace:
    return group(tmp_path_factory.mktemp("llm"))


def _script(server: str, replies: list[object]) -> None:
    body = json.dumps({"replies": replies}).encode()
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{server}/script", data=body, headers=headers)
    urllib.request.urlopen(request, timeout=5).read()


def _requests(server: str) -> list[dict]:
    return json.loads(urllib.request.urlopen(f"{server}/requests", timeout=5).read())


def _grader(server: str, api: str = "chat", **kwargs: object) -> LLMGrader:
    client = ChatClient(f"{server}/v1", "scripted", api=api)  # type: ignore[arg-type]
    return LLMGrader(client, **{"max_turns": 6, "request_timeout_s": 5.0, "total_timeout_s": 10.0, **kwargs})


def test_tool_loop_end_to_end(server: str, ws: GroupWorkspace) -> None:
    calls = [
        {"tool": "functions_touched", "args": {"candidate": "c3"}},
        {"tool": "lint_delta", "args": {"candidate": "c2"}},
        {"tool": "pairwise_diff", "args": {"a": "c1", "b": "c2"}},
        {"tool": "diff_stats", "args": {"candidate": "c9"}},
    ]
    _script(server, [*(json.dumps(c) for c in calls), f"```json\n{GOOD}\n```"])
    grade = grade_group(_grader(server), ws)
    assert not grade.fallback
    assert grade.ranking == [["gold"], ["printy"], ["readme", "wide"]] or grade.ranking == [
        ["gold"], ["printy"], ["wide", "readme"]
    ]  # fmt: skip
    assert grade.scores == {"gold": 1.0, "printy": 0.5, "wide": 0.2, "readme": 0.2}
    assert "functions_touched" not in grade.evidence["gold"]
    sent = _requests(server)
    assert len(sent) == 5  # the opening is the grader's own: only the model's turns are requests
    first = [m["content"].split(":", 1)[0] for m in sent[0]["messages"] if m["role"] == "user"][1:]
    assert first == [f"TOOL RESULT {tool}" for tool in OPENING_TOOLS]
    results = [m["content"] for m in sent[-1]["messages"] if m["content"].startswith("TOOL RESULT")]
    results = results[len(OPENING_TOOLS) :]
    assert results[0] == 'TOOL RESULT functions_touched: ["pkg/calc.py:add", "pkg/fmt.py:show"]'
    assert '"T201": 1' in results[1]
    assert 'print("DEBUG", a, b)' in results[2]
    assert "unknown candidate 'c9'" in results[3]


def test_without_an_opening_the_model_calls_every_tool(server: str, ws: GroupWorkspace) -> None:
    _script(server, [json.dumps({"tool": "diff_stats"}), GOOD])
    assert not grade_group(_grader(server, opening=()), ws).fallback
    sent = _requests(server)
    assert [m["role"] for m in sent[0]["messages"]] == ["system", "user"]
    assert sent[1]["messages"][-1]["content"].startswith("TOOL RESULT diff_stats: c1: 2 lines")


def test_completions_api_renders_the_conversation(server: str, ws: GroupWorkspace) -> None:
    _script(server, [json.dumps({"tool": "read_patch", "args": {"candidate": "c1"}}), GOOD])
    grade = grade_group(_grader(server, api="completions"), ws)
    assert not grade.fallback
    assert grade.ranking[0] == ["gold"]
    prompt = _requests(server)[-1]["prompt"]
    assert prompt.startswith("SYSTEM:")
    assert prompt.endswith("ASSISTANT:")
    assert "a + b + 1" in prompt


@pytest.mark.parametrize(
    ("replies", "reason"),
    [
        (["I think c1 is best."], "malformed_json"),
        (['{"ranking": [["c1"], ["c2"]'], "malformed_json"),
        (["[1, 2]"], "schema_violation"),
        (['{"tool": "format_disk", "args": {}}'], "schema_violation"),
        (['{"ranking": [["c1", "c2"], ["c3"]], "extra": 1}'], "schema_violation"),
        (['{"ranking": [["c1"], ["c2", "c3"]]}'], "omitted_candidate"),
        (['{"ranking": [["c1"], ["c2", "c3", "c4", "c7"]]}'], "invented_candidate"),
        (['{"ranking": [["c1", "c2"], ["c2", "c3", "c4"]]}'], "duplicated_candidate"),
        # the pointwise answer: one finite score per candidate, each exactly once
        (['{"scores": {"c1": -3, "c2": -4, "c3": -9}}'], "omitted_candidate"),
        (['{"scores": {"c1": -3, "c2": -4, "c3": -9, "c4": -9, "c5": 0}}'], "invented_candidate"),
        (['{"scores": {"c1": -3, "c2": -4, "c3": -9, "c4": -9, "c1": 0}}'], "duplicated_candidate"),
        (['{"scores": {"c1": "best", "c2": -4, "c3": -9, "c4": -9}}'], "schema_violation"),
        (['{"scores": {"c1": true, "c2": -4, "c3": -9, "c4": -9}}'], "schema_violation"),
        (['{"scores": {"c1": NaN, "c2": -4, "c3": -9, "c4": -9}}'], "schema_violation"),
        (['{"scores": [-3, -4, -9, -9]}'], "schema_violation"),
        (['{"scores": {}}'], "schema_violation"),
        (['{"scores": {"c1": -3}, "scores": {"c1": -3}}'], "schema_violation"),
        (['c1: 3 lines\nc2: 4 lines\n{"scores": {"c1": -3, "c2": -4, "c3": -9, "c4": -'], "malformed_json"),
        ([json.dumps({"tool": "diff_stats", "args": {"candidate": "c1"}})] * 7, "too_many_turns"),
        ([{"status": 500}], "http_error"),
        ([{"sleep": 3.0, "text": GOOD}], "timeout"),
    ],
)
def test_every_failure_falls_back_to_a_tie(
    server: str, ws: GroupWorkspace, replies: list[object], reason: str
) -> None:
    _script(server, replies)
    metrics = GraderMetrics()
    grade = grade_group(_grader(server, request_timeout_s=1.0), ws, metrics=metrics)
    assert grade.fallback
    assert grade.fallback_reason == reason, grade.fallback_detail
    assert grade.ranking == [ws.passing_ids]
    assert metrics.as_dict()[f"grader/fallbacks/{reason}"] == 1


def test_position_guard_ties_disagreeing_orders_and_counts_it(server: str, ws: GroupWorkspace) -> None:
    # Both passes put "c1" first: in the reversed second pass c1 is readme, so the rankings disagree.
    first_is_best = json.dumps({"ranking": [["c1"], ["c2"], ["c3"], ["c4"]]})
    _script(server, [first_is_best, first_is_best])
    metrics = GraderMetrics()
    grade = grade_group(_grader(server), ws, PositionGuard(threshold=0.34), metrics)
    assert grade.fallback
    assert grade.fallback_reason == "position_bias"
    assert (metrics.guard_checks, metrics.guard_disagreements) == (1, 1)
    # A consistent grader (same trajectories first in both orders) passes the guard.
    _script(server, [GOOD, json.dumps({"ranking": [["c4"], ["c3"], ["c1", "c2"]]})])
    grade = grade_group(_grader(server), ws, PositionGuard(threshold=0.34), metrics)
    assert not grade.fallback
    assert grade.ranking[0] == ["gold"]
    assert (metrics.guard_checks, metrics.guard_disagreements) == (2, 1)


def test_against_the_projects_own_policy_server(ws: GroupWorkspace) -> None:
    """The real client and loop against gagar.policy.server serving a tiny untrained model: whatever
    it says, grading ends in a grade (a ranking or a recorded fallback), never an exception."""
    from gagar.policy.generation import HFBackend
    from gagar.policy.model import ModelSize, build_model
    from gagar.policy.server import running_server
    from gagar.policy.tokenizer import train_tokenizer

    corpus = ['{"ranking": [["c1"]], "tool": "diff_stats"}' * 20, ws.patch("gold")] * 20
    tokenizer = train_tokenizer(corpus, vocab_size=300)
    model = build_model(tokenizer, ModelSize(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                             intermediate_size=64))  # fmt: skip
    with running_server(HFBackend(model.eval(), tokenizer), tokenizer, "tiny") as url:
        # the policy server samples: it refuses temperature 0, which OpenAI's API allows
        client = ChatClient(url, "tiny", api="completions", max_tokens=24, temperature=1.0)
        metrics = GraderMetrics()
        grade = grade_group(LLMGrader(client, max_turns=2, total_timeout_s=60.0), ws, metrics=metrics)
    assert grade.group_id == ws.group_id
    assert sorted(grade.candidates) == sorted(ws.passing_ids)
    assert grade.fallback, "an untrained model is not expected to produce a valid ranking"
    model_failures = {"malformed_json", "schema_violation", "too_many_turns", "omitted_candidate"}
    model_failures |= {"invented_candidate", "duplicated_candidate", "empty_tier"}
    assert grade.fallback_reason in model_failures, grade.fallback_detail
    assert metrics.as_dict()["grader/fallbacks"] == 1


def test_scores_alone_rank_the_candidates(server: str, ws: GroupWorkspace) -> None:
    _script(server, ["c1: clean\nc2: a print\n" + json.dumps({"scores": SCORES})])
    grade = grade_group(_grader(server), ws)
    assert not grade.fallback
    assert grade.ranking[:2] == [["gold"], ["printy"]]
    assert sorted(grade.ranking[2]) == ["readme", "wide"]
    assert grade.scores == {"gold": 1.0, "printy": 0.5, "wide": 0.2, "readme": 0.2}
    _script(server, [json.dumps({"scores": {"c1": 1.0}})])
    assert grade_group(_grader(server), ws).fallback_reason == "omitted_candidate"


def test_position_guard_passes_a_pointwise_grader_that_follows_the_candidates(
    server: str, ws: GroupWorkspace
) -> None:
    # The same trajectories scored alike in both orders (c1 is gold first, readme second) pass the guard.
    forward = json.dumps({"scores": {"c1": -2, "c2": -3, "c3": -5, "c4": -4}})
    backward = json.dumps({"scores": {"c1": -4, "c2": -5, "c3": -3, "c4": -2}})
    _script(server, [forward, backward])
    metrics = GraderMetrics()
    grade = grade_group(_grader(server), ws, PositionGuard(threshold=0.0), metrics)
    assert not grade.fallback, grade.fallback_detail
    assert grade.ranking == [["gold"], ["printy"], ["readme"], ["wide"]]
    assert (metrics.guard_checks, metrics.guard_disagreements) == (1, 0)


def test_style_and_integrity_tools_answer_for_every_candidate(server: str, ws: GroupWorkspace) -> None:
    _script(server, [json.dumps({"tool": "style_findings"}), GOOD])
    assert not grade_group(_grader(server), ws).fallback
    results = [
        m["content"] for m in _requests(server)[-1]["messages"] if m["content"].startswith("TOOL RESULT")
    ]
    integrity, stats, style = results  # integrity_flags and diff_stats: the grader's opening
    assert style.splitlines() == ["TOOL RESULT style_findings: c1: 0", "c2: 1 (print call)", "c3: 0", "c4: 0"]
    assert integrity.splitlines() == ["TOOL RESULT integrity_flags: c1: 0", "c2: 0", "c3: 0", "c4: 0"]
    assert stats.splitlines() == [
        "TOOL RESULT diff_stats: c1: 2 lines, 1 files",
        "c2: 3 lines, 1 files",
        "c3: 3 lines, 2 files",
        "c4: 4 lines, 2 files",
    ]
