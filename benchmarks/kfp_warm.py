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

from gagar.pipeline.local import run_local


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=2, help="pairs of warm and cold runs")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--embedded", type=Path, default=Path(".work/bench-rl-step/embedded"))
    parser.add_argument("--work", type=Path, default=Path(".work/kfp-warm"))
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    widths = {"run": -6, "step s": 8, "orchestration": 14, "rollout s": 10, "train s": 8, "warm start s": 13}
    print(" ".join(f"{name:<{-w}}" if w < 0 else f"{name:>{w}}" for name, w in widths.items()), " load")
    for i in range(2 * args.repeats):
        warm = i % 2 == 0
        out = args.work / f"run{i}"
        arguments = {
            "model": str((args.embedded / "policy").resolve()),
            "tasks": str((args.embedded / "rl-tasks.jsonl").resolve()),
            "storage": str(out / "store"),
            "group_size": args.group_size,
            "train_batch_groups": args.tasks,
            "gen_batch_groups": args.tasks,
            "max_new_tokens": args.max_new_tokens,
            "sandbox_backend": "local",
        }
        with open(args.work / f"run{i}.log", "w") as log:
            saved = os.dup(1), os.dup(2)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                result = run_local(arguments, out=out, steps=1, max_gen_batches=1, warm=warm)
            finally:
                for fd, target in zip(saved, (1, 2), strict=True):
                    os.dup2(fd, target)
                    os.close(fd)
        row = result.steps[-1]
        print(
            f"{'warm' if warm else 'cold':6} {result.wall_s:8.1f} {result.overhead_share:14.1%} "
            f"{row['perf/rollout_s']:10.1f} {row['perf/train_s']:8.1f} {result.warm_start_s:13.1f}  "
            f"{os.getloadavg()[0]:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
