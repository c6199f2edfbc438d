"""Token bucket and retries with the real clock and real ApiException responses."""

from __future__ import annotations

import random
import threading
import time

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse

from gagar.sandbox.k8s import RetryPolicy, TokenBucket, call_with_retry
from gagar.sandbox.k8s.ratelimit import backoff_delay, retry_after_s


def api_error(status: int, headers: dict[str, str] | None = None) -> ApiException:
    """An ApiException built from a real HTTP response, as the client raises it."""
    resp = urllib3.HTTPResponse(
        body=b'{"kind":"Status"}', headers=headers or {}, status=status, reason="test"
    )
    return ApiException(http_resp=RESTResponse(resp))


class Flaky:
    """A callable failing with the given errors, in order, then returning 'ok'; records call times."""

    def __init__(self, *errors: ApiException) -> None:
        self.errors, self.times = list(errors), []

    def __call__(self) -> str:
        self.times.append(time.monotonic())
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


FAST = RetryPolicy(max_attempts=4, base_delay_s=0.05, max_delay_s=1.0, jitter=0.0)


def test_bucket_spaces_requests_at_its_rate() -> None:
    bucket = TokenBucket(rate=50, burst=1)
    start = time.monotonic()
    for _ in range(20):
        bucket.acquire()
    elapsed = time.monotonic() - start
    assert 0.35 <= elapsed < 1.5  # 19 waits of 20 ms


def test_bucket_burst_passes_at_once_then_throttles() -> None:
    bucket = TokenBucket(rate=20, burst=10)
    start = time.monotonic()
    for _ in range(10):
        bucket.acquire()
    assert time.monotonic() - start < 0.05
    for _ in range(4):
        bucket.acquire()
    assert time.monotonic() - start >= 0.18  # 4 more at 20/s


def test_bucket_rate_holds_across_threads() -> None:
    bucket = TokenBucket(rate=100, burst=1)
    start = time.monotonic()
    threads = [threading.Thread(target=lambda: [bucket.acquire() for _ in range(10)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - start >= 0.37  # 40 tokens at 100/s, one free


def test_bucket_refuses_bad_parameters() -> None:
    with pytest.raises(ValueError, match="rate > 0"):
        TokenBucket(rate=0, burst=1)


def test_429_honours_retry_after() -> None:
    fn = Flaky(api_error(429, {"Retry-After": "0.3"}))
    assert call_with_retry(fn, FAST) == "ok"
    assert fn.times[1] - fn.times[0] >= 0.29


def test_5xx_backs_off_exponentially_then_succeeds() -> None:
    fn = Flaky(api_error(500), api_error(503), api_error(502))
    assert call_with_retry(fn, FAST) == "ok"
    gaps = [b - a for a, b in zip(fn.times, fn.times[1:], strict=False)]
    assert len(gaps) == 3
    for gap, expected in zip(gaps, [0.05, 0.1, 0.2], strict=True):
        assert gap >= expected * 0.9


def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    fn = Flaky(*[api_error(503) for _ in range(10)])
    with pytest.raises(ApiException) as err:
        call_with_retry(fn, FAST)
    assert err.value.status == 503
    assert len(fn.times) == FAST.max_attempts


@pytest.mark.parametrize("status", [400, 403, 404, 422])
def test_client_errors_are_not_retried(status: int) -> None:
    fn = Flaky(api_error(status))
    with pytest.raises(ApiException):
        call_with_retry(fn, FAST)
    assert len(fn.times) == 1


def test_conflict_retried_for_updates_but_not_for_creates() -> None:
    assert call_with_retry(Flaky(api_error(409)), FAST) == "ok"
    fn = Flaky(api_error(409))
    with pytest.raises(ApiException):
        call_with_retry(fn, FAST, retry_conflict=False)
    assert len(fn.times) == 1


def test_retries_pass_through_the_bucket() -> None:
    bucket = TokenBucket(rate=10, burst=1)
    fn = Flaky(api_error(500), api_error(500))
    start = time.monotonic()
    call_with_retry(fn, RetryPolicy(base_delay_s=0.001, jitter=0.0), bucket)
    assert time.monotonic() - start >= 0.19  # three requests at 10/s, one free


def test_backoff_is_jittered_and_capped() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=5.0, jitter=0.5)
    rng = random.Random(0)
    delays = [backoff_delay(1, policy, rng) for _ in range(200)]
    assert 0.5 <= min(delays) < 0.6
    assert 1.4 < max(delays) <= 1.5
    assert backoff_delay(10, policy, rng) == 5.0


def test_retry_after_parsing() -> None:
    assert retry_after_s(api_error(429, {"Retry-After": "2"})) == 2.0
    assert retry_after_s(api_error(429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) is None
    assert retry_after_s(api_error(429)) is None


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_429_halves_the_rate_pauses_everyone_and_successes_recover_it() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=100, burst=1, clock=clock, sleep=clock.sleep, recovery=10)
    bucket.throttled(2.0)
    assert bucket.rate == 50
    bucket.throttled(2.0)  # a second 429 in the same second does not cut again
    assert bucket.rate == 50
    assert bucket.acquire() >= 2.0  # held back for Retry-After
    clock.now += 1.0
    bucket.throttled(None)
    assert bucket.rate == 25
    for _ in range(100):
        bucket.succeeded()
    assert bucket.rate == 100  # back to the configured rate, never above
    stats = bucket.stats
    assert (stats.throttled, stats.min_rate_seen) == (3, 25)


def test_the_rate_never_falls_below_its_floor() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10, burst=1, clock=clock, sleep=clock.sleep, min_rate=2)
    for _ in range(20):
        clock.now += 1.5
        bucket.throttled(None)
    assert bucket.rate == 2


def test_429s_are_absorbed_beyond_max_attempts_and_reach_the_bucket() -> None:
    bucket = TokenBucket(rate=1000, burst=10)
    fn = Flaky(*[api_error(429, {"Retry-After": "0"}) for _ in range(6)])
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.001, jitter=0.0, max_throttled=10)
    assert call_with_retry(fn, policy, bucket) == "ok"
    assert bucket.stats.throttled == 6
    fn = Flaky(*[api_error(429) for _ in range(6)])
    with pytest.raises(ApiException):
        call_with_retry(fn, RetryPolicy(base_delay_s=0.001, jitter=0.0, max_throttled=3), bucket)
    assert len(fn.times) == 3
