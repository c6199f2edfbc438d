"""The tool-call agent: native function calls rendered by the model's chat template, run in a session.

The tools are declared once, in the OpenAI tools format (:data:`TOOLS`): ``bash`` (a command in the
trajectory's sandboxed session, :mod:`gagar.sandbox.session`), ``str_replace_editor`` (view with line
numbers and ranges, create, str_replace of a unique string, insert after a line, undo_edit) and
``submit``. A chat template that renders ``tools`` (Qwen2.5/3, Llama 3.1+, Hermes-style templates)
renders them itself (:func:`template_renders_tools`); for one that does not (SmolLM2's plain ChatML)
:func:`hermes_system` appends the Hermes convention to the system message, as Qwen2.5's template
writes it::

    # Tools
    You may call one or more functions to assist with the user query.
    You are provided with function signatures within <tools></tools> XML tags:
    <tools>
    {"type": "function", "function": {...}}        one line per tool
    </tools>
    For each function call, return a json object with function name and arguments within
    <tool_call></tool_call> XML tags:
    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

and wraps each tool answer in ``<tool_response>…</tool_response>``. With ``call_format: xml``
(:class:`~gagar.policy.agent.CallFormat`) the last paragraph asks instead for the call format of
Qwen3-Coder's template, whose values are written as they are, so code needs no JSON escaping (a small
model's commonest malformed call is a quote left unescaped in ``old_str``)::

    <tool_call>
    <function=str_replace_editor>
    <parameter=command>
    str_replace
    </parameter>
    <parameter=old_str>
        words = title.split(" ")
    </parameter>
    ...
    </function>
    </tool_call>

A value loses the one newline after its opening tag and the one before its closing tag, and is
converted to its parameter's type (JSON for integers, arrays and objects) as vLLM's ``qwen3_coder``
parser does.

The reply is parsed in either format, whichever it is written in (:func:`parse_tool_call`: the first
``<tool_call>`` block, its closing tag optional, holding a JSON object or a ``<function=…>``; or a
bare JSON object with ``name`` and ``arguments``/``parameters`` as Llama 3.1 writes it, or a bare
``<function=…>``; whitespace around the name is dropped, as a small model often ends it with a
newline); a reply whose call does not parse or validate against :data:`TOOLS` is answered with the
error, counted as ``malformed``, and the conversation goes on. The reply's text stays in the
conversation verbatim (never re-serialised), so the tokens the model sampled are the tokens it is
trained on, and the loss mask is the tool loop's (:mod:`gagar.policy.tool_loop`): 1 on sampled
tokens, 0 on tool answers and chat scaffolding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from gagar.policy.agent import AgentSettings, CallFormat
from gagar.policy.agent_format import named_definition, relevant_files
from gagar.policy.tool_loop import ConversationTools
from gagar.sandbox.shell_session import SessionError
from gagar.schema.task import Task
from gagar.schema.trajectory import Message

__all__ = [
    "HERMES_FOOTER",
    "HERMES_HEADER",
    "SYSTEM_PROMPT",
    "TOOLS",
    "XML_FOOTER",
    "SessionTools",
    "ToolCall",
    "ToolCallKit",
    "call_text",
    "hermes_system",
    "kind_of_call",
    "parse_tool_call",
    "render",
    "template_renders_tools",
    "validate_call",
]

_EDITOR_COMMANDS = ["view", "create", "str_replace", "insert", "undo_edit"]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the repository (/sandbox/repo). The shell persists "
            "between calls; no network. Run the tests with: python -m pytest -q",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "description": "View, create and edit files. view shows numbered lines (view_range [first, "
            "last], last -1: to the end) or lists a directory; create writes a new file; str_replace "
            "replaces old_str, which must occur exactly once, with new_str; insert adds new_str after "
            "line insert_line (0: at the top); undo_edit reverts the last edit of the file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": _EDITOR_COMMANDS},
                    "path": {"type": "string", "description": "File path, relative to the repository."},
                    "view_range": {"type": "array", "items": {"type": "integer"}},
                    "file_text": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                    "insert_line": {"type": "integer"},
                },
                "required": ["command", "path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish: the changes of the working tree are the answer.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
]
"""The agent's tools, declared once (OpenAI tools format): what the template renders, what calls are
checked against."""

SYSTEM_PROMPT = (
    "You fix bugs in a Python repository checked out at /sandbox/repo. Use the tools: read the code, "
    "edit it, run the tests with bash, then call submit."
)
HERMES_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
HERMES_FOOTER = (
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)
XML_FOOTER = (
    "</tools>\n\nFor each function call, write the function's name and each argument's value as it is "
    "(no quotes, no escapes) within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\n"
    "multiple lines\n</parameter>\n</function>\n</tool_call>"
)
_FOOTERS = {CallFormat.JSON: HERMES_FOOTER, CallFormat.XML: XML_FOOTER}
_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "array": list,
    "object": dict,
    "boolean": bool,
}
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(
    r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL
)
_RUNS_TESTS = re.compile(r"\b(pytest|unittest|tox|nox)\b|\btest_\w*\.py\b")


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool's name and its arguments."""

    name: str
    arguments: dict[str, Any]


