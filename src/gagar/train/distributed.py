"""Data-parallel policy updates under ``torchrun``: DDP, or FSDP for a model that does not fit one device.

Every process (rank) of the update holds the same batch and draws the same shuffled minibatches
(the minibatch order is seeded by run seed and step, never by rank); each rank computes the loss of
its own share of every minibatch (rows ``rank, rank + world, …``). The token-mean of DAPO is taken
over the *whole* minibatch: the ranks all-reduce their unmasked token counts first and divide by the
global count, so the summed per-rank losses are exactly the single-process loss, and the gradient
all-reduce (DDP and FSDP average over ranks, hence the factor ``world``) gives every rank the
single-process gradient. Checkpoints are written by rank 0 only.

A rank whose share of a minibatch is empty (the minibatch has fewer rows than there are ranks)
still runs the forward and backward pass on a fully masked row, so the collective calls match.

``gagar train update`` is the entry point torchrun starts (``torchrun --nproc-per-node N -m gagar
train update …``); on a cluster the train stage has Kubeflow Trainer start it
(:mod:`gagar.train.trainjob`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gagar.train.settings import DistributedSettings, Strategy

__all__ = [
    "DistributedSettings",
    "Strategy",
    "World",
    "all_reduce_max",
    "all_reduce_sum",
    "init_world",
    "merge_metrics",
    "reduce_metrics",
    "shard",
    "wrap_model",
]


_DIAGNOSTICS = (
    "policy/clip_frac_low",
    "policy/clip_frac_high",
    "policy/clip_frac",
    "policy/approx_kl",
    "policy/entropy",
    "policy/ratio_mean",
    "policy/ratio_min",
    "policy/ratio_max",
)
"""What :func:`gagar.train.loss.policy_loss` reports over a call's tokens, only when it has some."""


@dataclass(frozen=True)
class World:
    """This process's place in a data-parallel update."""

    rank: int
    size: int

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes checkpoints and logs."""
        return self.rank == 0


def init_world() -> World | None:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1 in the environment); None when
    this process updates alone. Backend nccl on GPUs, gloo on CPU."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return World(rank=dist.get_rank(), size=dist.get_world_size())


def shard(indices: Any, world: World | None) -> list[int]:
    """This rank's rows of one minibatch: ``indices[rank::size]`` (all of them without a world)."""
    rows = [int(i) for i in indices]
    return rows if world is None else rows[world.rank :: world.size]


def _all_reduce(value: float, world: World | None, op: str) -> float:
    if world is None:
        return value
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return float(tensor.item())


def all_reduce_sum(value: float, world: World | None) -> float:
    """``value`` summed over the ranks (itself without a world)."""
    return _all_reduce(value, world, "SUM")


def all_reduce_max(value: float, world: World | None) -> float:
    """The largest ``value`` of the ranks (itself without a world)."""
    return _all_reduce(value, world, "MAX")


def _summed(key: str) -> bool:
    """Losses (already divided by the minibatch's token count) and token counts add up across parts."""
    return key == "policy/tokens" or key.startswith("loss/")


def merge_metrics(parts: Sequence[tuple[Mapping[str, float], float]]) -> dict[str, float]:
    """The metrics of one process's micro-batches ``(metrics, tokens)`` as one pass over all of them
    would give: losses and token counts summed, ratio extremes as min and max, other diagnostics
    token-weighted (a diagnostic is absent from a part without tokens)."""
    if len(parts) == 1:
        return dict(parts[0][0])
    out: dict[str, float] = {}
    weights: dict[str, float] = {}
    for metrics, tokens in parts:
        for key, value in metrics.items():
            if _summed(key):
                out[key] = out.get(key, 0.0) + value
            elif key == "policy/ratio_min":
                out[key] = min(out.get(key, math.inf), value)
            elif key == "policy/ratio_max":
                out[key] = max(out.get(key, -math.inf), value)
            else:
                out[key] = out.get(key, 0.0) + value * tokens
                weights[key] = weights.get(key, 0.0) + tokens
    return {k: v / weights[k] if weights.get(k) else v for k, v in out.items()}


def reduce_metrics(metrics: Mapping[str, float], tokens: float, world: World | None) -> dict[str, float]:
    """One minibatch's metrics over every rank: losses (already divided by the global token count)
    and token counts summed, ratio extremes as min and max, other diagnostics token-weighted."""
    if world is None:
        return dict(metrics)
    import torch.distributed as dist

    keys = sorted(set(metrics) | set(_DIAGNOSTICS))  # the same on every rank, even one without tokens
    summed = {k for k in keys if _summed(k)}
    values = [metrics.get(k, 0.0) if k in summed else metrics.get(k, 0.0) * tokens for k in keys]
    weighted = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(weighted, op=dist.ReduceOp.SUM)
    total = all_reduce_sum(tokens, world)
    out = {
        k: v if k in summed else (v / total if total else 0.0)
        for k, v in zip(keys, weighted.tolist(), strict=True)
    }
    for key, op, none in (
        ("policy/ratio_min", dist.ReduceOp.MIN, math.inf),
        ("policy/ratio_max", dist.ReduceOp.MAX, -math.inf),
    ):
        extreme = torch.tensor([metrics[key] if tokens else none], dtype=torch.float64)
        dist.all_reduce(extreme, op=op)
        out[key] = float(extreme.item())
    return out if total else {k: v for k, v in out.items() if k in summed}


def wrap_model(model: torch.nn.Module, strategy: Strategy, world: World | None) -> torch.nn.Module:
    """``model`` ready for this world: itself alone, DistributedDataParallel, or sharded in place by
    ``fully_shard`` (FSDP2, one unit per decoder layer and one for the rest)."""
    if world is None:
        return model
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    if device is not None:
        model.to(device)
    if strategy is Strategy.DDP:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device is not None else None)
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            fully_shard(module)
    fully_shard(model)
    return model


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module a DDP wrapper holds (the model itself otherwise)."""
    return getattr(model, "module", model)
