"""Task environments as container images, layered as SWE-bench's harness layers them.

A task records the environment its tests need (``environment.requirements``: a synthesized
library's pinned packages, or nothing for a generated task, which needs only the sandbox's
pytest). On Kubernetes its pod must run in an image that carries it. :func:`plan_images`
turns each distinct environment into layers, each a Dockerfile on top of the one before:

- **base**: the Python base image (the one the stage images build ``FROM``), the settings every
  task image shares;
- **environment**: the requirements installed into the base's interpreter (the ``python`` on
  ``PATH`` that a task's ``test_cmd`` runs), the same list giving the same image;
- **instance** (optional): the task's repository snapshot at ``image_repo_dir`` (SWE-bench's
  ``/testbed``), for tasks whose repository should travel in the image.

Each layer is tagged by a hash of its specification (its parent's tag, its Dockerfile and its
files), so identical specifications share one image and a changed one never reuses a stale
tag. :func:`build_images` builds what the engine does not have yet and records the image of
each task in ``environment.image``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gagar.errors import UserError
from gagar.schema.task import Task

__all__ = [
    "BuildReport",
    "CliEngine",
    "ImageBuildError",
    "ImageEngine",
    "ImageSettings",
    "Layer",
    "build_images",
    "plan_images",
    "requirements_of",
    "with_image",
]

LayerKind = Literal["base", "env", "instance"]


class ImageSettings(BaseSettings):
    """How task images are built and named; each field reads ``GAGAR_TASK_IMAGES__<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="GAGAR_TASK_IMAGES__", extra="ignore", frozen=True)

    base_image: str = "python:3.11.11-slim-bookworm"
    """Image the base layer starts from: it needs python3 with pip, as ``python`` on PATH."""
    repository: str = "localhost/gagar/task-env"
    """Repository part of every tag, registry host included; the tag part is ``<layer>-<hash>``. The
    default names the images as podman stores them and as a node resolves them once loaded into its
    engine; for a cluster that pulls, name a registry its nodes reach (and push the images there)."""
    engine: str = "podman"
    """Container engine command that builds (``podman`` or ``docker``)."""
    default_requirements: list[str] = Field(default_factory=lambda: ["pytest"])
    """What a task that names no requirements needs (a generated task: the sandbox's pytest)."""
    instance: bool = False
    """Also build an instance layer per task holding its repository snapshot at ``image_repo_dir``."""
    image_repo_dir: str = "/testbed"
    """Where the instance layer puts the repository (the Kubernetes backend's ``image_repo_dir``)."""


@dataclass(frozen=True)
class Layer:
    """One image to build: its Dockerfile on top of ``parent`` and the files of its build context."""

    kind: LayerKind
    parent: str
    dockerfile: str
    files: tuple[tuple[str, str], ...] = ()

    def digest(self) -> str:
        """Hash of the specification: parent tag, Dockerfile, files (16 hex digits)."""
        spec = json.dumps([self.kind, self.parent, self.dockerfile, list(self.files)])
        return hashlib.sha256(spec.encode("utf-8")).hexdigest()[:16]

    def tag(self, repository: str) -> str:
        """``repository:<kind>-<digest>``."""
        return f"{repository}:{self.kind}-{self.digest()}"


def _base_layer(settings: ImageSettings) -> Layer:
    dockerfile = (
        f"FROM {settings.base_image}\n"
        "ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1\n"
        'LABEL dev.gagar.layer="base"\n'
        "RUN python -c 'import sys; assert sys.version_info >= (3, 8), sys.version'\n"
    )
    return Layer("base", settings.base_image, dockerfile)


def requirements_of(task: Task, settings: ImageSettings) -> tuple[str, ...]:
    """The environment's requirements, sorted and without duplicates (the defaults when it names none)."""
    wanted = task.environment.requirements or settings.default_requirements
    return tuple(sorted({r.strip() for r in wanted if r.strip()}, key=str.lower))


def _env_layer(base_tag: str, requirements: Sequence[str]) -> Layer:
    dockerfile = (
        f"FROM {base_tag}\n"
        'LABEL dev.gagar.layer="env"\n'
        "COPY requirements.txt /opt/gagar-env/requirements.txt\n"
        "RUN python -m pip install -r /opt/gagar-env/requirements.txt && python -m pytest --version\n"
    )
    return Layer("env", base_tag, dockerfile, (("requirements.txt", "\n".join(requirements) + "\n"),))


