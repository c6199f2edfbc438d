"""One RL step of the embedded default, by stage, against the step's floor measured in the same run.

The step (16 tasks x 8 samples by default, one generation batch, every mixed group trained on) runs
three times: as ``gagar train`` (the in-process loop, in a process of its own) and as ``gagar run``
(the kfp.local pipeline: one process per task), with warm stages (each stage function in a fork of
one pre-imported interpreter, the default) and cold (each in its task's own process). The step is
what a run pays every step. In process ``gagar train``'s loop runs two steps and the second is
measured, from the first step's metrics line to its own (loading the step's policy, its checkpoint,
its metrics line and plot included); what a run pays once is reported beside it, not in it: the
process's start-up (the interpreter, the torch and transformers imports, the config, the trainer),
the first step's extra (its first calls warm up the engine and the sandbox's forkserver) and exit.
Through kfp.local the step is the pipeline's one-step wall time, after the warm stages' server
start (once a run). The floor is taken on the measured in-process step's trajectories and policy.
Then its floor, in this process, on what the in-process step produced:

- generation: the same prompts through the same engine in the same calls with the same sampling
  seeds (so the same tokens), nothing around them (no prompt building, parsing, records or sandbox
  running beside them);
- tests: bare ``python -m pytest -q`` (the sandbox's interpreter, plugin autoload off) on a fresh
  copy of each trajectory's repository with its patch and the task's test patch applied (the copies
  written before the clock starts), with as many at once as the sandbox runs: no pristine reset,
  report plugin, isolation or verdict. Beside it the tests' tight floor: the same runs forked from
  one interpreter that imported pytest once (the sandbox's forkserver without the sandbox), which
  the step's ratio is also given against;
- update: the same PPO-clip forward/backward/optimizer steps on the same trajectories and
  advantages, the model already loaded, nothing written.

Printed: each stage's seconds and rate (rollout tokens/s, sandbox evaluations/s, grading, update
tokens/s, I/O and start-up: the rest of the step's time; in process the sandbox evaluates each engine
call's answers while the next is sampled, so its row is the wait after generation ended and its
rate is over its busy time) beside its floor, the ratio step / floor for
both runners, and kfp.local's orchestration share (wall time outside the stage functions). The
machine's load average is printed beside the figures; compare ratios, not seconds, across machines.

    python benchmarks/rl_step.py [--tasks 16] [--group-size 8] [--max-new-tokens 128] [--json out.json]

Without ``--policy``/``--rl-tasks`` the embedded default is prepared under ``--work`` (the shipped
pre-RL policy and 48 verified tasks, reused on later runs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gagar.records import read_records
from gagar.rl_step import tasks_per_call
from gagar.schema.batch import BatchEntry
from gagar.schema.result import TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import Trajectory

STAGES = ("rollout", "sandbox", "grade", "redistribute", "train")


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def _cpu_s() -> float:
    """CPU seconds of this process and of its children waited for so far (less load-bound than wall)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def step_config(
    args: argparse.Namespace, run_dir: Path, policy: Path, tasks: Path, steps: int = 1
) -> dict[str, Any]:
    """The ``gagar train`` settings of the measured step (one generation batch a step)."""
    return {
        "run_dir": str(run_dir),
        "tasks": str(tasks),
        "policy": str(policy),
        "steps": steps,
        "seed": args.seed,
        "keep_step_artifacts": True,
        "rollout": {
            "group_size": args.group_size,
            "gen_batch_groups": args.tasks,
            "train_batch_groups": args.tasks,
            "max_gen_batches": 1,
            "max_new_tokens": args.max_new_tokens,
        },
        "sandbox": {"backend": "local", "workers": args.workers},
        "grader": {"kind": "heuristic"},
        "advantage": {"algo": "gagar"},
        "optim": {"minibatch_size": args.minibatch_size},
    }


