"""Names of the stage images every component runs in (one image per stage)."""

from __future__ import annotations

from gagar import __version__

__all__ = ["DEFAULT_REGISTRY", "STAGES", "stage_image"]

STAGES = ("rollout", "sandbox", "grader", "redistribute", "train")
"""The pipeline stages, each with an image of its own (``images/<stage>/Dockerfile``)."""

DEFAULT_REGISTRY = "ghcr.io/gagar-project"
"""Registry and organisation the release images are pushed to."""


def stage_image(stage: str, registry: str = DEFAULT_REGISTRY, tag: str = __version__) -> str:
    """``<registry>/gagar-<stage>:<tag>``, e.g. ``ghcr.io/gagar-project/gagar-rollout:0.1.0``.

    Raises:
        ValueError: ``stage`` is not one of :data:`STAGES`, or the registry or tag is empty.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}: choose one of {', '.join(STAGES)}")
    if not registry.strip("/") or not tag:
        raise ValueError(f"an image needs a registry and a tag, got registry {registry!r} and tag {tag!r}")
    return f"{registry.rstrip('/')}/gagar-{stage}:{tag}"
