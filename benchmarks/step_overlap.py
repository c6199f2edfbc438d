"""The in-process step with the sandbox overlapping generation against the serial order, alternated
in one process (the same config, a fresh run directory each): step seconds, rollout plus the sandbox
wait after it, and CPU seconds (this process and its children: the sandbox's workers).

    python benchmarks/step_overlap.py --config .work/bench-rl-step/train.yaml --pairs 3

The config is a ``gagar train`` config (``benchmarks/rl_step.py`` writes one to
``<work>/train.yaml``); each run is one step of it, its ``run_dir`` replaced per run under ``--work``.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from gagar import rl_step
from gagar.schema.task import Task
from gagar.schema.trajectory import Trajectory
from gagar.train.config import TrainConfig
from gagar.train.trainer import Trainer

OVERLAPPED = rl_step.evaluate_while_generating


def serial(
    tasks: list[Task], trajectories: Any, sandbox: Any, timings: dict[str, float]
) -> rl_step.GeneratedBatch:
    """The order before the overlap: generate the whole batch, then evaluate it."""
    with rl_step.timed(timings, "perf/rollout_s"):
        generated: list[Trajectory] = list(trajectories)
    with rl_step.timed(timings, "perf/sandbox_s"):
        return rl_step.generation_batch(generated, rl_step.evaluate(tasks, generated, sandbox))


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="a gagar train config (runs one step)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(".work/bench-step-overlap"))
    args = parser.parse_args()
    base = yaml.safe_load(args.config.read_text())
    rows: dict[str, list[tuple[float, float]]] = {"overlap": [], "serial": []}
    for i in range(2 * args.pairs):
        mode = "overlap" if i % 2 == 0 else "serial"
        rl_step.evaluate_while_generating = OVERLAPPED if mode == "overlap" else serial  # type: ignore[assignment]
        run = args.work / f"{i}-{mode}"
        shutil.rmtree(run, ignore_errors=True)
        cpu = _cpu()
        m = Trainer(TrainConfig(**{**base, "run_dir": str(run), "steps": 1}), progress=False).run()[-1]
        cpu = _cpu() - cpu
        generation = m["perf/rollout_s"] + m["perf/sandbox_s"]
        rows[mode].append((m["perf/step_s"], generation))
        print(
            f"{mode:8} step {m['perf/step_s']:5.1f} s  rollout + sandbox wait {generation:5.1f} s  "
            f"cpu {cpu:5.1f} s  load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    median = {mode: sorted(r)[len(r) // 2] for mode, r in rows.items()}
    print(
        f"median step: overlap {median['overlap'][0]:.1f} s, serial {median['serial'][0]:.1f} s "
        f"(ratio {median['overlap'][0] / median['serial'][0]:.2f})"
    )


if __name__ == "__main__":
    main()
