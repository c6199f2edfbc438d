"""LoRA vs full-weight policy update on the embedded default policy: seconds per update, bytes written.

Both arms run :func:`gagar.train.update.run_update` (load, PPO-clip update, checkpoint) on the same
rollouts of the same SFT checkpoint, alternating, in one process; reports the median of each and
their ratio, and the size of what each checkpoint's ``model/`` and the published adapter hold.

    .venv/bin/python benchmarks/lora_update.py [--repeats 3] [--trajectories 64] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gagar.policy.adapter import publish_adapter
from gagar.policy.generation import HFBackend
from gagar.policy.model import load_policy
from gagar.policy.rollout import rollout
from gagar.policy.sft import SFTConfig, train_sft
from gagar.records import write_records
from gagar.schema.batch import BatchEntry
from gagar.schema.trajectory import SamplingParams
from gagar.stages import train_stage
from gagar.tasks.generate import generate_tasks
from gagar.train.lora import LoraSettings
from gagar.train.update import OptimConfig


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "tokenizer" not in p.name)


def _prepare(work: Path, n_traj: int) -> tuple[Path, Path, Path]:
    """A 4-layer SFT policy (2 steps), ``n_traj`` trajectories from it and a ±1 advantage batch."""
    tasks = generate_tasks(max(1, n_traj // 8), seed=3)
    config = SFTConfig(steps=2, batch_size=4, warmup_steps=1, num_layers=4)
    train_sft(tasks, work / "policy", config, progress=False)
    model, tokenizer = load_policy(work / "policy")
    params = SamplingParams(max_new_tokens=128, seed=1)
    trajs = list(rollout(tasks, HFBackend(model, tokenizer), tokenizer, 8, params, progress=False))
    write_records(work / "trajectories.jsonl", trajs)
    signs = np.random.default_rng(0).choice([-1.0, 1.0], size=len(trajs))
    batch = [
        BatchEntry(
            trajectory_id=t.trajectory_id,
            group_id=t.group_id,
            gen_batch=0,
            reward=float(a > 0),
            advantage=float(a),
            grpo_advantage=float(a),
        )
        for t, a in zip(trajs, signs, strict=True)
    ]
    write_records(work / "batch.jsonl", batch)
    return work / "policy", work / "trajectories.jsonl", work / "batch.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    work = args.work or Path(tempfile.mkdtemp(prefix="lora-bench-"))
    policy, trajectories, batch = _prepare(work, args.trajectories)
    optim = OptimConfig(lr=1e-4, minibatch_size=16)
    arms = {"full": LoraSettings(), "lora": LoraSettings(enabled=True)}
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    tokens_per_s: dict[str, list[float]] = {name: [] for name in arms}
    for repeat in range(args.repeats):
        for name, lora in arms.items():
            start = time.perf_counter()
            metrics = train_stage(
                policy=policy,
                trajectories=[trajectories],
                batch=batch,
                checkpoints=work / f"ckpt-{name}-{repeat}",
                step=0,
                optim=optim,
                lora=lora,
            )
            seconds[name].append(time.perf_counter() - start)
            tokens_per_s[name].append(metrics["perf/tokens_per_s"])
    model_dir = {name: work / f"ckpt-{name}-0" / "step-000000" / "model" for name in arms}
    adapter = publish_adapter(model_dir["lora"], work / "adapters", "policy-step-1")
    n_params = sum(p.numel() for p in load_policy(policy)[0].parameters())
    result = {
        "policy_parameters": n_params,
        "trajectories": args.trajectories,
        "update_s_median": {k: statistics.median(v) for k, v in seconds.items()},
        "train_tokens_per_s_median": {k: statistics.median(v) for k, v in tokens_per_s.items()},
        "lora_over_full_time_ratio": statistics.median(seconds["lora"]) / statistics.median(seconds["full"]),
        "checkpoint_model_bytes": {k: _dir_bytes(v) for k, v in model_dir.items()},
        "published_adapter_bytes": _dir_bytes(adapter),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
