"""The agentic LLM grader: a tool-calling loop over the shared workspace, ending in a JSON ranking.

The model sees the task and the passing candidates under aliases ``c1..ck`` (in the order it is
given, so the position-bias guard can present them reversed). Each turn it answers with exactly one
JSON object: a tool call ``{"tool": NAME, "args": {...}}``, whose result comes back as the next
message, or the final answer ``{"ranking": [["c2"], ["c1", "c3"]], "scores": {"c1": 0.4, ...}}``
(tiers best first; either may be left out, scores alone rank by score), which prose without braces
(notes) may precede. A per-candidate tool called without ``candidate`` answers for every candidate
at once, one short line each (:func:`summary_line`): what keeps a small model's transcripts short.
Bounded by ``max_steps`` turns and ``total_timeout_s``.

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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gagar.grader import tools
from gagar.grader.base import GraderFailure, Ranking
from gagar.grader.llm_client import ChatClient
from gagar.grader.workspace import GroupWorkspace
from gagar.sandbox.base import SandboxBackend

__all__ = [
    "SYSTEM_PROMPT",
    "TOOL_NAMES",
    "FinalAnswer",
    "LLMGrader",
    "ToolCall",
    "parse_json_object",
    "summary_line",
    "user_prompt",
]

VERSION = "2"
TOOL_NAMES = (
    "read_patch",
    "diff_stats",
    "files_touched",
    "functions_touched",
    "out_of_scope_edits",
    "lint_delta",
    "pairwise_diff",
    "run_tests",
    "read_conversation",
)


class ToolCall(BaseModel):
    """One tool call of the model."""

    model_config = ConfigDict(extra="forbid")

    tool: Literal[TOOL_NAMES]  # type: ignore[valid-type]
    args: dict[str, Any] = Field(default_factory=dict)


class FinalAnswer(BaseModel):
    """The model's final answer: tiers of aliases, best first, and/or scores (higher is better); scores
    alone rank the candidates by score, equal scores tied."""

    model_config = ConfigDict(extra="forbid")

    ranking: list[list[str]] | None = Field(default=None, min_length=1)
    scores: dict[str, float] | None = None

    @model_validator(mode="after")
    def _ranks_something(self) -> FinalAnswer:
        if self.ranking is None and not self.scores:
            raise ValueError("a final answer needs 'ranking' or 'scores'")
        return self

    def tiers(self) -> list[list[str]]:
        """The ranking, or the tiers the scores make (best first)."""
        if self.ranking is not None:
            return self.ranking
        assert self.scores is not None
        by_score: dict[float, list[str]] = {}
        for alias, score in self.scores.items():
            by_score.setdefault(score, []).append(alias)
        return [by_score[s] for s in sorted(by_score, reverse=True)]


SYSTEM_PROMPT = """You grade candidate patches for a code repair task. Every candidate passes the tests.
Rank them by quality: a good patch is targeted (changes only what the fix needs), minimal, and stays
in the code the failing tests exercise; unrelated edits, debug output, dead or commented-out code,
unused imports, renames and reformatting make a patch worse.

