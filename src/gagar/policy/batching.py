"""Step-synchronous batching of concurrent generation requests for the local server.

Requests that arrive while the backend decodes wait in a queue. When the backend is free, the
oldest waiting request and every other waiting request with the same backend, sampling settings
and ``n`` are decoded in ONE ``generate`` call (left-padded prompts, one KV cache), so each decode
step serves all of them; what arrives meanwhile forms the next batch. A batch ends when its longest
answer does. Seeded requests run alone: a seed makes one request reproducible, and sharing a batch
would make its tokens depend on its neighbours.

With ``max_sequences=1`` every request runs alone, in arrival order: the one-at-a-time server.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gagar.policy.generation import GenerationBackend, Sample
from gagar.schema.trajectory import SamplingParams

__all__ = ["BatchStats", "RequestBatcher"]


@dataclass
class _Request:
    """One caller's request, answered by the batcher's thread."""

    backend: GenerationBackend
    prompts: list[list[int]]
    params: SamplingParams
    n: int
    done: threading.Event = field(default_factory=threading.Event)
    samples: list[list[Sample]] | None = None
    error: BaseException | None = None

    @property
    def sequences(self) -> int:
        return len(self.prompts) * self.n

    def joins(self, first: _Request) -> bool:
        """Whether this request may share ``first``'s batch."""
        return (
            self.backend is first.backend
            and self.n == first.n
            and self.params.seed is None
            and first.params.seed is None
            and self.params == first.params
        )


@dataclass
class BatchStats:
    """What the batcher has done: ``generate`` calls, requests served, the largest batch."""

    batches: int = 0
    requests: int = 0
    largest: int = 0
    """Most requests decoded in one ``generate`` call."""


class RequestBatcher:
    """Decodes concurrent requests together on one thread (see the module docstring).

    Args:
        max_sequences: most sequences (prompts x n) in one batch; a single larger request still runs.
    """

    def __init__(self, max_sequences: int = 32) -> None:
        if max_sequences < 1:
            raise ValueError(f"max_sequences must be at least 1, got {max_sequences}")
        self.max_sequences = max_sequences
        self.stats = BatchStats()
        self._queue: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="gagar-batcher", daemon=True)
        self._thread.start()

    def generate(
        self, backend: GenerationBackend, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        """``backend.generate(prompts, params, n)``, decoded in a batch with concurrent callers."""
        request = _Request(backend, list(prompts), params, n)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._queue.append(request)
            self._cond.notify()
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.samples is not None
        return request.samples

    def close(self) -> None:
        """Stop the thread once the queue is empty."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = self._take()
            self._decode(batch)

    def _take(self) -> list[_Request]:
        """The oldest request and the waiting ones that may join it, within ``max_sequences``."""
        first = self._queue.popleft()
        batch, room, rest = [first], self.max_sequences - first.sequences, deque[_Request]()
        while self._queue:
            request = self._queue.popleft()
            if room >= request.sequences and request.joins(first):
                batch.append(request)
                room -= request.sequences
            else:
                rest.append(request)
        self._queue = rest
        return batch

    def _decode(self, batch: list[_Request]) -> None:
        first = batch[0]
        flat = [p for r in batch for p in r.prompts]
        try:
            samples = first.backend.generate(flat, first.params, first.n)
        except BaseException as exc:  # every caller of the batch gets the error, none waits forever
            for request in batch:
                request.error = exc
                request.done.set()
            return
        self.stats.batches += 1
        self.stats.requests += len(batch)
        self.stats.largest = max(self.stats.largest, len(batch))
        start = 0
        for request in batch:
            request.samples = samples[start : start + len(request.prompts)]
            start += len(request.prompts)
            request.done.set()
