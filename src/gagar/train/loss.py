"""Policy loss of DESIGN.md §4, and the per-token log-probs it is computed from.

For response token t of trajectory i, with Â_i the trajectory's advantage broadcast over its tokens:

    r_{i,t}   = π_θ(o_t | q, o_<t) / π_old(o_t | q, o_<t) = exp(log π_θ − log π_old)
    L_{i,t}   = min(r_{i,t} Â_i, clip(r_{i,t}, 1 − ε_low, 1 + ε_high) Â_i)
    J_PPO     = Σ_{i,t} m_{i,t} L_{i,t} / Σ_{i,t} m_{i,t}
    KL_{i,t}  = π_ref/π_θ − log(π_ref/π_θ) − 1                      (k3 estimator)
    loss      = −J_PPO + β Σ_{i,t} m_{i,t} KL_{i,t} / Σ_{i,t} m_{i,t}

- The clipped surrogate is PPO's (Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7).
- Clip-higher (ε_high > ε_low) and the token-level mean over the whole batch, rather than a mean per
  sequence first, are DAPO's (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System
  at Scale", §3.1 and §3.3).
- The k3 estimator of KL[π_θ ‖ π_ref] is Schulman's (2020, "Approximating KL Divergence"), used as the
  KL term of GRPO (Shao et al. 2024, "DeepSeekMath", eq. 4). β = 0 by default.
- m_{i,t} is the loss mask: 1 on tokens the policy produced, 0 on padding and on tool output.

:func:`policy_loss_reference` is a plain-loop version of :func:`policy_loss`; the tests check they agree.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gagar.train.settings import KLEstimator, PolicyLossConfig

__all__ = [
    "PackedSequences",
    "PolicyLossConfig",
    "kl_penalty",
    "micro_batches",
    "pack_sequences",
    "pad_rows",
    "policy_loss",
    "policy_loss_reference",
    "response_logprobs",
    "response_logprobs_and_entropy",
    "token_entropy",
    "token_logprobs",
    "token_mean",
]


# ---------------------------------------------------------------------------------------------------------
# Log-probs


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log softmax(logits / temperature)[token]`` in float32.

    Args:
        logits: ``(..., vocab)``.
        tokens: ``(...)`` token ids, same leading shape as ``logits``.
        temperature: the sampling temperature the old log-probs were taken at (the trajectories'
            ``sampling.temperature``); no default here: the knob's one default is
            :data:`gagar.schema.trajectory.Temperature`.

    Returns:
        ``(...)`` log-probabilities.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} disagree")
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


@dataclass(frozen=True)
class PackedSequences:
    """Prompt + response rows, right-padded into one batch for a single forward pass.

    Attributes:
        input_ids: ``(batch, seq_len)``; row i is ``prompt_i + response_i + padding``.
        attention_mask: ``(batch, seq_len)``, 1 on real tokens and 0 on padding.
        response_start: ``(batch,)``, index in the row of the first response token (= prompt length).
        response_len: the longest response; the width of every per-response-token tensor.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_start: torch.Tensor
    response_len: int


def pack_sequences(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int
) -> PackedSequences:
    """Lay out ``prompt_i + response_i`` per row, right-padded with ``pad_id``."""
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"need as many prompts as responses, >= 1: {len(prompts)}, {len(responses)}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs a token: the first response token is predicted from it")
    rows = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    input_ids = pad_rows(rows, max(map(len, rows)), pad_id, torch.long)
    attention_mask = pad_rows([[1] * len(r) for r in rows], input_ids.shape[1], 0, torch.long)
    response_start = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return PackedSequences(input_ids, attention_mask, response_start, max(map(len, responses)))


def micro_batches(lengths: Sequence[int], max_tokens: int | None) -> list[list[int]]:
    """Positions ``0..len(lengths)-1`` in order, cut into runs whose padded size (rows times the longest
    row) is at most ``max_tokens``; a row longer than that is a run alone; None: one run."""
    if max_tokens is None or not lengths:
        return [list(range(len(lengths)))]
    runs: list[list[int]] = [[]]
    longest = 0
    for i, n in enumerate(lengths):
        if runs[-1] and (len(runs[-1]) + 1) * max(longest, n) > max_tokens:
            runs.append([])
            longest = 0
        runs[-1].append(i)
        longest = max(longest, n)
    return runs


