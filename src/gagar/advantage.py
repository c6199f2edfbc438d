"""Advantages for GRPO and GAGAR, vectorised over a flat batch of trajectories.

Every function takes flat arrays of shape ``(n_traj,)`` plus a ``group_ids`` array
of the same length naming each trajectory's group (any hashable dtype numpy can
sort: ints or strings). No Python loop runs over groups; the per-group loop
references live in :mod:`gagar.advantage_reference` and the tests check that both
agree.

The algorithm (DESIGN.md §4), for a group with binary rewards r_i:

    A_i  = (r_i - mean(r)) / (std(r) + eps)              GRPO (unbiased std)
    A_i  =  r_i - mean(r)                                Dr. GRPO (norm_std=False)
    A'_i = A_i * w_i * sum_P(A) / sum_P(A * w)           GAGAR, for i in the passing set P

with w_i = f(rank_i), f positive and non-increasing; A'_i = A_i outside P.

Two registered variants sit beside it. ``gagar-no-restore`` is the ablation that
down-weights without the rescale (A'_i = A_i * w_i on P). ``gagar-tiered`` is the
paper's published form (public reimplementation notes of its Eqs. 6-8): centred
advantages without std, tier factors instead of rank weights, the passing sum restored
by a factor capped at ``lambda_max``, and the group re-centred afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

__all__ = [
    "AdvantageConfig",
    "AdvantageInputs",
    "BatchAssembly",
    "Decay",
    "DropReason",
    "Estimator",
    "RewardBatch",
    "SamplingCounts",
    "TierFactors",
    "assemble_batch",
    "compute_advantages",
    "credit_moved_ratio",
    "filter_generation_batch",
    "get_estimator",
    "grpo_advantages",
    "keep_mixed_groups",
    "rank_weights",
    "redistribute",
    "register_estimator",
    "tier_factors",
    "tiered_redistribute",
]


class Decay(StrEnum):
    """How a passing trajectory's rank becomes its weight."""

    GEOMETRIC = "geometric"
    """w = gamma ** (rank - 1)."""
    LINEAR = "linear"
    """w falls linearly from 1 at rank 1 to ``floor`` at the group's worst rank."""
    SCORE = "score"
    """w falls linearly from 1 at the group's best grader score to ``floor`` at its worst."""


# --------------------------------------------------------------------------- validation


def _as_1d(name: str, values: np.ndarray | Iterable, n: int | None = None) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if n is not None and array.shape[0] != n:
        raise ValueError(f"{name} has {array.shape[0]} entries but rewards/advantages have {n}")
    return array


def _finite_floats(name: str, values: np.ndarray | Iterable, n: int | None = None) -> np.ndarray:
    array = _as_1d(name, values, n)
    if array.dtype == bool:
        array = array.astype(np.float64)
    if not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"{name} must be numeric, got dtype {array.dtype}")
    array = array.astype(np.float64, copy=False)
    bad = ~np.isfinite(array)
    if bad.any():
        raise ValueError(f"{name} contains NaN or infinity (first at index {int(np.argmax(bad))})")
    return array


def _binary(name: str, values: np.ndarray | Iterable, n: int | None = None) -> np.ndarray:
    array = _finite_floats(name, values, n)
    not_binary = (array != 0.0) & (array != 1.0)
    if not_binary.any():
        i = int(np.argmax(not_binary))
        raise ValueError(f"{name} must be binary (0 or 1); index {i} is {array[i]!r}")
    return array


def _group_index(group_ids: np.ndarray | Iterable, n: int) -> tuple[np.ndarray, int]:
    """Dense group index per trajectory ``(n_traj,)`` and the number of groups."""
    ids = _as_1d("group_ids", group_ids, n)
    if ids.dtype.kind == "f" and np.isnan(ids).any():
        raise ValueError("group_ids contains NaN")
    if ids.dtype.kind in "iu" and n and ids.min() >= 0 and ids.max() < 4 * n + 16:
        # Small non-negative integer ids: a bincount-based relabelling avoids the sort.
        present = np.bincount(ids, minlength=int(ids.max()) + 1) > 0
        if present.all():  # already dense: 0 .. n_groups - 1
            return ids.astype(np.intp, copy=False), len(present)
        dense = np.cumsum(present) - 1
        return dense[ids], int(present.sum())
    uniques, inverse = np.unique(ids, return_inverse=True)
    return inverse.reshape(-1), len(uniques)


