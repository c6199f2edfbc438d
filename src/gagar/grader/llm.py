"""The agentic LLM grader: a tool-calling loop over the shared workspace, ending in a JSON ranking.

The model sees the task and the passing candidates under aliases ``c1..ck`` (in the order it is
given, so the position-bias guard can present them reversed). Each turn it answers with exactly one
JSON object: a tool call ``{"tool": NAME, "args": {...}}``, whose result comes back as the next
message, or the final answer ``{"ranking": [["c2"], ["c1", "c3"]], "scores": {"c1": 0.4, ...}}``
(tiers best first; scores optional). Bounded by ``max_steps`` turns and ``total_timeout_s``.

Failures raise :class:`~gagar.grader.base.GraderFailure` — ``malformed_json``, ``schema_violation``,
``too_many_steps``, ``timeout``, ``http_error``, ``bad_response`` — or
:class:`~gagar.schema.grade.RankingError` for a ranking that omits, duplicates or invents candidates;
:func:`~gagar.grader.base.grade_group` turns each into a tie with the reason recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gagar.grader import tools
from gagar.grader.base import GraderFailure, Ranking
from gagar.grader.llm_client import ChatClient
from gagar.grader.workspace import GroupWorkspace
from gagar.sandbox.base import SandboxBackend

__all__ = ["TOOL_NAMES", "FinalAnswer", "LLMGrader", "ToolCall", "parse_json_object"]

VERSION = "1"
TOOL_NAMES = (
    "read_patch",
    "diff_stats",
    "files_touched",
    "functions_touched",
    "out_of_scope_edits",
    "lint_delta",
    "pairwise_diff",
    "run_tests",
)


class ToolCall(BaseModel):
    """One tool call of the model."""

    model_config = ConfigDict(extra="forbid")

    tool: Literal[TOOL_NAMES]  # type: ignore[valid-type]
    args: dict[str, Any] = Field(default_factory=dict)


class FinalAnswer(BaseModel):
    """The model's final answer: tiers of aliases, best first, and optional scores (higher is better)."""

    model_config = ConfigDict(extra="forbid")

    ranking: list[list[str]] = Field(min_length=1)
    scores: dict[str, float] | None = None


SYSTEM_PROMPT = """You grade candidate patches for a code repair task. Every candidate passes the tests.
Rank them by quality: a good patch is targeted (changes only what the fix needs), minimal, and stays
in the code the failing tests exercise; unrelated edits, debug output, dead code, renames and
reformatting make a patch worse.

Answer with exactly one JSON object per turn and nothing else.
To call a tool: {"tool": NAME, "args": {...}}. Tools:
- read_patch {"candidate": ID}: the candidate's unified diff
- diff_stats {"candidate": ID}: files, added/removed lines, hunks, comment and blank lines added
- files_touched {"candidate": ID}: each changed file with its kind and line counts
- functions_touched {"candidate": ID}: the functions (scopes) whose lines change
- out_of_scope_edits {"candidate": ID}: changed lines outside the code the failing tests exercise
- lint_delta {"candidate": ID}: lint findings the candidate adds or removes
- pairwise_diff {"a": ID, "b": ID}: the difference between two candidates' patched files
- run_tests {"candidate": ID, "tests": [TEST_ID, ...]}: run extra tests against a candidate
To finish: {"ranking": [[best ids], [next ids], ...], "scores": {ID: number, ...}}
Ids in one inner list are tied. Every candidate must appear exactly once."""


