"""LoRA training (peft) on top of the SFT checkpoint: settings, wrap, the trainable model, merge for export.

With ``lora.enabled`` the policy update trains only a low-rank adapter; the base (the SFT
checkpoint directory) never changes. An adapter directory is peft's ``save_pretrained`` layout
(``adapter_config.json``, ``adapter_model.safetensors``) whose ``base_model_name_or_path`` is the
absolute path of the base, so :func:`gagar.policy.model.load_policy` loads either kind of directory.

Adapter directories themselves (layout, versions, publishing) are :mod:`gagar.policy.adapter`'s.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerBase

from gagar.policy.adapter import ADAPTER_CONFIG, is_adapter_dir
from gagar.policy.model import load_adapter, load_policy, save_policy

if TYPE_CHECKING:
    from peft import PeftModel

from gagar.train.settings import QWEN2_TARGET_MODULES, LoraSettings

__all__ = [
    "QWEN2_TARGET_MODULES",
    "LoraSettings",
    "export_merged",
    "load_trainable",
    "unwrap",
    "wrap",
]


def _peft_config(settings: LoraSettings):
    from peft import LoraConfig, TaskType

    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
    )


def wrap(
    model: torch.nn.Module, settings: LoraSettings, base_dir: str | os.PathLike[str], seed: int = 0
) -> PeftModel:
    """A peft model training a fresh adapter on ``model`` (whose weights are frozen in place).

    ``A`` is initialised from ``seed`` without touching the global generator; ``B`` is zero, so the
    wrapped model's logits equal the base's exactly until the first update. ``base_dir`` (made
    absolute) is recorded as the adapter's base.
    """
    from peft import get_peft_model

    model.config._name_or_path = str(Path(base_dir).resolve())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, _peft_config(settings))
    peft_model.peft_config["default"].base_model_name_or_path = str(Path(base_dir).resolve())
    return peft_model


def unwrap(model: PeftModel) -> torch.nn.Module:
    """The base model with the adapter merged into its weights (``W + (alpha / r) · B A``), peft removed."""
    return model.merge_and_unload()


def _check_matches(path: Path, settings: LoraSettings) -> None:
    """Refuse to continue an adapter whose shape differs from the configured one."""
    saved = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    expected = {"r": settings.rank, "lora_alpha": settings.alpha, "lora_dropout": settings.dropout}
    wrong = {k: (saved.get(k), v) for k, v in expected.items() if saved.get(k) != v}
    if sorted(saved.get("target_modules") or []) != sorted(settings.target_modules):
        wrong["target_modules"] = (saved.get("target_modules"), settings.target_modules)
    if wrong:
        details = ", ".join(f"{k}: saved {a!r}, configured {b!r}" for k, (a, b) in wrong.items())
        raise ValueError(f"{path}: adapter does not match the lora settings ({details})")


def load_trainable(
    policy: str | os.PathLike[str], settings: LoraSettings, seed: int = 0
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The model the LoRA update trains: ``policy``'s adapter when it is one, else a fresh one on it."""
    path = Path(policy)
    if is_adapter_dir(path):
        _check_matches(path, settings)
        return load_adapter(path, trainable=True)
    base, tokenizer = load_policy(path)
    return wrap(base, settings, path, seed=seed), tokenizer


def export_merged(adapter_dir: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Merge the adapter into its base's weights and save a plain Hugging Face policy to ``out``.

    The result loads without peft (e.g. for a full-weight vLLM engine or as the next SFT base).
    """
    model, tokenizer = load_adapter(adapter_dir)
    save_policy(unwrap(model), tokenizer, out)
    return Path(out)
