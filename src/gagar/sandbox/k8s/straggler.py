"""The step's straggler policy: when an evaluate() call stops waiting for the evaluations not back.

A training step needs most of its rewards, not all: one pod stuck behind a slow image
pull must not hold the step. Once ``ceil(step_quorum * total)`` evaluations are back, the
rest get ``straggler_wait_s`` more; past that, or past ``step_deadline_s`` from the start,
every evaluation still out is cut (reported ``infra_error``, its pod deleted), and dynamic
sampling drops it like any platform failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["StragglerPolicy", "quorum_size"]


def quorum_size(total: int, share: float) -> int:
    """Evaluations that make the quorum: ``ceil(share * total)``, at least 1 for a non-empty call."""
    if total == 0:
        return 0
    return max(1, min(total, math.ceil(share * total - 1e-9)))


@dataclass(frozen=True)
class StragglerPolicy:
    """``step_quorum``, ``straggler_wait_s`` and ``step_deadline_s`` of the backend's settings."""

    quorum: float = 1.0
    wait_s: float = 60.0
    deadline_s: float | None = None

    def cut_reason(
        self, total: int, done: int, started_at: float, quorum_at: float | None, now: float
    ) -> str | None:
        """Why the evaluations still out must be cut now, or None to keep waiting.

        ``quorum_at`` is when the quorum was reached (None before); times share one clock.
        """
        if done >= total:
            return None
        if self.deadline_s is not None and now - started_at >= self.deadline_s:
            return f"step deadline of {self.deadline_s:.0f} s reached with {done} of {total} evaluations back"
        if quorum_at is not None and now - quorum_at >= self.wait_s:
            return (
                f"straggler: {done} of {total} evaluations were back (quorum {self.quorum:.0%}) "
                f"and this one not {self.wait_s:.0f} s later"
            )
        return None