def pad_rows(rows: Sequence[Sequence[float]], width: int, value: float, dtype: torch.dtype) -> torch.Tensor:
    """Right-pad ragged rows to ``(len(rows), width)`` with ``value``."""
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"row {i} has {len(row)} values, more than width {width}")
        out[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy in nats of ``softmax(logits / temperature)``, in float32, without gradient.

    ``H = −Σ_v p_v log p_v = logsumexp(z) − Σ_v p_v z_v`` with ``z = logits / temperature``: the spread of
    the distribution the policy samples each response token from (a diagnostic: entropy collapse or
    blow-up, DAPO §3.1).

    Args:
        logits: ``(..., vocab)``.
        temperature: the sampling temperature (as :func:`token_logprobs`).

    Returns:
        ``(...)`` entropies.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    with torch.no_grad():
        z = logits.detach().float() / temperature
        return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def _response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_start: torch.Tensor,
    response_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logits scoring each response token, the tokens and where they exist: ``(batch, response_len,
    vocab)``, ``(batch, response_len)``, ``(batch, response_len)`` bool (see :func:`response_logprobs`)."""
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask must be equal 2-d shapes")
    if response_start.shape != (input_ids.shape[0],) or int(response_start.min()) < 1:
        raise ValueError("response_start must have shape (batch,) and values >= 1")
    seq_len = input_ids.shape[1]
    first = int(response_start.min()) - 1  # the first position whose logits score a response token
    logits = _logits_from(model, input_ids, attention_mask, first)  # (batch, seq_len - first, vocab)
    offsets = torch.arange(response_len, device=input_ids.device)
    positions = response_start.to(input_ids.device)[:, None] + offsets[None, :]  # (batch, response_len)
    in_row = positions < seq_len
    positions = positions.clamp(max=seq_len - 1)
    valid = in_row & attention_mask.gather(1, positions).bool()
    scoring = (positions - 1 - first).unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    return logits.gather(1, scoring), input_ids.gather(1, positions), valid


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft wrapper
    return _forward_takes_logits_to_keep(type(base))


@functools.cache
def _forward_takes_logits_to_keep(model_class: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def _logits_from(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, first: int
) -> torch.Tensor:
    """The logits at positions ``first`` … end: a Hugging Face causal LM computes only those
    (``logits_to_keep``), sparing the LM head, the widest matrix of a small model, the prompt's positions."""
    kept = input_ids.shape[1] - first
    if _takes_logits_to_keep(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=kept).logits
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    return logits[:, -kept:] if logits.shape[1] != kept else logits


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_start: torch.Tensor,
    response_len: int,
    temperature: float,
) -> torch.Tensor:
    """Per-response-token log-probs of a Hugging Face causal LM, in one forward pass.

    Alignment: the logits at position p predict the token at p + 1, so response token j of row b, at
    position ``s_b + j`` (``s_b = response_start[b]``), is scored by the logits at ``s_b + j − 1``.

    Args:
        model: a causal LM whose output has ``.logits`` of shape ``(batch, seq_len, vocab)``.
        input_ids: ``(batch, seq_len)`` prompt + response rows, right-padded (see :func:`pack_sequences`).
        attention_mask: ``(batch, seq_len)``.
        response_start: ``(batch,)`` index of each row's first response token, at least 1.
        response_len: width of the result.
        temperature: the sampling temperature (as :func:`token_logprobs`).

    Returns:
        ``(batch, response_len)`` log-probs; 0.0 past the end of a row (mask those positions out).
    """
    return response_logprobs_and_entropy(
        model, input_ids, attention_mask, response_start, response_len, temperature, entropy=False
    )[0]


