"""Policy loss: hand-computed values, gradients, masking, micro-batching and the plain-loop reference."""

from __future__ import annotations

import math

import pytest
import torch

from fixtures.policy import tiny_lm
from gagar.train.loss import (
    PolicyLossConfig,
    kl_penalty,
    pack_sequences,
    policy_loss,
    policy_loss_reference,
    response_logprobs,
    response_logprobs_and_entropy,
    token_entropy,
    token_logprobs,
)

torch.set_num_threads(1)
LOG = math.log


def _batch(ratios: list[list[float]], advantages: list[float], mask: list[list[int]] | None = None):
    """logprobs with the given ratios against old log-probs of log 0.5 (a leaf, so gradients can be read)."""
    old = torch.full((len(ratios), len(ratios[0])), LOG(0.5), dtype=torch.float64)
    logprobs = (old + torch.log(torch.tensor(ratios, dtype=torch.float64))).requires_grad_()
    keep = torch.ones_like(old) if mask is None else torch.tensor(mask, dtype=torch.float64)
    return logprobs, old, torch.tensor(advantages, dtype=torch.float64), keep


def test_positive_advantage_clips_only_above_one_plus_eps_high():
    # ratios 1.0, 1.5, 0.5, 1.1 with Â = +1: min(rÂ, clip(r, 0.8, 1.28)Â) = 1.0, 1.28, 0.5, 1.1
    loss, metrics = policy_loss(*_batch([[1.0, 1.5, 0.5, 1.1]], [1.0]))
    assert loss.item() == pytest.approx(-(1.0 + 1.28 + 0.5 + 1.1) / 4)
    assert metrics["policy/clip_frac_high"] == pytest.approx(0.25)
    assert metrics["policy/clip_frac_low"] == 0.0
    assert metrics["policy/ratio_mean"] == pytest.approx(1.025)
    assert metrics["policy/ratio_min"] == pytest.approx(0.5)
    assert metrics["policy/ratio_max"] == pytest.approx(1.5)
    assert metrics["loss/kl"] == 0.0
    assert metrics["loss/total"] == metrics["loss/policy"] == pytest.approx(loss.item())


def test_negative_advantage_clips_only_below_one_minus_eps_low():
    # Â = −2: rÂ = −2, −3, −1, −2.2; clip(r)Â = −2, −2.56, −1.6, −2.2; min = −2, −3, −1.6, −2.2
    loss, metrics = policy_loss(*_batch([[1.0, 1.5, 0.5, 1.1]], [-2.0]))
    assert loss.item() == pytest.approx((2.0 + 3.0 + 1.6 + 2.2) / 4)
    assert metrics["policy/clip_frac_low"] == pytest.approx(0.25)
    assert metrics["policy/clip_frac_high"] == 0.0


def test_clip_higher_is_asymmetric():
    # r = 1.25 is inside [0.8, 1.28] (clip-higher) but would be clipped by a symmetric ε = 0.2
    logprobs, old, adv, mask = _batch([[1.25]], [1.0])
    assert policy_loss(logprobs, old, adv, mask)[0].item() == pytest.approx(-1.25)
    symmetric = PolicyLossConfig(clip_low=0.2, clip_high=0.2)
    assert policy_loss(logprobs, old, adv, mask, symmetric)[0].item() == pytest.approx(-1.2)


def test_token_mean_is_global_over_the_batch_not_per_sequence():
    # one token with Â = +1, three with Â = −1, ratio 1: token mean (1 − 3) / 4 = −0.5 → loss 0.5
    # (a mean per sequence first would give (1 − 1) / 2 = 0)
    loss, metrics = policy_loss(*_batch([[1.0] * 3, [1.0] * 3], [1.0, -1.0], mask=[[1, 0, 0], [1, 1, 1]]))
    assert loss.item() == pytest.approx(0.5)
    assert metrics["policy/tokens"] == 4.0


def test_masked_tokens_contribute_nothing_even_when_not_finite():
    logprobs, old, adv, mask = _batch([[1.5, 0.7, 1.0]], [1.0], mask=[[1, 0, 1]])
    poisoned = logprobs.detach().clone()
    poisoned[0, 1] = float("nan")
    poisoned.requires_grad_()
    loss, _ = policy_loss(poisoned, old, adv, mask)
    loss.backward()
    assert loss.item() == pytest.approx(-(1.28 + 1.0) / 2)
    assert poisoned.grad[0, 1].item() == 0.0


def test_gradient_is_zero_exactly_where_the_clip_binds():
    # row 0, Â = +1: r = 1.5 clipped above (grad 0); r = 0.5 not clipped (d/dlogp of −rÂ/N = −0.5/4)
    # row 1, Â = −1: r = 0.5 clipped below (grad 0); r = 1.5 not clipped (−rÂ/N = +1.5/4)
    logprobs, old, adv, mask = _batch([[1.5, 0.5], [0.5, 1.5]], [1.0, -1.0])
    loss, metrics = policy_loss(logprobs, old, adv, mask)
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -0.125], [0.0, 0.375]], dtype=torch.float64))
    assert metrics["policy/clip_frac_low"] == metrics["policy/clip_frac_high"] == 0.25
    assert metrics["policy/clip_frac"] == 0.5


