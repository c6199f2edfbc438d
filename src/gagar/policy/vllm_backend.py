"""Generation with an in-process vLLM engine. GPU only; untested on the CPU build machines.

``vllm`` is imported lazily, so this module imports without it. The engine is built with
``logprobs_mode="processed_logprobs"`` so the returned log-probs are those of the temperature-scaled
distribution (the convention of :mod:`gagar.schema.trajectory`); ``SamplingParams(logprobs=0)`` asks
for the sampled token's log-prob only. For a warm server kept across RL steps, run vLLM's OpenAI
server and use :class:`gagar.policy.openai_backend.OpenAIBackend` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gagar.policy.generation import Sample
from gagar.schema.trajectory import SamplingParams

__all__ = ["VLLMBackend"]


class VLLMBackend:
    """Samples with ``vllm.LLM`` from a Hugging Face model directory.

    Args:
        model_path: the policy directory (config, safetensors, tokenizer).
        stop_token_ids: ids that end an answer (the tokenizer's EOS).
        engine_kwargs: passed to ``vllm.LLM`` (``gpu_memory_utilization``, ``max_model_len``, ...).
    """

    def __init__(self, model_path: str, stop_token_ids: Sequence[int], **engine_kwargs: Any) -> None:
        import vllm  # lazy: heavy, GPU builds only

        self._vllm = vllm
        self.stop_token_ids = tuple(stop_token_ids)
        engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.llm = vllm.LLM(model=model_path, **engine_kwargs)

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        """``n`` samples per prompt, in prompt order."""
        sampling = self._vllm.SamplingParams(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
            logprobs=0,
            stop_token_ids=list(self.stop_token_ids),
            skip_special_tokens=False,
        )
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(inputs, sampling, use_tqdm=False)
        return [[self._sample(c) for c in out.outputs] for out in outputs]

    def _sample(self, completion: Any) -> Sample:
        ids = list(completion.token_ids)
        logprobs = [float(step[t].logprob) for t, step in zip(ids, completion.logprobs, strict=True)]
        reason = "stop" if ids and ids[-1] in self.stop_token_ids else "length"
        return Sample(ids, logprobs, reason)
