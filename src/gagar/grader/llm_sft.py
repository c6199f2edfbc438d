"""SFT of the LLM grader on teacher transcripts (:mod:`gagar.grader.transcripts`).

The training loop is the policy's (:func:`gagar.policy.sft.run_sft`): checkpoints every
``checkpoint_every`` steps, ``resume``, a progress bar, ``loss_curve.png``, the model saved in Hugging
Face format with its tokenizer and chat template. Two starting points:

- ``init_policy`` set: a pretrained checkpoint (SmolLM2-135M-Instruct from ``gagar models install``,
  or any Hugging Face causal LM with a chat template), fine-tuned with a LoRA adapter merged into the
  base at the end (``lora.enabled``) or in full;
- ``init_policy`` None: the embedded tiny model from scratch, its BPE tokenizer trained on the
  transcripts (ChatML template).

The transcripts are written beside the model as ``transcripts.jsonl`` (chat messages and the
completions text in the model's chat template).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from gagar.grader.llm import OPENING_TOOLS, VERSION
from gagar.grader.sft import LabelledGroup
from gagar.grader.transcripts import Transcript, teacher_transcript, transcript_demos
from gagar.policy.demos import Demonstration
from gagar.policy.model import build_model, load_policy
from gagar.policy.sft import SFTConfig, SFTResult, run_sft
from gagar.policy.tokenizer import train_tokenizer
from gagar.records import atomic_write_text
from gagar.sandbox.base import SandboxBackend
from gagar.train.lora import LoraSettings

__all__ = [
    "GRADER_SFT_DEFAULTS",
    "PRETRAINED_GRADER_DEFAULTS",
    "build_transcripts",
    "check_trained_opening",
    "grader_sft_config",
    "train_llm_grader",
]

TRANSCRIPTS_FILE = "transcripts.jsonl"

GRADER_SFT_DEFAULTS: dict[str, Any] = {
    "steps": 160,
    "batch_size": 8,
    "lr": 3e-3,
    "warmup_steps": 10,
    "prompt_loss_weight": 0.0,
    "max_prompt_tokens": 1024,
    "max_answer_tokens": 1024,
    "vocab_size": 3072,
    "hidden_size": 128,
    "num_layers": 3,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 384,
    "noise_share": 0.0,
    "rename_share": 0.0,
    "checkpoint_every": 20,
}
"""The tiny grader's settings (from scratch), sized to under half an hour on the shared 2-core machine:
transcripts are long and regular, so a small vocabulary, the policy's width with one more layer, and the
loss on the assistant turns only (the output layer then runs on a fifth of the tokens)."""

PRETRAINED_GRADER_DEFAULTS: dict[str, Any] = {
    "steps": 80,
    "batch_size": 2,
    "lr": 1e-3,
    "warmup_steps": 5,
    "prompt_loss_weight": 0.0,
    "max_prompt_tokens": 1024,
    "max_answer_tokens": 1024,
    "noise_share": 0.0,
    "rename_share": 0.0,
    "checkpoint_every": 10,
    "lora": LoraSettings(enabled=True, rank=16, alpha=32.0),
}
"""Fine-tuning a pretrained grader (SmolLM2-135M-Instruct): a LoRA adapter and 160 transcripts of about
1,050 tokens, 41 minutes on one core of the shared 2-core machine. A pretrained model already copies
from its context, which is all the teacher's scores ask; with these settings it ranks the held-out
groups at Kendall tau 1.0 without a fallback (docs/grader.md)."""


def grader_sft_config(init_policy: str | None = None, full: bool = False, **overrides: Any) -> SFTConfig:
    """The grader's SFT settings: :data:`GRADER_SFT_DEFAULTS` from scratch, else
    :data:`PRETRAINED_GRADER_DEFAULTS` (LoRA unless ``full``), then ``overrides``."""
    if init_policy is None:
        return SFTConfig(**{**GRADER_SFT_DEFAULTS, **overrides})
    base = dict(PRETRAINED_GRADER_DEFAULTS)
    if full:
        base["lora"] = LoraSettings(enabled=False)
    return SFTConfig(init_policy=init_policy, **{**base, **overrides})


def build_transcripts(
    groups: Sequence[LabelledGroup],
    seed: int = 0,
    backend: SandboxBackend | None = None,
    progress: bool = True,
) -> list[Transcript]:
    """One teacher transcript per group with bundled files; the alias order is a function of (seed, group)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="gagar-transcripts-") as tmp:
        for group in tqdm(groups, desc="transcripts", unit="group", disable=not progress):
            if group.task.snapshot is None:
                continue
            rng = random.Random(f"{seed}:{group.group_id}")
            out.append(teacher_transcript(group, Path(tmp), rng, backend))
    return out