def hermes_system(
    system: str, tools: Sequence[dict[str, Any]] = TOOLS, call_format: CallFormat = CallFormat.JSON
) -> str:
    """``system`` with the Hermes tools section appended, asking for calls in ``call_format``
    (module docstring)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return f"{system}\n\n{HERMES_HEADER}\n{lines}\n{_FOOTERS[call_format]}"


def call_text(name: str, /, call_format: CallFormat = CallFormat.JSON, **arguments: object) -> str:
    """One assistant turn calling ``name`` in ``call_format``, as :func:`parse_tool_call` reads it."""
    if call_format is CallFormat.JSON:
        call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"<tool_call>\n{call}\n</tool_call>"
    values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in arguments.items()}
    parameters = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


def template_renders_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer's chat template writes a ``tools`` argument into the prompt."""
    probe = [{"role": "user", "content": "x"}]
    try:
        plain = tokenizer.apply_chat_template(probe, tokenize=False)
        with_tools = tokenizer.apply_chat_template(probe, tools=TOOLS, tokenize=False)
    except Exception:  # a template that refuses the argument does not render it
        return False
    return plain != with_tools


def _as_dicts(
    messages: Sequence[Message], hermes: bool, call_format: CallFormat = CallFormat.JSON
) -> list[dict[str, str]]:
    out = []
    for m in messages:
        content = m.content
        if hermes and m.role == "system":
            content = hermes_system(content, TOOLS, call_format)
        elif hermes and m.role == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": m.role, "content": content})
    return out


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    generation_prompt: bool,
    native: bool,
    call_format: CallFormat = CallFormat.JSON,
) -> str:
    """The conversation as the model reads it: ``native``, the template renders :data:`TOOLS`;
    otherwise the Hermes rendering (:func:`hermes_system` asking for ``call_format``,
    ``<tool_response>`` answers)."""
    if native:
        return tokenizer.apply_chat_template(
            _as_dicts(messages, False), tools=TOOLS, tokenize=False, add_generation_prompt=generation_prompt
        )
    return tokenizer.apply_chat_template(
        _as_dicts(messages, True, call_format), tokenize=False, add_generation_prompt=generation_prompt
    )


def _json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (what follows it is ignored)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object")
    value, _ = json.JSONDecoder().raw_decode(text[start:])
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _typed(value: str, spec: dict[str, Any] | None) -> Any:
    """An XML parameter's text as its parameter's type: strings as written, the rest read as JSON
    (left a string when it is not JSON, for :func:`validate_call` to name the type it needed)."""
    if spec is None or spec.get("type") == "string":
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _xml_call(body: str, tools: Sequence[dict[str, Any]]) -> ToolCall | str:
    """The ``<function=NAME><parameter=KEY>value</parameter>…</function>`` call in ``body``."""
    function = _FUNCTION.search(body)
    if function is None:
        return "no <function=NAME> in the tool call"
    name = function.group(1).strip()
    specs = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in tools}.get(name, {})
    arguments: dict[str, Any] = {}
    for key, raw in _PARAMETER.findall(function.group(2)):
        key = key.strip()
        if key in arguments:
            return f"the call gives the parameter {key!r} twice"
        value = raw.removeprefix("\n")
        arguments[key] = _typed(value[:-1] if value.endswith("\n") else value, specs.get(key))
    return ToolCall(name, arguments)


