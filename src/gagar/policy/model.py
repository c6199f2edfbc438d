"""The embedded default policy model: a small Qwen2-style causal LM built from a config.

Saved in Hugging Face format (``config.json``, ``model.safetensors``, ``tokenizer.json``), so a real
checkpoint (Qwen2.5-Coder, ...) and the tiny default load by the same path with :func:`load_policy`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from gagar.policy.adapter import adapter_base, is_adapter_dir, tokenizer_dir

__all__ = [
    "SERVING_DTYPES",
    "ModelSize",
    "build_model",
    "load_adapter",
    "load_policy",
    "save_policy",
    "serving_dtype",
]


@dataclass(frozen=True)
class ModelSize:
    """Shape of the tiny Qwen2 model."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of decoder layers."""
    num_heads: int = 4
    """Attention heads (head dim = hidden_size / num_heads)."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention, as Qwen2 uses)."""
    intermediate_size: int = 384
    """Width of the MLP."""
    max_positions: int = 1536
    """Longest sequence (prompt + answer) the model is trained and sampled at."""


def build_model(
    tokenizer: PreTrainedTokenizerBase, size: ModelSize = ModelSize(), seed: int = 0
) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 causal LM for ``tokenizer``'s vocabulary (float32, tied embeddings)."""
    if size.hidden_size % size.num_heads or size.num_heads % size.num_kv_heads:
        raise ValueError(f"hidden_size/num_heads/num_kv_heads do not divide evenly: {size}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        max_position_embeddings=size.max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def save_policy(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike[str]
) -> None:
    """Write model and tokenizer to ``path`` in Hugging Face format (safetensors)."""
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def load_policy(
    path: str | os.PathLike[str], device: str = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Load a policy (the tiny default or any Hugging Face causal LM checkpoint) in eval mode.

    A LoRA adapter directory (``adapter_config.json``, :mod:`gagar.policy.adapter`) loads as its base
    with the adapter applied; the tokenizer is the adapter directory's own, else the base's.

    Raises:
        FileNotFoundError: if ``path`` has neither ``config.json`` nor ``adapter_config.json``.
    """
    if is_adapter_dir(path):
        return load_adapter(path, device=device, dtype=dtype)
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(
            f"{path}: not a Hugging Face model directory (no config.json) nor a LoRA adapter directory"
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = AutoConfig.from_pretrained(path)
    quantization = getattr(config, "quantization_config", None)
    if isinstance(quantization, dict) and quantization.get("quant_method") == "gguf":
        # A GGUF converted by hand (from_config of the GGUF-loaded config) keeps this entry although its
        # safetensors are plain; left in, transformers attaches a GGUF quantizer and every later
        # save_pretrained of the model (SFT's result, RL checkpoints) is refused.
        del config.quantization_config
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype).to(device)
    model.eval()
    return model, tokenizer


def load_adapter(
    path: str | os.PathLike[str],
    *,
    trainable: bool = False,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Base + adapter of the adapter directory ``path`` (eval mode), and the tokenizer.

    With ``trainable`` only the adapter's parameters require gradients.
    """
    from peft import PeftModel

    base_dir = adapter_base(path)
    base, _ = load_policy(base_dir, device=device, dtype=dtype)
    model = PeftModel.from_pretrained(base, str(path), is_trainable=trainable)
    model.eval()
    return model, AutoTokenizer.from_pretrained(tokenizer_dir(Path(path), base_dir))


SERVING_DTYPES = ("auto", "float32", "bfloat16")
"""What ``gagar serve grader --dtype`` accepts."""


def serving_dtype(choice: str, cpu_flags: str | None = None) -> str:
    """``float32`` or ``bfloat16`` for ``choice``; ``auto`` is bfloat16 where the CPU multiplies it in
    hardware (the ``amx_bf16`` or ``avx512_bf16`` flag of ``/proc/cpuinfo``, read unless ``cpu_flags``
    is given), else float32.

    Raises:
        ValueError: ``choice`` is not one of :data:`SERVING_DTYPES`.
    """
    if choice not in SERVING_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(SERVING_DTYPES)}, got {choice!r}")
    if choice != "auto":
        return choice
    if cpu_flags is None:
        try:
            cpu_flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpu_flags = ""
    words = set(cpu_flags.split())
    return "bfloat16" if {"amx_bf16", "avx512_bf16"} & words else "float32"
