"""LoRA training: only the adapter changes, bit-exact resume, log-probs, publishing, plain-peft loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from fixtures.policy import tiny_sft_config
from gagar import rl_step
from gagar.policy.adapter import (
    ADAPTER_FILES,
    adapter_base,
    adapter_updates,
    adapter_version,
    is_adapter_dir,
    prune_adapters,
    publish_adapter,
)
from gagar.policy.generation import HFBackend
from gagar.policy.model import load_policy
from gagar.policy.rollout import rollout
from gagar.records import read_records, write_records
from gagar.schema.batch import BatchEntry
from gagar.schema.trajectory import SamplingParams, Trajectory
from gagar.storage import LocalStore
from gagar.tasks.generate import generate_tasks
from gagar.train.checkpoint import CheckpointManager
from gagar.train.config import TrainConfig
from gagar.train.lora import LoraSettings, export_merged, load_trainable, wrap
from gagar.train.loss import pack_sequences, response_logprobs
from gagar.train.update import OptimConfig, StaleTrajectoryError, make_optimizer, update_policy

torch.set_num_threads(1)

LORA = LoraSettings(enabled=True, rank=4, alpha=8)
OPTIM = OptimConfig(lr=1e-2, minibatch_size=4)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny SFT policy (1 layer, 32 wide)."""
    from gagar.policy.sft import train_sft

    out = tmp_path_factory.mktemp("base")
    train_sft(generate_tasks(2, seed=11), out, tiny_sft_config(), progress=False)
    return out


@pytest.fixture(scope="module")
def rollout_files(tmp_path_factory: pytest.TempPathFactory, base: Path) -> tuple[Path, Path]:
    """Trajectories sampled from the base (HF backend) and a batch with ±1 advantages."""
    model, tokenizer = load_policy(base)
    params = SamplingParams(max_new_tokens=12, seed=5)
    trajs = list(
        rollout(
            generate_tasks(2, seed=11),
            HFBackend(model, tokenizer),
            tokenizer,
            4,
            params,
            policy_version="base",
            progress=False,
        )
    )
    out = tmp_path_factory.mktemp("rollout")
    write_records(out / "trajectories.jsonl", trajs)
    advantages = np.random.default_rng(0).choice([-1.0, 1.0], size=len(trajs))
    entries = [
        BatchEntry(
            trajectory_id=t.trajectory_id,
            group_id=t.group_id,
            gen_batch=0,
            reward=float(a > 0),
            advantage=float(a),
            grpo_advantage=float(a),
        )
        for t, a in zip(trajs, advantages, strict=True)
    ]
    write_records(out / "batch.jsonl", entries)
    return out / "trajectories.jsonl", out / "batch.jsonl"


def _update(
    policy: Path,
    files: tuple[Path, Path],
    checkpoints: Path,
    step: int,
    *,
    lora: LoraSettings = LORA,
    policy_version: str | None = None,
) -> dict:
    """The update phase (:func:`gagar.rl_step.update`) on the rollout's files, ``lora`` and :data:`OPTIM`."""
    config = TrainConfig.from_values(
        {"tasks": "tasks.jsonl", "policy": str(policy), "optim": OPTIM, "lora": lora}
    )
    return rl_step.update(
        config, policy=policy, trajectories=read_records(files[0], Trajectory),
        batch=read_records(files[1], BatchEntry), checkpoints=checkpoints, step=step,
        policy_version=policy_version, reference=None,
    )  # fmt: skip


@pytest.fixture(scope="module")
def two_updates(tmp_path_factory: pytest.TempPathFactory, base: Path, rollout_files) -> Path:
    """Checkpoints of two LoRA updates: step 0 from the base, step 1 from step 0's adapter."""
    root = tmp_path_factory.mktemp("ckpt")
    _update(base, rollout_files, root, 0, policy_version="base")  # the version the rollout recorded
    _update(root / "step-000000" / "model", rollout_files, root, 1)
    return root


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_a_fresh_adapter_leaves_the_logits_of_the_base_exactly(base: Path):
    model, tokenizer = load_policy(base)
    ids = tokenizer("def add(a, b):\n    return a + b\n")["input_ids"]
    before = _logits(model, ids)
    wrapped = wrap(model, LORA, base)
    assert torch.equal(_logits(wrapped, ids), before)
    trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable
    assert all("lora_" in n for n in trainable)
    wrapped_modules = {n.split(".")[-4] for n in trainable}  # ...q_proj.lora_A.default.weight
    assert wrapped_modules == set(LORA.target_modules)