def check_trained_opening(model_dir: Path) -> None:
    """Refuse a grader trained on transcripts that open otherwise than this version's grader does
    (:data:`~gagar.grader.llm.OPENING_TOOLS`): its answers would follow tool outputs it never saw. A
    folder without ``transcripts.jsonl`` (a model trained elsewhere) passes.

    Raises:
        ValueError: naming the folder, the opening it was trained on and this version's.
    """
    path = model_dir / TRANSCRIPTS_FILE
    if not path.is_file():
        return
    calls = []
    try:
        with path.open() as f:
            first = json.loads(f.readline() or "{}")
        for m in first.get("messages", [])[2:]:
            if m["role"] == "assistant":
                tool = json.loads(m["content"]).get("tool") if m["content"].startswith('{"tool"') else None
                if tool is None:
                    break
                calls.append(tool)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: its first line is not a transcript record ({exc})") from None
    if tuple(calls) != OPENING_TOOLS:
        raise ValueError(
            f"{model_dir}: trained on transcripts that open with {', '.join(calls) or 'no tool'}; this "
            f"version's grader opens with {', '.join(OPENING_TOOLS)} (transcript format {VERSION}): "
            "retrain it with `gagar grader sft --kind llm`"
        )


def _chatml(t: Transcript) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in t.messages)


def _prepare(
    transcripts: Sequence[Transcript], out: Path, config: SFTConfig, resume: bool
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, list[Demonstration], dict[str, int]]:
    if config.init_policy is not None:
        model, tokenizer = load_policy(config.init_policy)
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(f"{config.init_policy}: the tokenizer has no chat template")
        if config.lora.enabled:
            from gagar.train.lora import wrap

            model = wrap(model, config.lora, config.init_policy, seed=config.seed)
    else:
        if resume and (out / "tokenizer.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(out)
        else:
            tokenizer = train_tokenizer([_chatml(t) for t in transcripts], config.vocab_size)
            tokenizer.save_pretrained(out)
        model = build_model(tokenizer, config.model_size, config.seed)
    lines = [json.dumps(t.record(tokenizer)) for t in transcripts]
    atomic_write_text(out / TRANSCRIPTS_FILE, "\n".join(lines) + "\n")
    budget = config.max_prompt_tokens + config.max_answer_tokens
    demos, dropped = transcript_demos(transcripts, tokenizer, budget)
    if not demos:
        raise ValueError(f"every transcript exceeds {budget} tokens")
    return model, tokenizer, demos, {"transcripts": len(transcripts), "dropped_too_long": dropped}


def train_llm_grader(
    transcripts: Sequence[Transcript],
    out_dir: str | os.PathLike[str],
    config: SFTConfig,
    resume: bool = False,
    progress: bool = True,
    until_step: int | None = None,
) -> SFTResult:
    """SFT the LLM grader on ``transcripts`` and save it to ``out_dir`` (Hugging Face format, with tokenizer).

    Raises:
        ValueError: no transcript fits the token budget, the base has no chat template, or ``resume``
            with other settings than the saved ones.
    """
    if not transcripts:
        raise ValueError("no teacher transcript to train on (no group with bundled files)")
    return run_sft(
        lambda out, cfg, again: _prepare(transcripts, out, cfg, again),
        out_dir,
        config,
        resume,
        progress,
        until_step,
        title="grader SFT",
    )
