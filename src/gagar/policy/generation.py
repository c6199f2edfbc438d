"""Generation backends behind one interface: each returns sampled token ids and their log-probs.

Backends: :class:`HFBackend` (transformers ``generate``, the CPU default, in this module),
:class:`gagar.policy.openai_backend.OpenAIBackend` (any OpenAI-compatible ``/v1/completions``
endpoint) and :class:`gagar.policy.vllm_backend.VLLMBackend` (GPU only). Log-probs follow the
convention of :mod:`gagar.schema.trajectory`: ``log softmax(logits / T)`` of the sampled token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from gagar.schema.trajectory import SamplingParams

__all__ = ["BATCH_SIZE", "GenerationBackend", "HFBackend", "Sample", "sequence_logprobs"]

BATCH_SIZE = 32
"""Most sequences the in-process engines sample together by default."""


@dataclass(frozen=True)
class Sample:
    """One sampled continuation of one prompt."""

    token_ids: list[int]
    """Generated tokens, the end token included when it was sampled; no padding."""
    logprobs: list[float]
    """Per generated token, ``log softmax(logits / T)[token]``; same length as ``token_ids``."""
    finish_reason: str
    """``stop`` when the end token was sampled, ``length`` when max_new_tokens was reached."""


class GenerationBackend(Protocol):
    """Samples ``n`` continuations for each prompt (given as token ids)."""

    stop_token_ids: tuple[int, ...]

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        """``n`` samples per prompt, in prompt order."""
        ...


def sequence_logprobs(
    model: torch.nn.Module, prompt_ids: list[int], response_ids: list[int], temperature: float
) -> torch.Tensor:
    """Teacher-forced ``log softmax(logits / T)`` of each response token, shape ``(len(response_ids),)``,
    at ``temperature`` T, the one the response was sampled at (``SamplingParams.temperature``)."""
    ids = torch.tensor([prompt_ids + response_ids], dtype=torch.long, device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(response_ids, device=logp.device)[:, None])[:, 0]


def _trim(tokens: list[int], stops: set[int]) -> tuple[int, str]:
    """Length of a generated row up to and including its first stop token, and why it ended.

    ``generate`` pads a row only after its stop token, so a row without one is all generated tokens.
    """
    for i, t in enumerate(tokens):
        if t in stops:
            return i + 1, "stop"
    return len(tokens), "length"


class HFBackend:
    """Sampling with transformers ``generate`` on a loaded model (left-padded batches).

    Args:
        model: a causal LM in eval mode.
        tokenizer: its tokenizer; ``eos_token_id`` ends an answer.
        batch_size: most sequences (prompts × n) per ``generate`` call.
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, batch_size: int = BATCH_SIZE
    ) -> None:
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id: answers could never end")
        self.stop_token_ids = (eos,)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        """``n`` samples per prompt; with ``params.seed`` set the whole call is reproducible."""
        if params.seed is not None:
            torch.manual_seed(params.seed)
        flat = [p for p in prompts for _ in range(n)]
        samples: list[Sample] = []
        for start in range(0, len(flat), self.batch_size):
            samples.extend(self._generate_batch(flat[start : start + self.batch_size], params))
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        """Plain sampling: a checkpoint's own defaults (top_k, repetition penalty, ...) must not apply,
        or the recorded log-probs would not be those of the distribution the tokens came from."""
        return GenerationConfig(
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,
            repetition_penalty=1.0,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=list(self.stop_token_ids),
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(self.model.device),
                attention_mask=mask.to(self.model.device),
                generation_config=self._generation_config(params),
            )
        new = out.sequences[:, width:].cpu()  # (batch, new_len)
        raw = torch.stack(out.logits, dim=1).float().cpu()  # (batch, new_len, vocab), before warpers
        logp = torch.log_softmax(raw / params.temperature, dim=-1).gather(-1, new[..., None])[..., 0]
        result = []
        for row in range(len(prompts)):
            tokens = new[row].tolist()
            length, reason = _trim(tokens, set(self.stop_token_ids))
            result.append(Sample(tokens[:length], logp[row, :length].tolist(), reason))
        return result
