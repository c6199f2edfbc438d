"""The RL pipeline through kfp.local with the warm vLLM server on loopback: refill, LoRA, versions.

Skipped without the vLLM environment (``make vllm-env``). Two steps, each drawing up to two generation
batches: step 0 samples under the server's base model (``policy``); its train stage publishes adapter
``policy-step-1`` to the store, step 1's rollout makes the running server load it and samples under
it, and the train stages accept only trajectories of the version the server sampled the step under.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from warm_support import needs_vllm

from gagar.pipeline import store
from gagar.pipeline.local import run_local
from gagar.records import read_records
from gagar.schema.trajectory import Trajectory

pytestmark = [needs_vllm, pytest.mark.slow]


def test_two_pipeline_steps_advance_the_servers_adapter(sft_run, vllm_server, tmp_path: Path) -> None:
    tasks, policy = sft_run
    storage = tmp_path / "store"
    arguments = {
        "policy": str(policy),
        "tasks": str(tasks),
        "storage": str(storage),
        "rollout_group_size": 2,
        "rollout_gen_batch_groups": 2,
        "rollout_train_batch_groups": 3,  # more mixed groups than one batch of two tasks can hold: a refill
        "rollout_max_gen_batches": 2,
        "rollout_max_new_tokens": 16,
        "optim_minibatch_size": 4,
        "optim_lr": 1e-2,
        "advantage_algo": "grpo",
        "sandbox_backend": "local",
        "sandbox_workers": "2",
        "rollout_backend": "server",
        "rollout_endpoint": vllm_server.base_url,
        "lora_enabled": True,
        "lora_rank": 8,
        "lora_alpha": 16.0,
    }
    try:
        result = run_local(arguments, out=tmp_path / "out", steps=2, max_gen_batches=2)
        served = vllm_server.client.served_models()
    finally:
        if "policy-step-1" in vllm_server.client.served_models():
            vllm_server.client.unload_adapter("policy-step-1")  # leave the shared server as found

    assert [row["step"] for row in result.steps] == [0, 1]
    assert all(row["sampling/gen_batches"] == 2.0 for row in result.steps)  # each step refilled
    assert "policy-step-1" in served  # loaded by step 1's rollout
    versions: dict[int, set[str | None]] = {}
    for path in result.pipeline_root.rglob("trajectories"):
        if "rollout" in str(path.parent):
            for t in read_records(path, Trajectory):
                versions.setdefault(t.step, set()).add(t.policy_version)
    assert versions == {0: {"policy"}, 1: {"policy-step-1"}}
    for n in (1, 2):  # each train stage published its adapter
        assert (storage / store.ADAPTERS / f"policy-step-{n}" / "adapter_model.safetensors").is_file()
    assert result.steps[1]["perf/adapter_swap_s"] < 5.0
