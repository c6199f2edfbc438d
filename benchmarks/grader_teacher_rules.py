"""How well candidate teacher rules, computed from what the grader's tools show, rank the groups of
``gagar grader eval`` as the oracle does: the ceiling an LLM grader that learns a rule can reach, before
anyone trains one on it.

Each rule turns a candidate's tool readings (``diff_stats`` lines and files, ``out_of_scope_edits``'s
lines out of scope, ``style_findings``) into a penalty; the figure is the mean Kendall tau-b between
minus the penalty and the oracle's totals over groups the oracle does not tie. Sets: the size-misleading
groups of the held-out kinds and of the training kinds, the catalogue ladders, and the passing
trajectories of rollouts when ``--trajectories`` and ``--results`` are given.

    python benchmarks/grader_teacher_rules.py --tasks heldout.jsonl \
        [--trajectories heldout-traj8.jsonl --results heldout-results8.jsonl]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gagar.grader import tools
from gagar.grader.kendall import kendall_tau_b, mean_ignoring_nan
from gagar.grader.sft import HELD_OUT_KINDS, TRAINING_KINDS, LabelledGroup, load_labelled_groups


@dataclass(frozen=True)
class Reading:
    lines: int
    files: int
    out_of_scope: int
    style: int


RULES: dict[str, Callable[[Reading], float]] = {
    "size (format 5)": lambda r: r.lines,
    "lines + 2 out + 4 extra files + style (formats 6 and 7)": lambda r: (
        r.lines + 2 * r.out_of_scope + 4 * max(0, r.files - 1) + r.style
    ),
    "lines + 2 out + style": lambda r: r.lines + 2 * r.out_of_scope + r.style,
    "by out, then lines, then style": lambda r: r.out_of_scope * 1e4 + r.lines * 1e2 + r.style,
    "by files, then out, then lines, then style": lambda r: (
        r.files * 1e6 + r.out_of_scope * 1e4 + r.lines * 1e2 + r.style
    ),
}


def reading(group: LabelledGroup, root: Path) -> dict[str, Reading]:
    ws = group.workspace(root)
    out = {}
    for tid in ws.passing_ids:
        stats = tools.diff_stats(ws, tid)
        out[tid] = Reading(
            stats.added + stats.removed,
            stats.files,
            tools.out_of_scope_edits(ws, tid).lines_out_of_scope,
            len(tools.style_findings(ws, tid).findings),
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--trajectories", type=Path)
    parser.add_argument("--results", type=Path)
    parser.add_argument("--max-candidates", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1, help="of the size-misleading groups (eval's --seed)")
    args = parser.parse_args()
    tasks, most = args.tasks, args.max_candidates
    misleading = {"groups_per_task": 0, "misleading_per_task": 2, "seed": args.seed, "max_candidates": most}
    sets = {
        "size-misleading, held-out kinds": load_labelled_groups(tasks, kinds=HELD_OUT_KINDS, **misleading),
        "size-misleading, training kinds": load_labelled_groups(tasks, kinds=TRAINING_KINDS, **misleading),
        "catalogue ladders": load_labelled_groups(tasks, groups_per_task=1, seed=0, max_candidates=most),
    }
    if args.trajectories is not None and args.results is not None:
        sets["rollouts"] = load_labelled_groups(tasks, args.trajectories, args.results, groups_per_task=0)
    print("| rule | " + " | ".join(f"{name} ({len(g)})" for name, g in sets.items()) + " |")
    print("|---" * (len(sets) + 1) + "|")
    taus: dict[str, list[float]] = {rule: [] for rule in RULES}
    with tempfile.TemporaryDirectory() as tmp:
        for name, groups in sets.items():
            per_rule: dict[str, list[float]] = {rule: [] for rule in RULES}
            for n, group in enumerate(groups):
                readings = reading(group, Path(tmp) / f"{name}-{n}")
                ids = sorted(readings)
                quality = [group.labels[t] for t in ids]
                for rule, penalty in RULES.items():
                    per_rule[rule].append(kendall_tau_b([-penalty(readings[t]) for t in ids], quality))
            for rule in RULES:
                taus[rule].append(mean_ignoring_nan(per_rule[rule]))
    for rule, values in taus.items():
        print(f"| {rule} | " + " | ".join(f"{v:.3f}" for v in values) + " |")


if __name__ == "__main__":
    main()
