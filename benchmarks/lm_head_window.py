"""The update's forward and backward pass with the LM head over every position against only from the
first response position (``logits_to_keep``, what ``gagar.train.loss`` does), interleaved in one
process on random tokens; best of ``--repeats``.

    python benchmarks/lm_head_window.py --policy DIR [--rows 16] [--prompt 200] [--response 128]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from gagar.policy.model import load_policy
from gagar.train import loss


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model, _ = load_policy(args.policy)
    ids = torch.randint(0, model.config.vocab_size, (args.rows, args.prompt + args.response))
    mask, start = torch.ones_like(ids), torch.full((args.rows,), args.prompt)
    windowed = loss._takes_logits_to_keep
    seconds: dict[str, list[float]] = {"every position": [], "from the first response position": []}
    sums = {}
    for _ in range(args.repeats):
        for name, takes in (
            ("every position", lambda m: False),
            ("from the first response position", windowed),
        ):
            loss._takes_logits_to_keep = takes
            began = time.perf_counter()
            logprobs = loss.response_logprobs(model, ids, mask, start, args.response)
            logprobs.sum().backward()
            seconds[name].append(time.perf_counter() - began)
            model.zero_grad()
            sums[name] = float(logprobs.detach().sum())
    loss._takes_logits_to_keep = windowed
    print(f"{args.policy}: {args.rows} x ({args.prompt} + {args.response}) tokens, {args.threads} thread(s)")
    for name, values in seconds.items():
        print(f"  LM head over {name:33} {min(values):7.2f} s (log-prob sum {sums[name]:.3f})")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