def _instance_layer(env_tag: str, task: Task, repo_dir: str) -> Layer:
    files = tuple(sorted((f"repo/{path}", text) for path, text in (task.snapshot or {}).items()))
    dockerfile = f'FROM {env_tag}\nLABEL dev.gagar.layer="instance"\nCOPY repo/ {repo_dir}/\n'
    return Layer("instance", env_tag, dockerfile, files)


@dataclass(frozen=True)
class Plan:
    """Every layer to have (parents first, each once) and the image of each task by instance id."""

    layers: tuple[Layer, ...]
    images: dict[str, str]


def plan_images(tasks: Iterable[Task], settings: ImageSettings) -> Plan:
    """The layers of the tasks' distinct environments and the image each task runs in.

    Raises:
        ValueError: an instance layer was asked for a task without a snapshot.
    """
    base = _base_layer(settings)
    base_tag = base.tag(settings.repository)
    layers: dict[str, Layer] = {base_tag: base}
    images: dict[str, str] = {}
    for task in tasks:
        env = _env_layer(base_tag, requirements_of(task, settings))
        image = env.tag(settings.repository)
        layers.setdefault(image, env)
        if settings.instance:
            if task.snapshot is None:
                raise ValueError(
                    f"task {task.instance_id!r}: an instance layer needs its snapshot (field snapshot)"
                )
            instance = _instance_layer(image, task, settings.image_repo_dir)
            image = instance.tag(settings.repository)
            layers.setdefault(image, instance)
        images[task.instance_id] = image
    return Plan(tuple(layers.values()), images)


class ImageBuildError(UserError):
    """The engine is missing or refused a build (its output's tail is in the message)."""


class ImageEngine(Protocol):
    """What building needs of a container engine."""

    def exists(self, tag: str) -> bool:
        """Whether the engine has an image ``tag``."""
        ...

    def build(self, tag: str, dockerfile: str, files: Sequence[tuple[str, str]]) -> None:
        """Build ``dockerfile`` with ``files`` as its context, tagged ``tag`` (ImageBuildError on failure)."""
        ...


@dataclass(frozen=True)
class CliEngine:
    """podman or docker through their command line."""

    command: str = "podman"
    timeout_s: float = 3600.0

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except FileNotFoundError:
            raise ImageBuildError(
                f"container engine {self.command!r} not found (GAGAR_TASK_IMAGES__ENGINE)"
            ) from None

    def exists(self, tag: str) -> bool:
        return self._run([self.command, "image", "inspect", tag]).returncode == 0

    def build(self, tag: str, dockerfile: str, files: Sequence[tuple[str, str]]) -> None:
        with tempfile.TemporaryDirectory(prefix="gagar-image-") as context:
            root = Path(context)
            (root / "Dockerfile").write_text(dockerfile, encoding="utf-8")
            for rel, text in files:
                path = root / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            proc = self._run([self.command, "build", "-t", tag, "-f", str(root / "Dockerfile"), str(root)])
        if proc.returncode != 0:
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            raise ImageBuildError(f"{self.command} build of {tag} failed: {tail}")


@dataclass
class BuildReport:
    """What :func:`build_images` did."""

    built: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)

    def line(self, tasks: int) -> str:
        """One line for the command's output."""
        images = len(self.built) + len(self.existing)
        return f"{tasks} tasks, {images} images: {len(self.built)} built, {len(self.existing)} already there"


def build_images(
    tasks: Sequence[Task],
    settings: ImageSettings,
    engine: ImageEngine,
    on_layer: Callable[[str, bool], None] | None = None,
) -> tuple[list[Task], BuildReport]:
    """Build the tasks' images the engine lacks (parents first); return the tasks with
    ``environment.image`` set, and what was built. ``on_layer(tag, built)`` reports each layer."""
    plan = plan_images(tasks, settings)
    report = BuildReport()
    for layer in plan.layers:
        tag = layer.tag(settings.repository)
        built = not engine.exists(tag)
        if built:
            engine.build(tag, layer.dockerfile, layer.files)
            report.built.append(tag)
        else:
            report.existing.append(tag)
        if on_layer is not None:
            on_layer(tag, built)
    return [with_image(t, plan.images[t.instance_id]) for t in tasks], report


def with_image(task: Task, image: str) -> Task:
    """``task`` with ``environment.image`` set to ``image``."""
    return task.model_copy(update={"environment": task.environment.model_copy(update={"image": image})})