def test_lora_updates_change_only_the_adapter(base: Path, two_updates: Path):
    base_weights = load_file(str(base / "model.safetensors"))
    adapter_dir = two_updates / "step-000001" / "model"
    assert is_adapter_dir(adapter_dir)
    assert adapter_base(adapter_dir) == base.resolve()
    assert not (adapter_dir / "model.safetensors").exists()  # the checkpoint holds the adapter only
    model, _ = load_policy(adapter_dir)
    compared = set()
    for name, value in model.get_base_model().state_dict().items():
        key = name.replace(".base_layer", "")
        if key in base_weights:
            assert torch.equal(value, base_weights[key]), name  # base weights bit-identical
            compared.add(key)
    assert compared == set(base_weights)
    adapter = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in adapter.items())


def test_the_optimizer_holds_only_adapter_parameters(base: Path, two_updates: Path):
    model, _ = load_trainable(base, LORA)
    optimizer = make_optimizer(model, OPTIM)
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    named = {id(p): n for n, p in model.named_parameters()}
    assert held
    assert all("lora_" in named[i] for i in held)
    assert len(held) == 2 * 7  # A and B of 7 projections in 1 layer
    saved = torch.load(two_updates / "step-000001" / "optimizer.pt", weights_only=True)
    assert len(saved["state"]) == len(held)


def test_resume_from_lora_checkpoints_is_bit_exact(base: Path, two_updates: Path, rollout_files):
    """Two updates through checkpoints (a process per step) equal two updates in one process."""
    trajs = {t.trajectory_id: t for t in read_records(rollout_files[0], Trajectory)}
    entries = read_records(rollout_files[1], BatchEntry)
    batch = [trajs[e.trajectory_id] for e in entries]
    advantages = np.array([e.advantage for e in entries])
    model, tokenizer = load_trainable(base, LORA)
    optimizer = make_optimizer(model, OPTIM)
    for step in (0, 1):
        torch.manual_seed(step)
        rng = np.random.default_rng([0, step])
        update_policy(model, optimizer, batch, advantages, OPTIM, tokenizer.pad_token_id, rng=rng)

    saved = load_file(str(two_updates / "step-000001" / "model" / "adapter_model.safetensors"))
    in_memory = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert len(saved) == len(in_memory)
    for name, value in in_memory.items():
        key = name.replace(".default", "")
        assert torch.equal(value.detach(), saved[key]), name
    state = torch.load(two_updates / "step-000001" / "optimizer.pt", weights_only=True)["state"]
    for index, expected in optimizer.state_dict()["state"].items():
        assert all(torch.equal(expected[k], state[index][k]) for k in expected), index


def test_hf_backend_logprobs_of_base_plus_adapter_equal_the_trainers(two_updates: Path):
    """Sampled through the HF rollout path, recomputed as the update does: ratio 1 within 1e-4."""
    adapter_dir = two_updates / "step-000001" / "model"
    sampler, tokenizer = load_policy(adapter_dir)
    prompts = [tokenizer("def scale(values, factor):")["input_ids"], tokenizer("# fix the bug")["input_ids"]]
    params = SamplingParams(max_new_tokens=16, seed=3)
    samples = [s for group in HFBackend(sampler, tokenizer).generate(prompts, params, n=3) for s in group]
    prompt_rows = [p for p in prompts for _ in range(3)]

    trainer_model, _ = load_trainable(adapter_dir, LORA)
    trainer_model.train()  # as in the update
    packed = pack_sequences(prompt_rows, [s.token_ids for s in samples], tokenizer.pad_token_id)
    args = (
        packed.input_ids,
        packed.attention_mask,
        packed.response_start,
        packed.response_len,
        params.temperature,
    )
    with torch.no_grad():
        recomputed = response_logprobs(trainer_model, *args)
    for row, sample in enumerate(samples):
        old = torch.tensor(sample.logprobs)
        ratio = torch.exp(recomputed[row, : len(old)] - old)
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4), (row, ratio)


