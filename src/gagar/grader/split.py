"""Ranking a group larger than a grader's context: split into chunks, rank each, merge by pairs.

The rule (``docs/grader.md``, "Groups larger than the context"):

1. The candidates, in the order they are presented, are cut into ``ceil(k / m)`` consecutive chunks
   of nearly equal size (sizes differ by at most one), ``m`` being the grader's ``max_candidates``.
2. Each chunk is ranked by the grader on its own.
3. The chunk rankings are merged left to right as in merge sort: the head tiers of the two rankings
   are compared by grading a group of two (one representative of each tier, the first id); the
   better tier is emitted first, and tied representatives merge their tiers into one.

A merge of rankings with ``a`` and ``b`` tiers grades at most ``a + b - 1`` pairs, so a group of 16
with ``m = 8`` costs two gradings of 8 and at most 15 of 2. No candidate is ever dropped: every id of
every chunk is in exactly one tier of the result. A failed chunk or pair grading fails the whole
group (the caller ties it and counts the fallback).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["chunks", "merge_tiers", "rank_in_chunks", "run_all"]

Tiers = list[list[str]]
RankFn = Callable[[Sequence[str]], Tiers]
"""Ranks a subset of the group's candidates (in the order given) into tiers, best first."""
T = TypeVar("T")


def run_all(calls: Sequence[Callable[[], T]], parallel: bool) -> list[T]:
    """Each call's result, in order; the calls run in threads at once when ``parallel``."""
    if not parallel or len(calls) < 2:
        return [call() for call in calls]
    with ThreadPoolExecutor(len(calls), thread_name_prefix="gagar-grade") as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result() for f in futures]


def chunks(order: Sequence[str], size: int) -> list[list[str]]:
    """``order`` cut into ``ceil(len / size)`` consecutive chunks whose sizes differ by at most one."""
    if size < 2:
        raise ValueError(f"a chunk must hold at least 2 candidates, got {size}")
    count = math.ceil(len(order) / size)
    base, extra = divmod(len(order), count)
    out, start = [], 0
    for i in range(count):
        end = start + base + (i < extra)
        out.append(list(order[start:end]))
        start = end
    return out


def _compare(rank: RankFn, a: str, b: str) -> int:
    """1 when ``a`` ranks above ``b``, -1 below, 0 tied."""
    tiers = rank([a, b])
    if len(tiers) == 1:
        return 0
    return 1 if tiers[0] == [a] else -1


def merge_tiers(first: Tiers, second: Tiers, rank: RankFn) -> Tiers:
    """The two rankings merged by comparing head tiers through ``rank`` on pairs (module docstring)."""
    out: Tiers = []
    i = j = 0
    while i < len(first) and j < len(second):
        verdict = _compare(rank, first[i][0], second[j][0])
        if verdict > 0:
            out.append(list(first[i]))
            i += 1
        elif verdict < 0:
            out.append(list(second[j]))
            j += 1
        else:
            out.append([*first[i], *second[j]])
            i, j = i + 1, j + 1
    return out + [list(t) for t in first[i:]] + [list(t) for t in second[j:]]


def rank_in_chunks(rank: RankFn, order: Sequence[str], max_candidates: int, parallel: bool = False) -> Tiers:
    """``order`` ranked by ``rank``: directly when it fits ``max_candidates``, else chunked and merged.

    With ``parallel`` the chunks are ranked at once (each in its own thread).
    """
    if len(order) <= max_candidates:
        return rank(order)
    parts = chunks(order, max_candidates)
    rankings = run_all([lambda part=part: rank(part) for part in parts], parallel)
    merged = rankings[0]
    for ranking in rankings[1:]:
        merged = merge_tiers(merged, ranking, rank)
    return merged
