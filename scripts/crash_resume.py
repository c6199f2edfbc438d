"""kill -9 a real `gagar train` run at random points, resume it each time, check nothing was lost.

``python -m gagar train --config CFG`` (``--resume`` after each kill) runs on 3 generated tasks and
a tiny SFT policy, with the local bubblewrap sandbox. Each attempt runs in a session of its own and
the whole process group is SIGKILLed; every process the attempt had started must be gone within
seconds (no orphan sandbox). The checks: the run completes; metrics.jsonl holds one line per step
0..N-1 in order; every checkpoint kept verifies and they are the last ``keep_checkpoints`` steps; no
partial directory is left. An uninterrupted reference run (skip it with ``--no-reference``) times the
kills and tells whether the killed run reproduced it (same rollouts, sandbox results, metrics and
final weights); that is reported, and required only with ``--require-reproducible``.

Prints a JSON summary and exits 1 if a check fails.

    python scripts/crash_resume.py --steps 6 --kills 5 --work .work/crash-resume-train
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from gagar.train.checkpoint import (
    CheckpointManager,
    CorruptCheckpointError,
    MetricsLog,
    verify,
)

KEEP_CHECKPOINTS = 3
STARTUP_S, STEP_S = 8.0, 15.0
"""Kill timing without a reference run: process start and one tiny step on a loaded 2-core CPU."""
PROCESS_GONE_S = 3.0
"""How long every process of a killed attempt may take to disappear before it counts as an orphan."""
VOLATILE = ("perf/", "policy", "sandbox/duration_s_mean", "grader/duration_s")
"""Metric keys that differ between two runs of the same steps (timings, the run directory)."""


def prepare_train(work: Path, steps: int, seed: int) -> None:
    """3 generated tasks, a tiny SFT policy, and ``run.yaml`` / ``reference.yaml`` under ``work``."""
    import yaml

    from gagar.policy.sft import SFTConfig, train_sft
    from gagar.tasks.generate import generate_tasks
    from gagar.tasks.loaders import write_tasks

    tasks = generate_tasks(3, seed=11)
    write_tasks(work / "tasks.jsonl", tasks)
    sft = SFTConfig(
        vocab_size=600,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        steps=3,
        batch_size=2,
        warmup_steps=1,
        checkpoint_every=3,
        noise_share=0.0,
        max_prompt_tokens=768,
    )
    train_sft(tasks, work / "policy", sft, progress=False)
    for name in ("run", "reference"):
        config = {
            "run_dir": name,
            "tasks": "tasks.jsonl",
            "policy": "policy",
            "steps": steps,
            "seed": seed,
            "keep_checkpoints": KEEP_CHECKPOINTS,
            "rollout": {
                "group_size": 2,
                "gen_batch_groups": 2,
                "train_batch_groups": 2,
                "max_gen_batches": 2,
                "max_new_tokens": 24,
            },
            "sandbox": {"workers": 2},
            "optim": {"lr": 1e-3, "minibatch_size": 4},
        }
        (work / f"{name}.yaml").write_text(yaml.safe_dump(config))


def _launch(work: Path, name: str, sandbox_root: Path, resume: bool) -> subprocess.Popen:
    """``gagar train --config <name>.yaml [--resume]`` in a session (and process group) of its own."""
    cmd = [sys.executable, "-m", "gagar", "train", "--config", str(work / f"{name}.yaml")]
    # the sandbox workspaces go under TMPDIR, in the run's own folder
    env = {**os.environ, "TMPDIR": str(sandbox_root), "TQDM_DISABLE": "1"}
    with open(work / f"{name}.log", "ab") as log:
        return subprocess.Popen(
            cmd + ["--resume"] * resume, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time in clock ticks) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0].decode(), fields[19].decode()


def _descendants(root: int) -> dict[int, str]:
    """Every live descendant of ``root`` (pid → start time, so that a reused pid is not mistaken)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _proc_stat(int(name))) is not None:
            children.setdefault(stat[0], []).append((int(name), stat[2]))
    found, todo = {}, [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            found[pid] = start
            todo.append(pid)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


def _mentioning(text: str) -> dict[int, str]:
    """Live processes whose command line contains ``text`` (a sandbox's bwrap names its workspace)."""
    found = {}
    for name in os.listdir("/proc"):
        pid = int(name) if name.isdigit() else os.getpid()
        if pid != os.getpid() and text in _cmdline(pid) and (stat := _proc_stat(pid)) is not None:
            found[pid] = stat[2]
    return found


def _survivors(pids: dict[int, str]) -> dict[int, str]:
    """Those of ``pids`` still running (zombies hold nothing and are not counted)."""
    alive = {}
    for pid, start in pids.items():
        stat = _proc_stat(pid)
        if stat is not None and stat[2] == start and stat[1] not in ("Z", "X"):
            alive[pid] = start
    return alive


def kill_session(proc: subprocess.Popen, sandbox_root: Path) -> list[str]:
    """SIGKILL the attempt's process group; returns the command lines of processes that outlived it.

    The sandboxes run in sessions of their own (bubblewrap with ``--die-with-parent``), outside the
    group: every descendant seen just before the kill, and anything naming ``sandbox_root``, must be
    gone within ``PROCESS_GONE_S``. Survivors are reported, then killed so that none outlives this script.
    """
    tree = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + PROCESS_GONE_S
    while True:
        left = _survivors(tree) | _mentioning(str(sandbox_root))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    orphans = [f"{pid}: {_cmdline(pid)}" for pid in left]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return orphans


def _phase(run_dir: Path, logged_at_launch: int, launched_at: float) -> str:
    """Where a killed attempt was, from what it left on disk (the trainer writes every file atomically).

    ``launched_at`` (``time.time()``) tells this attempt's step directory from one a killed attempt left.
    """
    ckpt_dir = run_dir / "checkpoints"
    logged = [r["step"] for r in MetricsLog(run_dir / "metrics.jsonl").read()]
    checkpointed = [c.step for c in CheckpointManager(ckpt_dir, keep_last=None).checkpoints()]
    names = [p.name for p in ckpt_dir.iterdir()] if ckpt_dir.exists() else []
    if any(n.startswith(".tmp-step-") for n in names):
        return "checkpoint write"
    if any(n.startswith(".old-step-") for n in names):
        return "checkpoint prune"
    if max(checkpointed, default=-1) > max(logged, default=-1):
        return "after the checkpoint, before the metrics line"
    step_dir = run_dir / "steps" / f"step-{len(logged):06d}"
    if not step_dir.exists() or step_dir.stat().st_mtime < launched_at:
        return "publish (plot) after a step" if len(logged) > logged_at_launch else "start-up"
    files = {p.name for p in step_dir.iterdir()}
    if "batch.jsonl" in files:
        return "update"
    if "grades.jsonl" in files or "workspace" in files:
        return "grade / redistribute"
    rolled, tested = (sum(n.startswith(f"{k}-") for n in files) for k in ("trajectories", "results"))
    return "sandbox" if rolled > tested else "rollout"


def _kill_train_at_random(
    proc: subprocess.Popen,
    run_dir: Path,
    started: int,
    steps: int,
    kills_left: int,
    timing: tuple[float, float],
    rng: random.Random,
) -> dict:
    """SIGKILL the attempt that began at step ``started`` after a random delay.

    The delay is drawn from [0, startup + 2 × share × step] seconds after launch, and the kill comes at
    once when the checkpoint of the share's last step appears, whichever is first.
    """
    startup_s, step_s = timing
    share = max(1, (steps - started) // (kills_left + 1))
    last = run_dir / "checkpoints" / f"step-{started + share - 1:06d}"
    logged, launched_at = len(MetricsLog(run_dir / "metrics.jsonl").read()), time.time()
    launched = time.monotonic()
    deadline = launched + rng.uniform(0.0, startup_s + 2 * share * step_s)
    while time.monotonic() < deadline and not last.exists() and proc.poll() is None:
        time.sleep(0.005)
    point = {"resumed_at_step": started, "delay_s": round(time.monotonic() - launched, 2)}
    if proc.poll() is not None:
        return point | {"ended_before_kill_rc": proc.returncode}
    return point | {
        "orphans": kill_session(proc, run_dir.parent / "sandbox"),
        "phase": _phase(run_dir, logged, launched_at),
    }


def _next_step(run_dir: Path) -> int:
    latest = CheckpointManager(run_dir / "checkpoints", keep_last=None).latest()
    return latest.step + 1 if latest else 0


def _rollouts(run_dir: Path) -> list[tuple]:
    """Per trajectory of every step: id, response token ids, old log-probs and sandbox status."""
    rows = []
    for step_dir in sorted((run_dir / "steps").iterdir()):
        status = {}
        for path in sorted(step_dir.glob("results-*.jsonl")):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                status[record["trajectory_id"]] = record["status"]
        for path in sorted(step_dir.glob("trajectories-*.jsonl")):
            for line in path.read_text().splitlines():
                t = json.loads(line)
                rows.append(
                    (
                        t["trajectory_id"],
                        t["response_token_ids"],
                        t["old_logprobs"],
                        status.get(t["trajectory_id"]),
                    )
                )
    return rows


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _same_as_reference(work: Path, steps: int) -> dict[str, bool]:
    """Whether the killed run reproduced the uninterrupted one, part by part."""
    logs = [MetricsLog(work / d / "metrics.jsonl").read() for d in ("reference", "run")]
    weights = [
        load_file(str(work / d / "checkpoints" / f"step-{steps - 1:06d}" / "model" / "model.safetensors"))
        for d in ("reference", "run")
    ]
    return {
        "rollouts_and_sandbox_results": _rollouts(work / "reference") == _rollouts(work / "run"),
        "metrics_except_timings": _stable(logs[0]) == _stable(logs[1]),
        "final_weights": weights[0].keys() == weights[1].keys()
        and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]),
    }


