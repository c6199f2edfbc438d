"""kill -9 a real training run at random points, resume it each time, check nothing was lost (issue 6).

A tiny Qwen2 policy is trained with the policy loss of ``gagar.train.loss`` on synthetic rollouts
(random token sequences, a masked tool-output span, advantages seeded by the step), checkpointing
every step. The run is killed with SIGKILL ``--kills`` times at random delays, each time restarted
with ``--resume``; then the script checks that every step has one log line and one checkpoint that
verifies, that no partial checkpoint is left, and that the metrics and final weights are bit-equal to
an uninterrupted reference run. It prints a JSON summary and exits 1 if a check fails.

    python scripts/crash_resume.py --steps 30 --kills 5 --work .work/crash-resume
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.utils.logging import disable_progress_bar

from gagar.train.checkpoint import (
    CheckpointManager,
    CorruptCheckpointError,
    MetricsLog,
    resume_latest,
    verify,
)
from gagar.train.loss import pack_sequences, pad_rows, policy_loss, response_logprobs

VOCAB, BATCH, MINIBATCH, EPOCHS = 256, 8, 4, 2


def synthetic_rollouts(step: int, seed: int) -> dict:
    """Prompts, responses, loss masks (a tool-output span masked) and advantages, fixed by (seed, step)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    prompts, responses, masks = [], [], []
    for _ in range(BATCH):
        plen = int(torch.randint(2, 7, (1,), generator=gen))
        rlen = int(torch.randint(4, 13, (1,), generator=gen))
        prompts.append(torch.randint(1, VOCAB, (plen,), generator=gen).tolist())
        responses.append(torch.randint(1, VOCAB, (rlen,), generator=gen).tolist())
        tool = torch.randint(1, rlen - 2, (1,), generator=gen).item()  # tool output: 2 tokens from here
        masks.append([0 if tool <= t < tool + 2 else 1 for t in range(rlen)])
    return {
        "prompts": prompts,
        "responses": responses,
        "masks": masks,
        "advantages": torch.randn(BATCH, generator=gen),
    }


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> dict[str, float]:
    """On-policy old log-probs, then EPOCHS passes over shuffled minibatches (torch's global RNG)."""
    packed = pack_sequences(batch["prompts"], batch["responses"], pad_id=0)
    args = (packed.input_ids, packed.attention_mask, packed.response_start, packed.response_len)
    mask = pad_rows(batch["masks"], packed.response_len, 0, torch.bool)
    with torch.no_grad():
        old = response_logprobs(model, *args)
    totals: dict[str, float] = {}
    for _ in range(EPOCHS):
        for idx in torch.randperm(BATCH).split(MINIBATCH):
            logprobs = response_logprobs(model, *(a[idx] for a in args[:3]), packed.response_len)
            loss, metrics = policy_loss(logprobs, old[idx], batch["advantages"][idx], mask[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value / (EPOCHS * BATCH // MINIBATCH)
    return totals


def train(
    run_dir: Path, steps: int, seed: int, resume: bool, on_start: Callable[[int], None] | None = None
) -> None:
    """The checkpoint-friendly loop: resume or start, then per step: train, log the step, checkpoint it.

    ``on_start`` is called with the last completed step (0 for a fresh run) before the first step.
    """
    torch.set_num_threads(1)
    disable_progress_bar()
    random.seed(seed)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    )
    model = Qwen2ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    manager, metrics_log = (
        CheckpointManager(run_dir / "checkpoints", keep_last=None),
        MetricsLog(run_dir / "metrics.jsonl"),
    )
    if not resume and manager.checkpoints():
        raise SystemExit(f"{run_dir} already has checkpoints; pass --resume")
    loaded = resume_latest(manager, model, optimizer, metrics_log=metrics_log) if resume else None
    start = loaded.step if loaded else 0
    if on_start is not None:
        on_start(start)
    for step in range(start + 1, steps + 1):
        metrics = train_step(model, optimizer, synthetic_rollouts(step, seed))
        metrics_log.append(step, metrics)  # before the checkpoint: a resume truncates redone steps
        manager.save(step, model, optimizer, extra_state={"seed": seed})


def _steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _child(run_dir: Path, steps: int, seed: int, resume: bool) -> subprocess.Popen:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--run-dir",
        str(run_dir),
        "--steps",
        str(steps),
        "--seed",
        str(seed),
    ]
    with open(run_dir.parent / "child-stderr.log", "ab") as stderr:
        return subprocess.Popen(cmd + ["--resume"] * resume, stdout=subprocess.PIPE, stderr=stderr, text=True)


def _kill_at_random(
    proc: subprocess.Popen, run_dir: Path, steps: int, kills_left: int, step_s: float, rng: random.Random
) -> dict:
    """SIGKILL after a random delay, bounded so that the later kills still find steps left to do.

    The child prints ``started N`` once resumed; it is killed after a delay drawn from
    [0, 2 × share × step_s], or at once when the checkpoint of step N + share appears, whichever is
    first, where share is an even split of the remaining steps among the kills left and the final run.
    """
    started = int(proc.stdout.readline().split()[1])
    share = max(1, (steps - started) // (kills_left + 1))
    deadline = time.monotonic() + rng.uniform(0.0, 2 * share * step_s)
    while (
        time.monotonic() < deadline
        and not (run_dir / "checkpoints" / f"step-{started + share:06d}").exists()
        and proc.poll() is None
    ):
        time.sleep(0.002)
    if proc.poll() is not None:
        raise SystemExit(f"the run ended (rc {proc.returncode}) before the kill; see child-stderr.log")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    partial = any(p.name.startswith(".") for p in (run_dir / "checkpoints").iterdir())
    return {
        "resumed_from": started,
        "steps_logged": _steps_logged(run_dir),
        "partial_checkpoint_present": partial,
    }


def crash_resume(work: Path, steps: int, kills: int, seed: int) -> dict:
    """Reference run in process, then the killed-and-resumed run in subprocesses; returns the summary."""
    reference, run = work / "reference", work / "run"
    began = time.monotonic()
    train(reference, steps, seed, resume=False)
    step_s = (time.monotonic() - began) / steps
    rng, kill_points = random.Random(seed), []
    for k in range(kills):
        proc = _child(run, steps, seed, resume=k > 0)
        kill_points.append(_kill_at_random(proc, run, steps, kills - k, step_s, rng))
    final = _child(run, steps, seed, resume=True)
    final.communicate()
    manager = CheckpointManager(run / "checkpoints", keep_last=None)
    corrupt = []
    for ckpt in manager.checkpoints():
        try:
            verify(ckpt)
        except CorruptCheckpointError as exc:
            corrupt.append(str(exc))
    ref_log, run_log = (
        MetricsLog(reference / "metrics.jsonl").read(),
        MetricsLog(run / "metrics.jsonl").read(),
    )
    weights = [
        load_file(str(d / "checkpoints" / f"step-{steps:06d}" / "model" / "model.safetensors"))
        for d in (reference, run)
    ]
    return {
        "steps": steps,
        "kills": len(kill_points),
        "kill_points": kill_points,
        "final_rc": final.returncode,
        "checkpoint_steps": [c.step for c in manager.checkpoints()],
        "corrupt": corrupt,
        "partial_left": sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")),
        "logged_steps": [r["step"] for r in run_log],
        "metrics_equal": ref_log == run_log,
        "params_equal": weights[0].keys() == weights[1].keys()
        and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]),
        "seconds": round(time.monotonic() - began, 1),
    }


