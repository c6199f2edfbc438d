"""The experiment's plots: held-out metrics per arm with confidence intervals, and training curves."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from io import BytesIO
from typing import Any

from gagar.experiment.stats import Interval, t_interval

__all__ = ["plot_metric_bars", "plot_training_curves"]


def _save(fig: Any, path: str | os.PathLike[str]) -> None:
    import matplotlib.pyplot as plt

    from gagar.records import atomic_write_bytes

    buffer = BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_metric_bars(
    panels: Mapping[str, Mapping[str, Interval | None]], path: str | os.PathLike[str]
) -> None:
    """One panel per metric (title -> arm -> interval): a bar per arm at its mean, whiskers at its CI.

    An arm with no value has no bar; an arm with one seed has a bar without whiskers.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4), constrained_layout=True)
    for ax, (title, by_arm) in zip(list(axes) if len(panels) > 1 else [axes], panels.items(), strict=True):
        arms = list(by_arm)
        means = [by_arm[a].mean if by_arm[a] is not None else 0.0 for a in arms]
        errors = [
            [(i.mean - i.low) if i is not None and i.low is not None else 0.0 for i in by_arm.values()],
            [(i.high - i.mean) if i is not None and i.high is not None else 0.0 for i in by_arm.values()],
        ]
        bars = ax.bar(range(len(arms)), means, yerr=errors, capsize=4, color="C0", alpha=0.8)
        for bar, interval in zip(bars, by_arm.values(), strict=True):
            if interval is None:
                bar.set_visible(False)
        ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def plot_training_curves(
    panels: Mapping[str, Mapping[str, Sequence[Sequence[float]]]], path: str | os.PathLike[str]
) -> None:
    """One panel per metric (title -> arm -> per seed, the value at each step): the mean over seeds per
    step and, with two seeds or more, its 95% t-interval as a band. Seeds may differ in length (a run
    still going); each step averages the seeds that reached it."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.4), constrained_layout=True)
    for ax, (title, by_arm) in zip(list(axes) if len(panels) > 1 else [axes], panels.items(), strict=True):
        for colour, (arm, seeds) in enumerate(by_arm.items()):
            steps = range(max((len(s) for s in seeds), default=0))
            intervals = [t_interval([s[step] for s in seeds if step < len(s)]) for step in steps]
            ax.plot(list(steps), [i.mean for i in intervals], marker="o", color=f"C{colour}", label=arm)
            banded = [(step, i) for step, i in zip(steps, intervals, strict=True) if i.low is not None]
            if banded:
                ax.fill_between(
                    [s for s, _ in banded],
                    [i.low for _, i in banded],
                    [i.high for _, i in banded],
                    color=f"C{colour}",
                    alpha=0.2,
                )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)