def parse_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (code fences and surrounding prose allowed).

    Raises:
        GraderFailure: ``malformed_json`` when there is no JSON object, ``schema_violation`` when
            the JSON is not an object.
    """
    stripped = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError:
        start = stripped.find("{")
        if start < 0:
            raise GraderFailure("malformed_json", f"no JSON object in the answer: {text[:200]!r}") from None
        try:
            value, _ = json.JSONDecoder().raw_decode(stripped[start:])
        except json.JSONDecodeError as exc:
            message = f"answer is not valid JSON ({exc.msg}): {text[:200]!r}"
            raise GraderFailure("malformed_json", message) from None
    if not isinstance(value, dict):
        raise GraderFailure("schema_violation", f"expected a JSON object, got {type(value).__name__}")
    return value


@dataclass
class _Session:
    """One grading conversation: the alias map and the tool implementations over the workspace."""

    ws: GroupWorkspace
    aliases: dict[str, str]
    """alias (c1..) -> trajectory id."""
    backend: SandboxBackend | None
    max_chars: int
    used: dict[str, list[str]]

    def _id(self, args: dict[str, Any], key: str) -> str:
        alias = args.get(key)
        if alias not in self.aliases:
            raise ValueError(f"unknown candidate {alias!r}; the candidates are {sorted(self.aliases)}")
        self.used[alias].append(key)
        return self.aliases[alias]

    def call(self, call: ToolCall) -> str:
        """The tool's result as text for the model; a bad argument comes back as an error message."""
        try:
            result = self._dispatch(call)
        except (ValueError, KeyError) as exc:
            return f"error: {exc}"
        text = result if isinstance(result, str) else json.dumps(result)
        return text[: self.max_chars]

    def _dispatch(self, call: ToolCall) -> Any:
        a = call.args
        simple: dict[str, Callable[[GroupWorkspace, str], Any]] = {
            "diff_stats": tools.diff_stats,
            "files_touched": tools.files_touched,
            "functions_touched": tools.functions_touched,
            "out_of_scope_edits": tools.out_of_scope_edits,
            "lint_delta": tools.lint_delta,
        }
        if call.tool in simple:
            return _jsonable(simple[call.tool](self.ws, self._id(a, "candidate")))
        if call.tool == "read_patch":
            return self.ws.patch(self._id(a, "candidate"))
        if call.tool == "pairwise_diff":
            diff = tools.pairwise_diff(self.ws, self._id(a, "a"), self._id(a, "b"), self.max_chars)
            return diff or "(identical)"
        if self.backend is None:
            raise ValueError("run_tests is not available in this deployment")
        tests = a.get("tests")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError("run_tests needs 'tests': a non-empty list of test ids")
        return _jsonable(tools.run_tests(self.ws, self._id(a, "candidate"), tests, self.backend))


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _user_prompt(ws: GroupWorkspace, aliases: dict[str, str]) -> str:
    lines = [
        f"Task {ws.task.instance_id}:",
        ws.task.problem_statement.strip()[:3000],
        "",
        f"Failing tests the fix makes pass: {', '.join(ws.task.FAIL_TO_PASS[:20])}",
        f"Candidates: {', '.join(aliases)}",
    ]
    return "\n".join(lines)


class LLMGrader:
    """Ranks candidates by talking to an OpenAI-compatible model that calls the inspection tools."""

    name = "llm"
    version = VERSION

    def __init__(
        self,
        client: ChatClient,
        *,
        max_steps: int = 8,
        request_timeout_s: float = 60.0,
        total_timeout_s: float = 300.0,
        tool_output_chars: int = 4000,
        backend: SandboxBackend | None = None,
    ) -> None:
        self.client = client
        self.max_steps, self.backend = max_steps, backend
        self.request_timeout_s, self.total_timeout_s = request_timeout_s, total_timeout_s
        self.tool_output_chars = tool_output_chars

    def rank(self, ws: GroupWorkspace, order: Sequence[str]) -> Ranking:
        aliases = {f"c{i}": tid for i, tid in enumerate(order, start=1)}
        session = _Session(ws, aliases, self.backend, self.tool_output_chars, {a: [] for a in aliases})
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": _user_prompt(ws, aliases)},
        ]
        deadline = time.monotonic() + self.total_timeout_s
        for _ in range(self.max_steps):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GraderFailure("timeout", f"no final ranking within {self.total_timeout_s:.1f} s")
            text = self.client.next_message(messages, min(self.request_timeout_s, remaining))
            answer = parse_json_object(text)
            messages.append({"role": "assistant", "content": text})
            if "ranking" in answer:
                return self._final(answer, session)
            try:
                call = ToolCall.model_validate(answer)
            except ValidationError as exc:
                raise GraderFailure("schema_violation", f"neither a tool call nor a ranking: {exc}") from None
            messages.append({"role": "user", "content": f"TOOL RESULT {call.tool}: {session.call(call)}"})
        raise GraderFailure("too_many_steps", f"no final ranking after {self.max_steps} turns")

    @staticmethod
    def _final(answer: dict[str, Any], session: _Session) -> Ranking:
        try:
            final = FinalAnswer.model_validate(answer)
        except ValidationError as exc:
            raise GraderFailure("schema_violation", f"final answer breaks the schema: {exc}") from None
        aliases = session.aliases
        # an unknown alias stays as it is, so the ranking check reports it as invented
        tiers = [[aliases.get(a, a) for a in tier] for tier in final.ranking]
        scores = None
        if final.scores is not None and set(final.scores) == set(aliases):
            scores = {aliases[a]: float(s) for a, s in final.scores.items()}
        evidence = {
            tid: f"{alias}: " + (", ".join(sorted(set(session.used[alias]))) or "no tool calls")
            for alias, tid in aliases.items()
        }
        return Ranking(tiers, scores, evidence)
