"""Generate bundled tasks and check them by real pytest runs: gold resolves all, the empty patch none.

Usage: python benchmarks/tasks_check.py [--n 200] [--seed 0] [--workers 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from multiprocessing import Pool

from gagar.schema.result import Outcome
from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff
from gagar.tasks.generate import generate_tasks, summary_line
from gagar.tasks.testrun import run_pytest


def _resolved(task: Task, outcomes: Mapping[str, Outcome]) -> bool:
    return all(outcomes.get(t) == Outcome.PASSED for t in task.FAIL_TO_PASS + task.PASS_TO_PASS)


def _check(task: Task) -> tuple[bool, bool]:
    """(gold resolves, empty patch resolves) for one task."""
    gold = run_pytest(apply_diff(task.snapshot or {}, task.patch))
    empty = run_pytest(task.snapshot or {})
    return _resolved(task, gold), _resolved(task, empty)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    start = time.perf_counter()
    tasks = generate_tasks(args.n, args.seed, workers=args.workers)
    generated = time.perf_counter()
    with Pool(args.workers) as pool:
        results = pool.map(_check, tasks)
    checked = time.perf_counter()

    gold = sum(g for g, _ in results)
    empty = sum(e for _, e in results)
    print(summary_line(tasks))
    print(f"gold resolves {gold}/{len(tasks)}, empty patch resolves {empty}/{len(tasks)}")
    print(
        f"generation {generated - start:.1f} s, checks {checked - generated:.1f} s "
        f"({args.workers} workers, {4 * len(tasks)} pytest runs in all)"
    )
    if gold != len(tasks) or empty != 0:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
