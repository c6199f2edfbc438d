"""The trainer with LoRA on: in-process rollouts from base + adapter, and a warm server swapping adapters."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fixtures.policy import tiny_sft_config
from gagar import rl_step
from gagar.policy.adapter import ADAPTER_FILES, is_adapter_dir, publish_adapter
from gagar.policy.model import load_policy
from gagar.records import read_records, write_records
from gagar.schema.batch import BatchEntry
from gagar.schema.trajectory import SamplingParams, Trajectory
from gagar.tasks.generate import generate_tasks
from gagar.tasks.loaders import write_tasks
from gagar.train.checkpoint import CheckpointManager
from gagar.train.config import TrainConfig
from gagar.train.lora import LoraSettings, load_trainable
from gagar.train.loss import pack_sequences, response_logprobs
from gagar.train.trainer import Trainer
from gagar.train.update import OptimConfig

pytestmark = pytest.mark.slow  # LoRA training runs end to end

torch.set_num_threads(1)

LORA = {"enabled": True, "rank": 4, "alpha": 8}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tasks file and a tiny SFT policy trained on those tasks."""
    from gagar.policy.sft import train_sft

    root = tmp_path_factory.mktemp("lora-run")
    tasks = generate_tasks(3, seed=11)
    write_tasks(root / "tasks.jsonl", tasks)
    train_sft(tasks, root / "policy", tiny_sft_config(), progress=False)
    return root / "tasks.jsonl", root / "policy"


def _config(
    run_dir: Path, tasks: Path, policy: Path, steps: int = 2, lora: dict | None = None, **rollout
) -> TrainConfig:
    return TrainConfig(
        run_dir=run_dir,
        tasks=tasks,
        policy=policy,
        steps=steps,
        rollout={
            "group_size": 2,
            "gen_batch_groups": 2,
            "train_batch_groups": 2,
            "max_gen_batches": 1,
            "max_new_tokens": 16,
            **rollout,
        },
        sandbox={"workers": 2},
        advantage={"algo": "grpo"},
        optim=OptimConfig(lr=1e-2, minibatch_size=4),
        lora=lora or LORA,
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _trajectories(run: Path, step: int) -> list[Trajectory]:
    return read_records(run / "steps" / f"step-{step:06d}" / "trajectories-0.jsonl", Trajectory)


def test_lora_run_samples_from_base_plus_adapter_and_publishes_each_update(setup, tmp_path: Path):
    """Three updates with ``keep_adapters`` 2: each published, the oldest pruned from the run."""
    tasks, policy = setup
    weights = _sha(policy / "model.safetensors")
    config = _config(tmp_path / "run", tasks, policy, steps=3, lora={**LORA, "keep_adapters": 2})
    rows = Trainer(config, progress=False).run()

    assert [r["step"] for r in rows] == [0, 1, 2]
    assert _sha(policy / "model.safetensors") == weights  # the SFT base is never written
    checkpoints = CheckpointManager(tmp_path / "run" / "checkpoints").checkpoints()
    assert all(is_adapter_dir(c.path / "model") for c in checkpoints)
    assert rows[1]["policy"] == str(checkpoints[0].path / "model")  # step 1 sampled base + adapter 1
    assert {t.policy_version for t in _trajectories(tmp_path / "run", 1)} == {rows[1]["policy"]}
    adapters = tmp_path / "run" / "adapters"
    assert sorted(p.name for p in adapters.iterdir()) == ["policy-step-2", "policy-step-3"]
    for row, name in zip(rows[1:], ("policy-step-2", "policy-step-3"), strict=True):
        size = sum((adapters / name / f).stat().st_size for f in ADAPTER_FILES)
        assert row["lora/adapter_bytes"] == size


def _assert_ratio_one(
    model: torch.nn.Module, rows: list[tuple[list[int], list[int], list[float]]], pad: int, temperature: float
):
    """The update's recomputation of tokens sampled at ``temperature``: exp(new - old) is 1 within 1e-4
    for every token."""
    packed = pack_sequences([p for p, _, _ in rows], [r for _, r, _ in rows], pad)
    args = (packed.input_ids, packed.attention_mask, packed.response_start, packed.response_len, temperature)
    with torch.no_grad():
        recomputed = response_logprobs(model, *args)
    for i, (_, response, old) in enumerate(rows):
        ratio = torch.exp(recomputed[i, : len(response)] - torch.tensor(old))
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4), (i, ratio)


