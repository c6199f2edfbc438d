"""The learned grader: a small MLP scorer SFT-trained to rank a group's passing candidates.

Each candidate is scored from its workspace evidence (:func:`gagar.grader.features.model_inputs`,
standardised); training minimises the pairwise logistic (RankNet) loss over every pair of
candidates of a group that the labels order:

    L = mean over (i, j) with y_i > y_j of  log(1 + exp(-(s_i - s_j)))

Saved as ``model.safetensors`` plus ``config.json`` (feature names, standardisation, sizes), which
``--grader learned --grader-model DIR`` loads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from gagar.grader.base import Ranking
from gagar.grader.features import FEATURE_NAMES, evidence_line, group_features, model_inputs
from gagar.grader.workspace import GroupWorkspace
from gagar.records import atomic_write_text
from gagar.schema.grade import ranking_from_scores

__all__ = ["LearnedGrader", "ScorerConfig", "TrainingGroup", "load_scorer", "save_scorer", "train_scorer"]

VERSION = "2"
"""2: ``lines_out_of_scope`` counts lines off the group's core too (:func:`gagar.grader.tools.group_core`)."""


@dataclass(frozen=True)
class TrainingGroup:
    """One labelled group: raw features ``(n, n_features)`` and labels ``(n,)``, higher is better."""

    features: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class ScorerConfig:
    """Sizes and optimisation of the scorer."""

    hidden: int = 32
    epochs: int = 300
    step_size: float = 1e-2
    """Adam's learning rate for the scorer (the policy's optimisers own ``lr``)."""
    weight_decay: float = 1e-4
    seed: int = 0


class Scorer(torch.nn.Module):
    """``(n, n_inputs)`` standardised inputs -> ``(n,)`` scores."""

    def __init__(self, n_inputs: int, hidden: int, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(n_inputs, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std).squeeze(-1)


def _pairs(groups: Sequence[TrainingGroup]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All inputs ``(n_total, n_inputs)`` and index pairs ``(n_pairs,)`` (better, worse)."""
    inputs, better, worse = [], [], []
    offset = 0
    for g in groups:
        inputs.append(model_inputs(g.features))
        y = g.labels
        i, j = np.nonzero(y[:, None] > y[None, :])
        better.append(i + offset)
        worse.append(j + offset)
        offset += len(y)
    x = torch.from_numpy(np.concatenate(inputs))
    return x, torch.from_numpy(np.concatenate(better)), torch.from_numpy(np.concatenate(worse))


def train_scorer(
    groups: Sequence[TrainingGroup],
    config: ScorerConfig = ScorerConfig(),
    progress: Callable[[int, float], None] | None = None,
) -> Scorer:
    """Fit a scorer on labelled groups with the pairwise logistic loss (full batch, Adam).

    Raises:
        ValueError: if the groups hold no ordered pair to learn from.
    """
    x, better, worse = _pairs(groups)
    if len(better) == 0:
        raise ValueError("the training groups hold no pair of candidates with different labels")
    torch.manual_seed(config.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only loses time to thread handoffs
    try:
        return _fit(x, better, worse, config, progress)
    finally:
        torch.set_num_threads(threads)


def _fit(
    x: torch.Tensor,
    better: torch.Tensor,
    worse: torch.Tensor,
    config: ScorerConfig,
    progress: Callable[[int, float], None] | None,
) -> Scorer:
    mean, std = x.mean(0), x.std(0).clamp_min(1e-3)
    model = Scorer(x.shape[1], config.hidden, mean, std)
    optimiser = torch.optim.Adam(model.parameters(), lr=config.step_size, weight_decay=config.weight_decay)
    for epoch in range(config.epochs):
        scores = model(x)  # (n_total,)
        loss = torch.nn.functional.softplus(-(scores[better] - scores[worse])).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if progress is not None:
            progress(epoch, float(loss))
    return model.eval()


def save_scorer(model: Scorer, directory: str | Path, config: ScorerConfig) -> None:
    """Write ``model.safetensors`` and ``config.json`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"))
    meta = {
        "kind": "gagar-learned-grader",
        "version": VERSION,
        "features": list(FEATURE_NAMES),
        "n_inputs": int(model.mean.shape[0]),
        "hidden": config.hidden,
    }
    atomic_write_text(directory / "config.json", json.dumps(meta, indent=1))


def load_scorer(directory: str | Path) -> Scorer:
    """Load a scorer saved by :func:`save_scorer`.

    Raises:
        ValueError: if the folder is not a learned grader or was trained on other features.
    """
    directory = Path(directory)
    try:
        meta = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{directory}: no readable config.json of a learned grader ({exc})") from None
    if meta.get("kind") != "gagar-learned-grader":
        raise ValueError(f"{directory}/config.json: not a learned grader (kind {meta.get('kind')!r})")
    if meta.get("features") != list(FEATURE_NAMES):
        raise ValueError(f"{directory}: trained on other features ({meta.get('features')})")
    state = load_file(str(directory / "model.safetensors"))
    model = Scorer(meta["n_inputs"], meta["hidden"], state["mean"], state["std"])
    model.load_state_dict(state)
    return model.eval()


class LearnedGrader:
    """Ranks candidates by the scores of a trained :class:`Scorer`; independent of their order."""

    name = "learned"
    version = VERSION
    concurrency = 1
    max_candidates = None

    def __init__(self, model: Scorer) -> None:
        self.model = model

    @classmethod
    def load(cls, directory: str | Path) -> LearnedGrader:
        return cls(load_scorer(directory))

    def score(self, raw: np.ndarray) -> np.ndarray:
        """Scores ``(n,)`` of raw features ``(n, n_features)``."""
        with torch.no_grad():
            return self.model(torch.from_numpy(model_inputs(raw))).numpy().astype(np.float64)

    def rank(self, ws: GroupWorkspace, order: Sequence[str]) -> Ranking:
        ids = sorted(order)
        raw = group_features(ws, ids)
        scores = dict(zip(ids, self.score(raw).round(4).tolist(), strict=True))
        evidence = {t: evidence_line(row) for t, row in zip(ids, raw, strict=True)}
        return Ranking(ranking_from_scores(scores, decimals=4), scores, evidence)