def parse_tool_call(reply: str, tools: Sequence[dict[str, Any]] = TOOLS) -> ToolCall | str:
    """The first call in ``reply`` (module docstring), or why there is none (the agent reads it)."""
    match = _CALL.search(reply)
    body = match.group(1) if match else reply.strip()
    if body.startswith("<function="):
        return _xml_call(body, tools)
    if not match and not body.startswith("{"):
        return "no tool call found: answer with one <tool_call></tool_call> block, as the tools section shows"
    try:
        call = _json_object(body)
    except ValueError as exc:
        return (
            f"the tool call is not valid JSON ({exc}): write one JSON object inside <tool_call></tool_call>"
        )
    name, arguments = call.get("name"), call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return "the call's arguments are a string that is not a JSON object"
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return 'a tool call needs "name" (a string) and "arguments" (an object)'
    return ToolCall(name.strip(), arguments)


def validate_call(call: ToolCall, tools: Sequence[dict[str, Any]] = TOOLS) -> str | None:
    """Why ``call`` does not fit the schema of its tool in ``tools``, or None when it does."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if call.name not in schemas:
        return f"unknown tool {call.name!r}: the tools are {', '.join(schemas)}"
    schema = schemas[call.name]
    missing = [k for k in schema.get("required", []) if k not in call.arguments]
    if missing:
        return f"{call.name} needs {', '.join(missing)}"
    for key, value in call.arguments.items():
        spec = schema["properties"].get(key)
        if spec is None:
            return f"{call.name} takes no argument {key!r}"
        expected = _TYPES[spec["type"]]
        if not isinstance(value, expected) or (spec["type"] == "integer" and isinstance(value, bool)):
            return f"{call.name}: {key} must be a {spec['type']}"
        if "enum" in spec and value not in spec["enum"]:
            return f"{call.name}: {key} must be one of {', '.join(spec['enum'])}"
    return None


def kind_of_call(reply: str) -> str:
    """The ``tool_calls`` key of ``reply`` (:data:`gagar.policy.agent.TOOL_CALL_KINDS`)."""
    call = parse_tool_call(reply)
    if isinstance(call, str) or validate_call(call) is not None:
        return "malformed"
    if call.name == "bash":
        return "bash_tests" if _RUNS_TESTS.search(call.arguments["command"]) else "bash"
    if call.name == "str_replace_editor":
        return str(call.arguments["command"])
    return call.name


class SessionTools:
    """One conversation's session, opened on its first call (lazily), closed as the conversation ends;
    the patch is read from the working tree when it submits. A session that fails (it does not start,
    or is lost: :class:`~gagar.sandbox.shell_session.SessionError`) sets ``infra_error`` instead of
    failing the batch."""

    def __init__(self, task: Task, opener: Callable[[Task], Any]) -> None:
        self.task, self._opener = task, opener
        self._session: Any = None
        self._patch: str | None = None
        self.submitted = False
        self.edits_reverted = 0
        self.infra_error: str | None = None

    @property
    def session(self) -> Any:
        if self._session is None:
            self._session = self._opener(self.task)
        return self._session

    def run(self, command: str, timeout_s: float) -> None:
        """Send ``command`` to the session (opening it first); :meth:`output` reads its answer."""
        try:
            self.session.begin(command, timeout_s)
        except SessionError as exc:
            self.infra_error = str(exc)

    def output(self) -> str:
        """The answer to the command :meth:`run` sent, or what made the session fail."""
        if self.infra_error is None:
            try:
                return str(self.session.finish())
            except SessionError as exc:
                self.infra_error = str(exc)
        return f"error: the sandbox session failed: {self.infra_error}"

    @property
    def patch(self) -> str:
        if self._patch is None:  # a conversation that never opened its session changed nothing
            opened = self._session is not None
            try:
                self._patch = self._session.patch() if self.submitted and opened else ""
            except SessionError as exc:
                self.infra_error, self._patch = str(exc), ""
        return self._patch

    def close(self) -> None:
        if self.submitted:
            _ = self.patch
        if self._session is not None:
            self._session.close()
            self._session = None


def _cut(text: str, limit: int) -> str:
    return (
        text
        if len(text) <= limit
        else text[: limit // 2] + "\n[… truncated …]\n" + text[-(limit // 2 - 20) :]
    )


class ToolCallKit:
    """The tool-call agent's conversations (:class:`gagar.policy.tool_loop.ToolKit`): rendered with the
    template's own tools section when it has one, sessions opened through ``opener``."""

    submit_kind = "submit"

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, settings: AgentSettings, opener: Callable[[Task], Any]
    ) -> None:
        self.native = template_renders_tools(tokenizer)
        self.settings, self.opener = settings, opener

    def shown_definition(self, task: Task) -> tuple[str, int, str] | None:
        """The file, first line and text of the definition the first message shows (``show_definition``:
        the function the statement names, in the most relevant file), or None."""
        return self._definition(task, relevant_files(task))

    def _definition(self, task: Task, likely: list[str]) -> tuple[str, int, str] | None:
        if not (likely and self.settings.show_definition):
            return None
        shown = named_definition(task, likely[0])
        return (likely[0], *shown) if shown is not None else None

    def first_messages(self, task: Task) -> list[Message]:
        files = "\n".join(sorted(task.snapshot or {}))
        likely = relevant_files(task)
        hint = f"\n\nMost relevant: {likely[0]}" if likely else ""
        if (shown := self._definition(task, likely)) is not None:
            _, first, text = shown
            code = text.rstrip("\n")
            hint += f" (lines {first}-{first + code.count(chr(10))})\n```\n{code}\n```"
        listing = f"\n\nFiles:\n{files}" if files else ""
        return [
            Message(role="system", content=SYSTEM_PROMPT),
            Message(role="user", content=f"{task.problem_statement.strip()}{listing}{hint}"),
        ]

    def render(
        self, tokenizer: PreTrainedTokenizerBase, messages: list[Message], generation_prompt: bool
    ) -> str:
        return render(tokenizer, messages, generation_prompt, self.native, self.settings.call_format)

    def open(self, task: Task) -> SessionTools:
        return SessionTools(task, self.opener)

    def kind_of(self, reply: str) -> str:
        return kind_of_call(reply)

    def _begin(self, tools: SessionTools, reply: str) -> str | None:
        """The answer to ``reply`` when it needs no session (an error, submit); else None, the call
        sent to the session."""
        from gagar.sandbox.session import editor_command

        call = parse_tool_call(reply)
        if isinstance(call, str):
            return f"error: {call}"
        if (problem := validate_call(call)) is not None:
            return f"error: {problem}"
        if call.name == "submit":
            tools.submitted = True
            return "submitted"
        command = call.arguments["command"] if call.name == "bash" else editor_command(call.arguments)
        tools.run(command, self.settings.command_timeout_s)
        return None

    def answer(self, turn: Sequence[tuple[ConversationTools, str]]) -> list[str]:
        """Every call of the turn sent to its conversation's session, then every answer read: the
        sessions run their calls at the same time."""
        started = []
        for tools, reply in turn:
            assert isinstance(tools, SessionTools)
            started.append(self._begin(tools, reply))
        out = []
        for (tools, _), answer in zip(turn, started, strict=True):
            text = answer if answer is not None else tools.output() or "(no output)"  # type: ignore[attr-defined]
            out.append(_cut(text, self.settings.max_tool_chars))
        return out