# ``gagar train``'s own loop in a process of its own, timestamping when the trainer is ready and
# when each step's metrics line and plot are written (perf_counter is CLOCK_MONOTONIC: system-wide).
_TRAIN_DRIVER = """
import json, sys, time
from gagar.train.config import load_config
from gagar.train.trainer import Trainer
trainer = Trainer(load_config(sys.argv[1]), progress=False)
ready, ends = time.perf_counter(), []
trainer.run(on_step=lambda metrics: ends.append(time.perf_counter()))
print(json.dumps({"ready": ready, "ends": ends, "policy": str(trainer.policy_for(len(ends) - 1))}))
"""


def run_in_process(args: argparse.Namespace, work: Path, policy: Path, tasks: Path) -> dict[str, Any]:
    """``gagar train``'s loop for two steps in a process of its own. The measured step is the second,
    from the first step's metrics line to its own (its metrics line and plot included): what every
    step of a run but the first costs. Beside it the first step (its first calls warm up the engine
    and the sandbox's forkserver), the process's start-up up to the trainer being ready and its
    exit; the second step's metrics, artifacts and the policy it sampled from."""
    run_dir = work / "train"
    config = work / "train.yaml"
    config.write_text(yaml.safe_dump(step_config(args, run_dir, policy, tasks, steps=2)))
    start, cpu = time.perf_counter(), _cpu_s()
    done = subprocess.run(
        [sys.executable, "-c", _TRAIN_DRIVER, str(config)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "TQDM_DISABLE": "1"},
    )
    end, cpu = time.perf_counter(), _cpu_s() - cpu
    timing = json.loads(done.stdout.splitlines()[-1])
    ready, (first, second) = timing["ready"], timing["ends"]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    return {
        "step_s": second - first,
        "first_step_s": first - ready,
        "startup_s": ready - start,
        "exit_s": end - second,
        "process_s": end - start,
        "cpu_s": cpu,
        "metrics": metrics,
        "step_dir": run_dir / "steps" / "step-000001",
        "policy": Path(timing["policy"]),
    }


def run_kfp(args: argparse.Namespace, work: Path, policy: Path, tasks: Path, warm: bool) -> dict[str, Any]:
    """``gagar run`` for one step through kfp.local, same settings, with warm stages (the default:
    each stage function in a fork of a pre-imported interpreter) or cold (each task's own process,
    as in a cluster); wall time and stage seconds."""
    from gagar.pipeline.local import run_local
    from gagar.pipeline.parameters import parameters_from_config
    from gagar.train.config import TrainConfig

    out = work / ("kfp" if warm else "kfp-cold")
    config = TrainConfig.from_values(step_config(args, out / "train", policy.resolve(), tasks.resolve()))
    arguments = {**parameters_from_config(config), "storage": str(out / "store")}  # the same settings
    log_path = out.with_suffix(".log")
    log_path.unlink(missing_ok=True)
    result = run_local(arguments, out=out, steps=1, max_gen_batches=1, warm=warm, log_file=log_path)
    now = time.localtime()
    walls = task_walls(log_path, now.tm_hour * 3600 + now.tm_min * 60 + now.tm_sec)
    return {
        "wall_s": result.wall_s,
        "metrics": result.steps[-1],
        "overhead_share": result.overhead_share,
        "warm_start_s": result.warm_start_s,
        "task_walls_s": walls,
    }


_TASK_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) - INFO - Executing task \W*\[\d+m'([\w-]+)'")


def task_walls(log: Path, end_s: float) -> dict[str, float]:
    """Wall seconds of each kfp.local task, from the runner's "Executing task" lines (the last task
    ends at ``end_s``, seconds since midnight)."""
    starts = []
    for line in log.read_text(errors="replace").splitlines():
        if m := _TASK_LINE.match(line):
            h, mi, sec, name = m.groups()
            starts.append((name, int(h) * 3600 + int(mi) * 60 + float(sec)))
    ends = [t for _, t in starts[1:]] + [end_s]
    walls: dict[str, float] = {}
    for (name, start), end in zip(starts, ends, strict=True):
        stage = re.sub(r"-\d+$", "", name)  # rollout-2: the same stage in a later step or batch
        walls[stage] = walls.get(stage, 0.0) + end - start
    return walls


def import_seconds(statement: str, runs: int = 3) -> float:
    """Fastest wall seconds of a fresh interpreter running ``statement`` (what a kfp.local task pays)."""
    best = float("inf")
    env = {**os.environ, "_KFP_RUNTIME": "true"}
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True, env=env)
        best = min(best, time.perf_counter() - start)
    return best


