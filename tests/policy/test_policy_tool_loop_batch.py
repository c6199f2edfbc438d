"""The tool loop on a generation batch: one engine call per turn for every live conversation, the
budgets, RUN_TESTS batched, and a real sampled multi-turn trajectory whose loss covers only what the
policy sampled."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from fixtures.policy import ScriptBackend
from gagar.metrics import build_metrics, record_step
from gagar.policy.agent import AgentKind, AgentSettings
from gagar.policy.generation import HFBackend, Sample, sequence_logprobs
from gagar.policy.model import load_policy
from gagar.policy.rollout import rollout
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.tool_loop import first_prompt, run_tool_loops
from gagar.rl_step import rollout_metrics
from gagar.schema.trajectory import SamplingParams

GOLD_EDIT = (
    "EDIT\ncalc/ops.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n"
)


@pytest.fixture(scope="module")
def tokenizer(tasks):
    return train_tokenizer([t for task in tasks for t in task.snapshot.values()], vocab_size=400)


def test_live_conversations_advance_together_and_tests_run_in_one_batch(tasks, tokenizer) -> None:
    add = tasks[0]
    scripts = [
        ["VIEW calc/ops.py", "SUBMIT"],
        ["SUBMIT"],
        ["VIEW calc/ops.py", "SEARCH a - b", "SUBMIT"],
        [GOLD_EDIT, "RUN_TESTS", "SUBMIT"],
        [GOLD_EDIT, "RUN_TESTS", "RUN_TESTS", "SUBMIT"],
    ]
    backend = ScriptBackend(tokenizer, scripts)
    test_batches: list[int] = []

    def run_tests(jobs):
        test_batches.append(len(jobs))
        return [f"report {len(patch)}" for _, patch in jobs]

    jobs = [(add, f"g/{i}", "g") for i in range(len(scripts))]
    out = run_tool_loops(jobs, backend, tokenizer, SamplingParams(seed=3), AgentSettings(), run_tests)
    assert backend.calls == [5, 4, 3, 1]  # one engine call per turn, only for the live conversations
    assert test_batches == [2, 1]  # the turn's RUN_TESTS requests go to the sandbox together
    assert [t.turns for t in out] == [2, 1, 3, 3, 4]
    assert all(t.finish_reason == "submit" for t in out)
    assert out[3].tool_calls == {"EDIT": 1, "RUN_TESTS": 1, "SUBMIT": 1}
    assert out[3].messages[5].content.startswith("report ")
    assert out[1].parse_error == "empty patch"
    assert out[3].parse_error is None
    metrics = rollout_metrics(out)
    assert metrics["rollout/turns_mean"] == pytest.approx(13 / 5)
    assert metrics["rollout/ran_tests_ratio"] == pytest.approx(2 / 5)
    assert metrics["rollout/tool_calls/run_tests"] == pytest.approx(3 / 5)
    assert metrics["rollout/submitted_ratio"] == 1.0
    assert metrics["rollout/tool_calls/submit"] == 1.0  # SUBMIT: a key the tool-call agent shares
    assert metrics["rollout/sampled_tokens_mean"] == pytest.approx(np.mean([sum(t.loss_mask) for t in out]))
    registry = CollectorRegistry()
    unfed = record_step(build_metrics(registry), metrics)
    agent_keys = (
        "rollout/turns",
        "rollout/sampled",
        "rollout/tool_calls",
        "rollout/ran",
        "rollout/submitted",
    )
    assert not [key for key in unfed if key.startswith(agent_keys)]
    calls = registry.get_sample_value("gagar_rollout_tool_calls_per_trajectory", {"command": "run_tests"})
    assert calls == pytest.approx(3 / 5)
    assert registry.get_sample_value("gagar_rollout_ran_tests_ratio") == pytest.approx(2 / 5)


def test_budgets_end_conversations(tasks, tokenizer) -> None:
    add = tasks[0]
    long = ScriptBackend(tokenizer, [["VIEW calc/ops.py"] * 10])
    [t] = run_tool_loops([(add, "a", "g")], long, tokenizer, SamplingParams(), AgentSettings(max_tokens=300))
    assert t.finish_reason == "length"
    assert t.n_prompt_tokens + t.n_response_tokens <= 300
    ticks = iter(range(100))
    slow = ScriptBackend(tokenizer, [["VIEW calc/ops.py"] * 10])
    [t] = run_tool_loops(
        [(add, "b", "g")], slow, tokenizer, SamplingParams(), AgentSettings(max_seconds=2.5),
        clock=lambda: float(next(ticks)),
    )  # fmt: skip
    assert (t.finish_reason, t.turns) == (
        "time",
        2,
    )  # the clock reads 0 at the start, 1 and 2 before turns 1-2
    turns = ScriptBackend(tokenizer, [["SEARCH add"] * 10])
    [t] = run_tool_loops([(add, "c", "g")], turns, tokenizer, SamplingParams(), AgentSettings(max_turns=3))
    assert (t.finish_reason, t.turns, t.parse_error) == ("max_turns", 3, "no SUBMIT")


def test_a_corrected_edit_counts_as_reverted(tasks, tokenizer) -> None:
    wrong = GOLD_EDIT.replace("a + b\n", "b + a + 0\n")
    fix = GOLD_EDIT.replace("a - b\n", "b + a + 0\n")
    backend = ScriptBackend(tokenizer, [[wrong, fix, "SUBMIT"]])
    [t] = run_tool_loops([(tasks[0], "t", "g")], backend, tokenizer, SamplingParams(), AgentSettings())
    assert t.edits_reverted == 1
    assert t.tool_calls["EDIT"] == 2
    assert t.parse_error is None


def test_a_sampled_multi_turn_trajectory_trains_on_sampled_tokens_only(tasks, tiny_policy) -> None:
    """A tiny real policy samples a conversation through the rollout; its masked tokens are exactly
    the tool answers and scaffolding, and the PPO update sees a ratio of 1 on what it sampled."""
    from gagar.train.update import OptimConfig, make_optimizer, update_policy

    torch.manual_seed(0)
    model, tok = load_policy(tiny_policy)
    agent = AgentSettings(kind=AgentKind.TOOL_LOOP, max_turns=3, max_tokens=900)
    params = SamplingParams(max_new_tokens=12, seed=1)
    out = list(rollout(tasks[:1], HFBackend(model, tok), tok, 2, params, agent=agent, progress=False))
    assert [t.trajectory_id for t in out] == ["calc-add/step0/0", "calc-add/step0/1"]
    t = max(out, key=lambda t: t.turns)
    assert t.turns >= 2  # a tiny policy never submits: each turn is answered
    mask = np.array(t.loss_mask)
    assert mask.sum() > 0
    assert (1 - mask).sum() > 0
    # The sampled tokens carry their sampling log-probs; every masked token has 0.0 and no gradient.
    teacher = sequence_logprobs(model, t.prompt_token_ids, t.response_token_ids, params.temperature).numpy()
    np.testing.assert_allclose(np.array(t.old_logprobs)[mask == 1], teacher[mask == 1], atol=2e-4)
    assert all(lp == 0.0 for lp, m in zip(t.old_logprobs, mask, strict=True) if not m)
    masked_text = tok.decode([i for i, m in zip(t.response_token_ids, mask, strict=True) if not m])
    for message in t.messages[3::2]:  # the tool answers after each turn
        if message is not t.messages[-1]:
            assert message.content in masked_text
    runs = np.split(np.arange(len(mask)), np.flatnonzero(np.diff(mask)) + 1)
    turns = [[t.response_token_ids[i] for i in run] for run in runs if mask[run[0]]]
    replies = [m.content for m in t.messages if m.role == "assistant"]
    assert len(turns) == len(replies) == t.turns  # one sampled run per turn, scaffolding between
    for ids, reply in zip(turns, replies, strict=True):
        assert tok.decode(ids[:-1] if ids[-1] == tok.eos_token_id else ids) == reply
    optim = OptimConfig(lr=1e-4, epochs=1, minibatch_size=2)
    metrics = update_policy(
        model, make_optimizer(model, optim), out, np.array([1.0, -1.0]), optim, tok.pad_token_id or 0,
        rng=np.random.default_rng(0),
    )  # fmt: skip
    assert metrics["policy/approx_kl"] == pytest.approx(0.0, abs=1e-5)  # tool tokens (old 0.0) are not in it
    assert metrics["policy/clip_frac"] == 0.0


class CappedBackend:
    """Replies by conversation (told apart by their first prompt) and records each call's
    ``(prompts, max_new_tokens)``, checking it as a server enforcing its context length would."""

    def __init__(self, tokenizer, scripts: dict[tuple[int, ...], list[str]], limit: int) -> None:
        self.tokenizer, self.scripts, self.limit = tokenizer, scripts, limit
        self.stop_token_ids = (tokenizer.eos_token_id,)
        self.caps: list[tuple[int, int]] = []

    def generate(self, prompts, params, n=1):
        self.caps.append((len(prompts), params.max_new_tokens))
        out = []
        for p in prompts:
            assert len(p) + params.max_new_tokens <= self.limit
            [script] = [s for first, s in self.scripts.items() if tuple(p[: len(first)]) == first]
            ids = [
                *self.tokenizer.encode(script.pop(0), add_special_tokens=False),
                self.tokenizer.eos_token_id,
            ]
            out.append([Sample(ids, [-0.25] * len(ids), "stop")])
        return out


def test_a_conversation_near_its_budget_asks_for_no_more(tasks, tokenizer) -> None:
    jobs = [(tasks[0], "short", "g0"), (tasks[2], "long", "g2")]
    firsts = [
        tuple(tokenizer.encode(tokenizer.apply_chat_template(
            [m.model_dump(include={"role", "content"}) for m in first_prompt(t)], tokenize=False,
            add_generation_prompt=True), add_special_tokens=False))
        for t, _, _ in jobs
    ]  # fmt: skip
    scripts = {
        firsts[0]: ["SEARCH add", "SEARCH add", "SUBMIT"],
        firsts[1]: ["VIEW calc/ops.py", "SEARCH a", "SUBMIT"],
    }
    backend = CappedBackend(tokenizer, scripts, 420)
    out = run_tool_loops(
        jobs, backend, tokenizer, SamplingParams(max_new_tokens=64), AgentSettings(max_tokens=420)
    )
    assert backend.caps[0] == (2, 64)
    assert any(n == 1 and cap < 64 for n, cap in backend.caps)  # the long one's own, shorter call
    assert all(t.n_prompt_tokens + t.n_response_tokens <= 420 for t in out)


class _ByTaskBackend:
    """Each conversation replies with the next line of its task's script; one tick of the clock a call."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]], tasks) -> None:
        self.tokenizer, self.now, self.calls = tokenizer, 0.0, []
        self.stop_token_ids = (tokenizer.eos_token_id,)
        self.scripts = {t.problem_statement.splitlines()[0]: list(scripts[t.instance_id]) for t in tasks}

    def generate(self, prompts, params, n=1):
        self.calls.append(len(prompts))
        self.now += 1.0
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            [script] = [s for title, s in self.scripts.items() if title in text]
            eos = self.tokenizer.eos_token_id
            ids = [*self.tokenizer.encode(script.pop(0), add_special_tokens=False), eos]
            out.append([Sample(ids, [-0.25] * len(ids), "stop")])
        return out


def test_at_most_max_live_conversations_advance_and_each_clock_starts_when_it_joins(tasks, tokenizer) -> None:
    a, b, c = tasks[:3]
    scripts = {
        a.instance_id: ["VIEW calc/ops.py", "SUBMIT"],
        b.instance_id: ["SUBMIT"],
        c.instance_id: ["VIEW calc/ops.py"] * 5,
    }
    backend = _ByTaskBackend(tokenizer, scripts, [a, b, c])
    jobs = [(t, t.instance_id, "g") for t in (a, b, c)]
    agent = AgentSettings(max_live=2, max_seconds=1.5)
    out = run_tool_loops(jobs, backend, tokenizer, SamplingParams(), agent, clock=lambda: backend.now)
    # c waits for b's place, joins at t=1 and so may still sample at t=2 (a batch clock would stop it).
    assert backend.calls == [2, 2, 1]
    assert [(t.finish_reason, t.turns) for t in out] == [("submit", 2), ("submit", 1), ("time", 2)]