def _train_extra_adapter(run: Path, out: Path) -> Path:
    """An adapter surely away from the base: one update of step 1's adapter on ±1 advantages."""
    trajectories = run / "steps" / "step-000000" / "trajectories-0.jsonl"
    entries = [
        BatchEntry(
            trajectory_id=t.trajectory_id,
            group_id=t.group_id,
            gen_batch=0,
            reward=float(i % 2),
            advantage=1.0 if i % 2 else -1.0,
            grpo_advantage=1.0 if i % 2 else -1.0,
        )
        for i, t in enumerate(read_records(trajectories, Trajectory))
    ]
    write_records(out / "batch.jsonl", entries)
    policy = run / "adapters" / "policy-step-1"
    config = TrainConfig.from_values(
        {"tasks": "tasks.jsonl", "policy": str(policy), "optim": OptimConfig(lr=1e-2), "lora": LORA}
    )
    rl_step.update(
        config,
        policy=policy,
        trajectories=read_records(trajectories, Trajectory),
        batch=read_records(out / "batch.jsonl", BatchEntry),
        checkpoints=out / "checkpoints",
        step=0,
        policy_version=None,
        reference=None,
    )
    return out / "checkpoints" / "step-000000" / "model"


def test_server_rollouts_swap_adapters_and_their_logprobs_match_the_trainer(setup, tmp_path: Path):
    """A warm server (the project's own, with vLLM's LoRA routes) serves base, then policy-step-1."""
    from gagar.policy.generation import HFBackend
    from gagar.policy.openai_backend import OpenAIBackend
    from gagar.policy.server import peft_adapter_loader, running_server
    from gagar.policy.vllm_server import PolicyServerClient, swap_adapter

    tasks, policy = setup
    run = tmp_path / "run"
    model, tokenizer = load_policy(policy)
    loader = peft_adapter_loader(model, tokenizer)
    with running_server(HFBackend(model, tokenizer), tokenizer, "policy", adapter_loader=loader) as url:
        config = _config(run, tasks, policy, backend="server", endpoint=url)
        rows = Trainer(config, progress=False).run()
        client = PolicyServerClient(url)
        served = client.served_models()
        # A new trainer process resumes: it loads policy-step-2 and unloads what it finds left over.
        rows = Trainer(config.model_copy(update={"steps": 3}), progress=False).run(resume=True)
        served_after_resume = client.served_models()

        extra = publish_adapter(_train_extra_adapter(run, tmp_path), run / "adapters", "policy-step-9")
        swap_adapter(client, "policy-step-9", extra, "policy-step-2")
        after_swap = client.served_models()
        prompts = [t.prompt_token_ids for t in _trajectories(run, 1)[::2]]
        backend = OpenAIBackend(url, "policy-step-9", [tokenizer.eos_token_id])
        params = SamplingParams(max_new_tokens=16, seed=1)
        samples = backend.generate(prompts, params, n=2)

    assert [r["policy_version"] for r in rows] == ["policy", "policy-step-1", "policy-step-2"]
    assert sorted(served) == ["policy", "policy-step-1"]
    assert sorted(served_after_resume) == ["policy", "policy-step-2"]
    assert sorted(after_swap) == ["policy", "policy-step-9"]
    assert rows[1]["perf/adapter_swap_s"] > 0
    assert rows[2]["perf/adapter_swap_s"] > 0
    assert {t.policy_version for t in _trajectories(run, 0)} == {"policy"}
    step1 = _trajectories(run, 1)
    assert {t.policy_version for t in step1} == {"policy-step-1"}

    # What the server sampled is what the update recomputes: ratio 1 within 1e-4.
    trainer_model, _ = load_trainable(run / "adapters" / "policy-step-1", LoraSettings(**LORA))
    pad = tokenizer.pad_token_id
    [temperature] = {t.sampling.temperature for t in step1}
    _assert_ratio_one(
        trainer_model,
        [(t.prompt_token_ids, t.response_token_ids, t.old_logprobs) for t in step1],
        pad,
        temperature,
    )
    trained = load_file(str(extra / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in trained.items())
    extra_model, _ = load_trainable(extra, LoraSettings(**LORA))
    pairs = [(p, s) for p, group in zip(prompts, samples, strict=True) for s in group]
    assert {s.policy_version for _, s in pairs} == {"policy-step-9"}
    _assert_ratio_one(extra_model, [(p, s.token_ids, s.logprobs) for p, s in pairs], pad, params.temperature)
