"""Rollout writes valid trajectories, which are also sandbox predictions; the CLI commands run."""

from __future__ import annotations

import json
import logging
import re

import pytest
import typer
from typer.testing import CliRunner

from gagar.cli import policy as policy_cli
from gagar.policy.agent import SFT_CONFIG_FILE, AgentKind, AgentSettings, CallFormat, fine_tuned_agent
from gagar.policy.generation import HFBackend
from gagar.policy.prefix_cache import PrefixCachingBackend
from gagar.policy.rollout import make_backend, rollout
from gagar.records import read_records, write_records
from gagar.sandbox.base import Prediction
from gagar.schema.trajectory import SamplingParams, Trajectory


def test_rollout_records_are_valid_trajectories_and_predictions(tiny_policy, tasks, tmp_path) -> None:
    backend, tokenizer = make_backend(str(tiny_policy))
    params = SamplingParams(max_new_tokens=40, seed=1)
    trajectories = list(
        rollout(tasks, backend, tokenizer, 3, params, step=2, tasks_per_call=2, progress=False)
    )
    assert len(trajectories) == 3 * len(tasks)
    path = tmp_path / "traj.jsonl"
    write_records(path, trajectories)
    back = read_records(path, Trajectory)
    assert back == trajectories
    assert len({t.trajectory_id for t in back}) == len(back)
    for t in back:
        assert t.group_id == f"{t.instance_id}/step2"
        assert t.step == 2
        assert t.loss_mask == [1] * t.n_response_tokens
        assert (t.parse_error is None) == bool(t.model_patch)  # an untrained model rarely parses
        assert t.messages[-1].content == t.response
    assert [p.trajectory_id for p in read_records(path, Prediction)] == [t.trajectory_id for t in back]
    again = list(rollout(tasks, backend, tokenizer, 3, params, step=2, tasks_per_call=2, progress=False))
    assert [t.response_token_ids for t in again] == [t.response_token_ids for t in trajectories]


def test_trajectory_rejects_misaligned_token_lists() -> None:
    with pytest.raises(ValueError, match="old_logprobs"):
        Trajectory(trajectory_id="t", instance_id="i", group_id="g", response_token_ids=[1, 2],
                   old_logprobs=[0.0], loss_mask=[1, 1], n_response_tokens=2)  # fmt: skip


def test_cli_rollout_and_sft(tiny_policy, tasks, tmp_path) -> None:
    tasks_file = tmp_path / "tasks.jsonl"
    write_records(tasks_file, tasks)
    app = typer.Typer()
    app.command("rollout")(policy_cli.rollout)
    app.add_typer(policy_cli.app, name="policy")
    out = tmp_path / "t.jsonl"
    args = ["rollout", "--policy", str(tiny_policy), "--tasks", str(tasks_file), "--group-size", "2"]
    result = CliRunner().invoke(app, [*args, "--out", str(out), "--max-new-tokens", "16"])
    assert result.exit_code == 0, result.output
    summary = re.search(r'\{"trajectories".*\}', result.output)  # stderr's progress bars interleave
    assert summary is not None, result.output
    assert json.loads(summary.group(0))["trajectories"] == 2 * len(tasks)
    assert len(read_records(out, Trajectory)) == 2 * len(tasks)
    sft_args = ["policy", "sft", "--tasks", str(tasks_file), "--out", str(tmp_path / "p"), "--steps", "1"]
    result = CliRunner().invoke(app, [*sft_args, "--batch-size", "1", "--noise-share", "0"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p" / "model.safetensors").is_file()


def test_cli_policy_eval_tests_every_answer_in_the_sandbox(tiny_policy, tmp_path) -> None:
    from gagar.tasks.generate import generate_tasks

    tasks = generate_tasks(2, seed=5, split="heldout", workers=1)  # verified: an empty patch fails
    tasks_file = tmp_path / "tasks.jsonl"
    write_records(tasks_file, tasks)
    app = typer.Typer()
    app.add_typer(policy_cli.app, name="policy")
    args = ["policy", "eval", "--policy", str(tiny_policy), "--tasks", str(tasks_file), "--out"]
    result = CliRunner().invoke(
        app, [*args, str(tmp_path / "eval"), "--max-new-tokens", "16", "--workers", "1"]
    )
    assert result.exit_code == 0, result.output
    quality = json.loads(result.output[result.output.index("{") :])
    assert quality["n"] + quality["n_infra_errors"] == len(tasks)
    assert 0.0 <= quality["parse_rate"] <= 1.0
    assert quality["pass_at_1"] <= quality["parse_rate"]
    assert len(read_records(tmp_path / "eval" / "trajectories.jsonl", Trajectory)) == len(tasks)
    assert (tmp_path / "eval" / "summary.json").is_file()


def test_cli_rollout_and_eval_with_the_tool_loop(tiny_policy, tasks, tmp_path) -> None:
    from gagar.tasks.generate import generate_tasks

    app = typer.Typer()
    app.command("rollout")(policy_cli.rollout)
    app.add_typer(policy_cli.app, name="policy")
    tasks_file = tmp_path / "tasks.jsonl"
    write_records(tasks_file, tasks)
    loop = ["--agent", "tool-loop", "--max-turns", "2", "--max-new-tokens", "12"]
    args = ["rollout", "--policy", str(tiny_policy), "--tasks", str(tasks_file), "--group-size", "2"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "t.jsonl"), *loop])
    assert result.exit_code == 0, result.output
    rows = read_records(tmp_path / "t.jsonl", Trajectory)
    assert len(rows) == 2 * len(tasks)
    assert all(t.turns == 2 and sum(t.tool_calls.values()) == 2 for t in rows)  # a tiny policy never submits
    assert all(t.messages[1].role == "user" and t.messages[2].role == "assistant" for t in rows)
    held_out = generate_tasks(2, seed=5, split="heldout", workers=1)
    write_records(tmp_path / "held.jsonl", held_out)
    args = ["policy", "eval", "--policy", str(tiny_policy), "--tasks", str(tmp_path / "held.jsonl")]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "eval"), "--workers", "1", *loop])
    assert result.exit_code == 0, result.output
    quality = json.loads(result.output[result.output.index("{") :])
    assert quality["turns_mean"] == 2.0
    assert quality["submitted_rate"] == 0.0
    assert sum(quality["tool_calls_mean"].values()) == 2.0
    assert quality["sampled_tokens_mean"] <= 2 * 12


