"""The tool-call agent: calls parsed from the model's own format, tools rendered by the chat template
when it has a tools section (Hermes otherwise), malformed calls answered, tool output never trained on."""

from __future__ import annotations

import json
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from fixtures.calc import GOLD, calc_task
from gagar.policy.agent import TOOL_CALL_KINDS, AgentSettings, CallFormat
from gagar.policy.generation import Sample
from gagar.policy.rollout import agent_for
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.tool_call_demos import misquote
from gagar.policy.tool_calls import (
    HERMES_FOOTER,
    HERMES_HEADER,
    TOOLS,
    XML_FOOTER,
    ToolCall,
    ToolCallKit,
    call_text,
    kind_of_call,
    parse_tool_call,
    template_renders_tools,
    validate_call,
)
from gagar.policy.tool_loop import run_tool_loops
from gagar.schema.task import Task
from gagar.schema.trajectory import SamplingParams

TOOLS_TEMPLATE = (  # a Qwen2.5-style template with a tools section, written offline
    "{%- if tools %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '\\n\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages[1:] %}{%- if m['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class FakeSession:
    """Stands in for a sandboxed session: records what ran, answers with a fixed text."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def begin(self, command: str, timeout_s: float) -> None:
        editing = "session_editor.py" in command
        self.log.append("edit" if editing else f"bash {command}")
        self.pending = "TOOL-OUTPUT-MARKER edited" if editing else "TOOL-OUTPUT-MARKER 1 passed"

    def finish(self) -> str:
        return self.pending

    def patch(self) -> str:
        return "diff --git a/x b/x\n"

    def close(self) -> None:
        self.log.append("closed")


class Replay:
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


def _tokenizer(task: Task, template: str | None = None):
    vocabulary = agent_for(AgentSettings(kind="tool-call")).vocabulary()
    tok = train_tokenizer([*task.snapshot.values(), task.problem_statement, *vocabulary], vocab_size=600)
    if template is not None:
        tok.chat_template = template
    return tok


def test_parse_the_models_own_formats() -> None:
    call = parse_tool_call('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
    assert call == ToolCall("bash", {"command": "ls"})
    assert parse_tool_call('thinking first <tool_call>{"name": "submit", "arguments": {}}') == ToolCall(
        "submit", {}
    )
    assert parse_tool_call('{"name": "bash", "parameters": {"command": "ls"}}') == ToolCall(
        "bash", {"command": "ls"}
    )
    assert parse_tool_call(
        '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
    ) == (ToolCall("bash", {"command": "ls"}))
    assert parse_tool_call('<tool_call>{"name": "submit\\n", "arguments": {}}</tool_call>') == ToolCall(
        "submit", {}
    )  # a slip SmolLM2 makes (4-6 calls in 20 conversations)
    assert "no tool call" in parse_tool_call("I will now fix the bug.")
    assert "not valid JSON" in parse_tool_call('<tool_call>{"name": "bash", </tool_call>')
    assert "needs" in parse_tool_call('<tool_call>{"arguments": {}}</tool_call>')


def test_parse_the_qwen3_coder_format() -> None:
    reply = (
        "<tool_call>\n<function=str_replace_editor>\n<parameter=command>\nstr_replace\n</parameter>\n"
        '<parameter=path>\ncalc/ops.py\n</parameter>\n<parameter=old_str>\n    return a.split(" ")\n\n'
        "</parameter>\n<parameter=new_str>\n    return a.split()\n</parameter>\n</function>\n</tool_call>"
    )
    assert parse_tool_call(reply) == ToolCall(
        "str_replace_editor",
        {"command": "str_replace", "path": "calc/ops.py", "old_str": '    return a.split(" ")\n',
         "new_str": "    return a.split()"},
    )  # fmt: skip
    view = "<function=str_replace_editor>\n<parameter=command>\nview\n<parameter=path>\na.py\n"
    view += "<parameter=view_range>\n[3, 9]\n"  # no closing tags at all, no <tool_call> (as Qwen3-Coder may)
    assert parse_tool_call(view) == ToolCall("str_replace_editor", {"command": "view", "path": "a.py",
                                                                    "view_range": [3, 9]})  # fmt: skip
    assert parse_tool_call("<tool_call>\n<function=submit>\n</function>\n</tool_call>") == ToolCall(
        "submit", {}
    )
    twice = "<tool_call><function=bash><parameter=command>ls</parameter><parameter=command>pwd</parameter>"
    assert "twice" in parse_tool_call(twice)
    wrong_type = call_text("str_replace_editor", CallFormat.XML, command="insert", path="a", insert_line="x3")
    assert "insert_line must be a integer" in validate_call(parse_tool_call(wrong_type))
    assert kind_of_call(call_text("bash", CallFormat.XML, command="python -m pytest -q")) == "bash_tests"


_CODE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80).filter(
    lambda v: all(tag not in v for tag in ("</parameter>", "<parameter=", "</function>"))
)


@given(
    command=st.sampled_from(["str_replace", "create", "insert"]), old=_CODE, new=_CODE,
    line=st.integers(-3, 10**6), fmt=st.sampled_from(list(CallFormat)),
)  # fmt: skip
def test_a_written_call_reads_back_as_written(
    command: str, old: str, new: str, line: int, fmt: CallFormat
) -> None:
    arguments = {"command": command, "path": "pkg/a.py", "old_str": old, "new_str": new, "insert_line": line}
    assert parse_tool_call(call_text("str_replace_editor", fmt, **arguments)) == ToolCall(
        "str_replace_editor", arguments
    )


def test_validation_against_the_declared_schema() -> None:
    assert validate_call(ToolCall("bash", {"command": "ls"})) is None
    assert "unknown tool" in validate_call(ToolCall("python", {}))
    assert "needs command" in validate_call(ToolCall("bash", {}))
    assert "must be one of" in validate_call(
        ToolCall("str_replace_editor", {"command": "delete", "path": "a"})
    )
    assert "integer" in validate_call(
        ToolCall("str_replace_editor", {"command": "insert", "path": "a", "insert_line": "3", "new_str": "x"})
    )
    assert "takes no argument" in validate_call(ToolCall("submit", {"force": True}))
    assert kind_of_call(call_text("bash", command="python -m pytest -q")) == "bash_tests"
    assert kind_of_call(call_text("bash", command="ls")) == "bash"
    assert kind_of_call(call_text("str_replace_editor", command="view", path="a")) == "view"
    assert kind_of_call("hello") == "malformed"


@given(st.text(max_size=300))
def test_parsing_never_raises(reply: str) -> None:
    call = parse_tool_call(reply)
    assert isinstance(call, (str, ToolCall))
    assert kind_of_call(reply) in TOOL_CALL_KINDS


def test_misquote_changes_indentation_only() -> None:
    assert misquote("def f():\n    return 1\n") == "def f():\n     return 1\n"
    assert misquote("x = 1\n") is None


def test_a_template_with_a_tools_section_renders_the_tools(tasks) -> None:
    task = tasks[0]
    plain, native = _tokenizer(task), _tokenizer(task, TOOLS_TEMPLATE)
    assert not template_renders_tools(plain)
    assert template_renders_tools(native)
    kit_plain = ToolCallKit(plain, AgentSettings(kind="tool-call"), lambda t: None)
    kit_native = ToolCallKit(native, AgentSettings(kind="tool-call"), lambda t: None)
    msgs = kit_native.first_messages(task)
    by_template = kit_native.render(native, msgs, True)
    assert "# Tools\n<tools>" in by_template
    assert HERMES_HEADER not in by_template
    assert json.dumps(TOOLS[0]) in by_template  # the template's own tojson rendering
    hermes = kit_plain.render(plain, msgs, True)
    assert HERMES_HEADER in hermes
    assert HERMES_FOOTER in hermes
    assert '"name": "str_replace_editor"' in hermes
    xml_settings = AgentSettings(kind="tool-call", call_format="xml")
    xml = ToolCallKit(plain, xml_settings, lambda t: None).render(plain, msgs, True)
    assert HERMES_HEADER in xml
    assert XML_FOOTER in xml
    assert HERMES_FOOTER not in xml
    native_xml = ToolCallKit(native, xml_settings, lambda t: None).render(native, msgs, True)
    assert native_xml == by_template  # a template's own tools section wins


def test_the_first_message_can_show_the_named_definition(tasks) -> None:
    task = tasks[2]  # `clamp`, the third function of calc/ops.py
    tokenizer = _tokenizer(task)
    plain = ToolCallKit(tokenizer, AgentSettings(kind="tool-call"), lambda t: None)
    shows = ToolCallKit(tokenizer, AgentSettings(kind="tool-call", show_definition=True), lambda t: None)
    assert plain.shown_definition(task) is None
    assert "```" not in plain.first_messages(task)[1].content
    path, first, text = shows.shown_definition(task)
    lines = task.snapshot[path].splitlines()
    assert path == "calc/ops.py"
    assert lines[first - 1] == "def clamp(x, low, high):"
    last = first + len(text.splitlines()) - 1
    assert lines[last - 1] == "    return x"  # the whole definition, nothing after it
    message = shows.first_messages(task)[1].content
    assert message.endswith(f"Most relevant: calc/ops.py (lines {first}-{last})\n```\n{text}```")
    assert "def scale" not in message
    unnamed = task.model_copy(update={"problem_statement": "the helpers misbehave"})
    assert shows.shown_definition(unnamed) is None  # no named definition: the file is only named


def _conversation(task: Task, tokenizer, replies: list[str]):
    log: list[str] = []
    kit = ToolCallKit(tokenizer, AgentSettings(kind="tool-call", max_tokens=4096), lambda t: FakeSession(log))
    backend = Replay(tokenizer, replies)
    [traj] = run_tool_loops(
        [(task, "t0", "g0")], backend, tokenizer, SamplingParams(),
        AgentSettings(kind="tool-call", max_tokens=4096), kit=kit,
    )  # fmt: skip
    return traj, backend, log


def test_no_tool_output_token_has_loss_weight(tasks) -> None:
    task = tasks[0]
    for template in (None, TOOLS_TEMPLATE):
        tokenizer = _tokenizer(task, template)
        replies = [
            call_text("str_replace_editor", command="view", path="calc/ops.py"),
            "<tool_call>{not json</tool_call>",  # malformed: answered, the conversation goes on
            call_text("bash", command="python -m pytest -q"),
            call_text("submit"),
        ]
        traj, backend, log = _conversation(task, tokenizer, replies)
        assert traj.finish_reason == "submit"
        assert traj.turns == 4
        assert traj.tool_calls == {"view": 1, "malformed": 1, "bash_tests": 1, "submit": 1}
        assert log == ["edit", "bash python -m pytest -q", "closed"]
        assert traj.messages[5].content.startswith("error: the tool call is not valid JSON")
        sampled = [t for t, m in zip(traj.response_token_ids, traj.loss_mask, strict=True) if m]
        assert tokenizer.decode(sampled, skip_special_tokens=True) == "".join(replies)
        weighted = {i for i, m in enumerate(traj.loss_mask) if m}
        unweighted = [t for i, t in enumerate(traj.response_token_ids) if i not in weighted]
        assert "TOOL-OUTPUT-MARKER" in tokenizer.decode(unweighted)
        assert "TOOL-OUTPUT-MARKER" not in tokenizer.decode(sampled)
        assert "error:" not in tokenizer.decode(sampled)
        assert all(lp == 0.0 for lp, m in zip(traj.old_logprobs, traj.loss_mask, strict=True) if not m)
        full = traj.prompt_token_ids + traj.response_token_ids
        for seen in backend.seen:  # each turn saw exactly the recorded conversation so far
            assert full[: len(seen)] == seen


def test_sessions_close_when_conversations_end_without_submit(tasks) -> None:
    task = tasks[0]
    tokenizer = _tokenizer(task)
    log: list[str] = []
    agent = AgentSettings(kind="tool-call", max_tokens=4096, max_turns=2)
    kit = ToolCallKit(tokenizer, agent, lambda t: FakeSession(log))
    [traj] = run_tool_loops(
        [(task, "t", "g")], Replay(tokenizer, [call_text("bash", command="ls")] * 2), tokenizer,
        SamplingParams(), agent, kit=kit,
    )  # fmt: skip
    assert traj.finish_reason == "max_turns"
    assert traj.model_patch == ""
    assert traj.parse_error == "no SUBMIT"
    assert log == ["bash ls", "bash ls", "closed"]


def test_eval_reports_the_share_of_submissions_that_ran_tests() -> None:
    from gagar.policy.evaluate import TrajectoryEval, summarise
    from gagar.schema.result import Status

    def judged(tool_calls: dict[str, int], submitted: bool) -> TrajectoryEval:
        return TrajectoryEval(
            trajectory_id="t", instance_id="i", status=Status.FAILED, resolved=False, parsed=False,
            clean=False,
            diff_size=None, relative_size=None, n_response_tokens=10, turns=3, submitted=submitted,
            tool_calls=tool_calls,
        )  # fmt: skip

    quality = summarise(
        [
            judged({"bash_tests": 1, "submit": 1}, True),
            judged({"view": 1, "submit": 1}, True),
            judged({"bash_tests": 2, "malformed": 1}, False),
        ]
    )
    assert quality.ran_tests_rate == 2 / 3
    assert quality.tested_submissions_rate == 1 / 2
    assert quality.tool_calls_mean["malformed"] == 1 / 3


def test_a_session_that_cannot_start_is_an_infra_error_not_a_crash(tasks) -> None:
    """A broken sandbox (``bwrap`` replaced by ``false``, so the real local session never answers) ends
    that conversation as ``sandbox``; its trajectory is judged ``infra_error`` without being run, in its
    place among the others, and the rest of the batch is judged as usual."""
    from gagar.rl_step import evaluate
    from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
    from gagar.sandbox.session import open_session
    from gagar.schema.result import Status

    task = tasks[0]
    tokenizer = _tokenizer(task)
    broken = LocalBackend(settings=LocalSandboxSettings(bwrap="false"), workers=1)
    agent = AgentSettings(kind="tool-call", max_tokens=4096)
    kit = ToolCallKit(tokenizer, agent, lambda t: open_session(broken, t, 1000))
    replies = [call_text("bash", command="ls"), call_text("submit")]
    [failed] = run_tool_loops(
        [(task, "t-broken", "g")], Replay(tokenizer, replies), tokenizer, SamplingParams(), agent, kit=kit
    )
    assert failed.finish_reason == "sandbox"
    assert failed.infra_error is not None
    assert "did not start" in failed.infra_error
    assert failed.turns == 1
    assert failed.model_patch == ""
    assert [m.role for m in failed.messages][-1] == "assistant"  # the failure is not shown as a tool answer

    calc = calc_task()
    on_calc = {"instance_id": calc.instance_id, "infra_error": None}
    gold = failed.model_copy(update={**on_calc, "trajectory_id": "gold", "model_patch": GOLD})
    empty = failed.model_copy(update={**on_calc, "trajectory_id": "empty"})
    broken = failed.model_copy(update={"instance_id": calc.instance_id})
    results = evaluate([calc], [gold, broken, empty], LocalBackend(workers=1))
    assert [r.trajectory_id for r in results] == ["gold", "t-broken", "empty"]
    assert [r.status for r in results] == [Status.PASSED, Status.INFRA_ERROR, Status.FAILED]
    assert results[1].reason == failed.infra_error
