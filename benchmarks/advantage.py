"""Vectorised advantages against a plain per-group Python loop, on the same million trajectories.

    python benchmarks/advantage.py [--n 1000000] [--group-sizes 8 64]

For each group size: the time of grpo_advantages + keep_mixed_groups + redistribute,
the time of the loop references computing the same numbers, a check that both agree,
and the speed-up ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gagar.advantage import grpo_advantages, keep_mixed_groups, redistribute
from gagar.advantage_reference import grpo_advantages_loop, keep_mixed_groups_loop, redistribute_loop


def make_batch(n: int, group_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rewards, group ids and ranks ``(n,)`` for ``n // group_size`` groups, shuffled."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n // group_size), group_size)
    pass_rate = rng.uniform(0.1, 0.9, size=n // group_size)[groups]
    rewards = (rng.random(len(groups)) < pass_rate).astype(np.float64)
    ranks = np.where(rewards > 0, rng.integers(1, group_size + 1, size=len(groups)), np.nan).astype(
        np.float64
    )
    order = rng.permutation(len(groups))
    return rewards[order], groups[order], ranks[order]


def vectorised(rewards, groups, ranks):
    base = grpo_advantages(rewards, groups)
    mixed = keep_mixed_groups(rewards, groups)
    return base, mixed, redistribute(base, rewards, groups, ranks)


def looped(rewards, groups, ranks):
    r, g, k = rewards.tolist(), groups.tolist(), ranks.tolist()
    base = grpo_advantages_loop(r, g)
    mixed = keep_mixed_groups_loop(r, g)
    return base, mixed, redistribute_loop(base, [x > 0 for x in r], g, k)


def best_of(fn, args, repeats: int) -> tuple[float, tuple]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*args)
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'group size':>10} {'vectorised s':>13} {'loop s':>9} {'speed-up':>9}  agree")
    for size in args.group_sizes:
        batch = make_batch(args.n, size)
        t_vec, (base, mixed, new) = best_of(vectorised, batch, args.repeats)
        t_loop, (base_l, mixed_l, new_l) = best_of(looped, batch, 1)
        agree = (
            np.allclose(base, base_l, rtol=1e-12, atol=1e-12)
            and np.array_equal(mixed, mixed_l)
            and np.allclose(new, new_l, rtol=1e-9, atol=1e-12)
        )
        print(f"{size:>10} {t_vec:>13.3f} {t_loop:>9.2f} {t_loop / t_vec:>8.0f}x  {agree}")
        if not agree:
            raise SystemExit(f"vectorised and loop results differ for group size {size}")


if __name__ == "__main__":
    main()