def crash_resume_train(work: Path, steps: int, kills: int, seed: int, reference: bool) -> dict:
    """Set up, optionally run the reference, then kill-and-resume ``run/``; returns the summary."""
    began = time.monotonic()
    prepare_train(work, steps, seed)
    sandbox_root = work / "sandbox"
    sandbox_root.mkdir()
    sandbox_root.chmod(0o755)  # the sandbox uid must reach its workspace
    timing, run = (STARTUP_S, STEP_S), work / "run"
    if reference:
        t0 = time.monotonic()
        ref = _launch(work, "reference", sandbox_root, resume=False)
        if ref.wait() != 0:
            raise SystemExit(f"the reference run failed (rc {ref.returncode}); see {work / 'reference.log'}")
        step_s = [r["perf/step_s"] for r in MetricsLog(work / "reference" / "metrics.jsonl").read()]
        timing = (max(0.0, time.monotonic() - t0 - sum(step_s)), sum(step_s) / len(step_s))
    rng, kill_points = random.Random(seed), []
    for k in range(kills):
        started = _next_step(run)
        proc = _launch(work, "run", sandbox_root, resume=k > 0)
        kill_points.append(_kill_train_at_random(proc, run, started, steps, kills - k, timing, rng))
    final = _launch(work, "run", sandbox_root, resume=True)
    final.wait()
    checkpoints = CheckpointManager(run / "checkpoints", keep_last=None).checkpoints()
    corrupt = []
    for ckpt in checkpoints:
        try:
            verify(ckpt)
        except CorruptCheckpointError as exc:
            corrupt.append(str(exc))
    log_text = (work / "run.log").read_text(errors="replace")
    return {
        "steps": steps,
        "kills": kills,
        "keep_checkpoints": KEEP_CHECKPOINTS,
        "kill_timing_s": {"startup": round(timing[0], 1), "step": round(timing[1], 1)},
        "kill_points": kill_points,
        "final_rc": final.returncode,
        "logged_steps": [r["step"] for r in MetricsLog(run / "metrics.jsonl").read()],
        "lines_recovered": log_text.count("was checkpointed but not logged"),
        "steps_with_an_update": sum(
            r.get("policy/tokens", 0) > 0 for r in MetricsLog(run / "metrics.jsonl").read()
        ),
        "checkpoint_steps": [c.step for c in checkpoints],
        "corrupt": corrupt,
        "partial_left": sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")),
        "sandbox_workspaces_left": len(list(sandbox_root.glob("gagar-sbx-*"))),
        "same_as_reference": _same_as_reference(work, steps) if reference else None,
        "seconds": round(time.monotonic() - began, 1),
    }


