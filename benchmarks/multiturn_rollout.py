"""One multi-turn rollout (the tool-call or tool-loop agent) through the in-process transformers
backend two ways, same model, tasks and sampling seed, alternated in one process:

- ``generate``: :class:`~gagar.policy.generation.HFBackend`, every call prefilling each conversation
  from its first token (a conversation is re-sent whole every turn), the baseline;
- ``prefix-cache``: :class:`~gagar.policy.prefix_cache.PrefixCachingBackend`, each call prefilling
  only the tokens past the longest prefix an earlier call computed (the group's shared first prompt
  once, then each turn's tool answer and reply), what ``make_backend`` gives a multi-turn agent.

Both sample the same distribution but draw other random numbers, so the conversations differ; the
figure compared is seconds per sampled token (and per trajectory), beside the prompt tokens each
prefilled. The machine's load is printed with each round.

    .venv/bin/python benchmarks/multiturn_rollout.py --policy DIR --tasks train.jsonl --n-tasks 2 \
        --group-size 4 --agent tool-call --call-format xml --show-definition --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence

import torch

from gagar.policy.agent import AgentKind, AgentSettings, CallFormat
from gagar.policy.generation import BATCH_SIZE, HFBackend, Sample
from gagar.policy.model import load_policy
from gagar.policy.prefix_cache import PrefixCachingBackend
from gagar.policy.rollout import MULTI_TURN_CACHE_TOKENS, rollout
from gagar.sandbox.runner import BackendName
from gagar.sandbox.runner import make_backend as make_sandbox
from gagar.schema.trajectory import SamplingParams
from gagar.tasks.loaders import load_tasks


class CountingHF(HFBackend):
    """HFBackend counting the prompt tokens it prefills (padding left out)."""

    prefilled = 0

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        self.prefilled += n * sum(len(p) for p in prompts)
        return super().generate(prompts, params, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", required=True)
    parser.add_argument("--tasks", required=True)
    parser.add_argument("--n-tasks", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument(
        "--agent", choices=[AgentKind.TOOL_CALL.value, AgentKind.TOOL_LOOP.value], default="tool-call"
    )
    parser.add_argument("--call-format", choices=[f.value for f in CallFormat], default="json")
    parser.add_argument("--show-definition", action="store_true")
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=3072)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    agent = AgentSettings(
        kind=AgentKind(args.agent), max_turns=args.max_turns, max_tokens=args.max_tokens, max_seconds=None,
        call_format=CallFormat(args.call_format), show_definition=args.show_definition,
    )  # fmt: skip
    tasks = load_tasks(args.tasks)[: args.n_tasks]
    model, tokenizer = load_policy(args.policy)
    sandbox = make_sandbox(BackendName.LOCAL)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, seed=0)
    runs: dict[str, list[dict[str, float]]] = {"generate": [], "prefix-cache": []}
    for round_ in range(args.rounds):
        for name in runs:
            backend = (
                CountingHF(model, tokenizer)
                if name == "generate"
                else PrefixCachingBackend(model, tokenizer, MULTI_TURN_CACHE_TOKENS, BATCH_SIZE)
            )
            started = time.perf_counter()
            trajectories = list(
                rollout(
                    tasks,
                    backend,
                    tokenizer,
                    args.group_size,
                    params,
                    agent=agent,
                    sandbox=sandbox,
                    progress=False,
                )
            )
            seconds = time.perf_counter() - started
            sampled = sum(sum(t.loss_mask) for t in trajectories)
            prefilled = (
                backend.prefilled
                if isinstance(backend, CountingHF)
                else backend.stats.prompt_tokens - backend.stats.cached_tokens
            )
            row = {
                "seconds": round(seconds, 1),
                "trajectories": len(trajectories),
                "turns": round(sum(t.turns for t in trajectories) / len(trajectories), 2),
                "sampled_tokens": sampled,
                "prefilled_tokens": prefilled,
                "s_per_sampled_token": round(seconds / max(sampled, 1), 4),
                "s_per_trajectory": round(seconds / len(trajectories), 2),
                "load": round(os.getloadavg()[0], 2),
            }
            runs[name].append(row)
            print(json.dumps({"round": round_, "backend": name, **row}), flush=True)
    per_token = {name: sum(r["s_per_sampled_token"] for r in rows) / len(rows) for name, rows in runs.items()}
    per_traj = {name: sum(r["s_per_trajectory"] for r in rows) / len(rows) for name, rows in runs.items()}
    print(json.dumps({
        "speedup_per_sampled_token": round(per_token["generate"] / per_token["prefix-cache"], 2),
        "speedup_per_trajectory": round(per_traj["generate"] / per_traj["prefix-cache"], 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
