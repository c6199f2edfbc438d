"""Client-side rate limiting and retries for Kubernetes API calls.

A token bucket (like client-go's QPS/burst limiter) bounds the request rate of all
threads together and adapts to the server: a 429 halves its rate (at most once per
second, down to a floor) and holds every thread back for the ``Retry-After`` the server
sent; each success raises the rate again by a step, up to the configured one (additive
increase, multiplicative decrease). :func:`call_with_retry` retries conflicts, throttling
and server errors with capped exponential backoff and jitter, honouring ``Retry-After``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kubernetes.client.exceptions import ApiException

from gagar.sandbox.k8s.config import RetryPolicy

__all__ = [
    "RETRYABLE_STATUSES",
    "BucketStats",
    "TokenBucket",
    "backoff_delay",
    "call_with_retry",
    "retry_after_s",
]

T = TypeVar("T")

RETRYABLE_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
"""HTTP statuses worth another attempt (409 only for calls that are not creates; see call_with_retry)."""


@dataclass(frozen=True)
class BucketStats:
    """What a bucket has let through and been told: for benchmarks and logs."""

    requests: int
    """Tokens handed out (one per API request, retries included)."""
    throttled: int
    """429 responses reported to the bucket."""
    rate: float
    """The current rate, requests/s."""
    min_rate_seen: float
    """The lowest rate the bucket fell to."""


class TokenBucket:
    """Thread-safe, adaptive token bucket: up to ``rate`` tokens a second, at most ``burst`` saved up.

    The bucket starts full, so the first ``burst`` acquisitions pass at once and the
    following ones are spaced ``1 / rate`` seconds apart. :meth:`throttled` (a 429) halves
    the current rate, at most once a second and never below ``min_rate``, and holds all
    acquisitions back until the server's ``Retry-After`` has passed; :meth:`succeeded` adds
    ``rate / recovery`` back, up to the configured rate.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        min_rate: float | None = None,
        recovery: int = 50,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"token bucket needs rate > 0 and burst >= 1, got rate={rate}, burst={burst}")
        self.max_rate, self.burst = rate, burst
        self.min_rate = min(rate, min_rate if min_rate is not None else max(rate / 32, 0.5))
        self.rate = self._min_seen = rate
        self._step = rate / recovery
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._last = clock()
        self._paused_until = self._last_cut = float("-inf")
        self._requests = self._throttled = 0
        self._lock = threading.Lock()

    def _reserve(self) -> float:
        """Take one token (possibly going into debt); return how long the caller must wait."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= 1.0
            self._requests += 1
            debt = 0.0 if self._tokens >= 0 else -self._tokens / self.rate
            return max(debt, self._paused_until - now)

    def acquire(self) -> float:
        """Block until a token is available; return the seconds waited."""
        wait = self._reserve()
        if wait > 0:
            self._sleep(wait)
        return wait

    def throttled(self, retry_after_s: float | None) -> None:
        """The server answered 429: slow down, and pause everyone for ``retry_after_s`` if given."""
        with self._lock:
            now = self._clock()
            self._throttled += 1
            if retry_after_s:
                self._paused_until = max(self._paused_until, now + retry_after_s)
            if now - self._last_cut >= 1.0:
                self._last_cut = now
                self.rate = max(self.min_rate, self.rate / 2)
                self._min_seen = min(self._min_seen, self.rate)
                self._tokens = min(self._tokens, 0.0)  # no saved-up burst right after a 429

    def succeeded(self) -> None:
        """A request went through: recover the rate by one step."""
        if self.rate < self.max_rate:
            with self._lock:
                self.rate = min(self.max_rate, self.rate + self._step)

    @property
    def stats(self) -> BucketStats:
        with self._lock:
            return BucketStats(self._requests, self._throttled, self.rate, self._min_seen)


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

    429 waits for ``Retry-After`` when the server sent one, else backs off, and tells the
    bucket, which slows every thread down; 429s are retried up to ``policy.max_throttled``
    times, apart from the ``max_attempts`` that bound other failures (a throttling server
    is working as designed, not failing). 5xx backs off; 409 backs off only when
    ``retry_conflict`` (a create that conflicts means the object exists, which the caller
    handles, so creates pass ``retry_conflict=False``). Other errors, and the last failure,
    are raised unchanged.
    """
    rng = rng or random.Random()
    failures = throttles = 0
    while True:
        if bucket is not None:
            bucket.acquire()
        try:
            result = fn()
        except ApiException as exc:
            retryable = exc.status in RETRYABLE_STATUSES and (exc.status != 409 or retry_conflict)
            if not retryable:
                raise
            hinted = None
            if exc.status == 429:
                throttles += 1
                hinted = retry_after_s(exc)
                if bucket is not None:
                    bucket.throttled(hinted)
                if throttles >= policy.max_throttled:
                    raise
            else:
                failures += 1
                if failures >= policy.max_attempts:
                    raise
            attempt = failures + throttles
            delay = (
                min(policy.max_delay_s, hinted) if hinted is not None else backoff_delay(attempt, policy, rng)
            )
            sleep(delay)
        else:
            if bucket is not None:
                bucket.succeeded()
            return result
