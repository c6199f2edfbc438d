"""Multi-turn SFT demonstrations: rollout-shaped conversations from gold and unclean patches."""

from __future__ import annotations

import random

import pytest

from fixtures.policy import tiny_sft_config
from gagar.policy.agent import AgentKind, AgentSettings
from gagar.policy.demos import DEFAULT_NOISE_KINDS, demo_answers
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.tool_demos import demo_script, tool_loop_demos
from gagar.sandbox.edits import apply_edit_blocks, parse_edit_blocks
from gagar.tasks.diffs import apply_diff
from gagar.tasks.generate import generate_tasks

AGENT = AgentSettings(kind=AgentKind.TOOL_LOOP, max_tokens=1280)


@pytest.fixture(scope="module")
def generated():
    return generate_tasks(12, 3, verify=False)


@pytest.fixture(scope="module")
def tokenizer(generated):
    return train_tokenizer([t for task in generated for t in task.snapshot.values()], 600)


def test_scripts_view_edit_test_and_submit(generated) -> None:
    answers, _ = demo_answers(generated, 0.5, 0)
    rng = random.Random(0)
    scripts = [demo_script(a, rng, 1.0, DEFAULT_NOISE_KINDS) for a in answers]
    for answer, script in zip(answers, scripts, strict=True):
        assert script[0].startswith("VIEW ")
        assert script[-2:] == ["RUN_TESTS", "SUBMIT"]
        edits = [s for s in script if s.startswith("EDIT\n")]
        assert len(edits) == 1 if answer.noisy else len(edits) in (1, 2)  # clean: corrected when it can be
    assert any(sum(s.startswith("EDIT") for s in script) == 2 for script in scripts)


def test_demonstrations_are_rollout_conversations_with_the_loss_on_the_assistant_turns(
    generated, tokenizer
) -> None:
    answers, _ = demo_answers(generated, 0.5, 0)
    demos, counts = tool_loop_demos(answers, tokenizer, AGENT, 0.5, DEFAULT_NOISE_KINDS, 0)
    assert len(demos) + counts["skipped"] + counts["dropped_too_long"] == len(answers)
    assert counts["corrected"] >= 1
    by_id = {a.task.instance_id: a for a in answers}
    for demo in demos:
        assert demo.answer_mask is not None
        assert len(demo.answer_mask) == len(demo.answer_ids)
        assert len(demo.prompt_ids) + len(demo.answer_ids) <= AGENT.max_tokens
        taught = tokenizer.decode([i for i, m in zip(demo.answer_ids, demo.answer_mask, strict=True) if m])
        untaught = tokenizer.decode(
            [i for i, m in zip(demo.answer_ids, demo.answer_mask, strict=True) if not m]
        )
        assert taught.startswith("VIEW ")
        assert taught.endswith("SUBMIT" + tokenizer.eos_token)
        assert "edit applied" in untaught  # tool answers are context, never taught
        assert "edit applied" not in taught
        assert by_id[demo.instance_id].noisy == demo.noisy


def test_sft_on_multi_turn_demonstrations(tmp_path, generated) -> None:
    from gagar.policy.sft import train_sft

    config = tiny_sft_config(agent=AGENT, correction_share=0.5)
    result = train_sft(generated, tmp_path / "policy", config, progress=False)
    assert result.n_demos >= len(generated) // 2
    assert all(loss == loss for loss in result.losses)
    assert (tmp_path / "policy" / "model.safetensors").is_file()


def test_gold_demos_edit_to_the_gold_patch(generated) -> None:
    answers, _ = demo_answers(generated, 0.0, 0)
    rng = random.Random(1)
    for answer in answers:
        [edit] = [s for s in demo_script(answer, rng, 0.0, DEFAULT_NOISE_KINDS) if s.startswith("EDIT\n")]
        snapshot = answer.task.snapshot
        edited = apply_edit_blocks(dict(snapshot), parse_edit_blocks(edit.removeprefix("EDIT\n")))
        assert edited == apply_diff(snapshot, answer.task.patch)