def response_logprobs_and_entropy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_start: torch.Tensor,
    response_len: int,
    temperature: float,
    *,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_logprobs` and, from the same logits, the policy's entropy at each response token.

    Returns:
        ``(logprobs, entropy)``, both ``(batch, response_len)`` and 0.0 past the end of a row; the
        entropy (:func:`token_entropy`, no gradient) is None when ``entropy`` is False.
    """
    logits, tokens, valid = _response_logits(model, input_ids, attention_mask, response_start, response_len)
    logprobs = token_logprobs(logits, tokens, temperature).masked_fill(~valid, 0.0)
    if not entropy:
        return logprobs, None
    return logprobs, token_entropy(logits, temperature).masked_fill(~valid, 0.0)


# ---------------------------------------------------------------------------------------------------------
# Loss


def token_mean(values: torch.Tensor, mask: torch.Tensor, n_tokens: float | None = None) -> torch.Tensor:
    """Σ over unmasked tokens of the batch / number of unmasked tokens (one global mean, DAPO §3.3).

    Args:
        values: ``(batch, response_len)``.
        mask: ``(batch, response_len)`` bool; masked entries never reach the sum, even if NaN.
        n_tokens: the denominator to use instead of ``mask.sum()``: the token count of the whole batch
            when it is split into micro-batches whose gradients are accumulated.

    Returns:
        A scalar ``()``.
    """
    total = _masked(values, mask).sum()
    count = float(mask.sum()) if n_tokens is None else float(n_tokens)
    if count <= 0:
        raise ValueError("token_mean over zero unmasked tokens: every token of the batch is masked")
    return total / count


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL[π_θ ‖ π_ref] from samples of π_θ (Schulman 2020), shape of the inputs.

    With log ρ = log π_ref − log π_θ: k1 = −log ρ, k2 = ½ (log ρ)², k3 = ρ − log ρ − 1 (GRPO eq. 4).
    """
    log_rho = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_rho
    if estimator == "k2":
        return 0.5 * log_rho.square()
    if estimator == "k3":
        return torch.exp(log_rho) - log_rho - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; expected k1, k2 or k3")


def _masked(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.where(keep, values, torch.zeros_like(values))


def _check_shapes(logprobs: torch.Tensor, advantages: torch.Tensor, **same: torch.Tensor | None) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (batch, response_len), got {tuple(logprobs.shape)}")
    for name, tensor in same.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(f"{name} {tuple(tensor.shape)} must match logprobs {tuple(logprobs.shape)}")
    if advantages.shape != (logprobs.shape[0],):
        raise ValueError(f"advantages must be ({logprobs.shape[0]},) (batch,), got {tuple(advantages.shape)}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyLossConfig | None = None,
    ref_logprobs: torch.Tensor | None = None,
    n_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level PPO-clip loss with clip-higher and an optional KL penalty (module docstring).

    Args:
        logprobs: ``(batch, response_len)`` log π_θ of the response tokens, with gradient.
        old_logprobs: ``(batch, response_len)`` log π_old, the sampling policy's log-probs.
        advantages: ``(batch,)`` one advantage per trajectory, broadcast over its tokens.
        mask: ``(batch, response_len)`` bool or 0/1; 0 on padding and tool output.
        config: clip range and KL settings; defaults to :class:`PolicyLossConfig`.
        ref_logprobs: ``(batch, response_len)`` log π_ref; required when ``config.kl_coef > 0``.
        n_tokens: token count of the whole batch when this is one of several micro-batches whose
            gradients are accumulated (see :func:`token_mean`); the losses then sum across micro-batches.

    Returns:
        ``(loss, metrics)``: the scalar loss to minimise and floats: ``loss/policy``, ``loss/kl`` (0.0
        when no reference is given), ``loss/total``, ``policy/tokens`` and, over this call's unmasked
        tokens when it has any, ``policy/clip_frac_low`` (ratio < 1 − ε_low with Â < 0: clipped),
        ``policy/clip_frac_high`` (ratio > 1 + ε_high with Â > 0), ``policy/clip_frac``,
        ``policy/approx_kl`` (k3 estimate of KL[π_old ‖ π_θ]) and ``policy/ratio_{mean,min,max}``.
    """
    config = config or PolicyLossConfig()
    _check_shapes(logprobs, advantages, old_logprobs=old_logprobs, mask=mask, ref_logprobs=ref_logprobs)
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ValueError(f"kl_coef is {config.kl_coef} but no ref_logprobs were given")
    keep = mask.bool()
    # Zero masked entries first, so that non-finite values there (padding) cannot reach a gradient.
    logprobs, old_logprobs = _masked(logprobs, keep), _masked(old_logprobs.detach(), keep)

    log_ratio = logprobs - old_logprobs  # (batch, response_len)
    ratio = torch.exp(log_ratio)  # r_{i,t}
    adv = advantages.detach().to(logprobs.dtype)[:, None]  # Â_i broadcast over tokens: (batch, 1)
    surrogate = ratio * adv  # r Â
    clipped_surrogate = torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high) * adv
    per_token_objective = torch.minimum(surrogate, clipped_surrogate)  # L_{i,t}, PPO eq. 7
    pg_loss = -token_mean(per_token_objective, keep, n_tokens)  # −J_PPO, token-mean (DAPO)

    if ref_logprobs is not None:
        ref = _masked(ref_logprobs.detach(), keep)
        kl_loss = token_mean(kl_penalty(logprobs, ref, config.kl_estimator), keep, n_tokens)
    else:
        kl_loss = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    total = pg_loss + config.kl_coef * kl_loss

    metrics = {"loss/policy": pg_loss.item(), "loss/kl": kl_loss.item(), "loss/total": total.item()}
    metrics.update(_diagnostics(ratio.detach(), log_ratio.detach(), adv, keep, config))
    return total, metrics


@torch.no_grad()
def _diagnostics(
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    keep: torch.Tensor,
    config: PolicyLossConfig,
) -> dict[str, float]:
    """Clip fractions, approximate KL and ratio statistics over the unmasked tokens."""
    n = int(keep.sum())
    if n == 0:
        return {"policy/tokens": 0.0}
    clipped_low = (ratio < 1.0 - config.clip_low) & (adv < 0)  # gradient zeroed by the lower clip
    clipped_high = (ratio > 1.0 + config.clip_high) & (adv > 0)  # gradient zeroed by the upper clip
    approx_kl = (ratio - 1.0) - log_ratio  # k3 estimate of KL[π_old ‖ π_θ] (Schulman 2020)
    kept_ratio = ratio[keep]
    return {
        "policy/tokens": float(n),
        "policy/clip_frac_low": float(token_mean(clipped_low.float(), keep)),
        "policy/clip_frac_high": float(token_mean(clipped_high.float(), keep)),
        "policy/clip_frac": float(token_mean((clipped_low | clipped_high).float(), keep)),
        "policy/approx_kl": float(token_mean(approx_kl, keep)),
        "policy/ratio_mean": float(kept_ratio.mean()),
        "policy/ratio_min": float(kept_ratio.min()),
        "policy/ratio_max": float(kept_ratio.max()),
    }


def policy_loss_reference(
    logprobs: Sequence[Sequence[float]],
    old_logprobs: Sequence[Sequence[float]],
    advantages: Sequence[float],
    mask: Sequence[Sequence[int]],
    config: PolicyLossConfig | None = None,
    ref_logprobs: Sequence[Sequence[float]] | None = None,
) -> dict[str, float]:
    """Plain-loop :func:`policy_loss` on Python lists: ``loss/policy``, ``loss/kl`` and ``loss/total``."""
    config = config or PolicyLossConfig()
    objective_sum, kl_sum, n = 0.0, 0.0, 0
    for i, advantage in enumerate(advantages):
        for t, keep in enumerate(mask[i]):
            if not keep:
                continue
            ratio = math.exp(logprobs[i][t] - old_logprobs[i][t])
            clipped = min(max(ratio, 1.0 - config.clip_low), 1.0 + config.clip_high)
            objective_sum += min(ratio * advantage, clipped * advantage)
            if ref_logprobs is not None:
                log_rho = ref_logprobs[i][t] - logprobs[i][t]
                kl_sum += {"k1": -log_rho, "k2": 0.5 * log_rho**2, "k3": math.exp(log_rho) - log_rho - 1.0}[
                    config.kl_estimator
                ]
            n += 1
    if n == 0:
        raise ValueError("every token of the batch is masked")
    policy, kl = -objective_sum / n, kl_sum / n
    return {"loss/policy": policy, "loss/kl": kl, "loss/total": policy + config.kl_coef * kl}