def _group_sum(index: np.ndarray, n_groups: int, values: np.ndarray) -> np.ndarray:
    """Sum of ``values`` per group, shape ``(n_groups,)``."""
    return np.bincount(index, weights=values, minlength=n_groups)


# --------------------------------------------------------------------------- GRPO


def grpo_advantages(
    rewards: np.ndarray | Iterable[float],
    group_ids: np.ndarray | Iterable,
    *,
    norm_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """Group-relative advantages ``(n_traj,)``.

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with the unbiased std of the group;
    ``norm_std=False`` gives ``r_i - mean_g`` (Dr. GRPO). A group of one gets 0.
    """
    r = _finite_floats("rewards", rewards)
    index, n_groups = _group_index(group_ids, len(r))
    counts = np.bincount(index, minlength=n_groups).astype(np.float64)  # (n_groups,)
    mean = _group_sum(index, n_groups, r) / np.maximum(counts, 1.0)  # (n_groups,)
    centred = r - mean[index]  # (n_traj,)
    if not norm_std:
        return centred
    sq = _group_sum(index, n_groups, centred * centred)  # (n_groups,)
    std = np.sqrt(sq / np.maximum(counts - 1.0, 1.0))  # (n_groups,), unbiased
    inverse_scale = np.where(counts >= 2, 1.0 / (std + eps), 0.0)  # (n_groups,); a group of one gets 0
    return centred * inverse_scale[index]


def keep_mixed_groups(rewards: np.ndarray | Iterable[float], group_ids: np.ndarray | Iterable) -> np.ndarray:
    """Boolean mask ``(n_traj,)`` of trajectories whose group has both passing and failing members."""
    r = _binary("rewards", rewards)
    index, n_groups = _group_index(group_ids, len(r))
    counts = np.bincount(index, minlength=n_groups)
    passes = _group_sum(index, n_groups, r)
    mixed = (passes > 0) & (passes < counts)  # (n_groups,)
    return mixed[index]


# --------------------------------------------------------------------------- GAGAR


def _check_ranks_consistent_with_scores(index: np.ndarray, ranks: np.ndarray, scores: np.ndarray) -> None:
    """All arrays are the passing members' ``(n_pass,)``."""
    order = np.lexsort((ranks, index))
    same_group = index[order][1:] == index[order][:-1]
    rank_step = np.diff(ranks[order])
    score_step = np.diff(scores[order])
    bad = same_group & (((rank_step == 0) & (score_step != 0)) | ((rank_step > 0) & (score_step > 0)))
    if bad.any():
        raise ValueError(
            f"scores disagree with ranks at passing member {int(order[1:][np.argmax(bad)])}: a better rank "
            "must not have a lower score, and tied ranks need equal scores"
        )


def rank_weights(
    ranks: np.ndarray,
    index: np.ndarray,
    n_groups: int,
    *,
    decay: Decay | str = Decay.GEOMETRIC,
    gamma: float = 0.5,
    floor: float = 0.1,
    scores: np.ndarray | None = None,
) -> np.ndarray:
    """Weights ``(n_pass,)`` of the passing members, scaled so each group's best has weight 1.

    ``ranks``, ``index`` (dense group index) and ``scores`` hold the passing members
    only, ``(n_pass,)``. Dividing by the group's largest weight changes no advantage
    (the rescaling cancels any per-group factor) but makes a single passing member
    and an all-tied group exact no-ops.
    """
    decay = Decay(decay)
    if decay is Decay.GEOMETRIC:
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        raw = np.exp((ranks - 1.0) * np.log(gamma))  # gamma ** (rank - 1), faster than np.power
    else:
        if not 0.0 < floor <= 1.0:
            raise ValueError(f"floor must be in (0, 1], got {floor}")
        if decay is Decay.SCORE and scores is None:
            raise ValueError("decay='score' needs grader scores")
        key = ranks if decay is Decay.LINEAR else -scores  # smaller is better
        best = np.full(n_groups, np.inf)
        worst = np.full(n_groups, -np.inf)
        np.minimum.at(best, index, key)
        np.maximum.at(worst, index, key)
        spread = (worst - best)[index]
        has_spread = spread > 0
        raw = 1.0 - (1.0 - floor) * np.where(
            has_spread, (key - best[index]) / np.where(has_spread, spread, 1.0), 0.0
        )
    top = np.zeros(n_groups)
    np.maximum.at(top, index, raw)
    return raw / top[index]


def _restoring_factor(
    group: np.ndarray, n_groups: int, passing_a: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per group ``(n_groups,)``: whether its passing members can be reweighted (every passing
    advantage positive and a positive weighted sum), and the factor sum_P A / sum_P w A that brings
    the weighted passing advantages back to their sum (1 where they cannot be reweighted)."""
    passing_sum = _group_sum(group, n_groups, passing_a)
    weighted_sum = _group_sum(group, n_groups, passing_a * weights)
    nonpositive = np.bincount(group[passing_a <= 0], minlength=n_groups)
    eligible = (nonpositive == 0) & (weighted_sum > 0)
    return eligible, np.where(eligible, passing_sum / np.where(eligible, weighted_sum, 1.0), 1.0)


def redistribute(
    advantages: np.ndarray | Iterable[float],
    passed: np.ndarray | Iterable[bool],
    group_ids: np.ndarray | Iterable,
    ranks: np.ndarray | Iterable[float],
    *,
    decay: Decay | str = "geometric",
    gamma: float = 0.5,
    floor: float = 0.1,
    scores: np.ndarray | Iterable[float] | None = None,
    restore_sum: bool = True,
) -> np.ndarray:
    """GAGAR advantages ``(n_traj,)``: credit moves toward better-ranked passing trajectories.

    Args:
        advantages: GRPO advantages ``(n_traj,)``.
        passed: whether each trajectory resolved its task ``(n_traj,)``.
        group_ids: group of each trajectory ``(n_traj,)``.
        ranks: rank among the passing members of its group ``(n_traj,)``, 1 = best,
            ties share a rank; ignored (may be NaN) for failing members.
        decay: ``geometric`` (gamma ** (rank - 1)), ``linear`` (1 at rank 1 down to
            ``floor`` at the worst rank) or ``score`` (from ``scores``, higher is better).
        scores: grader scores ``(n_traj,)``, required for ``decay="score"``.
        restore_sum: rescale the weighted passing advantages back to their sum (GAGAR);
            False only down-weights (the ``gagar-no-restore`` ablation).

    The passing sum of each group is preserved, failing members are untouched, and a
    group is left as it is when its passing advantages are not all positive (a group
    that is not mixed, for example).
    """
    a = _finite_floats("advantages", advantages)
    n = len(a)
    ok = _binary("passed", passed, n).astype(bool)
    index, n_groups = _group_index(group_ids, n)
    try:
        decay = Decay(decay)
    except ValueError:
        raise ValueError(f"unknown decay {decay!r}; choose one of {[d.value for d in Decay]}") from None
    members = np.flatnonzero(ok)  # (n_pass,)
    rank = _as_1d("ranks", ranks, n).astype(np.float64)[members]
    if not np.isfinite(rank).all():
        raise ValueError(f"passing member at index {int(members[np.argmax(~np.isfinite(rank))])} has no rank")
    if (rank < 1).any():
        i = int(np.argmax(rank < 1))
        raise ValueError(f"ranks start at 1; passing member at index {int(members[i])} has rank {rank[i]!r}")
    group = index[members]  # (n_pass,)
    score = None
    if decay is Decay.SCORE:
        if scores is None:
            raise ValueError("decay='score' needs grader scores")
        score = _as_1d("scores", scores, n).astype(np.float64)[members]
        if not np.isfinite(score).all():
            raise ValueError(
                f"scores contains NaN at passing index {int(members[np.argmax(~np.isfinite(score))])}"
            )
        _check_ranks_consistent_with_scores(group, rank, score)

    weights = rank_weights(rank, group, n_groups, decay=decay, gamma=gamma, floor=floor, scores=score)
    passing_a = a[members]  # (n_pass,)
    eligible, restoring = _restoring_factor(group, n_groups, passing_a, weights)
    scale = restoring if restore_sum else np.ones(n_groups)
    out = a.copy()
    out[members] = np.where(eligible[group], passing_a * weights * scale[group], passing_a)
    return out


class TierFactors(BaseModel):
    """The constants of ``gagar-tiered`` (the paper's form); every one configurable."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    tier1_best: float = 1.0
    """Factor of the best-ranked candidates of tier 1."""
    tier1_rest: float = 0.9
    """Factor of the other candidates of tier 1."""
    tier2_top: float = 0.85
    """Factor of tier 2's best-ranked candidates; tier 2 falls linearly in rank from here to tier2_bottom."""
    tier2_bottom: float = 0.4
    """Factor of tier 2's worst-ranked candidates."""
    tier3: float = 0.2
    """Factor of every tier-3 candidate."""
    cutoffs: tuple[float, float] = (1 / 3, 2 / 3)
    """A candidate's tier from its rank position (rank - 1) / k among the k passing members of its
    group: tier 1 below the first cutoff, tier 2 below the second, tier 3 from there."""
    lambda_max: float = 1.5
    """Cap on the factor that restores the passing sum (the paper's appendix: 1.5)."""

    @model_validator(mode="after")
    def _ordered(self) -> TierFactors:
        factors = (self.tier1_best, self.tier1_rest, self.tier2_top, self.tier2_bottom, self.tier3)
        if not all(0.0 < f <= 1.0 for f in factors):
            raise ValueError(f"tier factors must be in (0, 1], got {factors}")
        if not factors == tuple(sorted(factors, reverse=True)):
            raise ValueError(f"tier factors must not increase from tier 1's best to tier 3, got {factors}")
        low, high = self.cutoffs
        if not 0.0 < low <= high <= 1.0:
            raise ValueError(f"tier cutoffs must satisfy 0 < first <= second <= 1, got {self.cutoffs}")
        if self.lambda_max < 1.0:
            raise ValueError(f"lambda_max must be at least 1 (1 restores nothing), got {self.lambda_max}")
        return self


def _group_extreme(index: np.ndarray, n_groups: int, values: np.ndarray, mask: np.ndarray, fn) -> np.ndarray:
    """Per-group min or max (``fn`` is ``np.minimum`` or ``np.maximum``) of ``values`` where ``mask``."""
    out = np.full(n_groups, np.inf if fn is np.minimum else -np.inf)
    fn.at(out, index[mask], values[mask])
    return out


def tier_factors(ranks: np.ndarray, index: np.ndarray, n_groups: int, factors: TierFactors) -> np.ndarray:
    """Factors ``(n_pass,)`` of the passing members from their ranks ``(n_pass,)`` and dense group ``index``.

    Tiers come from rank positions (:attr:`TierFactors.cutoffs`), so an all-tied group is all tier 1
    and all "best": every factor 1, which leaves its advantages as they were.
    """
    k = np.bincount(index, minlength=n_groups).astype(np.float64)[index]  # (n_pass,)
    position = (ranks - 1.0) / k
    low, high = factors.cutoffs
    tier = np.where(position < low, 1, np.where(position < high, 2, 3))  # (n_pass,)
    in1, in2 = tier == 1, tier == 2
    best1 = _group_extreme(index, n_groups, ranks, in1, np.minimum)[index]
    lo2 = _group_extreme(index, n_groups, ranks, in2, np.minimum)[index]
    hi2 = _group_extreme(index, n_groups, ranks, in2, np.maximum)[index]
    spread2 = np.where(in2 & (hi2 > lo2), hi2 - lo2, 1.0)
    along2 = np.where(in2 & (hi2 > lo2), (ranks - lo2) / spread2, 0.0)
    tier2 = factors.tier2_top - (factors.tier2_top - factors.tier2_bottom) * along2
    tier1 = np.where(ranks == best1, factors.tier1_best, factors.tier1_rest)
    return np.where(in1, tier1, np.where(in2, tier2, factors.tier3))


def tiered_redistribute(
    rewards: np.ndarray | Iterable[float],
    group_ids: np.ndarray | Iterable,
    ranks: np.ndarray | Iterable[float],
    factors: TierFactors | None = None,
) -> np.ndarray:
    """``gagar-tiered`` advantages ``(n_traj,)``, the paper's form.

    A_i = r_i - mean(r) per group; on the passing set P, A'_i = lam * f_i * A_i with tier factors
    f_i (:func:`tier_factors`) and lam = min(sum_P A / sum_P f A, lambda_max); then every member of
    a changed group is shifted by the same amount so the group sums to zero again. Groups that are
    not mixed, and passing members with no rank (NaN: the grader failed), keep the centred GRPO
    advantage.
    """
    factors = factors or TierFactors()
    r = _binary("rewards", rewards)
    n = len(r)
    index, n_groups = _group_index(group_ids, n)
    centred = grpo_advantages(r, group_ids, norm_std=False)
    rank_all = _as_1d("ranks", ranks, n).astype(np.float64)
    passed = r > 0
    unranked_groups = np.bincount(index[passed & ~np.isfinite(rank_all)], minlength=n_groups) > 0
    members = np.flatnonzero(passed & ~unranked_groups[index])  # (n_pass,)
    rank = rank_all[members]
    if (rank < 1).any():
        i = int(np.argmax(rank < 1))
        raise ValueError(f"ranks start at 1; passing member at index {int(members[i])} has rank {rank[i]!r}")
    group = index[members]
    f = tier_factors(rank, group, n_groups, factors)
    passing_a = centred[members]
    eligible, restoring = _restoring_factor(group, n_groups, passing_a, f)
    lam = np.minimum(restoring, factors.lambda_max)
    out = centred.copy()
    out[members] = np.where(eligible[group], passing_a * f * lam[group], passing_a)
    sizes = np.bincount(index, minlength=n_groups).astype(np.float64)
    shift = np.where(eligible, _group_sum(index, n_groups, out) / sizes, 0.0)  # (n_groups,)
    return out - shift[index]


def credit_moved_ratio(
    before: np.ndarray | Iterable[float],
    after: np.ndarray | Iterable[float],
    passed: np.ndarray | Iterable[bool],
) -> float:
    """Share of the passing credit that changed hands: ``sum_P |A' - A| / (2 sum_P |A|)``, in [0, 1)."""
    b = _finite_floats("before", before)
    a = _finite_floats("after", after, len(b))
    ok = _binary("passed", passed, len(b)).astype(bool)
    total = np.abs(b[ok]).sum()
    return float(np.abs(a[ok] - b[ok]).sum() / (2.0 * total)) if total > 0 else 0.0


# --------------------------------------------------------------------------- estimator registry


class Estimator(StrEnum):
    """Advantage estimators the trainer can use."""

    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    GAGAR = "gagar"
    GAGAR_TIERED = "gagar-tiered"
    GAGAR_NO_RESTORE = "gagar-no-restore"

    @property
    def uses_grader(self) -> bool:
        """Whether the estimator needs a grader's ranks of the passing members."""
        return self in (Estimator.GAGAR, Estimator.GAGAR_TIERED, Estimator.GAGAR_NO_RESTORE)


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator sees. All arrays are ``(n_traj,)``."""

    rewards: np.ndarray
    group_ids: np.ndarray
    ranks: np.ndarray | None = None
    """Rank among the passing members of the group, NaN for failing ones; GAGAR only."""
    scores: np.ndarray | None = None
    """Grader scores, higher is better; GAGAR with ``decay='score'`` only."""


@dataclass(frozen=True)
class AdvantageConfig:
    """Knobs shared by the estimators."""

    eps: float = 1e-6
    norm_std: bool = True
    decay: Decay = Decay.GEOMETRIC
    gamma: float = 0.5
    floor: float = 0.1
    tiers: TierFactors = field(default_factory=TierFactors)
    """The constants of ``gagar-tiered``."""


EstimatorFn = Callable[[AdvantageInputs, AdvantageConfig], tuple[np.ndarray, dict[str, float]]]
_ESTIMATORS: dict[Estimator, EstimatorFn] = {}


def register_estimator(name: Estimator | str) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator adding an estimator to the registry; a name can be registered once."""
    key = Estimator(name)

    def add(fn: EstimatorFn) -> EstimatorFn:
        if key in _ESTIMATORS:
            raise ValueError(f"advantage estimator {key.value!r} is already registered")
        _ESTIMATORS[key] = fn
        return fn

    return add


def get_estimator(name: Estimator | str) -> EstimatorFn:
    """The registered estimator called ``name``."""
    try:
        return _ESTIMATORS[Estimator(name)]
    except ValueError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {[e.value for e in Estimator]}"
        ) from None


def compute_advantages(
    name: Estimator | str, inputs: AdvantageInputs, config: AdvantageConfig | None = None
) -> tuple[np.ndarray, dict[str, float]]:
    """Advantages ``(n_traj,)`` and ``advantage/…`` metrics from the estimator called ``name``."""
    return get_estimator(name)(inputs, config or AdvantageConfig())


def _summary(advantages: np.ndarray) -> dict[str, float]:
    return {
        "advantage/mean": float(advantages.mean()) if advantages.size else 0.0,
        "advantage/abs_mean": float(np.abs(advantages).mean()) if advantages.size else 0.0,
    }


@register_estimator(Estimator.GRPO)
def _grpo(inputs: AdvantageInputs, config: AdvantageConfig) -> tuple[np.ndarray, dict[str, float]]:
    adv = grpo_advantages(inputs.rewards, inputs.group_ids, norm_std=config.norm_std, eps=config.eps)
    return adv, _summary(adv)


@register_estimator(Estimator.DR_GRPO)
def _dr_grpo(inputs: AdvantageInputs, config: AdvantageConfig) -> tuple[np.ndarray, dict[str, float]]:
    adv = grpo_advantages(inputs.rewards, inputs.group_ids, norm_std=False, eps=config.eps)
    return adv, _summary(adv)


def _ranked_gagar(
    inputs: AdvantageInputs, config: AdvantageConfig, *, restore_sum: bool, name: Estimator
) -> tuple[np.ndarray, dict[str, float]]:
    base = grpo_advantages(inputs.rewards, inputs.group_ids, norm_std=config.norm_std, eps=config.eps)
    if inputs.ranks is None:
        raise ValueError(f"the {name.value} estimator needs ranks from a grader")
    passed = np.asarray(inputs.rewards) > 0
    adv = redistribute(
        base,
        passed,
        inputs.group_ids,
        inputs.ranks,
        decay=config.decay,
        gamma=config.gamma,
        floor=config.floor,
        scores=inputs.scores,
        restore_sum=restore_sum,
    )
    return adv, {**_summary(adv), "credit/moved_ratio": credit_moved_ratio(base, adv, passed)}


@register_estimator(Estimator.GAGAR)
def _gagar(inputs: AdvantageInputs, config: AdvantageConfig) -> tuple[np.ndarray, dict[str, float]]:
    return _ranked_gagar(inputs, config, restore_sum=True, name=Estimator.GAGAR)


@register_estimator(Estimator.GAGAR_NO_RESTORE)
def _gagar_no_restore(
    inputs: AdvantageInputs, config: AdvantageConfig
) -> tuple[np.ndarray, dict[str, float]]:
    return _ranked_gagar(inputs, config, restore_sum=False, name=Estimator.GAGAR_NO_RESTORE)


@register_estimator(Estimator.GAGAR_TIERED)
def _gagar_tiered(inputs: AdvantageInputs, config: AdvantageConfig) -> tuple[np.ndarray, dict[str, float]]:
    if inputs.ranks is None:
        raise ValueError("the gagar-tiered estimator needs ranks from a grader")
    base = grpo_advantages(inputs.rewards, inputs.group_ids, norm_std=False)
    adv = tiered_redistribute(inputs.rewards, inputs.group_ids, inputs.ranks, config.tiers)
    passed = np.asarray(inputs.rewards) > 0
    return adv, {**_summary(adv), "credit/moved_ratio": credit_moved_ratio(base, adv, passed)}


# --------------------------------------------------------------------------- dynamic sampling


class DropReason(StrEnum):
    """Why dynamic sampling dropped a group."""

    ALL_PASS = "all_pass"
    ALL_FAIL = "all_fail"
    TOO_SMALL = "too_small"
    """Fewer than ``min_group_size`` members left once infra errors are removed."""
    SURPLUS = "surplus"
    """A mixed group generated after the train batch was already full."""


@dataclass(frozen=True)
class RewardBatch:
    """One generation batch as dynamic sampling sees it. All arrays are ``(n_traj,)``."""

    rewards: np.ndarray
    group_ids: np.ndarray
    infra_error: np.ndarray
    """True where the sandbox failed for the platform's reasons; such trajectories leave their group."""


@dataclass
class SamplingCounts:
    """What dynamic sampling generated, kept and dropped."""

    gen_batches: int = 0
    generated_trajectories: int = 0
    generated_groups: int = 0
    kept_trajectories: int = 0
    kept_groups: int = 0
    infra_error_trajectories: int = 0
    dropped_groups: dict[str, int] = field(default_factory=lambda: {r.value: 0 for r in DropReason})

    def as_metrics(self) -> dict[str, float]:
        """Flat ``sampling/…`` metrics (the keys :func:`gagar.metrics.record_step` knows)."""
        flat = {
            "sampling/gen_batches": self.gen_batches,
            "sampling/trajectories_generated": self.generated_trajectories,
            "sampling/groups_generated": self.generated_groups,
            "sampling/trajectories_kept": self.kept_trajectories,
            "sampling/groups_kept": self.kept_groups,
            "sampling/infra_error_trajectories": self.infra_error_trajectories,
        }
        flat.update({f"sampling/dropped/{k}": v for k, v in self.dropped_groups.items()})
        return {k: float(v) for k, v in flat.items()}


def filter_generation_batch(
    batch: RewardBatch, *, min_group_size: int = 2, room: int | None = None
) -> tuple[np.ndarray, dict[str, int]]:
    """Keep mask ``(n_traj,)`` for one generation batch and the dropped-group counts by reason.

    Trajectories with an infra error leave their group first; a group then left with
    fewer than ``min_group_size`` members is dropped, and so are all-pass and all-fail
    groups. At most ``room`` mixed groups are kept (first generated first), the rest
    are dropped as surplus.
    """
    r = _binary("rewards", batch.rewards)
    n = len(r)
    infra = _binary("infra_error", batch.infra_error, n).astype(bool)
    index, n_groups = _group_index(batch.group_ids, n)
    valid = ~infra
    size = np.bincount(index, weights=valid.astype(np.float64), minlength=n_groups)  # (n_groups,)
    passes = _group_sum(index, n_groups, np.where(valid, r, 0.0))
    too_small = size < min_group_size
    all_pass = ~too_small & (passes == size)
    all_fail = ~too_small & (passes == 0)
    mixed = ~(too_small | all_pass | all_fail)
    if room is not None:
        # First-seen order of groups, so "first generated first" holds for any id type.
        first_seen = np.full(n_groups, n, dtype=np.int64)
        np.minimum.at(first_seen, index, np.arange(n))
        mixed_in_order = np.flatnonzero(mixed)[np.argsort(first_seen[mixed], kind="stable")]
        surplus = np.zeros(n_groups, dtype=bool)
        surplus[mixed_in_order[max(room, 0) :]] = True
        mixed &= ~surplus
    else:
        surplus = np.zeros(n_groups, dtype=bool)
    dropped = {
        DropReason.ALL_PASS.value: int(all_pass.sum()),
        DropReason.ALL_FAIL.value: int(all_fail.sum()),
        DropReason.TOO_SMALL.value: int(too_small.sum()),
        DropReason.SURPLUS.value: int(surplus.sum()),
    }
    return mixed[index] & valid, dropped


@dataclass
class BatchAssembly:
    """The train batch dynamic sampling assembled."""

    keep: list[np.ndarray]
    """One keep mask ``(n_traj_b,)`` per generation batch consumed, in order."""
    counts: SamplingCounts
    train_batch_groups: int

    @property
    def full(self) -> bool:
        """Whether the train batch reached its size (else ``max_gen_batches`` ran out first)."""
        return self.counts.kept_groups >= self.train_batch_groups


def assemble_batch(
    batches: Iterable[RewardBatch],
    *,
    train_batch_groups: int,
    max_gen_batches: int,
    min_group_size: int = 2,
    on_kept: Callable[[int, np.ndarray], None] | None = None,
) -> BatchAssembly:
    """Consume generation batches until ``train_batch_groups`` mixed groups are kept.

    ``batches`` is iterated lazily, so a generator that rolls out and evaluates on
    demand generates no more than needed. Stops when the train batch is full or
    after ``max_gen_batches`` batches, whichever comes first; a group id seen in an
    earlier batch is refused (groups never straddle generation batches).
    ``on_kept(b, mask)`` hears batch ``b``'s final keep mask before the next batch is
    drawn (what lets a caller grade kept groups while the next batch generates).
    """
    if train_batch_groups < 1:
        raise ValueError(f"train_batch_groups must be at least 1, got {train_batch_groups}")
    if max_gen_batches < 1:
        raise ValueError(f"max_gen_batches must be at least 1, got {max_gen_batches}")
    counts = SamplingCounts()
    keep: list[np.ndarray] = []
    seen: np.ndarray = np.array([])
    for batch in batches:
        groups = np.unique(np.asarray(batch.group_ids))
        repeated = np.intersect1d(groups, seen) if seen.size else groups[:0]
        if repeated.size:
            raise ValueError(f"group id {repeated[0]!r} appears in more than one generation batch")
        seen = groups if not seen.size else np.concatenate([seen, groups])
        mask, dropped = filter_generation_batch(
            batch, min_group_size=min_group_size, room=train_batch_groups - counts.kept_groups
        )
        keep.append(mask)
        if on_kept is not None:
            on_kept(len(keep) - 1, mask)
        counts.gen_batches += 1
        counts.generated_trajectories += len(mask)
        counts.generated_groups += len(groups)
        counts.infra_error_trajectories += int(np.count_nonzero(np.asarray(batch.infra_error)))
        counts.kept_trajectories += int(mask.sum())
        counts.kept_groups += len(np.unique(np.asarray(batch.group_ids)[mask])) if mask.any() else 0
        for reason, k in dropped.items():
            counts.dropped_groups[reason] += k
        if counts.kept_groups >= train_batch_groups or counts.gen_batches >= max_gen_batches:
            break
    return BatchAssembly(keep=keep, counts=counts, train_batch_groups=train_batch_groups)