def test_published_adapter_loads_with_plain_peft_and_reproduces_the_logits(
    base: Path, two_updates: Path, tmp_path: Path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    source = two_updates / "step-000001" / "model"
    published = publish_adapter(source, tmp_path / "adapters", "policy-step-2")
    assert published == tmp_path / "adapters" / "policy-step-2"
    assert sorted(p.name for p in published.iterdir()) == sorted(ADAPTER_FILES)
    mtime = (published / ADAPTER_FILES[1]).stat().st_mtime_ns
    assert publish_adapter(source, tmp_path / "adapters", "policy-step-2") == published  # idempotent
    assert (published / ADAPTER_FILES[1]).stat().st_mtime_ns == mtime
    other = publish_adapter(two_updates / "step-000000" / "model", tmp_path / "adapters", "policy-step-9")
    publish_adapter(source, tmp_path / "adapters", "policy-step-9")  # a redone update replaces it
    assert (other / ADAPTER_FILES[1]).read_bytes() == (source / ADAPTER_FILES[1]).read_bytes()
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["policy-step-2", "policy-step-9"]

    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(published)).eval()
    ours, tokenizer = load_policy(published)  # tokenizer taken from the base
    ids = tokenizer("def clamp(x, low, high):")["input_ids"]
    assert torch.equal(_logits(plain, ids), _logits(ours, ids))
    assert not torch.allclose(_logits(plain, ids), _logits(load_policy(base)[0], ids))

    merged = export_merged(published, tmp_path / "merged")
    assert not is_adapter_dir(merged)
    assert torch.allclose(_logits(load_policy(merged)[0], ids), _logits(ours, ids), atol=1e-5)


def test_pruning_keeps_the_newest_adapters_by_update_number(tmp_path: Path):
    for n in (1, 2, 9, 10, 11):
        (tmp_path / f"policy-step-{n}").mkdir()
    (tmp_path / "policy-step-x").mkdir()
    (tmp_path / ".tmp-policy-step-12-abc").mkdir()
    removed = prune_adapters(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["policy-step-1", "policy-step-2", "policy-step-9"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".tmp-policy-step-12-abc",
        "policy-step-10",
        "policy-step-11",
        "policy-step-x",
    ]
    assert prune_adapters(tmp_path, keep=2) == []


def test_adapter_version_names_round_trip() -> None:
    assert [adapter_updates(adapter_version(n)) for n in (1, 12, 300)] == [1, 12, 300]
    assert [adapter_updates(name) for name in ("policy-step-x", "policy-step-", "policy", "step-3")] == [
        None
    ] * 4


def test_adapters_are_also_published_to_an_artifact_store(two_updates: Path, tmp_path: Path):
    from gagar.train.trainer import Trainer

    store_root = tmp_path / "store"
    config = TrainConfig(
        run_dir=tmp_path / "run",
        tasks=tmp_path / "t.jsonl",
        policy=tmp_path / "p",
        lora={"enabled": True, "publish_uri": str(store_root)},
    )
    trainer = Trainer(config, progress=False)
    ckpt = CheckpointManager(two_updates, keep_last=None).checkpoints()[1]
    path = trainer.publish_adapter(ckpt)
    assert path == tmp_path / "run" / "adapters" / "policy-step-2"
    store = LocalStore(store_root)
    manifest = store.read_manifest("policy-step-2")
    assert manifest is not None
    assert manifest.step == 2
    assert sorted(manifest.files) == sorted(ADAPTER_FILES)
    assert trainer.publish_adapter(ckpt) == path  # a resumed run publishes again without error


def test_a_stale_trajectory_is_refused_naming_it(base: Path, rollout_files, tmp_path: Path):
    stale = r"trajectory '.+/0' was sampled by policy version 'base', but the update is from 'policy-step-3'"
    with pytest.raises(StaleTrajectoryError, match=stale):
        _update(base, rollout_files, tmp_path, 0, policy_version="policy-step-3")
    assert not list(tmp_path.iterdir())  # nothing written


def test_an_adapter_of_another_shape_or_without_lora_is_refused(two_updates: Path, rollout_files, tmp_path):
    adapter_dir = two_updates / "step-000001" / "model"
    with pytest.raises(ValueError, match=r"does not match the lora settings \(r: saved 4, configured 8"):
        _update(adapter_dir, rollout_files, tmp_path, 2, lora=LoraSettings(enabled=True))
    with pytest.raises(ValueError, match="is a LoRA adapter: enable lora"):
        _update(adapter_dir, rollout_files, tmp_path, 2, lora=LoraSettings())


def test_server_rollouts_need_lora_and_an_endpoint(tmp_path: Path):
    paths = {"tasks": tmp_path / "t.jsonl", "policy": tmp_path / "p"}
    with pytest.raises(ValueError, match=r"needs rollout\.endpoint"):
        TrainConfig(**paths, rollout={"backend": "server"}, lora={"enabled": True})
    with pytest.raises(ValueError, match=r"needs lora\.enabled"):
        TrainConfig(**paths, rollout={"backend": "server", "endpoint": "http://127.0.0.1:1/v1"})
    config = TrainConfig(
        **paths, rollout={"backend": "server", "endpoint": "http://h:1/v1"}, lora={"enabled": True}
    )
    assert (config.rollout.served_model, config.lora.rank, config.lora.alpha) == ("policy", 8, 16.0)
    assert json.loads(config.model_dump_json())["lora"]["target_modules"][0] == "q_proj"
