"""Markdown the Kubeflow UI shows for a step: the step's headline numbers and where credit moved."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from gagar.records import read_records

__all__ = ["HEADLINE", "credit_table", "merge_metrics", "step_summary"]

HEADLINE = (
    ("rollout/resolved_rate", "resolved rate"),
    ("rollout/trajectories", "trajectories"),
    ("rollout/parse_rate", "parse rate"),
    ("sandbox/hack_ratio", "hack ratio"),
    ("sampling/groups_generated", "groups generated"),
    ("sampling/groups_kept", "groups kept"),
    ("sampling/batch_full", "batch full (1 = yes)"),
    ("grader/fallbacks", "grader fallbacks"),
    ("credit/moved_ratio", "credit moved"),
    ("loss/policy", "policy loss"),
    ("policy/approx_kl", "approx KL"),
)
"""(metric key, label) of the rows the step summary leads with."""


def _number(value: float) -> str:
    return f"{value:.4g}"


def step_summary(step: int, metrics: Mapping[str, float]) -> str:
    """A Markdown table of one RL step: the :data:`HEADLINE` rows, dropped groups, hacks by kind (the
    kinds seen), then stage durations."""
    rows = [(label, metrics[key]) for key, label in HEADLINE if key in metrics]
    rows += [
        (f"groups dropped: {key.rsplit('/', 1)[1]}", value)
        for key, value in sorted(metrics.items())
        if key.startswith("sampling/dropped/")
    ]
    rows += [
        (f"hacks: {key.rsplit('/', 1)[1]}", value)
        for key, value in sorted(metrics.items())
        if key.startswith("sandbox/hacks/") and value > 0
    ]
    rows += [(key, value) for key, value in sorted(metrics.items()) if key.startswith("perf/")]
    lines = [f"## RL step {step}", "", "| metric | value |", "|---|---|"]
    lines += [f"| {label} | {_number(value)} |" for label, value in rows]
    return "\n".join(lines) + "\n"


def credit_table(batch: str | os.PathLike[str], max_rows: int = 200) -> str:
    """A Markdown table of the passing trajectories of the train batch: rank, GRPO and final advantage.

    Credit moves only among passing trajectories (failing ones keep their GRPO advantage), so
    those are the rows; at most ``max_rows`` of them, largest change first.
    """
    from gagar.schema.batch import BatchEntry

    entries = [e for e in read_records(batch, BatchEntry) if e.reward > 0]
    entries.sort(key=lambda e: abs(e.advantage - e.grpo_advantage), reverse=True)
    lines = [
        f"## Credit redistribution ({len(entries)} passing trajectories)",
        "",
        "| group | trajectory | rank | GRPO advantage | advantage | change |",
        "|---|---|---|---|---|---|",
    ]
    for e in entries[:max_rows]:
        rank = "-" if e.rank is None else _number(e.rank)
        change = e.advantage - e.grpo_advantage
        lines.append(
            f"| {e.group_id} | {e.trajectory_id} | {rank} | {_number(e.grpo_advantage)} | "
            f"{_number(e.advantage)} | {change:+.4g} |"
        )
    if len(entries) > max_rows:
        lines.append(f"\n{len(entries) - max_rows} more rows left out.")
    return "\n".join(lines) + "\n"


def merge_metrics(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One flat dict of several stages' metrics (later parts win on a shared key)."""
    merged: dict[str, float] = {}
    for part in parts:
        merged.update({key: float(value) for key, value in part.items()})
    return merged