def check_train(summary: dict, require_reproducible: bool) -> list[str]:
    """What the summary shows to be wrong; empty when the run survived every kill."""
    steps, keep = summary["steps"], summary["keep_checkpoints"]
    same = summary["same_as_reference"] or {}
    problems = {
        "an attempt ended before its kill": any("ended_before_kill_rc" in p for p in summary["kill_points"]),
        "a process outlived its killed attempt": any(p.get("orphans") for p in summary["kill_points"]),
        "the resumed run did not finish cleanly": summary["final_rc"] != 0,
        "the metrics log is not one line per step, in order": summary["logged_steps"] != list(range(steps)),
        "the checkpoints kept are not the last keep_checkpoints steps": summary["checkpoint_steps"]
        != list(range(max(0, steps - keep), steps)),
        "a checkpoint is corrupt": bool(summary["corrupt"]),
        "a partial checkpoint was left behind": bool(summary["partial_left"]),
        "the killed run did not reproduce the uninterrupted one": require_reproducible
        and not (same and all(same.values())),
    }
    return [name for name, failed in problems.items() if failed]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path(".work/crash-resume-train"))
    parser.add_argument("--summary", type=Path, help="also write the JSON summary here")
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the uninterrupted run (kills use fixed timing)",
    )
    parser.add_argument(
        "--require-reproducible", action="store_true", help="fail unless the reference is reproduced"
    )
    args = parser.parse_args()
    if args.steps < args.kills + 1:
        raise SystemExit(f"--steps must be at least {args.kills + 1} for {args.kills} kills")
    if args.no_reference and args.require_reproducible:
        raise SystemExit("--require-reproducible needs the reference run: drop --no-reference")
    if args.work.exists() and any(args.work.iterdir()):
        raise SystemExit(f"{args.work} is not empty; give a fresh --work directory")
    args.work.mkdir(parents=True, exist_ok=True)
    work = args.work.resolve()
    summary = crash_resume_train(work, args.steps, args.kills, args.seed, not args.no_reference)
    summary["problems"] = check_train(summary, args.require_reproducible)
    text = json.dumps(summary, indent=1)
    print(text)
    if args.summary:
        args.summary.write_text(text)
    sys.exit(1 if summary["problems"] else 0)


if __name__ == "__main__":
    main()
