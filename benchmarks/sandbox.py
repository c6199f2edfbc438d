"""Sandbox throughput: evaluations per second with isolation against the same pytest runs without it.

Every configuration evaluates the same jobs (a small pytest suite and its gold patch) with
the local backend; ``isolate=False`` runs the very same workspace, patch and pytest command
without prlimit, setpriv and bubblewrap. Configurations are interleaved over a few rounds
and the best round is kept, so load from other processes skews them alike.

    python benchmarks/sandbox.py [--jobs 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import time

from gagar.sandbox.base import Prediction
from gagar.sandbox.local import LocalBackend
from gagar.sandbox.patch import file_diff
from gagar.sandbox.results import Status
from gagar.tasks.schema import Task

SOURCE = "def clamp(x, lo, hi):\n    return max(lo, x)\n"
TESTS = "".join(
    f"def test_{i}():\n    from lib import clamp\n    assert clamp({i}, 0, 5) == {min(i, 5)}\n\n"
    for i in range(8)
)


def make_jobs(n: int) -> list[tuple[Task, Prediction]]:
    """``n`` distinct tasks, each with its gold patch as the prediction."""
    gold = file_diff("lib.py", SOURCE, SOURCE.replace("max(lo, x)", "min(hi, max(lo, x))"))
    jobs = []
    for k in range(n):
        task = Task(
            instance_id=f"clamp-{k}",
            repo="bench/clamp",
            snapshot={"lib.py": SOURCE, "tests/test_lib.py": TESTS},
            problem_statement="clamp ignores hi",
            patch=gold,
            FAIL_TO_PASS=[f"tests/test_lib.py::test_{i}" for i in range(6, 8)],
            PASS_TO_PASS=[f"tests/test_lib.py::test_{i}" for i in range(6)],
        )
        jobs.append((task, Prediction(instance_id=task.instance_id, model_patch=gold)))
    return jobs


def throughput(jobs: list[tuple[Task, Prediction]], workers: int, isolate: bool) -> float:
    """Evaluations per second; every evaluation must resolve."""
    backend = LocalBackend(workers=workers, isolate=isolate)
    start = time.perf_counter()
    results = backend.evaluate(jobs)
    elapsed = time.perf_counter() - start
    bad = [r for r in results if r.status != Status.PASSED]
    if bad:
        raise RuntimeError(f"{len(bad)} evaluations did not pass: {bad[0].reason}\n{bad[0].log[-2000:]}")
    return len(jobs) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    jobs = make_jobs(args.jobs)
    cores = os.cpu_count() or 1
    configs = [(w, iso) for w in sorted({1, cores}) for iso in (False, True)]
    best = dict.fromkeys(configs, 0.0)
    for _ in range(args.rounds):
        for workers, isolate in configs:
            best[(workers, isolate)] = max(best[(workers, isolate)], throughput(jobs, workers, isolate))
    for (workers, isolate), rate in best.items():
        print(f"workers={workers} isolate={isolate!s:5}: {rate:6.2f} evaluations/s")
    for workers in sorted({1, cores}):
        overhead = best[(workers, False)] / best[(workers, True)] - 1
        print(f"isolation overhead at {workers} worker(s): {100 * overhead:+.1f}% (target <= 10%)")
    scaling = best[(cores, True)] / best[(1, True)]
    print(f"isolated scaling 1 -> {cores} workers: x{scaling:.2f} (ideal x{cores})")


if __name__ == "__main__":
    main()