def test_zero_advantage_gives_zero_loss_and_gradient():
    logprobs, old, adv, mask = _batch([[3.0, 0.1]], [0.0])
    loss, metrics = policy_loss(logprobs, old, adv, mask)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(logprobs.grad) == 0
    assert metrics["policy/clip_frac"] == 0.0


def test_approx_kl_is_k3_of_old_against_new():
    # r = 2: (r − 1) − log r = 1 − ln 2
    _, metrics = policy_loss(*_batch([[2.0]], [1.0]))
    assert metrics["policy/approx_kl"] == pytest.approx(1.0 - LOG(2.0))


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [("k1", LOG(2.0)), ("k2", 0.5 * LOG(2.0) ** 2), ("k3", LOG(2.0) - 0.5)],
)
def test_kl_penalty_estimators_by_hand(estimator: str, expected: float):
    # π_θ = 0.5, π_ref = 0.25: log ρ = −ln 2, ρ = 0.5
    value = kl_penalty(torch.tensor([LOG(0.5)]), torch.tensor([LOG(0.25)]), estimator)
    assert value.item() == pytest.approx(expected)


def test_kl_term_enters_the_total_with_its_coefficient():
    logprobs, old, adv, mask = _batch([[1.0, 1.0]], [0.0])
    ref = logprobs.detach() + LOG(0.5)  # π_ref = π_θ / 2 on every token: k3 = ln 2 − 0.5
    loss, metrics = policy_loss(logprobs, old, adv, mask, PolicyLossConfig(kl_coef=0.1), ref_logprobs=ref)
    assert metrics["loss/kl"] == pytest.approx(LOG(2.0) - 0.5)
    assert loss.item() == pytest.approx(0.1 * (LOG(2.0) - 0.5))
    loss.backward()  # d k3 / d logp = 1 − ρ = 0.5, times β / N
    assert torch.allclose(logprobs.grad, torch.full_like(logprobs, 0.1 * 0.5 / 2))


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_loss_agrees_with_the_plain_loop(seed: int):
    gen = torch.Generator().manual_seed(seed)
    batch, length = 5, 7
    old = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3
    logprobs = old + torch.randn(batch, length, generator=gen, dtype=torch.float64) * 0.4
    ref = old + torch.randn(batch, length, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(batch, generator=gen, dtype=torch.float64)
    mask = (torch.rand(batch, length, generator=gen) > 0.3).to(torch.float64)
    mask[0, 0] = 1.0
    config = PolicyLossConfig(kl_coef=0.05 * seed, kl_estimator=("k1", "k2", "k3")[seed % 3])
    _, metrics = policy_loss(logprobs, old, adv, mask, config, ref_logprobs=ref)
    expected = policy_loss_reference(
        logprobs.tolist(), old.tolist(), adv.tolist(), mask.int().tolist(), config, ref.tolist()
    )
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


def test_micro_batches_with_the_global_token_count_add_up_to_the_full_batch():
    gen = torch.Generator().manual_seed(7)
    old = -torch.rand(4, 6, generator=gen, dtype=torch.float64)
    logprobs = (old + 0.3 * torch.randn(4, 6, generator=gen, dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1] * 6, [1] * 2 + [0] * 4, [1] * 5 + [0], [0, 1, 1, 0, 1, 1]], dtype=torch.bool)
    full, _ = policy_loss(logprobs, old, adv, mask)
    (full_grad,) = torch.autograd.grad(full, logprobs)
    n = float(mask.sum())
    halves = (slice(0, 2), slice(2, 4))
    parts = [policy_loss(logprobs[h], old[h], adv[h], mask[h], n_tokens=n)[0] for h in halves]
    (micro_grad,) = torch.autograd.grad(sum(parts), logprobs)
    assert sum(parts).item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(micro_grad, full_grad, rtol=0, atol=1e-15)


def test_bad_inputs_are_refused_with_a_clear_error():
    logprobs, old, adv, mask = _batch([[1.0, 1.0]], [1.0])
    with pytest.raises(ValueError, match=r"old_logprobs \(1, 3\) must match"):
        policy_loss(logprobs, torch.zeros(1, 3), adv, mask)
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss(logprobs, old, torch.zeros(1, 2), mask)
    with pytest.raises(ValueError, match="no ref_logprobs"):
        policy_loss(logprobs, old, adv, mask, PolicyLossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="every token of the batch is masked"):
        policy_loss(logprobs, old, adv, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="clip_high"):
        PolicyLossConfig(clip_low=0.3, clip_high=0.2)


