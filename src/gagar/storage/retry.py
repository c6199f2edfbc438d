"""Bounded retries with exponential backoff and full jitter."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["RetryError", "RetryPolicy", "retry_call"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient failure.

    Attempt ``n`` (0-based) that fails waits ``uniform(0, min(max_delay_s, base_delay_s * 2**n))``
    ("full jitter", so clients that failed together do not retry together).
    """

    attempts: int = 5
    """Total tries, the first included (>= 1)."""
    base_delay_s: float = 0.5
    """Backoff scale."""
    max_delay_s: float = 8.0
    """Cap on one wait."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("RetryPolicy delays must be >= 0")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based)."""
        return rng.uniform(0.0, min(self.max_delay_s, self.base_delay_s * 2.0**attempt))


class RetryError(Exception):
    """Every attempt failed with a retryable error; ``cause`` is the last one."""

    def __init__(self, attempts: int, cause: BaseException) -> None:
        self.attempts, self.cause = attempts, cause
        super().__init__(f"gave up after {attempts} attempt(s): {cause}")


def retry_call(
    fn: Callable[[], T],
    policy: RetryPolicy,
    is_retryable: Callable[[BaseException], bool],
    *,
    what: str = "call",
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> T:
    """Call ``fn`` until it succeeds, a non-retryable error escapes, or ``policy.attempts`` run out.

    Raises:
        RetryError: the last attempt failed with a retryable error.
    """
    rng = rng or random.Random()
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:
            if not is_retryable(exc):
                raise
            if attempt + 1 == policy.attempts:
                raise RetryError(policy.attempts, exc) from exc
            wait = policy.delay(attempt, rng)
            log.warning(
                "%s failed (%s: %s); retry %d/%d in %.2fs",
                what,
                type(exc).__name__,
                exc,
                attempt + 1,
                policy.attempts - 1,
                wait,
            )
            sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover
