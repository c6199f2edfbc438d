"""The experiment's report: the table with CIs over seeds, paired differences against GRPO, plots, markdown.

Every interval is a 95% Student-t interval over the per-seed values (one number per seed: the
mean over that seed's held-out answers); differences are paired by seed. The verdict is left for a
person to write; :func:`mechanical_check` states the numbers the issue's aim is judged on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gagar.experiment.config import greedy_points
from gagar.experiment.evaluation import EVAL_RECORDS, SUMMARY, EvalSummary
from gagar.experiment.harness import CONFIG, SESSIONS, TIMING, Session
from gagar.experiment.plots import plot_metric_bars, plot_training_curves
from gagar.experiment.stats import Interval, paired_difference, t_interval
from gagar.policy.evaluate import TrajectoryEval
from gagar.records import atomic_write_text, read_records

__all__ = [
    "AIM_CLEAN_POINTS",
    "CURVE_KEYS",
    "GREEDY_METRICS",
    "METRICS",
    "TRAINING_SUMMARY",
    "ExperimentResults",
    "Metric",
    "Preference",
    "arm_interval",
    "judge_aim",
    "load_results",
    "mechanical_check",
    "oracle_preference",
    "paired_interval",
    "preference_interval",
    "render_report",
    "write_report",
]

AIM_CLEAN_POINTS = 15.0
"""The issue's aim: clean-resolved rate at least this many points above GRPO's."""


@dataclass(frozen=True)
class Metric:
    """One reported quantity of a held-out evaluation."""

    key: str
    label: str
    value: Callable[[EvalSummary], float | None]
    scale: float = 1.0
    """100 for rates, reported in percent (differences in points)."""
    digits: int = 2


METRICS: tuple[Metric, ...] = (
    Metric("resolved", "resolved rate (%)", lambda s: s.quality.pass_at_1, 100.0, 1),
    Metric("clean_resolved", "clean-resolved rate (%)", lambda s: s.quality.clean_resolved_rate, 100.0, 1),
    Metric(
        "unclean_share",
        "unclean share of resolving (%)",
        lambda s: s.quality.unclean_share_of_resolving,
        100.0,
        1,
    ),
    Metric(
        "diff_size", "diff size / gold, resolved", lambda s: s.quality.relative_diff_size_resolved, 1.0, 2
    ),
    Metric("tokens", "response tokens / trajectory", lambda s: s.quality.response_tokens_mean, 1.0, 1),
    Metric("turns", "turns / trajectory", lambda s: s.quality.turns_mean, 1.0, 2),
    Metric("parse", "parse rate (%)", lambda s: s.quality.parse_rate, 100.0, 1),
)
_BY_KEY = {m.key: m for m in METRICS}
GREEDY_METRICS: tuple[Metric, ...] = (
    _BY_KEY["resolved"],
    _BY_KEY["clean_resolved"],
    _BY_KEY["tokens"],
    Metric("changed", "answers changed from the start (%)", lambda s: s.changed_from_start, 100.0, 1),
)
"""What the greedy held-out evaluations during training report (one answer per task)."""


@dataclass(frozen=True)
class ExperimentResults:
    """What an experiment folder holds: its settings, evaluations, per-run curves and timings."""

    config: dict[str, Any]
    """``config.json`` as written by the harness."""
    summaries: list[EvalSummary]
    curves: dict[str, dict[str, list[list[float]]]]
    """Training metric key -> arm -> per seed, the value at each step (NaN where a step has none)."""
    sessions: list[Session]
    seconds: dict[str, float]
    """Work seconds by kind (train, eval, greedy_eval, grader_sft)."""
    greedy: list[EvalSummary] = field(default_factory=list)
    """The greedy held-out evaluations during training (``greedy_eval``), the start's included."""
    judged: dict[tuple[str, int | None], list[TrajectoryEval]] = field(default_factory=dict)
    """(arm, seed) -> the final evaluation's judged answers (``eval.jsonl``)."""
    training: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """Training summary label (:data:`TRAINING_SUMMARY`) -> arm -> one value per seed's run."""

    @property
    def last_greedy(self) -> list[EvalSummary]:
        """The greedy evaluations after the last update (the start's as the ``sft`` row)."""
        return [s for s in self.greedy if s.arm == "sft" or s.updates == self.config["steps"]]

    @property
    def arms(self) -> list[str]:
        return [a["name"] for a in self.config["arms"]]

    @property
    def baseline(self) -> str | None:
        """The first GRPO arm."""
        return next((a["name"] for a in self.config["arms"] if a["algo"] == "grpo"), None)


