"""A 2-step RL run through the warm vLLM server: the adapter version advances, the ratio starts at 1.

Skipped without the vLLM environment (``make vllm-env``). The trainer publishes ``policy-step-1`` after
the first update and swaps it into the running server before the second rollout (docs/warm-inference.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from warm_support import needs_vllm

from gagar.records import read_records
from gagar.schema.trajectory import Trajectory
from gagar.train.config import TrainConfig
from gagar.train.lora import LoraSettings, load_trainable
from gagar.train.loss import pack_sequences, response_logprobs
from gagar.train.trainer import Trainer

pytestmark = [needs_vllm, pytest.mark.slow]

LORA = {"enabled": True, "rank": 8, "alpha": 16}


def _trajectories(run: Path, step: int) -> list[Trajectory]:
    return read_records(run / "steps" / f"step-{step:06d}" / "trajectories-0.jsonl", Trajectory)


def test_two_rl_steps_through_the_warm_vllm_server(sft_run, vllm_server, tmp_path: Path) -> None:
    tasks, policy = sft_run
    run = tmp_path / "run"
    config = TrainConfig(
        run_dir=run,
        tasks=tasks,
        policy=policy,
        steps=2,
        rollout={
            "group_size": 2,
            "gen_batch_groups": 2,
            "train_batch_groups": 2,
            "max_gen_batches": 1,
            "max_new_tokens": 16,
            "backend": "server",
            "endpoint": vllm_server.base_url,
        },
        sandbox={"workers": 2},
        advantage={"algo": "grpo"},
        optim={"lr": 1e-2, "minibatch_size": 4},
        lora=LORA,
    )
    rows = Trainer(config, progress=False).run()
    served = vllm_server.client.served_models()
    vllm_server.client.unload_adapter("policy-step-1")  # leave the shared server as the other tests expect

    assert [r["policy_version"] for r in rows] == ["policy", "policy-step-1"]
    assert "policy-step-1" in served
    assert {t.policy_version for t in _trajectories(run, 0)} == {"policy"}
    step1 = _trajectories(run, 1)
    assert {t.policy_version for t in step1} == {"policy-step-1"}
    assert rows[1]["perf/adapter_swap_s"] < 5.0

    # what vLLM sampled under policy-step-1 is what the update recomputes: PPO ratio 1 at the first update
    model, tokenizer = load_trainable(run / "adapters" / "policy-step-1", LoraSettings(**LORA))
    model.eval()
    packed = pack_sequences(
        [t.prompt_token_ids for t in step1], [t.response_token_ids for t in step1], tokenizer.pad_token_id
    )
    [temperature] = {t.sampling.temperature for t in step1}
    args = (packed.input_ids, packed.attention_mask, packed.response_start, packed.response_len, temperature)
    with torch.no_grad():
        recomputed = response_logprobs(model, *args)
    for i, t in enumerate(step1):
        diff = (recomputed[i, : len(t.response_token_ids)] - torch.tensor(t.old_logprobs)).abs()
        assert float(diff.max()) < 1e-3, (t.trajectory_id, float(diff.max()))