def generation_floor(policy: Path, trajectories: list[Trajectory]) -> dict[str, float]:
    """The same prompts, engine and sampling seed in one ``generate`` call; tokens and seconds."""
    from gagar.policy.generation import HFBackend
    from gagar.policy.model import load_policy

    model, tokenizer = load_policy(policy)
    backend = HFBackend(model, tokenizer)
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    prompts = [g[0].prompt_token_ids for g in groups.values()]
    params, n = trajectories[0].sampling, len(next(iter(groups.values())))
    per_call = tasks_per_call(backend, n) or len(prompts)  # as the rollout hands them to the engine
    assert params.seed is not None
    calls = [
        (prompts[first : first + per_call], params.model_copy(update={"seed": params.seed + c}))
        for c, first in enumerate(range(0, len(prompts), per_call))
    ]
    start, cpu = time.perf_counter(), _cpu_s()
    samples = [row for chunk, seeded in calls for row in backend.generate(chunk, seeded, n)]
    seconds, cpu = time.perf_counter() - start, _cpu_s() - cpu
    tokens = sum(len(s.token_ids) for row in samples for s in row)
    same = [s.token_ids for row in samples for s in row] == [t.response_token_ids for t in trajectories]
    return {"tokens": float(tokens), "seconds": seconds, "cpu_s": cpu, "same_tokens": float(same)}


def _patched_copy(task: Task, patch: str, root: Path) -> Path | None:
    """A copy of the task's repository under ``root`` with ``patch`` and the test patch applied;
    None when a patch does not apply (the judge refuses it without running tests either)."""
    from gagar.sandbox.patch import PatchError, apply_patch
    from gagar.sandbox.workspace import materialize

    repo = Path(tempfile.mkdtemp(prefix="repo-", dir=root))
    materialize(task, repo, None)
    try:
        if patch.strip():
            apply_patch(repo, patch, 1 << 22)
        if task.test_patch.strip():
            apply_patch(repo, task.test_patch, 1 << 22)
    except PatchError:
        return None
    return repo


def _bare_pytest(repo: Path, python: str) -> int:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    return subprocess.run(argv, cwd=repo, env=env, capture_output=True, check=False).returncode


WARM_PYTEST = """
import os, sys, time
import pytest
from _pytest.config import default_plugins
for name in default_plugins:
    try:
        __import__(f"_pytest.{name}")
    except ImportError:
        pass
repos, workers = sys.argv[2:], int(sys.argv[1])
null = os.open(os.devnull, os.O_WRONLY)
start, running = time.perf_counter(), set()
for repo in repos:
    if len(running) >= workers:
        running.discard(os.wait()[0])
    pid = os.fork()
    if pid == 0:
        os.chdir(repo)
        os.dup2(null, 1)
        os.dup2(null, 2)
        sys.path.insert(0, repo)
        os._exit(pytest.main(["-q", "-p", "no:cacheprovider"]) & 0xFF)
    running.add(pid)
while running:
    running.discard(os.wait()[0])
print(time.perf_counter() - start)
"""
"""The tests' tight floor: pytest imported once, then one forked child per run, ``workers`` at once
(what the sandbox's forkserver does, without isolation, pristine reset, report plugin or verdict)."""