CURVE_KEYS = {
    "rollout/resolved_rate": "training resolved rate",
    "rollout/response_tokens_mean": "training response tokens",
    "policy/entropy": "policy entropy (nats/token)",
    "sandbox/hack_ratio": "training hack rate",
    "credit/moved_ratio": "share of passing credit moved",
    "loss/policy": "policy-gradient loss",
}
"""Training metrics (metrics.jsonl keys) plotted per step, with their titles."""
_ABLATION_KEYS = ("loss/policy", "policy/entropy", "rollout/response_tokens_mean")


def _mean_of(key: str, transform: Callable[[float], float] = float) -> Callable[[Sequence[dict]], float]:
    def mean(rows: Sequence[dict[str, Any]]) -> float:
        values = [transform(r[key]) for r in rows if key in r]
        return sum(values) / len(values) if values else math.nan

    return mean


def _share_of_step(key: str) -> Callable[[Sequence[dict]], float]:
    def share(rows: Sequence[dict[str, Any]]) -> float:
        total = sum(r.get("perf/step_s", 0.0) for r in rows)
        return 100.0 * sum(r.get(key, 0.0) for r in rows) / total if total else math.nan

    return share


TRAINING_SUMMARY: dict[str, Callable[[Sequence[dict[str, Any]]], float]] = {
    "step s": _mean_of("perf/step_s"),
    "grader's share of step time (%)": _share_of_step("perf/grade_s"),
    "groups kept / step": _mean_of("sampling/groups_kept"),
    "share of passing credit moved (%)": _mean_of("credit/moved_ratio", lambda v: 100.0 * v),
    "training hack rate (%)": _mean_of("sandbox/hack_ratio", lambda v: 100.0 * v),
    "entropy (nats/token)": _mean_of("policy/entropy"),
    "|policy-gradient loss|": _mean_of("loss/policy", abs),
    "response tokens": _mean_of("rollout/response_tokens_mean"),
}
"""What each training run's ``metrics.jsonl`` is summarised into, over all its steps: the grader's share
is its wait (``perf/grade_s``) over the step's wall time; the others are means over steps."""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_results(out_dir: Path) -> ExperimentResults:
    """Read an experiment folder written by :func:`gagar.experiment.harness.run_experiment`.

    Raises:
        ValueError: the folder holds no ``config.json`` (not an experiment folder).
    """
    config_path = out_dir / CONFIG
    if not config_path.exists():
        raise ValueError(f"{out_dir}: no {CONFIG}; not an experiment folder (run `gagar experiment run`)")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    found = {kind: sorted((out_dir / kind).rglob(SUMMARY)) for kind in ("eval", "greedy")}
    summaries, greedy = (
        [EvalSummary.model_validate_json(p.read_text(encoding="utf-8")) for p in found[kind]]
        for kind in ("eval", "greedy")
    )
    curves: dict[str, dict[str, list[list[float]]]] = {key: {} for key in CURVE_KEYS}
    training: dict[str, dict[str, list[float]]] = {label: {} for label in TRAINING_SUMMARY}
    for arm in config["arms"]:
        for seed in config["seeds"]:
            rows = _read_jsonl(out_dir / "runs" / arm["name"] / f"seed-{seed}" / "metrics.jsonl")
            for label, summarise in TRAINING_SUMMARY.items():
                if rows:
                    training[label].setdefault(arm["name"], []).append(summarise(rows))
            for key in CURVE_KEYS:
                # a step without the key (no update: no entropy) is NaN, so the steps stay aligned
                values = [float(r.get(key, math.nan)) for r in sorted(rows, key=lambda r: r["step"])]
                if any(math.isfinite(v) for v in values):
                    curves[key].setdefault(arm["name"], []).append(values)
    seconds: dict[str, float] = {}
    for row in _read_jsonl(out_dir / TIMING):
        seconds[row["kind"]] = seconds.get(row["kind"], 0.0) + float(row["seconds"])
    sessions = [Session.model_validate(row) for row in _read_jsonl(out_dir / SESSIONS)]
    judged = {
        (s.arm, s.seed): read_records(path.with_name(EVAL_RECORDS), TrajectoryEval)
        for s, path in zip(summaries, found["eval"], strict=True)
        if path.with_name(EVAL_RECORDS).exists()
    }
    return ExperimentResults(config, summaries, curves, sessions, seconds, greedy, judged, training)


