"""The agentic LLM grader: a tool-calling loop over the shared workspace, ending in a JSON verdict.

The model sees the task and the passing candidates under aliases ``c1..ck`` (in the order it is
given, so the position-bias guard can present them reversed). Each turn it answers with exactly one
JSON object: a tool call ``{"tool": NAME, "args": {...}}``, whose result comes back as the next
message, or the final answer. The final answer is pointwise: ``{"scores": {"c1": -4, "c2": 0, ...}}``,
one score per candidate, higher is better (prose before it is allowed and ignored);
the grader derives the ranking (equal scores tied), so a model never has to sort or write tiers. A
tiered ``{"ranking": [["c2"], ["c1", "c3"]]}`` (best first) is accepted too. A per-candidate tool
called without ``candidate`` answers for every candidate at once, one short line each
(:func:`summary_line`): what keeps a small model's transcripts short. Every grading opens with
:data:`OPENING_TOOLS` run by the grader itself (:func:`opening_turns`: the calls and their results, as the
model's own turns would read), so the model's first request already sees each candidate's flags and size
and goes on with whatever further tools it chooses, or answers. Bounded by ``max_turns`` model requests
and ``total_timeout_s``.

Failures raise :class:`~gagar.grader.base.GraderFailure` — ``malformed_json``, ``schema_violation``
(also a score that is not a finite number), ``duplicated_candidate`` (a candidate scored twice),
``too_many_turns``, ``timeout``, ``http_error``, ``bad_response`` — or
:class:`~gagar.schema.grade.RankingError` for an answer that omits, duplicates or invents candidates;
:func:`~gagar.grader.base.grade_group` turns each into a tie with the reason recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, Strict, ValidationError, model_validator

from gagar.grader import tools
from gagar.grader.base import GraderFailure, Ranking
from gagar.grader.llm_client import ChatModel
from gagar.grader.workspace import GroupWorkspace
from gagar.sandbox.base import SandboxBackend

__all__ = [
    "CONCURRENCY",
    "GROUP_TIMEOUT_S",
    "MAX_CANDIDATES",
    "MAX_TURNS",
    "OPENING_TOOLS",
    "SYSTEM_PROMPT",
    "TOOL_NAMES",
    "FinalAnswer",
    "LLMGrader",
    "ToolCall",
    "integrity_first",
    "opening_turns",
    "parse_json_object",
    "summary_line",
    "user_prompt",
]

VERSION = "5"
"""The prompt and transcript format: 5 answers with the scores alone and shows ``diff_stats`` as lines
and files. A grader trained on another version's transcripts must be retrained
(``gagar grader sft --kind llm``). The grader's own opening (:data:`OPENING_TOOLS`) did not change the
format: it writes the turns the version-5 transcripts open with; nor did :func:`integrity_first`, which
the grader applies to whatever the model answers."""
TOOL_NAMES = (
    "read_patch",
    "diff_stats",
    "files_touched",
    "functions_touched",
    "out_of_scope_edits",
    "style_findings",
    "integrity_flags",
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


Score = Annotated[FiniteFloat, Strict()]
"""A finite JSON number (not a string, boolean, NaN or infinity)."""


class FinalAnswer(BaseModel):
    """The model's final answer: scores per alias (higher is better; the ranking follows, equal scores
    tied) and/or tiers of aliases, best first (which then decide the ranking)."""

    model_config = ConfigDict(extra="forbid")

    ranking: list[list[str]] | None = Field(default=None, min_length=1)
    scores: dict[str, Score] | None = None

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


SYSTEM_PROMPT = """Rank patches that all pass the tests: best is targeted and minimal. One JSON object a turn.
Tools, for every candidate when "candidate" is left out: {"tool": "diff_stats"} (size), integrity_flags
(test gaming), out_of_scope_edits, style_findings, files_touched, functions_touched, lint_delta,
read_patch; also pairwise_diff {"a", "b"}, run_tests {"candidate", "tests"}, read_conversation.
Finish: {"scores": {"c1": S, ...}}, higher is better."""


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
        return f"{value.added + value.removed} lines, {value.files} files"
    if tool == "files_touched":
        return _listed([f"{c.path.rsplit('/', 1)[-1]} ({c.kind}) +{c.added} -{c.removed}" for c in value])
    if tool == "functions_touched":
        return _listed([_short(s) for s in value])
    if tool == "out_of_scope_edits":
        line = f"{value.lines_in_scope} in scope, {value.lines_out_of_scope} out"
        return line + (
            f" ({_listed([_short(s) for s in value.out_of_scope], 1)})" if value.out_of_scope else ""
        )
    if tool == "lint_delta":
        if not value.available:
            return "lint unavailable"
        codes = ", ".join(f"{c} {n:+d}" for c, n in value.by_code.items())
        return f"{value.delta:+d}" + (f" ({codes})" if codes else "")
    if tool == "style_findings":
        what = [f.rsplit(": ", 1)[-1] for f in value.findings]
        return f"{len(what)}" + (f" ({_listed(what, 3)})" if what else "")
    if tool == "integrity_flags":
        kinds = [f.split(":", 1)[0] for f in value.flags]
        return f"{len(kinds)}" + (f" ({_listed(kinds, 2)})" if kinds else "")
    raise ValueError(f"{tool} has no one-line summary")


class _JSONObject(dict[str, Any]):
    """A decoded JSON object that remembers the keys it named more than once."""

    duplicates: list[str]


def _object(pairs: list[tuple[str, Any]]) -> _JSONObject:
    out = _JSONObject(pairs)
    keys = [k for k, _ in pairs]
    out.duplicates = sorted({k for k in keys if keys.count(k) > 1})
    return out


def parse_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (code fences and surrounding prose allowed).

    Raises:
        GraderFailure: ``malformed_json`` when there is no JSON object, ``schema_violation`` when
            the JSON is not an object.
    """
    stripped = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    decoder = json.JSONDecoder(object_pairs_hook=_object)
    try:
        value = decoder.decode(stripped)
    except json.JSONDecodeError:
        start = stripped.find("{")
        if start < 0:
            raise GraderFailure("malformed_json", f"no JSON object in the answer: {text[:200]!r}") from None
        try:
            value, _ = decoder.raw_decode(stripped[start:])
        except json.JSONDecodeError as exc:
            message = f"answer is not valid JSON ({exc.msg}): {text[:200]!r}"
            raise GraderFailure("malformed_json", message) from None
    if not isinstance(value, dict):
        raise GraderFailure("schema_violation", f"expected a JSON object, got {type(value).__name__}")
    if value.duplicates:
        raise GraderFailure("schema_violation", f"the answer names {value.duplicates} twice")
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
            "style_findings": tools.style_findings,
            "integrity_flags": tools.integrity_flags,
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


