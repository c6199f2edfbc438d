"""SFT: the loss falls, the result round-trips through Hugging Face format, resuming changes nothing."""

from __future__ import annotations

import ast
import itertools
import json
import random

import numpy as np
import pytest
import torch

from gagar.policy.agent_format import answer_from_patch
from gagar.policy.demos import demo_answers, split_signature, tokenize_demos, wrong_fix
from gagar.policy.model import ModelSize, build_model, load_policy, save_policy
from gagar.policy.sft import (
    SFTConfig,
    batch_indices,
    collate,
    lr_factor,
    sft_loss,
    token_counts,
    train_sft,
)
from gagar.policy.tokenizer import train_tokenizer
from gagar.sandbox.base import Prediction
from gagar.sandbox.local import LocalBackend
from gagar.tasks.diffs import apply_diff, make_diff
from gagar.tasks.generate import generate_tasks
from gagar.tasks.oracle import score_patch
from gagar.train.loss import micro_batches

TINY = {
    "vocab_size": 400, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
    "intermediate_size": 64, "batch_size": 3, "warmup_steps": 2, "lr": 1e-2, "max_prompt_tokens": 512,
}  # fmt: skip


def test_loss_decreases_and_model_round_trips(tasks, tmp_path) -> None:
    out = tmp_path / "policy"
    result = train_sft(tasks, out, SFTConfig(steps=30, checkpoint_every=10, **TINY), progress=False)
    assert sum(result.losses[-5:]) / 5 < 0.7 * sum(result.losses[:5]) / 5
    for name in ("config.json", "model.safetensors", "tokenizer.json", "loss_curve.png", "sft_metrics.json"):
        assert (out / name).is_file(), name
    model, tokenizer = load_policy(out)
    ids = torch.tensor([tokenizer.encode("def add(a, b):")])
    again, _ = load_policy(out)
    torch.testing.assert_close(model(input_ids=ids).logits, again(input_ids=ids).logits)


def test_a_saved_policy_tokenizes_text_as_sft_did(tasks, tmp_path) -> None:
    """Rollouts load the tokenizer from the policy directory (as Qwen2Tokenizer, from its config), so it
    must segment prompts and answers exactly as the tokenizer SFT trained with."""
    answers, _ = demo_answers(tasks, noise_share=0.5, seed=0)
    corpus = [text for a in answers for text in (*a.task.snapshot.values(), a.answer)] * 3
    trained = train_tokenizer([*corpus, "round(3.14159 * r**2, 3)\n    return 1024\n"], 400)
    save_policy(build_model(trained, ModelSize(32, 1, 2, 1, 64, 640)), trained, tmp_path)
    _, loaded = load_policy(tmp_path)
    at_sft, _ = tokenize_demos(answers, trained, 512, 128)
    at_rollout, _ = tokenize_demos(answers, loaded, 512, 128)
    assert [(d.prompt_ids, d.answer_ids) for d in at_rollout] == [
        (d.prompt_ids, d.answer_ids) for d in at_sft
    ]
    text = "    total = round(3.14159 * radius**2, 3)\n    return 1024\n"
    assert loaded.encode(text) == trained.encode(text)


def test_resume_equals_uninterrupted(tasks, tmp_path) -> None:
    config = SFTConfig(steps=8, checkpoint_every=3, keep_checkpoints=1, **TINY)
    straight = train_sft(tasks, tmp_path / "a", config, progress=False)
    stopped = train_sft(tasks, tmp_path / "b", config, progress=False, until_step=5)
    assert len(stopped.losses) == 5
    assert not (tmp_path / "b" / "model.safetensors").exists()
    resumed = train_sft(tasks, tmp_path / "b", config, resume=True, progress=False)
    assert resumed.losses == straight.losses
    other = config.model_copy(update={"lr": 3e-3})
    with pytest.raises(ValueError, match="other settings"):
        train_sft(tasks, tmp_path / "b", other, resume=True, progress=False)


