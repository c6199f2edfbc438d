"""Prefix caching: the same tokens and log-probs as transformers' generate, with the prefill cut."""

from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from gagar.policy.generation import HFBackend
from gagar.policy.prefix_cache import PrefixCachingBackend, PrefixStore, common_prefix, next_tokens
from gagar.schema.trajectory import SamplingParams

GREEDY = SamplingParams(temperature=1e-5, top_p=1.0, max_new_tokens=12)
tokens = st.lists(st.integers(0, 3), max_size=12)


def _naive_common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(tokens, tokens)
def test_common_prefix_agrees_with_a_plain_loop(a: list[int], b: list[int]) -> None:
    assert common_prefix(a, b) == _naive_common_prefix(a, b) == common_prefix(b, a)


def _kv(length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.arange(length, dtype=torch.float)[None, :, None], torch.zeros(1, length, 1))]


@settings(max_examples=60, deadline=None)
@given(st.lists(tokens.filter(bool), max_size=10), tokens, st.integers(1, 20))
def test_store_stays_in_budget_and_finds_the_longest_prefix(
    stored: list[list[int]], prompt: list[int], budget: int
) -> None:
    store = PrefixStore(budget)
    for seq in stored:
        store.put(seq, _kv(len(seq)))
        assert store.tokens <= budget
    held = [list(k) for k in store._entries]
    assert store.tokens == sum(len(k) for k in held)
    best = max((common_prefix(k, prompt) for k in held), default=0)
    n, kv = store.longest(prompt)
    assert n == best
    if n:
        assert kv is not None
        assert kv[0][0].shape[1] == n
        assert kv[0][0][0, :, 0].tolist() == list(range(n))  # the first n positions of the entry


def test_a_longer_prompt_replaces_its_prefix_and_the_oldest_goes_first() -> None:
    store = PrefixStore(10)
    store.put([1, 2, 3], _kv(3))
    store.put([1, 2, 3, 4, 5], _kv(5))
    assert store.tokens == 5  # [1, 2, 3] is answered by its extension
    store.put([7, 8, 9, 9], _kv(4))
    store.longest([1, 2])  # touches the first entry: [7, 8, 9, 9] is now the oldest
    store.put([6, 6], _kv(2))
    assert store.longest([7, 8])[0] == 0
    assert store.longest([1, 2, 3, 4])[0] == 4
    store.put(list(range(11)), _kv(11))  # longer than the budget: not stored
    assert store.longest(list(range(11)))[0] == 0


def test_top_p_samples_only_inside_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(400, 1)
    torch.manual_seed(0)
    chosen, logp = next_tokens(logits, SamplingParams(temperature=1.0, top_p=0.7, max_new_tokens=1))
    assert set(chosen.tolist()) == {0, 1}  # 0.5 + 0.3 reach 0.7; the rest is cut
    assert torch.allclose(logp, torch.log_softmax(logits, -1).gather(-1, chosen[:, None])[:, 0])


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _prompts() -> list[list[int]]:
    system = [5, 9, 11, 13, 2, 7, 7, 30]
    return [[*system, 40, 41, 42], [*system, 40, 41, 42, 50, 51], [*system, 20], [3, 4]]


@pytest.mark.parametrize("batch_size", [None, 1, 3])  # every row at once, one at a time, a ragged last chunk
def test_greedy_answers_equal_generate_and_later_turns_hit_the_cache(
    model: LlamaForCausalLM, batch_size: int | None
) -> None:
    first = HFBackend(model, SimpleNamespace(eos_token_id=63, pad_token_id=0)).generate(_prompts(), GREEDY)
    stop = first[0][0].token_ids[2]  # the first answer's third token ends it: rows leave the batch early
    tokenizer = SimpleNamespace(eos_token_id=stop, pad_token_id=0)
    expected = HFBackend(model, tokenizer).generate(_prompts(), GREEDY)
    cached = PrefixCachingBackend(model, tokenizer, cache_tokens=1000, batch_size=batch_size)
    for call in range(2):  # the second call finds every prompt stored
        got = cached.generate(_prompts(), GREEDY)
        for want, have in zip(expected, got, strict=True):
            assert have[0].token_ids == want[0].token_ids
            assert have[0].finish_reason == want[0].finish_reason
            assert have[0].logprobs == pytest.approx(want[0].logprobs, abs=1e-4)
        if call == 0:
            assert cached.stats.cached_tokens > 0  # the shared system prompt was prefilled once
    assert expected[0][0].finish_reason == "stop"
    assert len(expected[0][0].token_ids) <= 3
    asked = 2 * sum(len(p) for p in _prompts())
    assert cached.stats.prompt_tokens == asked
    assert cached.stats.cached_tokens >= sum(len(p) - 1 for p in _prompts())  # all but the last token


def test_seeded_sampling_is_reproducible_and_n_samples_each(model: LlamaForCausalLM) -> None:
    backend = PrefixCachingBackend(model, SimpleNamespace(eos_token_id=63), cache_tokens=1000)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=6, seed=3)
    one, two = backend.generate(_prompts()[:2], params, n=3), backend.generate(_prompts()[:2], params, n=3)
    assert [len(row) for row in one] == [3, 3]
    assert [[s.token_ids for s in row] for row in one] == [[s.token_ids for s in row] for row in two]
    with pytest.raises(ValueError, match="at least one token"):
        backend.generate([[]], params)


def test_the_grader_server_answers_chat_through_the_cache(model: LlamaForCausalLM, tiny_policy) -> None:
    from gagar.policy.model import load_policy
    from gagar.policy.server import running_server

    weights, tokenizer = load_policy(tiny_policy)
    backend = PrefixCachingBackend(weights, tokenizer, cache_tokens=4096)
    messages = [{"role": "system", "content": "rank"}, {"role": "user", "content": "c1, c2"}]
    body = {"messages": messages, "max_tokens": 4, "temperature": 0}
    with running_server(backend, tokenizer, "grader") as url:
        replies = []
        for _ in range(2):
            request = urllib.request.Request(
                f"{url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            replies.append(json.loads(urllib.request.urlopen(request, timeout=60).read()))
    assert replies[0]["choices"][0]["message"] == replies[1]["choices"][0]["message"]
    assert backend.stats.cached_tokens >= backend.stats.prompt_tokens // 2 - 1  # the second was cached


def test_serving_dtype_is_bfloat16_only_where_the_cpu_multiplies_it() -> None:
    from gagar.policy.model import serving_dtype

    assert serving_dtype("auto", "flags : fpu avx512f amx_bf16 amx_tile") == "bfloat16"
    assert serving_dtype("auto", "flags : fpu avx512f avx512_bf16") == "bfloat16"
    assert serving_dtype("auto", "flags : fpu avx2 amx_bf16x") == "float32"  # a word, not a substring
    assert serving_dtype("float32", "flags : amx_bf16") == "float32"
    assert serving_dtype("bfloat16", "flags : avx2") == "bfloat16"
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16, got 'fp8'"):
        serving_dtype("fp8")