def test_a_policy_sampled_with_another_agent_prompt_than_it_was_fine_tuned_for_is_named(
    tiny_policy, tmp_path, caplog
) -> None:
    single, tool_call = AgentSettings(), AgentSettings(kind=AgentKind.TOOL_CALL)
    assert fine_tuned_agent(tiny_policy) == single  # gagar policy sft recorded it
    with caplog.at_level(logging.WARNING, logger="gagar.policy.rollout"):
        make_backend(str(tiny_policy), agent=single.model_copy(update={"max_turns": 3, "max_tokens": 99}))
        assert not caplog.records  # budgets do not change the prompt
        make_backend(str(tiny_policy), agent=tool_call)
    (record,) = caplog.records
    assert str(tiny_policy) in record.getMessage()
    assert "kind single there, tool-call here" in record.getMessage()
    assert fine_tuned_agent(tmp_path) is None  # nothing recorded: a pretrained model, an RL checkpoint
    (tmp_path / SFT_CONFIG_FILE).write_text('{"agent": {"kind": "no-such-agent"}}')
    assert fine_tuned_agent(tmp_path) is None


def test_the_prompt_shaping_settings_of_the_tool_call_agent_are_its_call_format_and_definition() -> None:
    trained = AgentSettings(kind=AgentKind.TOOL_CALL, call_format=CallFormat.XML, show_definition=True)
    assert trained.prompt_differences(trained.model_copy(update={"max_turns": 2, "max_tool_chars": 90})) == {}
    assert trained.prompt_differences(AgentSettings(kind=AgentKind.TOOL_CALL)) == {
        "call_format": ("xml", "json"),
        "show_definition": ("true", "false"),
    }
    assert trained.prompt_differences(AgentSettings()) == {"kind": ("tool-call", "single")}
    # the single-shot prompt has no call format: its unused fields differ without effect
    assert AgentSettings().prompt_differences(AgentSettings(call_format=CallFormat.XML)) == {}


def test_a_multi_turn_agent_prefills_only_what_no_earlier_turn_computed(tiny_policy, tasks) -> None:
    assert isinstance(make_backend(str(tiny_policy))[0], HFBackend)
    assert isinstance(make_backend(str(tiny_policy), agent=AgentSettings())[0], HFBackend)
    loop = AgentSettings(kind=AgentKind.TOOL_LOOP, max_turns=3)
    backend, tokenizer = make_backend(str(tiny_policy), agent=loop)
    assert isinstance(backend, PrefixCachingBackend)
    params = SamplingParams(max_new_tokens=12, seed=3)
    rows = list(rollout(tasks[:2], backend, tokenizer, 2, params, agent=loop, progress=False))
    assert all(t.turns == 3 for t in rows)
    # each group's first prompt is prefilled once, each later turn only past its previous call: of
    # the 12 prompts sent (4 conversations x 3 turns), 2 first turns and every later turn's history
    # come from the cache
    first_prompts = sum(len(t.prompt_token_ids) for t in rows)
    assert backend.stats.cached_tokens >= first_prompts + first_prompts // 2 - 2
    assert backend.stats.cached_tokens > backend.stats.prompt_tokens / 2
    assert backend.store.tokens == 0  # released once the call's conversations ended
