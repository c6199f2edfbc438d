"""Helpers of the warm-inference tests: the vLLM skip marker and random LoRA adapters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gagar.policy.vllm_server import find_vllm_python

__all__ = ["needs_vllm", "write_adapter"]

needs_vllm = pytest.mark.skipif(
    find_vllm_python() is None,
    reason="no vLLM environment: run `make vllm-env` (scripts/install-vllm-env.sh) or set GAGAR_VLLM_PYTHON",
)


def write_adapter(base_dir: Path, out: Path, seed: int, rank: int = 8) -> Path:
    """A peft LoRA adapter for the policy in ``base_dir`` with random, non-zero B (so it changes outputs)."""
    from peft import LoraConfig, get_peft_model

    from gagar.policy.model import load_policy

    model, _ = load_policy(base_dir)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "o_proj"])
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
    peft_model.save_pretrained(out)
    return out
