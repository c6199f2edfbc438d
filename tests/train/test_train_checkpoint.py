"""Checkpoints: bit-exact resume, model formats, corruption, partial writes, retention, metrics log."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from gagar.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointManager,
    CorruptCheckpointError,
    MetricsLog,
    verify,
)

torch.set_num_threads(1)


def _toy(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def _toy_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """A step whose data comes from all three global generators, so resume must restore each."""
    x = torch.randn(16, 4) + float(np.random.rand()) + random.random()  # noqa: NPY002
    loss = ((model(x) - x.sum(dim=1, keepdim=True).sin()) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (the global generators are what resume restores)
    torch.manual_seed(seed)


def test_interrupted_run_resumes_bit_exactly(tmp_path: Path):
    total, interrupted_at = 6, 3
    _seed_all(1)
    model, optimizer, scheduler = _toy(0)
    for _ in range(total):
        _toy_step(model, optimizer, scheduler)

    _seed_all(1)
    manager = CheckpointManager(tmp_path, keep_last=2)
    first, first_opt, first_sched = _toy(0)
    for step in range(1, interrupted_at + 1):
        _toy_step(first, first_opt, first_sched)
        manager.save(step, first, first_opt, first_sched, extra_state={"seen": step})
    _seed_all(99)  # the resumed process starts from other generator states and other weights
    resumed, resumed_opt, resumed_sched = _toy(5)
    loaded = manager.load(manager.latest(), resumed, resumed_opt, resumed_sched)
    assert (loaded.step, loaded.extra_state) == (interrupted_at, {"seen": interrupted_at})
    for _ in range(interrupted_at, total):
        _toy_step(resumed, resumed_opt, resumed_sched)

    for name, value in model.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    assert resumed_sched.get_last_lr() == scheduler.get_last_lr()
    expected_state = optimizer.state_dict()["state"]
    for index, state in resumed_opt.state_dict()["state"].items():
        assert all(torch.equal(state[k], expected_state[index][k]) for k in state), index


def _qwen(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=32,
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


def test_hugging_face_model_is_saved_loadable_by_from_pretrained(tmp_path: Path):
    from transformers import AutoModelForCausalLM

    model = _qwen(0)
    ckpt = CheckpointManager(tmp_path).save(1, model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert (ckpt.path / "model" / "config.json").is_file()
    other = _qwen(1)
    CheckpointManager(tmp_path).load(ckpt, other, rng=False)
    reloaded = AutoModelForCausalLM.from_pretrained(ckpt.path / "model")
    for name, value in model.state_dict().items():
        assert torch.equal(value, other.state_dict()[name]), name
        assert torch.equal(value, reloaded.state_dict()[name]), name


def test_peft_adapter_round_trips(tmp_path: Path):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(_qwen(0), lora)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()  # lora_B starts at zero; make the adapter non-trivial
    ckpt = CheckpointManager(tmp_path).save(3, model)
    assert (ckpt.path / "model" / "adapter_model.safetensors").is_file()
    other = get_peft_model(_qwen(0), lora)
    CheckpointManager(tmp_path).load(ckpt, other)
    trained = dict(model.named_parameters())
    for name, param in other.named_parameters():
        if "lora_" in name:
            assert torch.equal(param, trained[name]), name
    with pytest.raises(CheckpointError, match="cannot load it into a Qwen2ForCausalLM"):
        CheckpointManager(tmp_path).load(ckpt, _qwen(0))


def test_corrupt_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path: Path, caplog):
    manager = CheckpointManager(tmp_path, keep_last=None)
    model, optimizer, _ = _toy(0)
    manager.save(1, model, optimizer)
    second = manager.save(2, model, optimizer)
    weights = second.path / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="gagar.train.checkpoint"):
        assert manager.latest() == Checkpoint(1, manager.path_for(1))
    assert "step-000002" in caplog.text
    assert "model/model.safetensors" in caplog.text
    with pytest.raises(CorruptCheckpointError, match="does not match its sha256"):
        manager.load(second, model, optimizer)
    (manager.path_for(1) / "MANIFEST.json").unlink()
    assert manager.latest() is None


def test_partial_directories_are_ignored_and_removed_by_the_next_save(tmp_path: Path):
    manager = CheckpointManager(tmp_path)
    model, optimizer, _ = _toy(0)
    manager.save(1, model, optimizer)
    partial = tmp_path / ".tmp-step-000002-abcd"
    partial.mkdir()
    (partial / "optimizer.pt").write_bytes(b"half a file")
    assert [c.step for c in manager.checkpoints()] == [1]
    assert manager.latest().step == 1
    manager.save(2, model, optimizer)
    assert not partial.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000001", "step-000002"]


def test_retention_keeps_the_newest_and_never_touches_later_steps(tmp_path: Path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    model, optimizer, _ = _toy(0)
    for step in range(1, 5):
        manager.save(step, model, optimizer)
    assert [c.step for c in manager.checkpoints()] == [3, 4]
    manager.save(2, model, optimizer)  # a re-run of an earlier step keeps the later ones
    assert [c.step for c in manager.checkpoints()] == [2, 3, 4]
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)


def test_saving_a_step_again_replaces_it(tmp_path: Path):
    manager = CheckpointManager(tmp_path)
    first, _, _ = _toy(0)
    second, _, _ = _toy(1)
    manager.save(1, first)
    ckpt = manager.save(1, second)
    verify(ckpt)
    target, _, _ = _toy(2)
    manager.load(ckpt, target)
    assert torch.equal(target[0].weight, second[0].weight)
    assert [p.name for p in tmp_path.iterdir()] == ["step-000001"]


def test_load_refuses_what_does_not_fit(tmp_path: Path):
    manager = CheckpointManager(tmp_path)
    model, optimizer, _ = _toy(0)
    ckpt = manager.save(1, model, rng=False)
    with pytest.raises(CheckpointError, match="saved without RNG state"):
        manager.load(ckpt, model)
    with pytest.raises(CheckpointError, match=r"has no optimizer\.pt"):
        manager.load(ckpt, model, optimizer, rng=False)
    with pytest.raises(CheckpointError, match="weights do not fit the model"):
        manager.load(ckpt, torch.nn.Sequential(torch.nn.Linear(4, 3)), rng=False)
    with pytest.raises(TypeError):
        manager.save(2, model, extra_state={"not json": object()})
    assert [c.step for c in manager.checkpoints()] == [1]


def test_metrics_log_drops_a_torn_line_and_truncates_to_the_resumed_step(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    metrics = MetricsLog(path)
    for step, loss in [(1, 0.5), (2, 0.4), (3, 0.3), (2, 0.4)]:  # step 2 redone after a crash
        metrics.append(step, {"loss": loss})
    with open(path, "a") as fh:
        fh.write('{"step": 4, "lo')  # killed mid-write
    assert [r["step"] for r in metrics.read()] == [1, 2, 3, 2]
    assert metrics.truncate(2) == [{"loss": 0.5, "step": 1}, {"loss": 0.4, "step": 2}]
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics record"):
        metrics.read()
