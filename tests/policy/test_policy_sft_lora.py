"""LoRA SFT from a Hugging Face folder: the adapter trains, the saved policy is base + adapter merged."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from gagar.cli import policy as cli_policy
from gagar.policy.model import load_adapter, load_policy
from gagar.policy.sft import ADAPTER_DIR, PRETRAINED_DEFAULTS, SFTConfig, train_sft
from gagar.train.lora import LoraSettings


def _config(init: str, **overrides) -> SFTConfig:
    settings = {"steps": 2, "batch_size": 2, "warmup_steps": 1, "lr": 5e-2, "noise_share": 0.0}
    return SFTConfig.fine_tune(init, **{**settings, **overrides, "max_prompt_tokens": 512})


def test_lora_needs_a_pretrained_base() -> None:
    with pytest.raises(ValueError, match="set init_policy"):
        SFTConfig(lora=LoraSettings(enabled=True))


def test_fine_tune_defaults_are_lora_and_overridable() -> None:
    config = SFTConfig.fine_tune("some/dir")
    assert config.lora.enabled
    assert config.steps == PRETRAINED_DEFAULTS["steps"]
    assert config.prompt_loss_weight == 0.0
    assert config.noise_share == PRETRAINED_DEFAULTS["noise_share"] > SFTConfig().noise_share
    full = SFTConfig.fine_tune("some/dir", lora=LoraSettings(enabled=False), steps=7)
    assert (full.lora.enabled, full.steps) == (False, 7)


def test_sft_help_states_the_pretrained_defaults() -> None:
    # The CLI spells the defaults out rather than importing gagar.policy.sft (torch) at start-up.
    help_text = inspect.signature(cli_policy.sft).parameters["init_policy"].default.help
    stated = re.search(r"lr ([\d.e-]+), .*?(\d+) steps, noise share (\d+(?:\.\d+)?)", help_text)
    assert stated is not None, help_text
    lr, steps, noise_share = stated.groups()
    assert float(lr) == PRETRAINED_DEFAULTS["lr"]
    assert int(steps) == PRETRAINED_DEFAULTS["steps"]
    assert float(noise_share) == PRETRAINED_DEFAULTS["noise_share"]


def test_lora_sft_saves_the_merged_policy_and_the_adapter(tiny_policy, tasks, tmp_path) -> None:
    train_sft(
        tasks, tmp_path, _config(str(tiny_policy), lora=LoraSettings(enabled=True, rank=4)), progress=False
    )
    base, tokenizer = load_policy(tiny_policy)
    merged, merged_tokenizer = load_policy(tmp_path)
    adapter, _ = load_adapter(tmp_path / ADAPTER_DIR)
    assert merged_tokenizer.get_vocab() == tokenizer.get_vocab()
    ids = torch.tensor([tokenizer.encode("def add(a, b):\n    return a + b\n")])
    with torch.no_grad():
        out_base, out_merged, out_adapter = (m(input_ids=ids).logits for m in (base, merged, adapter))
    torch.testing.assert_close(out_merged, out_adapter, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out_merged, out_base)
    assert not any("lora" in name for name, _ in merged.named_parameters()), "a plain model, no peft"


def test_lora_sft_resumes_from_an_adapter_only_checkpoint(tiny_policy, tasks, tmp_path) -> None:
    config = _config(str(tiny_policy), steps=4, checkpoint_every=2, lora=LoraSettings(enabled=True, rank=4))
    straight = train_sft(tasks, tmp_path / "straight", config, progress=False)
    train_sft(tasks, tmp_path / "resumed", config, progress=False, until_step=2)
    state = torch.load(tmp_path / "resumed" / "checkpoints" / "step-000002" / "state.pt", weights_only=False)
    assert all("lora_" in name for name in state["model"])
    resumed = train_sft(tasks, tmp_path / "resumed", config, resume=True, progress=False)
    assert resumed.losses == pytest.approx(straight.losses, abs=1e-6)


def test_the_cli_takes_lora_options_for_a_pretrained_base(tiny_policy, tasks, tmp_path) -> None:
    from typer.testing import CliRunner

    from gagar.cli import app
    from gagar.records import write_records

    write_records(tmp_path / "tasks.jsonl", tasks)
    args = ["policy", "sft", "--tasks", str(tmp_path / "tasks.jsonl"), "--steps", "1", "--batch-size", "1"]
    done = CliRunner().invoke(
        app,
        [
            *args,
            "--out",
            str(tmp_path / "p"),
            "--init-policy",
            str(tiny_policy),
            "--lora-rank",
            "2",
            "--lora-targets",
            "q_proj,v_proj",
        ],
    )
    assert done.exit_code == 0, done.output
    saved = SFTConfig.model_validate_json((tmp_path / "p" / "sft_config.json").read_text())
    assert (saved.lora.enabled, saved.lora.rank, saved.lora.target_modules) == (True, 2, ["q_proj", "v_proj"])
    assert saved.lr == PRETRAINED_DEFAULTS["lr"]
    refused = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "q"), "--lora-rank", "2"])
    assert refused.exit_code != 0
    assert "--init-policy" in refused.output


def test_a_folder_with_a_stale_gguf_quantization_entry_loads_as_plain_weights(tiny_policy, tmp_path) -> None:
    import json
    import shutil

    from gagar.policy.model import save_policy

    folder = tmp_path / "hand-converted"
    shutil.copytree(tiny_policy, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gguf", "gguf_file": "m.gguf", "dequantize": False}
    (folder / "config.json").write_text(json.dumps(config))
    model, tokenizer = load_policy(folder)
    save_policy(model, tokenizer, tmp_path / "saved")  # refused while the GGUF quantizer is attached
    assert "quantization_config" not in json.loads((tmp_path / "saved" / "config.json").read_text())
