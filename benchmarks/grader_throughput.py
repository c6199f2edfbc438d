"""Seconds per LLM grading: all of a step's gradings at once on one warm batching server, against one
at a time, in the same run on the same groups.

One RL step's grading: ``--groups`` catalogue groups (ladders of ``--min-candidates`` to
``--max-candidates`` oracle-labelled candidates, one group per task), each graded in both candidate
orders (the position guard), so ``2 x groups`` gradings. Each of ``--engines`` is one server process
(``gagar serve grader``, ``--threads`` torch threads), started before the clock and stopped before the
next one starts, serving every LLM mode:

- ``own``: the project's server, every prompt prefilled whole (``--prefix-cache 0``), float32: the
  previous path;
- ``own-prefix``: the project's server reusing the key/values of earlier prompts, float32;
- ``own-prefix-bf16``: the same in bfloat16 (``--dtype bfloat16``);
- ``vllm``, ``vllm-bf16``: vLLM's OpenAI server (its CPU build, ``--engine vllm``; needs
  ``make vllm-env``) in float32 and bfloat16.

The modes:

- ``one_at_a_time``: the previous path; ``grade_groups`` grades group after group and order after
  order, so the server decodes one conversation at a time (a lone request is a batch of one);
- ``model_opens``: batched, and the model asks for the overview tools itself (``opening=()``: three
  requests a grading, the path before the grader ran its own opening);
- ``batched``: the grader runs every group and both orders at once (``concurrency``), the server
  decodes whatever requests are waiting in one batch (``--max-batch``), and each grading opens with
  the grader's own overview (``OPENING_TOOLS``), so the model's first request is its answer;
- ``heuristic``: the heuristic grader on the same groups (no model), for the step's ratio.

For each: wall seconds, seconds per grading (wall / gradings, both orders counted), requests per grading,
fallbacks, position disagreements, mean Kendall tau-b against the oracle's labels. Prints a table and
the ratios one_at_a_time / batched and model_opens / batched; ``--json`` writes the figures.

    python benchmarks/grader_throughput.py --model grader-dir --tasks heldout.jsonl [--groups 4]
        [--min-candidates 2 --max-candidates 8] [--threads 1] [--max-batch 32]
        [--engines own,own-prefix,vllm] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gagar.grader.base import Grader, PositionGuard
from gagar.grader.heuristic import HeuristicGrader
from gagar.grader.kendall import kendall_tau_b, scores_from_ranking
from gagar.grader.llm import OPENING_TOOLS, LLMGrader
from gagar.grader.llm_client import ChatClient
from gagar.grader.run import grade_groups
from gagar.grader.sft import LabelledGroup, noise_groups
from gagar.records import read_records
from gagar.schema.grade import Grade
from gagar.schema.result import TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import Trajectory


class CountingClient:
    """A :class:`ChatClient` that counts its requests (thread-safe)."""

    def __init__(self, inner: ChatClient) -> None:
        self.inner, self.requests = inner, 0
        self._lock = threading.Lock()

    def next_message(self, messages: list[dict[str, str]], timeout: float) -> str:
        with self._lock:
            self.requests += 1
        return self.inner.next_message(messages, timeout)


ENGINE_FLAGS = {
    "own": ["--engine", "own", "--prefix-cache", "0", "--dtype", "float32"],
    "own-prefix": ["--engine", "own", "--dtype", "float32"],
    "own-prefix-bf16": ["--engine", "own", "--dtype", "bfloat16"],
    "vllm": ["--engine", "vllm", "--dtype", "float32"],
    "vllm-bf16": ["--engine", "vllm", "--dtype", "bfloat16"],
}
"""``gagar serve grader`` options of each engine the benchmark can start."""


@dataclass
class Row:
    engine: str
    mode: str
    wall_s: float
    gradings: int
    s_per_grading: float
    requests_per_grading: float
    fallbacks: int
    fallback_reasons: dict[str, int]
    position_disagreements: int
    kendall_tau: float


def rollout_of(
    groups: Sequence[LabelledGroup],
) -> tuple[dict[str, Task], list[Trajectory], dict[str, TestResult]]:
    """The groups as a step's rollout: every candidate a passing trajectory."""
    tasks = {g.task.instance_id: g.task for g in groups}
    trajectories, results = [], {}
    for g in groups:
        for c in g.candidates:
            trajectories.append(
                Trajectory(trajectory_id=c.trajectory_id, instance_id=g.task.instance_id, group_id=g.group_id,
                           model_patch=c.patch)
            )  # fmt: skip
            results[c.trajectory_id] = TestResult(
                trajectory_id=c.trajectory_id, instance_id=g.task.instance_id, status="passed", resolved=True
            )
    return tasks, trajectories, results


def mean_tau(grades: Sequence[Grade], groups: Sequence[LabelledGroup]) -> float:
    taus = []
    for grade, group in zip(grades, groups, strict=True):
        predicted, ids = scores_from_ranking(grade.ranking), sorted(group.labels)
        tau = kendall_tau_b([predicted[t] for t in ids], [group.labels[t] for t in ids])
        if not math.isnan(tau):
            taus.append(tau)
    return sum(taus) / len(taus) if taus else math.nan


