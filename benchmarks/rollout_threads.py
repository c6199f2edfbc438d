"""Rollout wall time with one torch thread against two, alternating in one run (the baseline: one).

On a shared machine whose kernel splits CPU between sessions first (``sched_autogroup_enabled``), a
process may get well under its cores; torch's intra-op threads then wait on each other at every
small operator of a tiny model's decode step. Each round times the same rollout (same tasks, same
sampling seed) in a fresh process per thread count, so one setting cannot warm the other's caches.

    python benchmarks/rollout_threads.py --tasks T [--policy DIR] [--tasks-n 3] [--group-size 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from gagar.policy.rollout import make_backend, rollout
from gagar.schema.trajectory import SamplingParams
from gagar.tasks.loaders import load_tasks
gen, tok = make_backend(sys.argv[2], "hf")
tasks = load_tasks(sys.argv[3])[: int(sys.argv[4])]
params = SamplingParams(temperature=1.0, max_new_tokens=96, seed=1)
wall, cpu = time.perf_counter(), time.process_time()
out = list(rollout(tasks, gen, tok, int(sys.argv[5]), params, policy_version="bench", progress=False))
print(json.dumps({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                  "tokens": sum(t.n_response_tokens for t in out)}))
"""


def _run(threads: int, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-c", _CHILD, str(threads), str(args.policy), str(args.tasks), str(args.tasks_n)]
    done = subprocess.run([*cmd, str(args.group_size)], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from gagar.embedded import SHIPPED_POLICY

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, default=SHIPPED_POLICY)
    parser.add_argument("--tasks", type=Path, required=True, help="Tasks to prompt with (JSONL).")
    parser.add_argument("--tasks-n", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    for round_ in range(args.rounds):
        one, two = _run(1, args), _run(2, args)
        print(
            f"round {round_}: 1 thread {one['wall_s']:.2f} s (cpu {one['cpu_s']:.2f} s), "
            f"2 threads {two['wall_s']:.2f} s (cpu {two['cpu_s']:.2f} s), {one['tokens']} tokens; "
            f"2 threads / 1 thread = {two['wall_s'] / one['wall_s']:.1f}x wall"
        )


if __name__ == "__main__":
    main()
