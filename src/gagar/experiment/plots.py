"""The experiment's plots: held-out metrics per arm with confidence intervals, and training curves."""

from __future__ import annotations

import math
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
    panels: Mapping[str, Mapping[str, Sequence[Sequence[float]]]],
    path: str | os.PathLike[str],
    x: Sequence[float] | None = None,
    xlabel: str = "step",
) -> None:
    """One panel per metric (title -> arm -> per seed, the value at each point): the mean over seeds per
    point and, with two seeds or more, its 95% t-interval as a band. Seeds may differ in length (a run
    still going); each point averages the seeds that reached it. ``x`` places point ``i`` at ``x[i]``
    (default: at ``i``, the step); a NaN value is a point that seed does not have. Panels go three
    to a row."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig, grid = plt.subplots(
        rows, columns, figsize=(5 * columns, 3.4 * rows), constrained_layout=True, squeeze=False
    )
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, by_arm) in zip(axes, panels.items(), strict=False):
        for colour, (arm, seeds) in enumerate(by_arm.items()):
            reached = [
                (x[p] if x is not None else p, [s[p] for s in seeds if p < len(s) and math.isfinite(s[p])])
                for p in range(max((len(s) for s in seeds), default=0))
            ]
            at = [a for a, values in reached if values]
            intervals = [t_interval(values) for _, values in reached if values]
            ax.plot(at, [i.mean for i in intervals], marker="o", color=f"C{colour}", label=arm)
            banded = [(a, i) for a, i in zip(at, intervals, strict=True) if i.low is not None]
            if banded:
                ax.fill_between(
                    [a for a, _ in banded],
                    [i.low for _, i in banded],
                    [i.high for _, i in banded],
                    color=f"C{colour}",
                    alpha=0.2,
                )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)