@dataclass(frozen=True)
class Preference:
    """:func:`oracle_preference`'s answer for one pair of evaluations."""

    rate: float | None
    """Mean over the tasks both resolve of the share of comparisons the treatment wins (ties 1/2);
    None when no task is resolved by both."""
    tasks: int
    tie_share: float | None
    """Share of the comparisons that were ties (equal quality)."""


def oracle_preference(treatment: Sequence[TrajectoryEval], control: Sequence[TrajectoryEval]) -> Preference:
    """How often the oracle prefers ``treatment``'s patch to ``control``'s on the tasks both resolve.

    On each such task every resolving answer of one side is compared with every resolving answer of the
    other by the oracle's quality score (a win counts 1, a tie 1/2); the task's rate is the mean of its
    comparisons and the rate is the mean over tasks, so a task with more answers weighs no more. 0.5 is
    no preference. Answers the oracle could not score are left out.
    """

    def by_task(answers: Sequence[TrajectoryEval]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for a in answers:
            if a.resolved and a.quality is not None:
                out.setdefault(a.instance_id, []).append(a.quality)
        return out

    ours, theirs = by_task(treatment), by_task(control)
    rates, ties, pairs = [], 0, 0
    for task in sorted(ours.keys() & theirs.keys()):
        scores = [1.0 if a > b else 0.5 if a == b else 0.0 for a in ours[task] for b in theirs[task]]
        rates.append(sum(scores) / len(scores))
        ties += scores.count(0.5)
        pairs += len(scores)
    return Preference(
        rate=sum(rates) / len(rates) if rates else None,
        tasks=len(rates),
        tie_share=ties / pairs if pairs else None,
    )


def _per_seed(summaries: Sequence[EvalSummary], arm: str, metric: Metric) -> dict[int | None, float]:
    """Seed -> scaled value of ``metric`` for ``arm`` (seeds without a value are left out)."""
    out: dict[int | None, float] = {}
    for s in summaries:
        value = metric.value(s) if s.arm == arm else None
        if value is not None:
            out[s.seed] = value * metric.scale
    return out


def arm_interval(
    results: ExperimentResults, arm: str, metric: Metric, summaries: Sequence[EvalSummary] | None = None
) -> Interval | None:
    """Mean over seeds of ``metric`` for ``arm`` with its 95% t-interval; None when no seed has a value.

    ``summaries`` defaults to the final evaluations (``results.summaries``)."""
    chosen = results.summaries if summaries is None else summaries
    values = list(_per_seed(chosen, arm, metric).values())
    return t_interval(values) if values else None


def paired_interval(
    results: ExperimentResults,
    treatment: str,
    control: str,
    metric: Metric,
    summaries: Sequence[EvalSummary] | None = None,
) -> Interval | None:
    """Paired 95% t-interval of ``treatment − control`` over the seeds both have; None when none."""
    chosen = results.summaries if summaries is None else summaries
    a, b = _per_seed(chosen, treatment, metric), _per_seed(chosen, control, metric)
    seeds = sorted(s for s in a.keys() & b.keys() if s is not None)
    return paired_difference([a[s] for s in seeds], [b[s] for s in seeds]) if seeds else None


def _fmt(interval: Interval | None, digits: int, signed: bool = False) -> str:
    if interval is None:
        return "n/a"
    sign = "+" if signed else ""
    text = f"{interval.mean:{sign}.{digits}f}"
    if interval.low is not None and interval.high is not None:
        text += f" [{interval.low:{sign}.{digits}f}, {interval.high:{sign}.{digits}f}]"
    return text if interval.n > 1 else text + " (n=1)"


def mechanical_check(results: ExperimentResults) -> list[str]:
    """One line per GAGAR arm: clean-resolved and resolved differences against GRPO, and whether the aim
    (clean-resolved at least +15 points, resolved not lower beyond noise) is met by these numbers."""
    control = results.baseline
    if control is None:
        return ["no GRPO arm: nothing to compare against"]
    lines = []
    clean, resolved = _BY_KEY["clean_resolved"], _BY_KEY["resolved"]
    for arm in results.arms:
        if arm == control:
            continue
        dc = paired_interval(results, arm, control, clean)
        dr = paired_interval(results, arm, control, resolved)
        if dc is None or dr is None:
            lines.append(f"{arm} vs {control}: no paired seeds evaluated yet")
            continue
        verdict = judge_aim(dc, dr)
        lines.append(
            f"{arm} vs {control}: clean-resolved {dc.mean:+.1f} points, 95% CI "
            f"{_ci(dc)}; resolved {dr.mean:+.1f} points, 95% CI {_ci(dr)}; aim {verdict}"
        )
    return lines


def judge_aim(clean_diff: Interval, resolved_diff: Interval) -> str:
    """Whether paired differences (in points) meet the aim: clean-resolved at least +15 points on average
    and resolved not lower beyond noise (the upper end of its 95% interval at or above 0)."""
    if resolved_diff.high is None:
        return "cannot be judged with one seed"
    clean_ok = clean_diff.mean >= AIM_CLEAN_POINTS
    resolved_ok = resolved_diff.high >= 0.0
    relation = "≥" if clean_ok else "<"
    return (
        f"{'met' if clean_ok and resolved_ok else 'not met'} (clean-resolved {relation} "
        f"+{AIM_CLEAN_POINTS:.0f} points; resolved "
        + ("not lower beyond noise)" if resolved_ok else "lower beyond noise: its CI is below 0)")
    )


def _ci(interval: Interval) -> str:
    if interval.low is None or interval.high is None:
        return "n/a (1 seed)"
    return f"[{interval.low:+.1f}, {interval.high:+.1f}]"


def _count_lines(path: str) -> str:
    p = Path(path)
    return (
        str(sum(1 for line in p.open(encoding="utf-8") if line.strip()))
        if p.suffix == ".jsonl" and p.exists()
        else "?"
    )


def _show(path: str) -> str:
    """``path`` relative to the working directory when it lies under it (reports go into the repository)."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _session_line(s: Session) -> str:
    """One session: command, start, wall time, machine, nice value and load averages."""
    line = f"`{s.command}` (started {s.started}, {s.wall_s / 60:.1f} min) on {s.machine}"
    if s.niceness is not None:
        line += f", nice {s.niceness}"
    if s.load_start is not None and s.load_end is not None:
        start, end = (" / ".join(f"{v:.2f}" for v in load) for load in (s.load_start, s.load_end))
        line += f"; load average (1/5/15 min) {start} at the start, {end} at the end"
    return line


def _table(
    results: ExperimentResults,
    metrics: Sequence[Metric] = METRICS,
    summaries: Sequence[EvalSummary] | None = None,
) -> list[str]:
    chosen = results.summaries if summaries is None else summaries
    rows = ["| arm | seeds | " + " | ".join(m.label for m in metrics) + " |"]
    rows.append("|---" * (len(metrics) + 2) + "|")
    for arm in ["sft", *results.arms]:
        n = sum(1 for s in chosen if s.arm == arm)
        cells = [_fmt(arm_interval(results, arm, m, chosen), m.digits) for m in metrics]
        rows.append(f"| {arm} | {n} | " + " | ".join(cells) + " |")
    return rows


def _paired_table(
    results: ExperimentResults,
    metrics: Sequence[Metric] = METRICS,
    summaries: Sequence[EvalSummary] | None = None,
) -> list[str]:
    control = results.baseline
    if control is None:
        return ["No GRPO arm: no paired differences."]
    rows = [
        f"| arm − {control} | " + " | ".join(m.label for m in metrics) + " |",
        "|---" * (len(metrics) + 1) + "|",
    ]
    for arm in results.arms:
        if arm != control:
            cells = [
                _fmt(paired_interval(results, arm, control, m, summaries), m.digits, signed=True)
                for m in metrics
            ]
            rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    return rows


def preference_interval(
    results: ExperimentResults, treatment: str, control: str
) -> tuple[Interval, float] | None:
    """The oracle's preference for ``treatment`` over ``control`` (:func:`oracle_preference`), in percent:
    mean over the seeds both evaluated [95% t-interval], and the mean number of tasks compared; None
    when no seed has a task both resolve."""
    per_seed = [
        oracle_preference(results.judged[treatment, seed], results.judged[control, seed])
        for seed in results.config["seeds"]
        if (treatment, seed) in results.judged and (control, seed) in results.judged
    ]
    rates = [100.0 * p.rate for p in per_seed if p.rate is not None]
    if not rates:
        return None
    return t_interval(rates), sum(p.tasks for p in per_seed) / len(per_seed)


def _preference_section(results: ExperimentResults) -> list[str]:
    control = results.baseline
    if control is None:
        return []
    rows = []
    for arm in results.arms:
        found = preference_interval(results, arm, control) if arm != control else None
        if found is not None:
            rows.append(f"| {arm} | {_fmt(found[0], 1)} | {found[1]:.1f} |")
    if not rows:
        return []
    return [
        f"## The oracle's preference against {control}",
        "",
        f"On the held-out tasks both the arm and {control} resolve (same seed), how often the patch-quality "
        f"oracle scores the arm's patch above {control}'s: every resolving answer of one against every "
        "resolving answer of the other, a tie counting one half, averaged per task and then over tasks; "
        "50% is no preference. Mean over seeds [95% t-interval].",
        "",
        f"| arm | preferred to {control} (%) | tasks compared per seed |",
        "|---|---|---|",
        *rows,
        "",
    ]


def _training_section(results: ExperimentResults) -> list[str]:
    if not any(results.training.values()):
        return []
    labels = list(TRAINING_SUMMARY)
    rows = ["| arm | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for arm in results.arms:
        cells = []
        for label in labels:
            values = [v for v in results.training[label].get(arm, []) if math.isfinite(v)]
            cells.append(
                _fmt(t_interval(values), 3 if "entropy" in label or "loss" in label else 1)
                if values
                else "n/a"
            )
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    return [
        "## Training",
        "",
        "Each run's steps summarised (means over steps; the grader's share is its wait over the step's wall "
        "time), then mean over seeds [95% t-interval].",
        "",
        *rows,
        "",
    ]


def _greedy_section(results: ExperimentResults) -> list[str]:
    """The greedy held-out evaluations after the last update, when the run made them."""
    last = results.last_greedy
    if not any(s.arm != "sft" for s in last):
        return []
    c = results.config
    tasks = (c.get("greedy_eval") or {}).get("tasks")
    return [
        "## Greedy held-out answers after the last update",
        "",
        f"One greedy answer per held-out task ({'all tasks' if tasks is None else f'the first {tasks}'}), "
        f"from the start and after every {c['greedy_eval']['every']} updates; here after the last "
        f"({c['steps']}). `answers changed from the start` is the share of tasks whose greedy answer "
        "differs, token for token, from the starting policy's: how far the run moved the policy.",
        "",
        *_table(results, GREEDY_METRICS, last),
        "",
        "Paired differences against GRPO, per seed:",
        "",
        *_paired_table(results, GREEDY_METRICS, last),
        "",
    ]


def render_report(results: ExperimentResults, plots: Mapping[str, str]) -> str:
    """The markdown report; ``plots`` maps a caption to an image path relative to the report."""
    c, ev = results.config, results.config["evaluation"]
    wall = sum(s.wall_s for s in results.sessions)
    lines = [
        "# GAGAR vs GRPO",
        "",
        f"Starting policy `{_show(c['policy'])}`; {_count_lines(c['train_tasks'])} training tasks "
        f"(`{_show(c['train_tasks'])}`), {_count_lines(c['heldout_tasks'])} held-out tasks "
        f"(`{_show(c['heldout_tasks'])}`). "
        f"Arms {', '.join(results.arms)}; seeds {c['seeds']}; {c['steps']} RL steps each. Held-out "
        f"evaluation: {ev['samples_per_task']} answers per task at temperature {ev['temperature']}, "
        f"at most {ev['max_new_tokens']} new tokens. Training settings passed to every run: "
        f"`{json.dumps(c['train'], sort_keys=True)}`."
        + "".join(
            f" Arm `{a['name']}` also: `{json.dumps(a['train'], sort_keys=True)}`."
            for a in c["arms"]
            if a.get("train")
        ),
        "",
        "## How it was run",
        "",
        *[f"- {_session_line(s)}" for s in results.sessions],
        "",
        f"Wall time over all sessions: {wall / 60:.1f} min (work: "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in sorted(results.seconds.items()))
        + ").",
        "",
        "## Held-out results",
        "",
        "Each cell: mean over seeds [95% Student-t interval over the per-seed values]. `sft` is the "
        "starting policy, evaluated once (no interval). Diff size is changed lines of a resolving patch "
        "over changed lines of the gold patch, averaged over resolving answers; clean-resolved means "
        "resolved with no unnecessary modification according to the patch-quality oracle.",
        "",
        *_table(results),
        "",
        "## Paired differences against GRPO",
        "",
        "Per seed, the arm's value minus GRPO's on the same seed; mean [95% paired t-interval]. "
        "Rates in points.",
        "",
        *_paired_table(results),
        "",
        *_preference_section(results),
        *_training_section(results),
        *_greedy_section(results),
        "## Mechanical check of the aim",
        "",
        *[f"- {line}" for line in mechanical_check(results)],
        "",
        *[f"![{caption}]({path})\n" for caption, path in plots.items()],
        "## Verdict",
        "",
        "_To be written by a person after reading the numbers above._",
        "",
    ]
    return "\n".join(lines)


def greedy_curves(results: ExperimentResults) -> dict[str, dict[str, list[list[float]]]]:
    """Greedy metric label -> arm -> per seed, the value at each greedy point (the start first, shared
    by every seed); only points a seed has reached, in order."""
    start = next((s for s in results.greedy if s.arm == "sft"), None)
    curves: dict[str, dict[str, list[list[float]]]] = {}
    for metric in GREEDY_METRICS:
        by_arm: dict[str, list[list[float]]] = {}
        for arm in results.arms:
            for seed in results.config["seeds"]:
                runs = sorted(
                    (s for s in results.greedy if s.arm == arm and s.seed == seed),
                    key=lambda s: s.updates or 0,
                )
                points = [start, *runs] if start is not None else runs
                values = [
                    metric.value(s) * metric.scale
                    if metric.value(s) is not None
                    else (0.0 if metric.key == "changed" else math.nan)
                    for s in points
                ]
                if runs and all(math.isfinite(v) for v in values):
                    by_arm.setdefault(arm, []).append(values)
        if by_arm:
            curves[metric.label] = by_arm
    return curves


def write_report(out_dir: Path, report: Path) -> list[str]:
    """Write the markdown report and its plots next to ``report``: ``<stem>-metrics.png`` (final
    held-out metrics), ``<stem>-training.png`` (training curves), ``<stem>-heldout.png`` (greedy
    held-out curves) and ``<stem>-ablation.png`` (entropy and length of the GAGAR arms); a plot with
    nothing to show is left out. Returns the mechanical check lines."""
    results = load_results(out_dir)
    report.parent.mkdir(parents=True, exist_ok=True)
    bars = report.with_name(f"{report.stem}-metrics.png")
    panels = {m.label: {a: arm_interval(results, a, m) for a in ["sft", *results.arms]} for m in METRICS}
    plot_metric_bars(panels, bars)
    plots = {"held-out metrics per arm, 95% CI over seeds": bars.name}
    if any(results.curves.values()):
        training = report.with_name(f"{report.stem}-training.png")
        curve_panels = {
            title: results.curves[key] for key, title in CURVE_KEYS.items() if results.curves[key]
        }
        plot_training_curves(curve_panels, training)
        plots["training curves: mean over seeds, band: 95% t-interval"] = training.name
    held = greedy_curves(results)
    if held:
        heldout = report.with_name(f"{report.stem}-heldout.png")
        points = greedy_points(
            results.config["steps"], (results.config.get("greedy_eval") or {}).get("every")
        )
        plot_training_curves(held, heldout, x=points, xlabel="updates")
        plots["greedy held-out answers during training: mean over seeds, band: 95% t-interval"] = heldout.name
    algos = {a["name"]: a["algo"] for a in results.config["arms"]}
    compared = [a for a in results.arms if algos[a] in ("gagar", "gagar-no-restore", "grpo")]
    if any(algos[a] == "gagar-no-restore" for a in compared):
        ablation = report.with_name(f"{report.stem}-ablation.png")
        panels_ab = {
            CURVE_KEYS[key]: {a: v for a, v in results.curves[key].items() if a in compared}
            for key in _ABLATION_KEYS
            if results.curves[key]
        }
        plot_training_curves(panels_ab, ablation)
        plots["the ablation (no sum-preserving rescale) beside gagar and grpo: entropy and length"] = (
            ablation.name
        )
    atomic_write_text(report, render_report(results, plots))
    return mechanical_check(results)
