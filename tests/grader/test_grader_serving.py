"""The grader's own server decodes concurrent requests together (gagar.policy.batching)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gagar.grader.llm_client import ChatClient
from gagar.policy.batching import RequestBatcher
from gagar.policy.generation import HFBackend, Sample
from gagar.policy.model import load_policy
from gagar.policy.server import CompletionServer, running_server
from gagar.schema.trajectory import SamplingParams

EMBEDDED = Path(__file__).resolve().parents[2] / "src" / "gagar" / "data" / "embedded-policy"


class _GatedBackend:
    """Answers each prompt with its own length; the first call waits for ``gate``; records each call."""

    stop_token_ids = (0,)

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[int] = []

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        if not self.calls:
            self.calls.append(len(prompts))
            self.gate.wait(10)
        else:
            self.calls.append(len(prompts))
        return [[Sample([len(p)], [0.0], "stop") for _ in range(n)] for p in prompts]


def _queued(batcher: RequestBatcher, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(batcher._queue) < count:
        assert time.monotonic() < deadline, "requests never queued"
        time.sleep(0.005)


def test_requests_waiting_while_the_backend_decodes_share_the_next_batch() -> None:
    backend, batcher = _GatedBackend(), RequestBatcher(max_sequences=8)
    greedy = SamplingParams(temperature=1e-5, max_new_tokens=4)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(batcher.generate, backend, [[1]], greedy)
        while not backend.calls:
            time.sleep(0.005)
        waiting = [pool.submit(batcher.generate, backend, [[1] * (i + 2)], greedy) for i in range(5)]
        seeded = pool.submit(batcher.generate, backend, [[9, 9]], greedy.model_copy(update={"seed": 3}))
        other = pool.submit(batcher.generate, backend, [[7]], greedy.model_copy(update={"max_new_tokens": 9}))
        _queued(batcher, 7)
        backend.gate.set()
        answers = [f.result()[0][0].token_ids for f in waiting]
        assert first.result()[0][0].token_ids == [1]
        assert seeded.result()[0][0].token_ids == [2]
        assert other.result()[0][0].token_ids == [1]
    batcher.close()
    assert answers == [[2], [3], [4], [5], [6]]  # each caller gets its own prompt's answer
    assert sorted(backend.calls) == [1, 1, 1, 5]  # the five alike in one call; seeded, other alone
    assert batcher.stats.largest == 5
    assert batcher.stats.requests == 8


def test_max_sequences_one_serves_one_request_at_a_time() -> None:
    backend, batcher = _GatedBackend(), RequestBatcher(max_sequences=1)
    backend.gate.set()
    params = SamplingParams(temperature=1e-5, max_new_tokens=4)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: batcher.generate(backend, [[1] * i], params), range(1, 5)))
    batcher.close()
    assert backend.calls == [1, 1, 1, 1]
    assert batcher.stats.largest == 1


def test_a_failing_batch_fails_each_of_its_callers() -> None:
    class Broken(_GatedBackend):
        def generate(self, prompts, params, n=1):  # type: ignore[no-untyped-def]
            raise RuntimeError("out of memory")

    batcher = RequestBatcher()
    with pytest.raises(RuntimeError, match="out of memory"):
        batcher.generate(Broken(), [[1]], SamplingParams(max_new_tokens=2))
    batcher.close()


@pytest.fixture(scope="module")
def embedded():
    return load_policy(EMBEDDED)


def _chat(server: CompletionServer, text: str) -> str:
    body = {"messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 12}
    return server.chat(body)["choices"][0]["message"]["content"]


def test_concurrent_greedy_chats_answer_as_they_do_alone(embedded) -> None:
    model, tokenizer = embedded
    prompts = [f"Rank c{i}: {'x = 1; ' * i}" for i in range(1, 7)]  # unequal lengths: left padding
    alone = CompletionServer(HFBackend(model, tokenizer), tokenizer, "g", max_batch=1)
    expected = [_chat(alone, p) for p in prompts]
    alone.batcher.close()
    together = CompletionServer(HFBackend(model, tokenizer), tokenizer, "g", max_batch=32)
    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda p: _chat(together, p), prompts))
    together.batcher.close()
    assert got == expected
    assert together.batcher.stats.batches < len(prompts)  # some requests shared a decode


def test_the_grader_client_talks_to_the_batching_server(embedded) -> None:
    model, tokenizer = embedded
    with running_server(HFBackend(model, tokenizer), tokenizer, "grader") as url:
        client = ChatClient(url, "grader", max_tokens=8)
        with ThreadPoolExecutor(4) as pool:
            replies = list(
                pool.map(lambda i: client.next_message([{"role": "user", "content": f"c{i}"}], 60), range(4))
            )
    assert all(isinstance(r, str) for r in replies)