Answer with exactly one JSON object per turn.
To call a tool: {"tool": NAME, "args": {...}}. Without "candidate", a tool answers for every candidate.
- diff_stats {"candidate": ID}: files, added/removed lines, hunks, comment and blank lines added
- files_touched {"candidate": ID}: each changed file with its kind and line counts
- functions_touched {"candidate": ID}: the functions (scopes) whose lines change
- out_of_scope_edits {"candidate": ID}: changed lines outside the code the failing tests exercise
- lint_delta {"candidate": ID}: lint findings the candidate adds or removes
- read_patch {"candidate": ID}: the candidate's unified diff
- pairwise_diff {"a": ID, "b": ID}: the difference between two candidates' patched files
- run_tests {"candidate": ID, "tests": [TEST_ID, ...]}: run tests against a candidate
- read_conversation {"candidate": ID}: how a multi-turn agent got there (its turns, tests run, edits reverted)
To finish, a note per candidate, then {"ranking": [[best ids], [next ids], ...]} (ids in one inner
list are tied) or {"scores": {ID: number, ...}} (higher is better, equal scores tie).
Every candidate must appear exactly once."""

_PER_CANDIDATE = ("diff_stats", "files_touched", "functions_touched", "out_of_scope_edits", "lint_delta")


def _short(scope: str) -> str:
    """``pkg/mod.py:func`` as ``mod.py:func``."""
    path, _, rest = scope.partition(":")
    return f"{path.rsplit('/', 1)[-1]}:{rest}" if rest else path.rsplit("/", 1)[-1]


def _listed(items: Sequence[str], most: int = 4) -> str:
    shown = ", ".join(items[:most])
    return shown + (f" +{len(items) - most} more" if len(items) > most else "")


def summary_line(tool: str, value: Any) -> str:
    """One short line for a per-candidate tool's result (the all-candidates form)."""
    if tool == "diff_stats":
        v = value
        sizes = f"{v.files} files, +{v.added} -{v.removed}, {v.hunks} hunks"
        return f"{sizes}, {v.comment_lines} comment, {v.blank_lines} blank"
    if tool == "files_touched":
        return _listed([f"{c.path.rsplit('/', 1)[-1]} ({c.kind}) +{c.added} -{c.removed}" for c in value])
    if tool == "functions_touched":
        return _listed([_short(s) for s in value])
    if tool == "out_of_scope_edits":
        line = f"{value.lines_in_scope} in scope, {value.lines_out_of_scope} out"
        return line + (
            f" ({_listed([_short(s) for s in value.out_of_scope], 3)})" if value.out_of_scope else ""
        )
    if tool == "lint_delta":
        if not value.available:
            return "lint unavailable"
        codes = ", ".join(f"{c} {n:+d}" for c, n in value.by_code.items())
        return f"{value.delta:+d}" + (f" ({codes})" if codes else "")
    raise ValueError(f"{tool} has no one-line summary")


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
    """alias -> the tools called on it."""
    tool: str = ""

    def _id(self, args: dict[str, Any], key: str) -> str:
        alias = args.get(key)
        if alias not in self.aliases:
            raise ValueError(f"unknown candidate {alias!r}; the candidates are {sorted(self.aliases)}")
        self.used[alias].append(self.tool)
        return self.aliases[alias]

    def call(self, call: ToolCall) -> str:
        """The tool's result as text for the model; a bad argument comes back as an error message."""
        self.tool = call.tool
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
        if call.tool in simple and "candidate" not in a:
            lines = []
            for alias, tid in self.aliases.items():
                self.used[alias].append(call.tool)
                lines.append(f"{alias}: {summary_line(call.tool, simple[call.tool](self.ws, tid))}")
            return "\n".join(lines)
        if call.tool in simple:
            return _jsonable(simple[call.tool](self.ws, self._id(a, "candidate")))
        if call.tool == "read_patch":
            return self.ws.patch(self._id(a, "candidate"))
        if call.tool == "read_conversation":
            tid = self._id(a, "candidate")
            entry = self.ws.entry(tid)
            head = f"{entry.turns} turns, {entry.tests_run} test runs, {entry.edits_reverted} edits reverted"
            return f"{head}\n\n{self.ws.conversation(tid) or '(a single-shot answer)'}"
        if call.tool == "pairwise_diff":
            first, second = self._id(a, "a"), self._id(a, "b")
            diff = tools.pairwise_diff(self.ws, first, second, self.max_chars)
            for tid, alias in ((first, a["a"]), (second, a["b"])):  # files named by alias, not trajectory id
                diff = diff.replace(f" {tid}/", f" {alias}/")
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


def user_prompt(ws: GroupWorkspace, aliases: dict[str, str], statement_chars: int = 1500) -> str:
    """The first user message: the statement (cut at ``statement_chars``), the failing tests, the aliases."""
    lines = [
        f"Task {ws.task.instance_id}:",
        ws.task.problem_statement.strip()[:statement_chars],
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
            {"role": "user", "content": user_prompt(ws, aliases)},
        ]
        deadline = time.monotonic() + self.total_timeout_s
        for _ in range(self.max_steps):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GraderFailure("timeout", f"no final ranking within {self.total_timeout_s:.1f} s")
            text = self.client.next_message(messages, min(self.request_timeout_s, remaining))
            answer = parse_json_object(text)
            messages.append({"role": "assistant", "content": text})
            if "ranking" in answer or "scores" in answer:
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
        tiers = [[aliases.get(a, a) for a in tier] for tier in final.tiers()]
        scores = None
        if final.scores is not None and set(final.scores) == set(aliases):
            scores = {aliases[a]: float(s) for a, s in final.scores.items()}
        evidence = {
            tid: f"{alias}: " + (", ".join(sorted(set(session.used[alias]))) or "no tool calls")
            for alias, tid in aliases.items()
        }
        return Ranking(tiers, scores, evidence)