def test_noisy_demonstrations_are_unclean_and_share_follows_setting(tasks) -> None:
    many = tasks * 20
    answers, counts = demo_answers(many, noise_share=0.5, seed=0)
    assert 0.3 < counts["noisy"] / len(many) < 0.7
    noisy = [a for a in answers if a.noisy]
    assert all(a.answer != answer_from_patch(a.task.snapshot, a.task.patch) for a in noisy)
    assert any("(\n" in a.answer for a in noisy)  # split_signature: the parameters one a line
    assert any("is None:" in a.answer for a in noisy)  # the catalogue's widened_fix
    catalogue, counts = demo_answers(tasks, noise_share=1.0, seed=0, noise_kinds=["unrelated_file"])
    assert counts["noisy"] == len(tasks)
    assert all(a.answer.count("<<<<<<< SEARCH") == 2 for a in catalogue)
    none, counts = demo_answers(tasks, noise_share=0.0, seed=0)
    assert counts["clean"] == len(tasks)
    assert not any(a.noisy for a in none)
    assert all(score_patch(t, t.patch).clean for t in tasks)


def test_wrong_fixes_apply_edit_the_function_to_fix_and_leave_the_bug(tasks) -> None:
    generated = generate_tasks(4, seed=17, split="train", workers=1)
    for task in [*tasks, *generated]:
        patch = wrong_fix(task, random.Random(0))
        assert patch != task.patch
        answer = answer_from_patch(task.snapshot, patch)  # quotes the file: the answer parses
        assert answer != answer_from_patch(task.snapshot, task.patch)
        after = apply_diff(task.snapshot, patch)
        assert after != apply_diff(task.snapshot, task.patch)
    judged = LocalBackend(workers=1).evaluate(
        [
            (task, Prediction(instance_id=task.instance_id, model_patch=patch))
            for task in generated
            for patch in (task.patch, wrong_fix(task, random.Random(0)))
        ]
    )
    assert [r.resolved for r in judged] == [True, False] * len(generated)


def test_wrong_share_answers_that_share_with_wrong_fixes_and_leaves_other_streams_alone(tasks) -> None:
    many = tasks * 30
    answers, counts = demo_answers(many, noise_share=0.5, seed=0, wrong_share=0.3)
    assert 0.15 < counts["wrong"] / len(many) < 0.45
    assert not any(a.wrong and a.noisy for a in answers)
    gold = {t.instance_id: answer_from_patch(t.snapshot, t.patch) for t in tasks}
    assert all(a.answer != gold[a.task.instance_id] for a in answers if a.wrong)
    before, _ = demo_answers(many, noise_share=0.5, seed=0)
    off, _ = demo_answers(many, noise_share=0.5, seed=0, wrong_share=0.0)
    assert off == before
    with pytest.raises(ValueError, match="wrong_share"):
        demo_answers(tasks, noise_share=0.5, seed=0, wrong_share=1.5)


def test_a_run_records_what_its_demonstrations_are(tasks, tmp_path) -> None:
    config = SFTConfig(steps=2, wrong_share=0.5, micro_batch_tokens=64, **TINY)  # micro-batched steps too
    result = train_sft(tasks * 4, tmp_path, config, progress=False)
    recorded = json.loads((tmp_path / "sft_metrics.json").read_text())["demo_counts"]
    assert recorded == result.demo_counts
    assert result.demo_counts["wrong"] + result.demo_counts["noisy"] + result.demo_counts["clean"] == 12
    assert result.demo_counts["wrong"] > 0


def test_split_signature_keeps_the_fix_and_code_but_is_not_clean(tasks) -> None:
    for task in tasks:
        noisy = split_signature(task.snapshot, task.patch)
        fixed, after = apply_diff(task.snapshot, task.patch), apply_diff(task.snapshot, noisy)
        assert ast.dump(ast.parse(after["calc/ops.py"])) == ast.dump(ast.parse(fixed["calc/ops.py"]))
        assert after != fixed
        quality = score_patch(task, noisy)
        assert not quality.clean
        assert quality.files_beyond_gold == 0
        assert not quality.outside_scopes
    with pytest.raises(ValueError, match="no function"):
        split_signature({"a.py": "x = 1\n"}, make_diff({"a.py": "x = 1\n"}, {"a.py": "x = 2\n"}))


