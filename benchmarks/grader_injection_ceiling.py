"""The teacher's own Kendall tau between each group's ranking with and without text addressed to the
grader in its worse half, on the groups ``gagar grader eval --inject-worse`` builds: the ceiling an
LLM grader that learned the teacher's rule can reach on them.

    python benchmarks/grader_injection_ceiling.py --tasks heldout.jsonl [--max-candidates 8]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from gagar.grader.kendall import kendall_tau_b, mean_ignoring_nan
from gagar.grader.sft import LabelledGroup, inject_worse, load_labelled_groups, with_hacks
from gagar.grader.transcripts import evidence, visible_penalty


def teacher_scores(group: LabelledGroup, root: Path) -> dict[str, float]:
    ws = group.workspace(root)
    return {t: -float(visible_penalty(evidence(ws, t))) for t in ws.passing_ids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--groups-per-task", type=int, default=1)
    parser.add_argument("--min-candidates", type=int, default=2)
    parser.add_argument("--max-candidates", type=int, default=8)
    parser.add_argument("--hack-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = (args.min_candidates, args.max_candidates)
    groups = load_labelled_groups(args.tasks, None, None, None, args.groups_per_task, args.seed, *sizes)
    groups = with_hacks(groups, args.hack_share, args.seed)
    taus = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, group in enumerate(groups):
            with_text, _ = inject_worse(group)
            before = teacher_scores(group, Path(tmp) / f"clean{n}")
            after = teacher_scores(with_text, Path(tmp) / f"text{n}")
            ids = sorted(before)
            taus.append(kendall_tau_b([before[t] for t in ids], [after[t] for t in ids]))
    below = sum(t < 1.0 for t in taus)
    mean = mean_ignoring_nan(taus)
    print(f"{len(groups)} groups: the teacher's tau with vs without the text {mean:.3f}")
    print(f"lowest {min(taus):.2f}; {below} groups below 1")


if __name__ == "__main__":
    main()