OPENING_TOOLS = ("integrity_flags", "diff_stats")
"""The overview every grading opens with, for every candidate at once, in this order: the flags and the
sizes. The grader runs them itself rather than asking the model to (two fewer requests a grading, and no
decoding of calls that are the same in every grading); the teacher's transcripts open the same way."""


def call_text(call: ToolCall) -> str:
    """A tool call as the model writes it (and as the transcripts show it)."""
    return json.dumps(call.model_dump(exclude_defaults=True), separators=(", ", ": "))


def _result_turn(session: _Session, call: ToolCall) -> dict[str, str]:
    """The user turn answering ``call``: its result through ``session``."""
    return {"role": "user", "content": f"TOOL RESULT {call.tool}: {session.call(call)}"}


def integrity_first(ranking: Ranking, classes: Mapping[str, int]) -> Ranking:
    """``ranking`` with each candidate below every candidate of a lower integrity class
    (:attr:`gagar.grader.tools.IntegrityReport.integrity_class`), the model's order kept within a class.

    The integrity rule is the grader's, not the model's: whatever the candidates' text talks the model
    into, a candidate flagged for text addressed to the grader cannot rank above an honest one, nor a
    reward hack above either. Scores are shifted by class so that they order as the tiers do. A
    candidate ``classes`` does not know (an alias the model invented) stays where it was, for the
    ranking check to report.
    """
    order = sorted({classes.get(t, 0) for tier in ranking.tiers for t in tier})
    tiers = [[t for t in tier if classes.get(t, 0) == c] for c in order for tier in ranking.tiers]
    scores = ranking.scores
    if scores:
        span = max(scores.values()) - min(scores.values()) + 1.0
        scores = {t: s - span * classes.get(t, 0) for t, s in scores.items()}
    return Ranking([tier for tier in tiers if tier], scores, ranking.evidence)


