"""Names of the stage images every component runs in (one image per stage), and their CPU variants."""

from __future__ import annotations

from gagar import __version__

__all__ = ["CPU_BASE", "CPU_BUILD_ARGS", "CPU_TORCH", "DEFAULT_REGISTRY", "STAGES", "stage_image"]

STAGES = ("rollout", "sandbox", "grader", "redistribute", "train")
"""The pipeline stages, each with an image of its own (``images/<stage>/Dockerfile``)."""

DEFAULT_REGISTRY = "ghcr.io/gagar-project"
"""Registry and organisation the release images are pushed to."""

CPU_BASE = "python:3.11.11-slim-bookworm"
"""Base of every image that builds without a GPU base."""
CPU_TORCH = "torch==2.13.0+cpu"
"""The CPU build of the torch the project pins (a local wheel: no index serves it to these builds)."""
CPU_BUILD_ARGS: dict[str, dict[str, str]] = {
    "rollout": {"BASE": CPU_BASE, "TORCH": CPU_TORCH},
    "grader": {"TORCH": CPU_TORCH},
    "train": {"TORCH": CPU_TORCH},
}
"""Build arguments of the CPU variant of each stage whose default build needs CUDA (a base or a wheel)."""


def stage_image(
    stage: str, registry: str = DEFAULT_REGISTRY, tag: str = __version__, variant: str | None = None
) -> str:
    """``<registry>/gagar-<stage>:<tag>``, e.g. ``ghcr.io/gagar-project/gagar-rollout:0.1.0``.

    ``variant="cpu"`` names the CPU variant, ``<tag>-cpu``, of a stage that has one
    (:data:`CPU_BUILD_ARGS`); the other stages have one image for both.

    Raises:
        ValueError: ``stage`` is not one of :data:`STAGES`, the registry or tag is empty, or the
            variant is not ``cpu``.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}: choose one of {', '.join(STAGES)}")
    if not registry.strip("/") or not tag:
        raise ValueError(f"an image needs a registry and a tag, got registry {registry!r} and tag {tag!r}")
    if variant not in (None, "cpu"):
        raise ValueError(f"unknown image variant {variant!r}: use 'cpu' or None (the release images)")
    suffix = "-cpu" if variant == "cpu" and stage in CPU_BUILD_ARGS else ""
    return f"{registry.rstrip('/')}/gagar-{stage}:{tag}{suffix}"
