"""Sandbox throughput: the hardened judge against bare pytest on the same jobs, in the same run.

Every configuration evaluates the same jobs (a small pytest suite and its gold patch):

- ``bare``: write the repository to a temporary folder, apply the patch, run
  ``python -m pytest -q -p no:cacheprovider`` with the sandbox's interpreter and plugin
  autoload off (as the judge runs it), read its exit status: nothing else;
- ``judge``: the local backend with ``isolate=False``: the pristine judge (reset of the tests
  and runner settings, pinned pytest, the report plugin on its pipe with the runtime monitor,
  hack detection and the trusted cross-checks)
  without prlimit, setpriv and bubblewrap;
- ``hardened``: the judge inside a sandbox started per evaluation (``forkserver`` off);
- ``forkserver``: the local backend as it runs in training: the judge inside a pre-started worker
  per slot that forks each evaluation into namespaces of its own (:mod:`gagar.sandbox.forkserver`),
  worker start-up included in the rates.

Configurations are interleaved over a few rounds and the best round is kept, so load from
other processes skews them alike (the load average is printed beside the rates); each rate is
printed as a ratio to bare pytest's (above 1: faster than bare pytest, as the forkserver is: it
skips the interpreter start and pytest's import that every bare run pays). On a machine shared with
other work the rates swing by tens of percent between runs, so the script also times single
evaluations of every configuration, interleaved one by one, and compares their fastest (least
disturbed) latencies.

    python benchmarks/sandbox.py [--jobs 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gagar.sandbox.base import Prediction
from gagar.sandbox.forkserver import WorkerPool
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.sandbox.patch import apply_patch, file_diff
from gagar.sandbox.workspace import materialize
from gagar.schema.result import Status
from gagar.schema.task import Task

CONFIGS = ("bare", "judge", "hardened", "forkserver")

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


def bare_pytest(task: Task, pred: Prediction, python: str) -> int:
    """Plain pytest on a fresh copy with the patch applied; its exit status."""
    with tempfile.TemporaryDirectory(prefix="gagar-bench-") as tmp:
        repo = Path(tmp)
        materialize(task, repo, None)
        apply_patch(repo, pred.model_patch, 1 << 22)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "PYTHONDONTWRITEBYTECODE": "1"}
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        return subprocess.run(argv, cwd=repo, env=env, capture_output=True, check=False).returncode


def _backend(config: str, workers: int) -> LocalBackend:
    settings = LocalSandboxSettings(forkserver=config == "forkserver")
    return LocalBackend(workers=workers, isolate=config != "judge", settings=settings)


def throughput(jobs: list[tuple[Task, Prediction]], workers: int, config: str) -> float:
    """Evaluations per second; every evaluation must resolve (bare: exit 0)."""
    start = time.perf_counter()
    if config == "bare":
        python = LocalSandboxSettings().python
        with ThreadPoolExecutor(workers) as pool:
            codes = list(pool.map(lambda job: bare_pytest(*job, python), jobs))
        if any(codes):
            raise RuntimeError(f"bare pytest failed: exit statuses {codes}")
    else:
        results = _backend(config, workers).evaluate(jobs)
        bad = [r for r in results if r.status != Status.PASSED]
        if bad:
            raise RuntimeError(f"{len(bad)} evaluations did not pass: {bad[0].reason}\n{bad[0].log[-2000:]}")
    return len(jobs) / (time.perf_counter() - start)


def latency_floor(jobs: list[tuple[Task, Prediction]], repeats: int) -> dict[str, float]:
    """Fastest single-evaluation seconds of each configuration over ``repeats`` interleaved runs."""
    python = LocalSandboxSettings().python
    judge, hardened, forked = (_backend(c, 1) for c in ("judge", "hardened", "forkserver"))
    workers = WorkerPool(forked._start_worker)  # one warm worker, as a training batch has
    run = {
        "bare": lambda job: bare_pytest(*job, python),
        "judge": lambda job: judge.evaluate_one(*job),
        "hardened": lambda job: hardened.evaluate_one(*job),
        "forkserver": lambda job: forked.evaluate_one(*job, 0, workers),
    }
    best = dict.fromkeys(CONFIGS, float("inf"))
    try:
        for n in range(repeats):
            for config in CONFIGS:
                start = time.perf_counter()
                run[config](jobs[n % len(jobs)])
                best[config] = min(best[config], time.perf_counter() - start)
    finally:
        workers.close()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30, help="single evaluations per configuration")
    args = parser.parse_args()
    jobs = make_jobs(args.jobs)
    load = os.getloadavg()
    cores = os.cpu_count() or 1
    configs = [(w, c) for w in sorted({1, cores}) for c in CONFIGS]
    best = dict.fromkeys(configs, 0.0)
    for _ in range(args.rounds):
        for key in configs:
            best[key] = max(best[key], throughput(jobs, *key))
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after: {os.getloadavg()[0]:.2f}")
    for (workers, config), rate in best.items():
        print(f"workers={workers} {config:8}: {rate:6.2f} evaluations/s")
    for workers in sorted({1, cores}):
        bare = best[(workers, "bare")]
        ratios = ", ".join(f"{c} x{best[(workers, c)] / bare:.2f}" for c in CONFIGS[1:])
        print(f"evaluations/s against bare pytest at {workers} worker(s): {ratios}")
    floor = latency_floor(jobs, args.repeats)
    print("fastest single evaluation: " + ", ".join(f"{c} {1000 * floor[c]:.0f} ms" for c in CONFIGS))
    ratios = ", ".join(f"{c} x{floor[c] / floor['bare']:.2f}" for c in CONFIGS[1:])
    print(f"latency of the fastest against bare pytest: {ratios}")
    for config in ("hardened", "forkserver"):
        scaling = best[(cores, config)] / best[(1, config)]
        print(f"{config} scaling 1 -> {cores} workers: x{scaling:.2f} (ideal x{cores})")


if __name__ == "__main__":
    main()
