"""The warm policy server on vLLM's CPU build: runtime LoRA versions and log-prob agreement.

Skipped without the vLLM environment (``make vllm-env``). The session's server (conftest) runs in fp32,
so the trainer's fp32 recomputation is the reference; adapters here are named ``probe-N`` and unloaded
at the end, apart from the ``policy-step-N`` versions of the RL test sharing the server.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from warm_support import needs_vllm, write_adapter

from gagar.policy.generation import sequence_logprobs
from gagar.policy.model import load_policy
from gagar.policy.openai_backend import OpenAIBackend, StaleAdapterError
from gagar.policy.vllm_server import PolicyServer, PolicyServerError, swap_adapter
from gagar.schema.trajectory import SamplingParams

pytestmark = [needs_vllm, pytest.mark.slow]

LOGPROB_TOLERANCE = 1e-3
"""Largest |server log-prob − trainer log-prob| accepted per token: |ratio − 1| ≤ e^0.001 − 1 ≈ 0.1%."""


@pytest.fixture(scope="module")
def adapters(
    base_policy: Path, vllm_server: PolicyServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[int, Path]]:
    """Two adapters, ``probe-1`` and ``probe-2``; whichever the server still serves is unloaded after."""
    root = tmp_path_factory.mktemp("adapters")
    yield {n: write_adapter(base_policy, root / f"probe-{n}", seed=n) for n in (1, 2)}
    for name in vllm_server.client.served_models():
        if name.startswith("probe-"):
            vllm_server.client.unload_adapter(name)


def _prompts(base_policy: Path) -> list[list[int]]:
    _, tokenizer = load_policy(base_policy)
    return [tokenizer.encode(text) for text in ("def add(a, b):\n", "class Box:\n    def ")]


def test_versions_advance_and_stale_ones_are_refused(vllm_server, adapters, base_policy) -> None:
    client, url = vllm_server.client, vllm_server.base_url
    assert client.health()
    assert "policy" in client.served_models()
    params = SamplingParams(max_new_tokens=8, seed=0)
    swap_adapter(client, "probe-1", adapters[1], None)
    (samples,) = OpenAIBackend(url, "probe-1").generate(_prompts(base_policy)[:1], params)
    assert samples[0].policy_version == "probe-1"
    assert swap_adapter(client, "probe-2", adapters[2], "probe-1") < 5.0
    served = client.served_models()
    assert "probe-2" in served
    assert "probe-1" not in served
    with pytest.raises(StaleAdapterError, match="probe-1"):
        OpenAIBackend(url, "probe-1").generate(_prompts(base_policy)[:1], params)
    with pytest.raises(PolicyServerError, match="HTTP"):
        client.unload_adapter("probe-1")  # already gone: vLLM's refusal comes through


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_adapter_logprobs_agree_with_the_trainer(vllm_server, adapters, base_policy, temperature) -> None:
    """Sampled through the server under the adapter's name, recomputed by transformers + peft in fp32."""
    from peft import PeftModel

    swap_adapter(vllm_server.client, "probe-2", adapters[2], None)
    adapted = PeftModel.from_pretrained(load_policy(base_policy)[0], adapters[2]).eval()
    base = load_policy(base_policy)[0]
    params = SamplingParams(max_new_tokens=24, temperature=temperature, seed=3)
    prompts = _prompts(base_policy)
    rows = OpenAIBackend(vllm_server.base_url, "probe-2").generate(prompts, params, n=3)
    worst, moved = 0.0, 0.0
    for prompt, samples in zip(prompts, rows, strict=True):
        for sample in samples:
            ref = sequence_logprobs(adapted, prompt, sample.token_ids, temperature)
            worst = max(worst, float((torch.tensor(sample.logprobs) - ref).abs().max()))
            unadapted = sequence_logprobs(base, prompt, sample.token_ids, temperature)
            moved = max(moved, float((ref - unadapted).abs().max()))
    assert moved > 10 * LOGPROB_TOLERANCE, "the adapter barely changes the model: the check would be vacuous"
    assert worst < LOGPROB_TOLERANCE, f"max |Δ log p| = {worst:.2e}: PPO ratio off by {math.expm1(worst):.2e}"