def tests_floor(tasks: list[Task], trajectories: list[Trajectory], workers: int) -> dict[str, float]:
    """Bare pytest on each trajectory's patched repository, ``workers`` at a time; runs and seconds.

    The copies are written first and not timed: only the pytest runs are the floor (the sandbox's
    own time includes writing its workspaces).
    """
    from gagar.sandbox.local import LocalSandboxSettings
    from gagar.scratch import scratch_root

    by_id = {t.instance_id: t for t in tasks}
    python = LocalSandboxSettings().python
    with tempfile.TemporaryDirectory(prefix="gagar-bench-", dir=scratch_root()) as tmp:
        repos = [_patched_copy(by_id[t.instance_id], t.model_patch, Path(tmp)) for t in trajectories]
        runnable = [r for r in repos if r is not None]
        start = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda repo: _bare_pytest(repo, python), runnable))
        seconds = time.perf_counter() - start
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "PYTHONDONTWRITEBYTECODE": "1"}
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        cpu = _cpu_s()
        warm = subprocess.run(
            [python, "-c", WARM_PYTEST, str(workers), *map(str, runnable)],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        cpu = _cpu_s() - cpu  # the helper's start and pytest import included: a slight overcount
    return {
        "evaluations": float(len(runnable)),
        "seconds": seconds,
        "warm_seconds": float(warm.stdout),
        "warm_cpu_s": cpu,
    }


def update_floor(
    policy: Path, trajectories: list[Trajectory], batch: list[BatchEntry], minibatch: int
) -> dict:
    """The update's forward/backward/optimizer steps on the same batch, the model already loaded."""
    from gagar.policy.model import load_policy
    from gagar.train.update import OptimConfig, make_optimizer, update_policy

    model, tokenizer = load_policy(policy)
    config = OptimConfig(minibatch_size=minibatch)
    optimizer = make_optimizer(model, config)
    by_id = {t.trajectory_id: t for t in trajectories}
    chosen = [by_id[e.trajectory_id] for e in batch]
    advantages = np.array([e.advantage for e in batch])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    start, cpu = time.perf_counter(), _cpu_s()
    update_policy(model, optimizer, chosen, advantages, config, pad, rng=np.random.default_rng([0, 0]))
    seconds, cpu = time.perf_counter() - start, _cpu_s() - cpu
    return {"tokens": float(sum(sum(t.loss_mask) for t in chosen)), "seconds": seconds, "cpu_s": cpu}


def breakdown(metrics: dict[str, float], wall: float) -> dict[str, float]:
    """Seconds of each stage function, and the rest of the step's time (I/O, start-up, orchestration)."""
    stages = {name: float(metrics.get(f"perf/{name}_s", 0.0)) for name in STAGES}
    stages["io_and_startup"] = wall - sum(stages.values())
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, help="pre-RL policy (default: the embedded default's)")
    parser.add_argument("--rl-tasks", type=Path, help="RL tasks JSONL (default: the embedded default's)")
    parser.add_argument("--work", type=Path, default=Path(".work/bench-rl-step"), help="scratch folder")
    parser.add_argument("--tasks", type=int, default=16, help="tasks in the generation batch")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--minibatch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="sandbox slots (floor too)")
    parser.add_argument("--skip-kfp", action="store_true", help="measure the in-process step only")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.policy is None or args.rl_tasks is None:
        from gagar.embedded import prepare

        embedded = prepare(work / "embedded", progress=False)
        args.policy = args.policy or embedded.policy
        args.rl_tasks = args.rl_tasks or embedded.rl_tasks
    args.policy, args.rl_tasks = args.policy.resolve(), args.rl_tasks.resolve()
    for sub in ("train", "kfp", "kfp-cold"):
        subprocess.run(["rm", "-rf", str(work / sub)], check=True)

    report: dict[str, Any] = {"load_before": _load(), "settings": vars(args) | {"cores": os.cpu_count()}}
    inproc = run_in_process(args, work, args.policy, args.rl_tasks)
    report["load_after_train"] = _load()
    step_dir = inproc["step_dir"]
    trajectories = read_records(step_dir / "trajectories-0.jsonl", Trajectory)
    results = read_records(step_dir / "results-0.jsonl", TestResult)
    batch = read_records(step_dir / "batch.jsonl", BatchEntry)
    tasks = read_records(args.rl_tasks, Task)

    gen = generation_floor(inproc["policy"], trajectories)
    tests = tests_floor(tasks, trajectories, args.workers)
    update = update_floor(inproc["policy"], trajectories, batch, args.minibatch_size)
    floor_s = gen["seconds"] + tests["seconds"] + update["seconds"]
    tight_s = gen["seconds"] + tests["warm_seconds"] + update["seconds"]
    tight_cpu_s = gen["cpu_s"] + tests["warm_cpu_s"] + update["cpu_s"]
    report["load_after_floor"] = _load()

    m = inproc["metrics"]
    tokens = sum(t.n_response_tokens for t in trajectories)
    stages = breakdown(m, inproc["step_s"])
    report["in_process"] = {
        **{key: inproc[key] for key in ("step_s", "first_step_s", "startup_s", "exit_s", "process_s")},
        "stages_s": stages,
        "rollout_tokens_per_s": tokens / stages["rollout"],
        "sandbox_evaluations_per_s": len(results) / m.get("perf/sandbox_busy_s", stages["sandbox"]),
        "sandbox_busy_s": m.get("perf/sandbox_busy_s"),
        "update_tokens_per_s": update["tokens"] / stages["train"] if stages["train"] else 0.0,
        "step_over_floor": inproc["step_s"] / floor_s,
        "step_over_tight_floor": inproc["step_s"] / tight_s,
        "cpu_s": inproc["cpu_s"],
        "cpu_over_tight_floor_cpu": inproc["cpu_s"] / tight_cpu_s,
        "torch_threads": os.environ.get("OMP_NUM_THREADS", "torch's default"),
        "resolved_rate": m.get("rollout/resolved_rate"),
        "trajectories": len(trajectories),
        "trained_on": len(batch),
    }
    report["floor"] = {
        "seconds": floor_s,
        "tight_seconds": tight_s,
        "tight_cpu_s": tight_cpu_s,
        "generation": gen | {"tokens_per_s": gen["tokens"] / gen["seconds"]},
        "tests": tests
        | {
            "evaluations_per_s": tests["evaluations"] / tests["seconds"],
            "warm_evaluations_per_s": tests["evaluations"] / tests["warm_seconds"],
        },
        "update": update | {"tokens_per_s": update["tokens"] / update["seconds"]},
    }
    if not args.skip_kfp:
        for key, warm in (("kfp_local", True), ("kfp_local_cold", False)):
            kfp = run_kfp(args, work, args.policy, args.rl_tasks, warm)
            report["load_after_kfp"] = _load()
            report[key] = {
                "wall_s": kfp["wall_s"],
                "stages_s": breakdown(kfp["metrics"], kfp["wall_s"]),
                "orchestration_share": kfp["overhead_share"],
                "step_over_floor": kfp["wall_s"] / floor_s,
                "step_over_tight_floor": kfp["wall_s"] / tight_s,
                "task_walls_s": kfp["task_walls_s"],
                "warm_start_s": kfp["warm_start_s"],
            }
        report["kfp_local"]["startup_probe_s"] = {
            "python + kfp executor": import_seconds("import kfp.dsl.executor_main"),
            "+ gagar.pipeline.store_stages": import_seconds(
                "import kfp.dsl.executor_main, gagar.pipeline.store_stages"
            ),
            "+ torch, transformers (a cold rollout or train)": import_seconds(
                "import kfp.dsl.executor_main, gagar.pipeline.store_stages, torch, transformers"
            ),
        }
    print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")