def measure(
    engine: str, mode: str, grader: Grader, groups: Sequence[LabelledGroup], client: CountingClient | None
) -> Row:
    tasks, trajectories, results = rollout_of(groups)
    with tempfile.TemporaryDirectory(prefix="gagar-bench-grader-") as tmp:
        start = time.perf_counter()
        grades, metrics = grade_groups(
            grader, tasks, trajectories, results, Path(tmp), guard=PositionGuard(), progress=False
        )
        wall = time.perf_counter() - start
    gradings = 2 * sum(len(g.candidates) >= 2 for g in groups)
    requests = client.requests if client is not None else 0
    return Row(
        engine=engine,
        mode=mode,
        wall_s=round(wall, 2),
        gradings=gradings,
        s_per_grading=round(wall / gradings, 3),
        requests_per_grading=round(requests / gradings, 2),
        fallbacks=sum(metrics.fallbacks.values()),
        fallback_reasons={k: v for k, v in metrics.fallbacks.items() if v},
        position_disagreements=metrics.guard_disagreements,
        kendall_tau=round(mean_tau(grades, groups), 3),
    )


def speedups(rows: Sequence[Row]) -> dict[str, float]:
    """Wall-time ratios against the previous paths: ``own`` one at a time and ``own`` batched against
    every later row, and each engine's ``model_opens`` against its ``batched``."""
    wall = {(r.engine, r.mode): r.wall_s for r in rows}
    out = {}
    for base in (("own", "one_at_a_time"), ("own", "batched")):
        for key, seconds in wall.items():
            if base in wall and key != base and key[1] not in ("heuristic", "model_opens") and key >= base:
                out[f"{base[0]} {base[1]} / {key[0]} {key[1]}"] = round(wall[base] / seconds, 2)
    for engine, mode in wall:
        if mode == "model_opens" and (engine, "batched") in wall:
            out[f"{engine} model_opens / batched"] = round(wall[engine, mode] / wall[engine, "batched"], 2)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    model: Path, engine: str, threads: int, max_batch: int
) -> tuple[subprocess.Popen[bytes], str]:
    """``gagar serve grader`` with ``engine``'s options in its own process; waits for ``/health``."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # vLLM: OMP_NUM_THREADS threads, unpinned, as the own server
    command = [sys.executable, "-m", "gagar", "serve", "grader", "--model", str(model), *ENGINE_FLAGS[engine]]
    command += ["--port", str(port), "--max-batch", str(max_batch)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the grader server exited with {proc.returncode}") from None
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError("the grader server did not become healthy within 300 s")


def stop(proc: subprocess.Popen[bytes], grace_s: float = 120.0) -> None:
    """Stop a server process: SIGTERM, then SIGKILL after ``grace_s`` (vLLM's shutdown can hang)."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def llm_grader(
    url: str, mode: str, groups: int, args: argparse.Namespace
) -> tuple[LLMGrader, CountingClient]:
    client = CountingClient(ChatClient(url, "grader", max_tokens=args.max_tokens))
    grader = LLMGrader(
        client, request_timeout_s=900, total_timeout_s=1800,
        concurrency=1 if mode == "one_at_a_time" else 2 * groups,
        max_candidates=args.context_candidates,
        opening=() if mode == "model_opens" else OPENING_TOOLS,
    )  # fmt: skip
    return grader, client


def load_avg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="The LLM grader's folder.")
    parser.add_argument("--tasks", type=Path, required=True, help="Tasks JSONL with bundled files.")
    parser.add_argument("--groups", type=int, default=4, help="Groups of the step (one per task).")
    parser.add_argument("--min-candidates", type=int, default=2)
    parser.add_argument("--max-candidates", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="The server's torch threads.")
    parser.add_argument("--max-batch", type=int, default=32, help="The server's most sequences a batch.")
    parser.add_argument("--max-tokens", type=int, default=384, help="Most tokens of one grader turn.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the groups.")
    parser.add_argument(
        "--context-candidates",
        type=int,
        default=8,
        help="The grader's max_candidates: larger groups are split.",
    )
    parser.add_argument(
        "--modes",
        default="heuristic,one_at_a_time,model_opens,batched",
        help="Comma-separated modes to run, in order.",
    )
    parser.add_argument(
        "--engines",
        default="own,own-prefix",
        help=f"Comma-separated servers, in order: {', '.join(ENGINE_FLAGS)}.",
    )
    parser.add_argument("--json", type=Path, default=None, help="Write the figures here.")
    args = parser.parse_args()

    tasks = [t for t in read_records(args.tasks, Task) if t.snapshot is not None][: args.groups]
    groups = noise_groups(tasks, 1, size=args.max_candidates, seed=args.seed, min_size=args.min_candidates)
    sizes = [len(g.candidates) for g in groups]
    print(f"{len(groups)} groups of {sizes} candidates; load before: {load_avg()}", flush=True)
    modes, rows = args.modes.split(","), []
    if "heuristic" in modes:
        rows.append(measure("-", "heuristic", HeuristicGrader(), groups, None))
    for engine in args.engines.split(","):
        proc, url = start_server(args.model, engine, args.threads, args.max_batch)
        try:
            for mode in (m for m in modes if m != "heuristic"):
                grader, client = llm_grader(url, mode, len(groups), args)
                rows.append(measure(engine, mode, grader, groups, client))
                print(f"{engine} {mode} done; load {load_avg()}: {asdict(rows[-1])}", flush=True)
        finally:
            stop(proc)
    header = "| engine | mode | wall s | gradings | s/grading | requests/grading | fallbacks |"
    print(header + " position disagreements | tau |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.engine} | {r.mode} | {r.wall_s} | {r.gradings} | {r.s_per_grading} | "
            f"{r.requests_per_grading} | {r.fallbacks} | {r.position_disagreements} | {r.kendall_tau} |"
        )
    ratios = speedups(rows)
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x")
    if args.json is not None:
        payload = {"args": {k: str(v) for k, v in vars(args).items()}, "sizes": sizes, "speedups": ratios}
        payload["rows"] = [asdict(r) for r in rows]
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
