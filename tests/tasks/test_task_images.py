"""Task environments as images: one image per distinct environment, tagged by its specification,
layered base -> environment -> optional instance, built parents first, skipped when present."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gagar.cli import app
from gagar.schema.task import Environment, Task
from gagar.tasks.images import ImageSettings, build_images, plan_images, requirements_of
from gagar.tasks.loaders import load_tasks, write_tasks

PIN = st.from_regex(r"[a-z]{1,8}==[0-9]\.[0-9]", fullmatch=True)


def task(instance_id: str, requirements: list[str] | None = None, snapshot: dict | None = None) -> Task:
    return Task(
        instance_id=instance_id,
        repo="demo/lib",
        base_commit=None if snapshot else "0" * 40,
        snapshot=snapshot,
        problem_statement="p",
        patch="",
        FAIL_TO_PASS=["tests/test_a.py::test_a"],
        environment=Environment(requirements=requirements or []),
    )


class FakeEngine:
    """Records builds; an image exists once built (or when listed at the start)."""

    def __init__(self, present: set[str] | None = None) -> None:
        self.present = set(present or ())
        self.builds: list[tuple[str, str]] = []

    def exists(self, tag: str) -> bool:
        return tag in self.present

    def build(self, tag: str, dockerfile: str, files) -> None:
        parent = dockerfile.split("\n", 1)[0].removeprefix("FROM ")
        assert parent in self.present or not parent.startswith("gagar/"), f"{tag} built before {parent}"
        self.builds.append((tag, dockerfile))
        self.present.add(tag)


def test_one_image_per_distinct_environment_recorded_in_each_task() -> None:
    tasks = [
        task("a-1", ["inflection==0.5.1", "pytest==8.3.4"]),
        task("a-2", ["pytest==8.3.4", "inflection==0.5.1"]),  # same set, other order
        task("b-1", ["semver==3.0.2", "pytest==8.3.4"]),
        task("gen-1"),  # a generated task: the defaults
    ]
    engine = FakeEngine()
    out, report = build_images(tasks, ImageSettings(), engine)
    images = {t.instance_id: t.environment.image for t in out}
    assert images["a-1"] == images["a-2"] != images["b-1"]
    assert len(set(images.values())) == 3
    assert all(image.startswith("localhost/gagar/task-env:env-") for image in images.values())
    assert len(report.built) == 4  # base + three environments
    assert report.built[0].startswith("localhost/gagar/task-env:base-")
    env = dict(engine.builds)[images["gen-1"]]
    assert env.startswith(f"FROM {report.built[0]}\n")
    assert "pip install -r /opt/gagar-env/requirements.txt" in env
    again, second = build_images(out, ImageSettings(), engine)
    assert (second.built, len(second.existing)) == ([], 4)
    assert [t.environment.image for t in again] == [t.environment.image for t in out]


def test_the_defaults_fill_an_environment_that_names_nothing() -> None:
    assert requirements_of(task("g"), ImageSettings()) == ("pytest",)
    assert requirements_of(task("g", ["b==1", "a==2", "b==1"]), ImageSettings()) == ("a==2", "b==1")


@settings(max_examples=50, deadline=None)
@given(st.sets(PIN, min_size=1, max_size=6), st.sets(PIN, min_size=1, max_size=6))
def test_the_tag_is_a_function_of_the_specification(one: set[str], other: set[str]) -> None:
    cfg = ImageSettings()
    first = plan_images([task("x", sorted(one))], cfg).images["x"]
    shuffled = plan_images([task("x", sorted(one, reverse=True))], cfg).images["x"]
    second = plan_images([task("x", sorted(other))], cfg).images["x"]
    assert first == shuffled
    assert (first == second) == (one == other)
    rebased = plan_images([task("x", sorted(one))], ImageSettings(base_image="python:3.12-slim")).images["x"]
    assert rebased != first


def test_an_instance_layer_carries_the_snapshot_and_needs_one() -> None:
    cfg = ImageSettings(instance=True)
    engine = FakeEngine()
    snap = {"lib/a.py": "x = 1\n", "tests/test_a.py": "def test_a():\n    pass\n"}
    (out,), report = build_images([task("s", ["pytest==8.3.4"], snap)], cfg, engine)
    assert out.environment.image.startswith("localhost/gagar/task-env:instance-")
    assert len(report.built) == 3
    assert "COPY repo/ /testbed/" in dict(engine.builds)[out.environment.image]
    with pytest.raises(ValueError, match=r"'bare'.*snapshot"):
        plan_images([task("bare")], cfg)  # a SWE-bench task: its image is the instance's


def test_the_command_builds_through_the_engine_cli_and_writes_the_tasks(tmp_path: Path) -> None:
    """``gagar tasks build-images`` with a stand-in engine executable that keeps tags as files."""
    store = tmp_path / "store"
    store.mkdir()
    engine = tmp_path / "engine"
    engine.write_text(
        "#!/bin/sh\n"
        f'STORE="{store}"\n'
        'if [ "$1 $2" = "image inspect" ]; then test -e "$STORE/$(echo "$3" | tr /: __)"; exit $?; fi\n'
        'if [ "$1" = "build" ]; then test -s "$5" || exit 3\n'
        '  touch "$STORE/$(echo "$3" | tr /: __)"; exit 0; fi\n'
        "exit 2\n"
    )
    engine.chmod(engine.stat().st_mode | stat.S_IXUSR)
    tasks_in, tasks_out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_tasks(tasks_in, [task("a", ["pytest==8.3.4"]), task("b", ["pytest==8.3.4"])])
    runner = CliRunner()
    argv = [
        "tasks",
        "build-images",
        "--tasks",
        str(tasks_in),
        "--out",
        str(tasks_out),
        "--engine",
        str(engine),
    ]
    first = runner.invoke(app, argv, env={**os.environ})
    assert first.exit_code == 0, first.output
    assert "2 tasks, 2 images: 2 built, 0 already there" in first.output
    (a, b) = load_tasks(tasks_out)
    assert a.environment.image == b.environment.image
    assert len(list(store.iterdir())) == 2
    second = runner.invoke(app, argv)
    assert "0 built, 2 already there" in second.output
    broken = runner.invoke(app, [*argv[:-1], str(tmp_path / "no-such-engine")])
    assert broken.exit_code == 2
    assert "container engine" in broken.output
    assert "Traceback" not in broken.output