def check(summary: dict) -> list[str]:
    """What the summary shows to be wrong; empty when the run survived every kill."""
    every = list(range(1, summary["steps"] + 1))
    problems = {
        "the resumed run did not finish cleanly": summary["final_rc"] != 0,
        "a step is missing its checkpoint": summary["checkpoint_steps"] != every,
        "a checkpoint is corrupt": bool(summary["corrupt"]),
        "a partial checkpoint was left behind": bool(summary["partial_left"]),
        "the metrics log is not one line per step": summary["logged_steps"] != every,
        "metrics differ from the uninterrupted run": not summary["metrics_equal"],
        "final weights differ from the uninterrupted run": not summary["params_equal"],
    }
    return [name for name, failed in problems.items() if failed]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path(".work/crash-resume"))
    parser.add_argument("--summary", type=Path, help="also write the JSON summary here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        train(
            args.run_dir,
            args.steps,
            args.seed,
            args.resume,
            on_start=lambda n: print(f"started {n}", flush=True),
        )
        return
    if args.steps < 2 * (args.kills + 1):
        raise SystemExit(f"--steps must be at least 2 × (--kills + 1) = {2 * (args.kills + 1)}")
    if args.work.exists() and any(args.work.iterdir()):
        raise SystemExit(f"{args.work} is not empty; give a fresh --work directory")
    (args.work / "run").mkdir(parents=True)
    summary = crash_resume(args.work, args.steps, args.kills, args.seed)
    summary["problems"] = check(summary)
    text = json.dumps(summary, indent=1)
    print(text)
    if args.summary:
        args.summary.write_text(text)
    sys.exit(1 if summary["problems"] else 0)


if __name__ == "__main__":
    main()
