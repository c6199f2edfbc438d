"""kfp.local with warm stages against cold ones: the same one-step run alternated (warm first), so
load drifts hit both alike; each run's wall time, orchestration share and stage seconds.

    python benchmarks/kfp_warm.py [--repeats 2] [--tasks 16] [--group-size 8] [--work .work/kfp-warm]

Uses the embedded default prepared by ``benchmarks/rl_step.py`` under ``--embedded`` (default
``.work/bench-rl-step/embedded``).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from rl_step import run_kfp  # this folder is on sys.path when the script runs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=2, help="pairs of warm and cold runs")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--embedded", type=Path, default=Path(".work/bench-rl-step/embedded"))
    parser.add_argument("--work", type=Path, default=Path(".work/kfp-warm"))
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    widths = {"run": -6, "step s": 8, "orchestration": 14, "rollout s": 10, "train s": 8, "warm start s": 13}
    print(" ".join(f"{name:<{-w}}" if w < 0 else f"{name:>{w}}" for name, w in widths.items()), " load")
    for i in range(2 * args.repeats):
        warm = i % 2 == 0
        work = args.work / f"run{i}"
        work.mkdir(parents=True)
        result = run_kfp(args, work, args.embedded / "policy", args.embedded / "rl-tasks.jsonl", warm)
        row = result["metrics"]
        print(
            f"{'warm' if warm else 'cold':6} {result['wall_s']:8.1f} {result['overhead_share']:14.1%} "
            f"{row['perf/rollout_s']:10.1f} {row['perf/train_s']:8.1f} {result['warm_start_s']:13.1f}  "
            f"{os.getloadavg()[0]:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