def opening_turns(session: _Session, calls: Sequence[ToolCall]) -> list[dict[str, str]]:
    """The chat turns of ``calls`` run through ``session``: each call as an assistant turn, its result as
    the user turn after it."""
    turns = []
    for call in calls:
        turns += [{"role": "assistant", "content": call_text(call)}, _result_turn(session, call)]
    return turns


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def user_prompt(
    ws: GroupWorkspace, aliases: dict[str, str], statement_chars: int = 120, tests: int = 2
) -> str:
    """The first user message, as short as the ranking allows: the statement's first line(s) (cut at
    ``statement_chars``), the names of the first ``tests`` failing tests and how many more, the aliases."""
    failing = ws.task.FAIL_TO_PASS
    names = [t.rsplit("::", 1)[-1] for t in failing[:tests]]
    more = f" +{len(failing) - tests}" if len(failing) > tests else ""
    statement = " ".join(ws.task.problem_statement.split())[:statement_chars]
    return f"Task: {statement}\nTests: {', '.join(names)}{more}\nCandidates: {', '.join(aliases)}"


MAX_TURNS = 8
"""Most tool-calling turns of one grading (``grader.max_turns``'s default)."""

GROUP_TIMEOUT_S = 300.0
"""Seconds one grading (one group, every turn) may take; the llm grader's timeout, its one default."""

MAX_CANDIDATES = 8
"""Most candidates one grading shows the model (the largest groups of its transcripts); a larger
group is ranked in chunks and merged (:mod:`gagar.grader.split`)."""

CONCURRENCY = 16
"""Gradings :func:`gagar.grader.run.make_grader`'s LLM grader runs at once: every group of a step in
both candidate orders, decoded together by one warm server."""


class LLMGrader:
    """Ranks candidates by talking to an OpenAI-compatible model that calls the inspection tools.

    ``concurrency`` conversations may run at once (the client is thread-safe); ``max_candidates`` is
    the most candidates one conversation shows; ``opening`` the tools the grader runs before the model's
    first request (``()``: the model calls every tool itself).
    """

    name = "llm"
    version = VERSION

    def __init__(
        self,
        client: ChatModel,
        *,
        max_turns: int = MAX_TURNS,
        request_timeout_s: float = 60.0,
        total_timeout_s: float = GROUP_TIMEOUT_S,
        tool_output_chars: int = 4000,
        backend: SandboxBackend | None = None,
        concurrency: int = 1,
        max_candidates: int = MAX_CANDIDATES,
        opening: Sequence[str] = OPENING_TOOLS,
    ) -> None:
        if concurrency < 1 or max_candidates < 2:
            raise ValueError(f"concurrency >= 1 and max_candidates >= 2, got {concurrency}, {max_candidates}")
        self.opening = [ToolCall(tool=name) for name in opening]
        self.concurrency, self.max_candidates = concurrency, max_candidates
        self.client = client
        self.max_turns, self.backend = max_turns, backend
        self.request_timeout_s, self.total_timeout_s = request_timeout_s, total_timeout_s
        self.tool_output_chars = tool_output_chars

    def rank(self, ws: GroupWorkspace, order: Sequence[str]) -> Ranking:
        aliases = {f"c{i}": tid for i, tid in enumerate(order, start=1)}
        session = _Session(ws, aliases, self.backend, self.tool_output_chars, {a: [] for a in aliases})
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_prompt(ws, aliases)},
            *opening_turns(session, self.opening),
        ]
        deadline = time.monotonic() + self.total_timeout_s
        for _ in range(self.max_turns):
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
            messages.append(_result_turn(session, call))
        raise GraderFailure("too_many_turns", f"no final ranking after {self.max_turns} turns")

    @staticmethod
    def _final(answer: dict[str, Any], session: _Session) -> Ranking:
        scored = answer.get("scores")
        if isinstance(scored, _JSONObject) and scored.duplicates:
            raise GraderFailure("duplicated_candidate", f"the scores name {scored.duplicates} twice")
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
        classes = {tid: tools.integrity_flags(session.ws, tid).integrity_class for tid in aliases.values()}
        return integrity_first(Ranking(tiers, scores, evidence), classes)