def test_sft_loss_is_the_causal_lm_loss_on_answers_plus_weighted_prompt_loss(tasks) -> None:
    answers, _ = demo_answers(tasks, noise_share=0.0, seed=0)
    corpus = [text for a in answers for text in (*a.task.snapshot.values(), a.answer)]
    tokenizer = train_tokenizer(corpus, 400)
    demos, _ = tokenize_demos(answers, tokenizer, 512, 128)
    model = build_model(tokenizer, ModelSize(32, 1, 2, 1, 64, 640))
    batch = collate(demos, tokenizer.pad_token_id)
    answer_only, answer_part = sft_loss(model, batch, prompt_weight=0.0)
    hf_answer_loss = model(**batch).loss
    torch.testing.assert_close(answer_only, hf_answer_loss)
    torch.testing.assert_close(answer_part, hf_answer_loss)

    prompt_labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    prompt_labels = prompt_labels.masked_fill(batch["labels"] != -100, -100)
    hf_prompt_loss = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=prompt_labels
    ).loss
    total, answer_part = sft_loss(model, batch, prompt_weight=0.5)
    torch.testing.assert_close(total, hf_answer_loss + 0.5 * hf_prompt_loss)
    torch.testing.assert_close(answer_part, hf_answer_loss)


@pytest.mark.parametrize("prompt_weight", [0.0, 0.5])
def test_micro_batches_give_the_gradient_of_the_whole_batch(tasks, prompt_weight: float) -> None:
    answers, _ = demo_answers(tasks, noise_share=0.0, seed=0)
    corpus = [text for a in answers for text in (*a.task.snapshot.values(), a.answer)]
    tokenizer = train_tokenizer(corpus, 400)
    demos, _ = tokenize_demos(answers, tokenizer, 512, 128)
    model = build_model(tokenizer, ModelSize(32, 1, 2, 1, 64, 640))
    pad = tokenizer.pad_token_id
    whole_batch = collate(demos, pad)
    whole, whole_answer = sft_loss(model, whole_batch, prompt_weight)
    expected = torch.autograd.grad(whole, list(model.parameters()))
    lengths = [len(d.prompt_ids) + len(d.answer_ids) for d in demos]
    runs = micro_batches(lengths, max(lengths) + 1)  # a demonstration a pass
    assert len(runs) == len(demos) > 1
    counts = token_counts(whole_batch)
    per_pass = [token_counts(collate([demos[i] for i in run], pad)) for run in runs]
    assert (sum(a for a, _ in per_pass), sum(p for _, p in per_pass)) == counts  # what run_sft adds up
    summed = [torch.zeros_like(p) for p in model.parameters()]
    answer = 0.0
    for run in runs:
        loss, answer_part = sft_loss(model, collate([demos[i] for i in run], pad), prompt_weight, counts)
        for total, grad in zip(summed, torch.autograd.grad(loss, list(model.parameters())), strict=True):
            total += grad
        answer += answer_part.item()
    for got, want in zip(summed, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert answer == pytest.approx(whole_answer.item(), rel=1e-5)


def test_batches_are_deterministic_of_similar_length_and_cover_every_demo() -> None:
    lengths = np.random.default_rng(0).integers(10, 500, size=1000)
    first = batch_indices(lengths, 16, seed=3, step=7)
    assert np.array_equal(first, batch_indices(lengths, 16, seed=3, step=7))
    assert len(set(first.tolist())) == 16
    spreads = [np.ptp(lengths[batch_indices(lengths, 16, 0, s)]) for s in range(200)]
    assert np.median(spreads) < 0.2 * np.ptp(lengths)
    seen = np.concatenate([batch_indices(lengths, 16, 0, s) for s in range(2000)])
    counts = np.bincount(seen, minlength=len(lengths))
    assert counts.min() > 0
    assert counts.max() < 3 * counts.mean()


def test_lr_schedule_warms_up_then_decays() -> None:
    factors = [lr_factor(s, 10, 100) for s in range(100)]
    assert factors[0] == pytest.approx(0.1)
    assert factors[9] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))
    assert factors[-1] > 0.1 - 1e-9


def test_a_run_in_micro_batches_trains_as_one_in_whole_batches(tasks, tmp_path) -> None:
    from fixtures.policy import tiny_sft_config

    whole = train_sft(tasks, tmp_path / "whole", tiny_sft_config(batch_size=3), progress=False)
    split = train_sft(
        tasks, tmp_path / "split", tiny_sft_config(batch_size=3, micro_batch_tokens=1), progress=False
    )
    assert split.losses == pytest.approx(whole.losses, rel=1e-4)