def print_report(r: dict[str, Any]) -> None:
    s, f, ip = r["settings"], r["floor"], r["in_process"]
    print(f"RL step: {s['tasks']} tasks x {s['group_size']} samples on {s['cores']} cores")
    print(f"{'stage':16} {'gagar train':>12} {'gagar run':>12} {'floor':>9}   rates (step / floor)")
    kfp = r.get("kfp_local", {}).get("stages_s", {})
    floors = {
        "rollout": f["generation"]["seconds"],
        "sandbox": f["tests"]["seconds"],
        "train": f["update"]["seconds"],
    }
    rates = {
        "rollout": f"{ip['rollout_tokens_per_s']:.0f} / {f['generation']['tokens_per_s']:.0f} tokens/s",
        "sandbox": f"{ip['sandbox_evaluations_per_s']:.2f} / {f['tests']['evaluations_per_s']:.2f} evals/s "
        f"(busy {ip['sandbox_busy_s'] or 0:.1f} s, overlapping generation) "
        f"(tight floor {f['tests']['warm_evaluations_per_s']:.2f}: {f['tests']['warm_seconds']:.1f} s)",
        "train": f"{ip['update_tokens_per_s']:.0f} / {f['update']['tokens_per_s']:.0f} tokens/s",
    }
    for name in (*STAGES, "io_and_startup"):
        floor = floors.get(name)
        kfp_s = f"{kfp[name]:12.1f}" if name in kfp else f"{'-':>12}"
        floor_s = f"{floor:9.1f}" if floor is not None else f"{'-':>9}"
        print(f"{name:16} {ip['stages_s'][name]:12.1f} {kfp_s} {floor_s}   {rates.get(name, '')}")
    total_kfp = f"{r['kfp_local']['wall_s']:12.1f}" if "kfp_local" in r else f"{'-':>12}"
    print(f"{'step':16} {ip['step_s']:12.1f} {total_kfp} {f['seconds']:9.1f}")
    same = "same tokens" if f["generation"]["same_tokens"] else "NOT the same tokens"
    gen, runs = f["generation"]["tokens"], f["tests"]["evaluations"]
    print(f"floor generation: {gen:.0f} tokens ({same}); tests: {runs:.0f} bare pytest runs")
    ratio, tight, step = ip["step_over_floor"], ip["step_over_tight_floor"], ip["step_s"]
    print(
        f"gagar train: step / floor = {ratio:.2f} (target <= 2; {tight:.2f} against the tight floor, "
        f"{f['tight_seconds']:.1f} s), step {step:.1f} s (target <= 15), torch threads {ip['torch_threads']}"
    )
    print(
        f"  once a run: start-up {ip['startup_s']:.1f} s (interpreter, imports, config, trainer), first step "
        f"{ip['first_step_s']:.1f} s (its first calls warm up), exit {ip['exit_s']:.1f} s; the two-step "
        f"process {ip['process_s']:.1f} s"
    )
    print(
        f"CPU seconds (less load-bound): the two-step process {ip['cpu_s']:.1f}, tight floor of one step "
        f"{f['tight_cpu_s']:.1f}: ratio {ip['cpu_over_tight_floor_cpu']:.2f}"
    )
    for key, label in (("kfp_local", "warm stages, the default"), ("kfp_local_cold", "cold stages")):
        if key not in r:
            continue
        k = r[key]
        started = f", after {k['warm_start_s']:.1f} s starting the warm stages (once a run)"
        print(
            f"gagar run (kfp.local, {label}): step {k['wall_s']:.1f} s, step / floor = "
            f"{k['step_over_floor']:.2f} ({k['step_over_tight_floor']:.2f} tight), "
            f"orchestration {k['orchestration_share']:.0%} of the step (target <= 10%)"
            + (started if k["warm_start_s"] else "")
        )
        own = {name: k["stages_s"].get(name, 0.0) for name in k["task_walls_s"]}
        tasks = ", ".join(f"{n} {w:.1f} s ({w - own[n]:.1f} outside)" for n, w in k["task_walls_s"].items())
        print(f"  tasks: {tasks}")
    if "kfp_local" in r:
        probe = ", ".join(f"{n} {v:.2f} s" for n, v in r["kfp_local"]["startup_probe_s"].items())
        print(f"a task's start-up: {probe}")
    print(f"load average: before {r['load_before']}, after {r.get('load_after_kfp', r['load_after_floor'])}")


if __name__ == "__main__":
    main()
