"""Client-side rate limiting and retries for Kubernetes API calls.

A token bucket (like client-go's QPS/burst limiter) bounds the request rate of all
threads together; :func:`call_with_retry` retries conflicts, throttling and server
errors with capped exponential backoff and jitter, honouring ``Retry-After``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from kubernetes.client.exceptions import ApiException

from gagar.sandbox.k8s.config import RetryPolicy

__all__ = ["RETRYABLE_STATUSES", "TokenBucket", "backoff_delay", "call_with_retry", "retry_after_s"]

T = TypeVar("T")

RETRYABLE_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
"""HTTP statuses worth another attempt (409 only for calls that are not creates; see call_with_retry)."""


class TokenBucket:
    """Thread-safe token bucket: ``rate`` tokens a second, at most ``burst`` saved up.

    The bucket starts full, so the first ``burst`` acquisitions pass at once and the
    following ones are spaced ``1 / rate`` seconds apart.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"token bucket needs rate > 0 and burst >= 1, got rate={rate}, burst={burst}")
        self.rate, self.burst = rate, burst
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def _reserve(self) -> float:
        """Take one token (possibly going into debt); return how long the caller must wait."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def acquire(self) -> float:
        """Block until a token is available; return the seconds waited."""
        wait = self._reserve()
        if wait > 0:
            self._sleep(wait)
        return wait


def retry_after_s(exc: ApiException) -> float | None:
    """The ``Retry-After`` header of a response in seconds, None when absent or not a number."""
    headers = exc.headers or {}
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def backoff_delay(attempt: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Delay after failed attempt ``attempt`` (from 1): base * 2^(attempt-1), jittered, capped."""
    raw = policy.base_delay_s * 2 ** (attempt - 1)
    factor = 1.0 + policy.jitter * (2.0 * rng.random() - 1.0)
    return min(policy.max_delay_s, raw * factor)


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    bucket: TokenBucket | None = None,
    *,
    retry_conflict: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> T:
    """Call ``fn`` (one API request) through the rate limiter, retrying transient API errors.

    429 waits for ``Retry-After`` when the server sent one, else backs off; 5xx backs off;
    409 backs off only when ``retry_conflict`` (a create that conflicts means the object
    exists, which the caller handles, so creates pass ``retry_conflict=False``). Other
    errors, and the last failure, are raised unchanged.
    """
    rng = rng or random.Random()
    for attempt in range(1, policy.max_attempts + 1):
        if bucket is not None:
            bucket.acquire()
        try:
            return fn()
        except ApiException as exc:
            retryable = exc.status in RETRYABLE_STATUSES and (exc.status != 409 or retry_conflict)
            if not retryable or attempt == policy.max_attempts:
                raise
            hinted = retry_after_s(exc) if exc.status == 429 else None
            delay = (
                min(policy.max_delay_s, hinted) if hinted is not None else backoff_delay(attempt, policy, rng)
            )
            sleep(delay)
    raise AssertionError("unreachable: the loop returns or raises")
