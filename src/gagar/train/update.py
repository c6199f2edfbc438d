"""The policy update: PPO-clip epochs over a batch of trajectories and their advantages.

One call is one RL step's update: ``epochs`` passes over the batch in shuffled minibatches,
one optimizer step per minibatch, the loss of :mod:`gagar.train.loss` on the response tokens the
policy produced (tool output is masked by each trajectory's ``loss_mask``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gagar.policy.adapter import is_adapter_dir
from gagar.schema.batch import BatchEntry
from gagar.schema.trajectory import Trajectory
from gagar.train.checkpoint import CheckpointManager
from gagar.train.distributed import (
    Strategy,
    World,
    all_reduce_max,
    all_reduce_sum,
    init_world,
    merge_metrics,
    reduce_metrics,
    shard,
    unwrapped,
    wrap_model,
)
from gagar.train.lora import LoraSettings, load_trainable
from gagar.train.loss import (
    micro_batches,
    pack_sequences,
    pad_rows,
    policy_loss,
    response_logprobs,
    response_logprobs_and_entropy,
    token_mean,
)
from gagar.train.settings import OptimConfig

log = logging.getLogger(__name__)

__all__ = [
    "OptimConfig",
    "StaleTrajectoryError",
    "check_policy_versions",
    "make_optimizer",
    "run_update",
    "update_policy",
]


class StaleTrajectoryError(ValueError):
    """A trajectory of the batch was sampled by another policy version than the one being updated."""


def make_optimizer(model: torch.nn.Module, config: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (all weights, or a LoRA adapter's)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the policy has no trainable parameters")
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def check_policy_versions(trajectories: Sequence[Trajectory], expected: str) -> None:
    """Refuse a batch holding a trajectory that another policy version sampled.

    The PPO ratio is taken against the sampling policy's log-probs, so a trajectory of an older
    adapter would be trained on as if it were on-policy.

    Raises:
        StaleTrajectoryError: naming the first such trajectory, its version and the expected one.
    """
    for t in trajectories:
        if t.policy_version != expected:
            raise StaleTrajectoryError(
                f"trajectory {t.trajectory_id!r} was sampled by policy version {t.policy_version!r}, "
                f"but the update is from {expected!r}: refusing a stale trajectory"
            )


def _temperature(trajectories: Sequence[Trajectory]) -> float:
    temps = {t.sampling.temperature for t in trajectories}
    if len(temps) != 1:
        raise ValueError(
            f"trajectories of one update were sampled at different temperatures: {sorted(temps)}"
        )
    return temps.pop()


def update_policy(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trajectories: Sequence[Trajectory],
    advantages: np.ndarray,
    config: OptimConfig,
    pad_id: int,
    *,
    rng: np.random.Generator,
    reference: torch.nn.Module | None = None,
    world: World | None = None,
) -> dict[str, float]:
    """Update ``model`` in place; returns ``loss/…``, ``policy/…``, ``perf/…`` metrics (minibatch means).

    ``policy/entropy`` is the token-mean entropy (nats) of the policy's next-token distribution over
    the response tokens it produced (loss-masked), from the logits of each minibatch's forward pass,
    i.e. before that minibatch's optimizer step.

    Args:
        trajectories: the kept trajectories of the step, ``(n_traj,)``.
        advantages: their advantages ``(n_traj,)``.
        rng: shuffles the minibatches (seeded by the caller for reproducible resumes; the same on
            every rank).
        reference: frozen reference policy for the KL term; needed only when ``kl_coef > 0``.
        world: this process's rank in a data-parallel update (``model`` wrapped by
            :func:`gagar.train.distributed.wrap_model`): it computes the loss of its rows of each
            minibatch, divided by the minibatch's token count over every rank
            (:mod:`gagar.train.distributed`); None updates alone.
    """
    if len(trajectories) != len(advantages):
        raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages")
    if config.loss.kl_coef > 0 and reference is None:
        raise ValueError("kl_coef > 0 needs a reference policy")
    usable = [i for i, t in enumerate(trajectories) if sum(t.loss_mask) > 0]
    if not usable:
        return {"policy/tokens": 0.0}
    temperature = _temperature(trajectories)
    model.train()
    totals: dict[str, float] = {}
    steps, tokens, grad_norms = 0, 0, []
    start = time.perf_counter()
    for _ in range(config.epochs):
        order = rng.permutation(usable)
        for first in range(0, len(order), config.minibatch_size):
            minibatch = order[first : first + config.minibatch_size]
            rows = shard(minibatch, world)
            local_tokens = float(sum(sum(trajectories[i].loss_mask) for i in rows))
            n_tokens = all_reduce_sum(local_tokens, world)  # the whole minibatch's tokens
            lengths = [_length(trajectories[i]) for i in rows]
            runs = [[rows[j] for j in run] for run in micro_batches(lengths, config.micro_batch_tokens)]
            # Every rank runs as many backward passes (the collectives match); a rank short of rows or of
            # runs makes up the difference with passes over a fully masked row.
            runs += [[]] * (int(all_reduce_max(len(runs), world)) - len(runs))
            optimizer.zero_grad(set_to_none=True)
            parts = []
            for run in runs:
                picked = run or [int(minibatch[0])]
                chunk = [trajectories[i] for i in picked]
                parts.append(
                    _accumulate(
                        model, chunk, advantages[picked], masked_out=not run, n_tokens=n_tokens,
                        config=config, pad_id=pad_id, temperature=temperature,
                        reference=reference, world=world,
                    )
                )  # fmt: skip
            metrics = reduce_metrics(merge_metrics(parts), local_tokens, world)
            params = [p for p in model.parameters() if p.requires_grad]
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)))
            optimizer.step()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value)
            steps += 1
            tokens += int(n_tokens)
    elapsed = time.perf_counter() - start
    out = {key: value / steps for key, value in totals.items()}
    out.update(
        {
            "policy/grad_norm": float(np.mean(grad_norms)),
            "policy/optimizer_steps": float(steps),
            "perf/tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        }
    )
    return out


def _length(trajectory: Trajectory) -> int:
    return len(trajectory.prompt_token_ids) + len(trajectory.response_token_ids)


def _accumulate(
    model: torch.nn.Module,
    chunk: Sequence[Trajectory],
    advantages: np.ndarray,
    *,
    masked_out: bool,
    n_tokens: float,
    config: OptimConfig,
    pad_id: int,
    temperature: float,
    reference: torch.nn.Module | None,
    world: World | None,
) -> tuple[dict[str, float], float]:
    """One forward and backward pass over ``chunk``, its loss divided by the minibatch's ``n_tokens`` so
    the gradients of a minibatch's passes add up to the minibatch's; its metrics and token count."""
    prompts, responses = [t.prompt_token_ids for t in chunk], [t.response_token_ids for t in chunk]
    packed = pack_sequences(prompts, responses, pad_id)
    width = packed.response_len
    old = pad_rows([t.old_logprobs for t in chunk], width, 0.0, torch.float32)  # (rows, width)
    mask = pad_rows([t.loss_mask for t in chunk], width, 0, torch.float32)  # (rows, width)
    mask = mask * 0.0 if masked_out else mask
    adv = torch.tensor(advantages, dtype=torch.float32)
    args = (packed.input_ids, packed.attention_mask, packed.response_start, width, temperature)
    logprobs, entropy = response_logprobs_and_entropy(model, *args)  # (rows, width) each
    ref = None
    if config.loss.kl_coef > 0:
        with torch.no_grad():
            ref = response_logprobs(reference, *args)
    loss, metrics = policy_loss(logprobs, old, adv, mask, config.loss, ref_logprobs=ref, n_tokens=n_tokens)
    if mask.sum() > 0:  # the policy's token-mean entropy over the response tokens it produced
        metrics["policy/entropy"] = float(token_mean(entropy, mask.bool()))
    (loss * (world.size if world else 1)).backward()  # DDP and FSDP average the ranks' gradients
    return metrics, float(mask.sum())


def run_update(
    *,
    policy: Path,
    trajectories: Sequence[Trajectory],
    batch: Sequence[BatchEntry],
    checkpoints: Path,
    step: int,
    seed: int = 0,
    optim: OptimConfig | None = None,
    reference: Path | None = None,
    keep_last: int = 3,
    lora: LoraSettings | None = None,
    policy_version: str | None = None,
    strategy: Strategy = Strategy.DDP,
) -> dict[str, float]:
    """Load ``policy``, update it on the train ``batch``, write checkpoint ``step`` (with the tokenizer).

    Under ``torchrun`` (``WORLD_SIZE`` > 1) every process runs this with the same arguments: the
    update is data-parallel (``strategy``, :mod:`gagar.train.distributed`) and rank 0 alone writes
    the checkpoint; the result equals one process's update on the same batch.

    ``trajectories`` hold (at least) every trajectory the batch names. The optimizer state
    continues from the latest checkpoint under ``checkpoints``, if any. With ``lora.enabled`` only
    an adapter is trained (``policy`` is the SFT base or the previous step's adapter) and the
    checkpoint's ``model/`` is that adapter. With ``policy_version`` set, every trajectory of the
    batch must carry it (:func:`check_policy_versions`).

    Raises:
        ValueError: a batch entry names a trajectory that is not in ``trajectories``.
    """
    from gagar.policy.model import load_policy

    config = optim or OptimConfig()
    entries = list(batch)
    by_id = {t.trajectory_id: t for t in trajectories}
    missing = [e.trajectory_id for e in entries if e.trajectory_id not in by_id]
    if missing:
        raise ValueError(f"train batch: trajectory {missing[0]!r} is in no trajectories file")
    if policy_version is not None:
        check_policy_versions([by_id[e.trajectory_id] for e in entries], policy_version)
    lora = lora or LoraSettings()
    if lora.enabled:
        model, tokenizer = load_trainable(policy, lora, seed=seed)
    elif is_adapter_dir(policy):
        raise ValueError(
            f"{policy} is a LoRA adapter: enable lora to continue training it, or merge it into "
            "a full model first (gagar.train.lora.export_merged)"
        )
    else:
        model, tokenizer = load_policy(policy)
    world = init_world()
    sharded = world is not None and strategy is Strategy.FSDP
    if sharded and lora.enabled:
        raise ValueError("fsdp shards full-weight updates; a LoRA adapter is small: use ddp")
    manager = CheckpointManager(checkpoints, keep_last=keep_last)
    previous = manager.latest()
    resume = previous is not None and previous.step < step
    ref_model = load_policy(reference)[0] if config.loss.kl_coef > 0 and reference is not None else None
    torch.manual_seed(seed * 1_000_003 + step)
    trained = wrap_model(model, strategy, world)
    optimizer = make_optimizer(trained, config)  # over the sharded parameters under fsdp
    if resume and sharded:
        _load_full_optimizer(previous, trained, optimizer)
    elif resume:
        manager.load_optimizer(previous, optimizer)
    log.info(
        "step %d: updating on %d trajectories, %d process(es), %d epoch(s) of minibatches of %d",
        step, len(entries), world.size if world else 1, config.epochs, config.minibatch_size,
    )  # fmt: skip
    metrics = update_policy(
        trained,
        optimizer,
        [by_id[e.trajectory_id] for e in entries],
        np.array([e.advantage for e in entries], dtype=np.float64),
        config,
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        rng=np.random.default_rng([seed, step]),
        reference=ref_model,
        world=world,
    )
    model.eval()
    if world is not None and strategy is Strategy.FSDP:
        return _save_sharded(manager, step, trained, optimizer, tokenizer, metrics, world)
    if world is None or world.is_main:
        manager.save(
            step, unwrapped(trained), optimizer, extra_state={"metrics": metrics}, tokenizer=tokenizer
        )
    if world is not None:
        import torch.distributed as dist

        dist.barrier()  # no rank returns before the checkpoint exists
    return metrics


def _load_full_optimizer(ckpt: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore a checkpoint's full (unsharded, keyed by parameter name) optimizer state into an
    FSDP-sharded optimizer: checkpoints written under fsdp resume under fsdp."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    full = torch.load(ckpt.path / "optimizer.pt", map_location="cpu", weights_only=True)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
    set_optimizer_state_dict(model, optimizer, full, options=options)


def _save_sharded(
    manager: CheckpointManager,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    tokenizer: Any,
    metrics: dict[str, float],
    world: World,
) -> dict[str, float]:
    """Gather an FSDP model's and optimizer's full state on rank 0 and write the checkpoint there.

    The optimizer state is saved keyed by parameter name (torch's full state-dict form), which is
    what :func:`_load_full_optimizer` reads back; the weights load into the unsharded model."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, optim_state = get_state_dict(model, optimizer, options=options)
    tied = getattr(model, "_tied_weights_keys", None) or ()
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        weights = {k: v for k, v in weights.items() if k not in tied}  # saved once, as save_pretrained does
    if world.is_main:
        extra = {"metrics": metrics}
        manager.save(
            step, model, optimizer, extra_state=extra, tokenizer=tokenizer, full_state=(weights, optim_state)
        )
    dist.barrier()
    return metrics
