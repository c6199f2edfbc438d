"""The training curve per step (resolved rate, kept groups, credit moved, entropy, loss) as one PNG."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["plot_run"]

PANELS = [
    ("rollout/resolved_rate", "resolved rate (training rollouts)"),
    ("sampling/groups_kept", "mixed groups kept"),
    ("credit/moved_ratio", "share of passing credit moved"),
    ("policy/entropy", "policy entropy (nats/token)"),
    ("loss/policy", "policy loss"),
]


def plot_run(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write the per-step curves of ``rows`` (metrics.jsonl lines) to ``path``; no rows, no file."""
    if not rows:
        return
    from io import BytesIO

    from matplotlib.figure import Figure  # no pyplot: faster to import, no global figure state

    from gagar.records import atomic_write_bytes

    steps = [row["step"] for row in rows]
    fig = Figure(figsize=(4 * len(PANELS), 3.2))
    axes = fig.subplots(1, len(PANELS))
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.16, top=0.88, wspace=0.25)  # no layout solver
    for ax, (key, title) in zip(axes, PANELS, strict=True):
        ax.plot(steps, [row.get(key, float("nan")) for row in rows], marker="o")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    buffer = BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(path, buffer.getvalue())
