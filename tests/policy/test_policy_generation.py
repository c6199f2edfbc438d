"""Generation backends: sampled log-probs agree with teacher forcing; the OpenAI endpoint path works."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import torch

from gagar.policy.generation import HFBackend, sequence_logprobs
from gagar.policy.model import load_policy
from gagar.policy.openai_backend import EndpointError, OpenAIBackend, StaleAdapterError, parse_token_id
from gagar.policy.server import running_server
from gagar.schema.trajectory import SamplingParams


@pytest.fixture(scope="module")
def loaded(tiny_policy):
    return load_policy(tiny_policy)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_teacher_forcing(loaded, temperature: float) -> None:
    model, tokenizer = loaded
    prompts = [tokenizer.encode("def add(a, b):\n"), tokenizer.encode("x = 1\n" * 7)]  # unequal: left padding
    params = SamplingParams(temperature=temperature, max_new_tokens=24, seed=3)
    for prompt, samples in zip(
        prompts, HFBackend(model, tokenizer).generate(prompts, params, n=2), strict=True
    ):
        for sample in samples:
            assert len(sample.token_ids) == len(sample.logprobs) > 0
            ref = sequence_logprobs(model, prompt, sample.token_ids, temperature)
            torch.testing.assert_close(torch.tensor(sample.logprobs), ref, atol=1e-4, rtol=0)


def test_seeded_sampling_is_reproducible(loaded) -> None:
    model, tokenizer = loaded
    backend, prompt = HFBackend(model, tokenizer), [tokenizer.encode("def scale(")]
    params = SamplingParams(max_new_tokens=16, seed=11)
    assert backend.generate(prompt, params, 3) == backend.generate(prompt, params, 3)


def test_openai_backend_against_the_local_server(loaded) -> None:
    model, tokenizer = loaded
    hf = HFBackend(model, tokenizer)
    prompts = [tokenizer.encode("def clamp(x, low, high):\n")]
    params = SamplingParams(max_new_tokens=12, seed=5)
    with running_server(hf, tokenizer, "tiny") as url:
        remote = OpenAIBackend(url, "tiny", hf.stop_token_ids).generate(prompts, params, n=2)
        with urllib.request.urlopen(url + "/models") as resp:
            assert json.loads(resp.read())["data"][0]["id"] == "tiny"
        with pytest.raises(StaleAdapterError, match="does not serve policy version 'other'"):
            OpenAIBackend(url, "other", hf.stop_token_ids).generate(prompts, params)
    assert {s.policy_version for s in remote[0]} == {"tiny"}
    local = hf.generate(prompts, params, n=2)  # same seed, same engine: same tokens and log-probs
    assert [(s.token_ids, s.logprobs, s.finish_reason) for s in remote[0]] == [
        (s.token_ids, s.logprobs, s.finish_reason) for s in local[0]
    ]
    for sample in remote[0]:
        ref = sequence_logprobs(model, prompts[0], sample.token_ids, params.temperature)
        torch.testing.assert_close(torch.tensor(sample.logprobs), ref, atol=1e-4, rtol=0)


def test_server_refuses_bad_requests(loaded) -> None:
    model, tokenizer = loaded
    with running_server(HFBackend(model, tokenizer), tokenizer, "tiny") as url:
        for body in ({"prompt": 3}, {"prompt": "x", "n": 0}, {"prompt": "x", "temperature": -1}):
            request = urllib.request.Request(
                url + "/completions", data=json.dumps(body).encode(), method="POST"
            )
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(request)
            assert info.value.code == 400


def test_parse_token_id() -> None:
    assert parse_token_id("token_id:42") == 42
    with pytest.raises(EndpointError, match="return_tokens_as_token_ids"):
        parse_token_id("hello")