def test_token_logprobs_is_log_softmax_at_the_temperature():
    logits = torch.tensor([[[1.0, 2.0, 0.5]], [[0.0, -1.0, 3.0]]])  # (batch=2, len=1, vocab=3)
    tokens = torch.tensor([[1], [2]])
    got = token_logprobs(logits, tokens, temperature=2.0)
    expected = torch.log_softmax(logits / 2.0, dim=-1)[:, 0, :].gather(1, tokens)
    assert got.shape == (2, 1)
    assert torch.allclose(got, expected)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, tokens, temperature=0.0)


def test_token_entropy_by_hand():
    # p = (1/2, 1/4, 1/4): H = ½ ln 2 + 2 · ¼ ln 4 = 1.5 ln 2; uniform over 4: ln 4
    halves = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    assert token_entropy(halves, 1.0).item() == pytest.approx(1.5 * LOG(2), abs=1e-6)
    assert token_entropy(halves + 7.0, 1.0).item() == pytest.approx(1.5 * LOG(2), abs=1e-6)  # shift-invariant
    # the temperature divides the logits: 2 ln p at temperature 2 is p again
    assert token_entropy(2.0 * halves, temperature=2.0).item() == pytest.approx(1.5 * LOG(2), abs=1e-6)
    batch = torch.stack([torch.zeros(4), torch.tensor([50.0, 0.0, 0.0, 0.0])])  # (2, vocab=4)
    got = token_entropy(batch, 1.0)
    assert got.shape == (2,)
    assert got[0].item() == pytest.approx(LOG(4), abs=1e-6)
    assert got[1].item() == pytest.approx(0.0, abs=1e-6)  # nearly one-hot
    with pytest.raises(ValueError, match="temperature"):
        token_entropy(batch, temperature=0.0)


def test_response_entropy_is_that_of_the_distribution_each_response_token_was_sampled_from():
    model = tiny_lm()
    prompts, responses = [[5, 6, 7], [9]], [[10, 11], [12, 13, 14, 15]]
    packed = pack_sequences(prompts, responses, pad_id=0)
    args = (packed.input_ids, packed.attention_mask, packed.response_start, packed.response_len, 0.7)
    logprobs, entropy = response_logprobs_and_entropy(model, *args)
    assert torch.equal(logprobs.detach(), response_logprobs(model, *args).detach())
    assert entropy is not None
    assert entropy.shape == (2, 4)
    assert not entropy.requires_grad
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
        for j in range(len(response)):
            p = torch.softmax(logits[len(prompt) + j - 1] / 0.7, dim=-1)
            expected = -sum(float(q) * math.log(float(q)) for q in p)
            assert entropy[row, j].item() == pytest.approx(expected, abs=1e-5)
    assert entropy[0, 2:].tolist() == [0.0, 0.0]  # past the end of the first response


def test_the_update_logs_the_token_mean_entropy_over_the_masked_response_tokens():
    import numpy as np

    from gagar.schema.trajectory import SamplingParams, Trajectory
    from gagar.train.update import OptimConfig, make_optimizer, update_policy

    model = tiny_lm()
    prompts, responses, masks = [[5, 6, 7], [9]], [[10, 11], [12, 13, 14]], [[1, 1], [1, 0, 1]]
    trajectories = [
        Trajectory(
            trajectory_id=f"t{i}",
            instance_id="x",
            group_id="g",
            prompt_token_ids=p,
            response_token_ids=r,
            old_logprobs=[0.0] * len(r),
            loss_mask=m,
            n_prompt_tokens=len(p),
            n_response_tokens=len(r),
            sampling=SamplingParams(temperature=0.7),
        )
        for i, (p, r, m) in enumerate(zip(prompts, responses, masks, strict=True))
    ]
    packed = pack_sequences(prompts, responses, pad_id=0)
    args = (packed.input_ids, packed.attention_mask, packed.response_start, packed.response_len, 0.7)
    _, entropy = response_logprobs_and_entropy(model, *args)  # before the update changes the weights
    kept = [entropy[0, 0], entropy[0, 1], entropy[1, 0], entropy[1, 2]]  # the loss-masked tokens
    config = OptimConfig(lr=1e-3, minibatch_size=2)
    metrics = update_policy(
        model, make_optimizer(model, config), trajectories, np.array([1.0, -1.0]), config, pad_id=0,
        rng=np.random.default_rng(0),
    )  # fmt: skip
    assert metrics["policy/entropy"] == pytest.approx(float(sum(kept)) / 4, abs=1e-5)


def test_response_logprobs_aligns_logits_with_the_next_token():
    model = tiny_lm()
    prompts, responses = [[5, 6, 7], [9]], [[10, 11], [12, 13, 14, 15]]
    packed = pack_sequences(prompts, responses, pad_id=0)
    with torch.no_grad():
        got = response_logprobs(
            model, packed.input_ids, packed.attention_mask, packed.response_start, packed.response_len, 0.7
        )
    assert got.shape == (2, 4)
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        for j, token in enumerate(response):
            expected = torch.log_softmax(logits[len(prompt) + j - 1] / 0.7, dim=-1)[token]
            assert got[row, j].item() == pytest.approx(expected.item(), abs=1e-5)
    assert got[0, 2:].tolist() == [0.0, 0.0]  # past the end of the first response
