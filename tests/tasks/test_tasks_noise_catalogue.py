"""The noise catalogue on generated tasks: every kind is test-neutral; the oracle orders amounts."""

from __future__ import annotations

import ast
import itertools
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gagar.sandbox.base import Prediction
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, make_diff
from gagar.tasks.generate import generate_task
from gagar.tasks.noise import NoiseKind, NoiseNotApplicable, add_noise
from gagar.tasks.oracle import score_patch

TASKS = [generate_task(index, 23, verify=False) for index in range(6)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=st.sampled_from(TASKS), kind=st.sampled_from(list(NoiseKind)), seed=st.integers(0, 1 << 20))
def test_each_amount_of_a_kind_lowers_the_oracle_total(task: Task, kind: NoiseKind, seed: int) -> None:
    totals = [score_patch(task, task.patch).quality]
    for amount in (1, 2, 3):
        try:
            patch = add_noise(task, task.patch, [kind] * amount, rng=seed)
        except NoiseNotApplicable:
            break
        assert patch == add_noise(task, task.patch, [kind] * amount, rng=seed)  # a function of the seed
        totals.append(score_patch(task, patch).quality)
    assert all(a > b for a, b in itertools.pairwise(totals)), (kind, totals)


@settings(max_examples=30, deadline=None)
@given(task=st.sampled_from(TASKS), seed=st.integers(0, 1 << 20))
def test_more_kinds_rank_lower(task: Task, seed: int) -> None:
    rng = random.Random(seed)
    kinds = rng.sample(
        [NoiseKind.DEBUG_PRINT, NoiseKind.COMMENT, NoiseKind.UNRELATED_FILE, NoiseKind.DEAD_CODE], 3
    )
    totals = [score_patch(task, add_noise(task, task.patch, kinds[:n], rng=seed)).quality for n in (1, 2, 3)]
    assert totals[0] > totals[1] > totals[2]


@pytest.mark.skipif(os.geteuid() != 0, reason="the local sandbox drops to a sandbox uid: needs root")
def test_every_kind_twice_still_resolves_the_task_in_the_sandbox() -> None:
    jobs = []
    for index, task in enumerate(TASKS[:3]):
        for kind in NoiseKind:
            try:
                patch = add_noise(task, task.patch, [kind, kind], rng=index)
            except NoiseNotApplicable:
                continue
            jobs.append(
                (task, Prediction(instance_id=task.instance_id, model_patch=patch, trajectory_id=kind))
            )
    assert len(jobs) >= 3 * len(NoiseKind) - 3
    backend = LocalBackend(SandboxLimits(wall_time_s=60), LocalSandboxSettings(), workers=2)
    results = backend.evaluate(jobs)
    unresolved = [(r.trajectory_id, r.status, r.reason) for r in results if not r.resolved]
    assert unresolved == []


def test_grader_training_groups_span_at_least_four_quality_levels() -> None:
    from gagar.grader.sft import noise_groups

    groups = noise_groups(TASKS, groups_per_task=2, seed=5)
    assert len(groups) == 2 * len(TASKS)
    assert all(len(set(g.labels.values())) >= 4 for g in groups)
    assert noise_groups(TASKS[:1], seed=5)[0].labels == noise_groups(TASKS[:1], seed=5)[0].labels


def test_grader_training_groups_can_vary_in_size_like_rollout_groups() -> None:
    from gagar.grader.sft import noise_groups

    fixed = noise_groups(TASKS, groups_per_task=3, seed=5)
    varied = noise_groups(TASKS, groups_per_task=3, seed=5, min_size=2)
    assert {len(g.candidates) for g in fixed} == {5}
    sizes = [len(g.candidates) for g in varied]
    assert (min(sizes), max(sizes)) == (2, 5)
    assert all(len(set(g.labels.values())) == len(g.candidates) for g in varied)  # every level distinct
    with pytest.raises(ValueError, match="min_size"):
        noise_groups(TASKS, min_size=1)


_VERSION = {
    "semverish/__init__.py": "",
    "semverish/version.py": (
        "class Version:\n"
        "    def __init__(self, major):\n"
        "        self.major = major\n"
        "\n"
        "    def compare(self, other):\n"
        "        return (self.major < other.major) - (self.major > other.major)\n"
    ),
    "tests/test_version.py": (
        "from semverish.version import Version\n\n\n"
        "def test_compare():\n    assert Version(2).compare(Version(1)) == 1\n"
    ),
}


def test_kinds_acting_on_a_method_leave_every_file_parsing() -> None:
    fixed = _VERSION["semverish/version.py"].replace(
        "(self.major < other.major) - (self.major > other.major)",
        "(self.major > other.major) - (self.major < other.major)",
    )
    task = Task(
        instance_id="demo__semverish-1",
        repo="demo/semverish",
        snapshot=_VERSION,
        problem_statement="compare is reversed",
        patch=make_diff(_VERSION, {**_VERSION, "semverish/version.py": fixed}),
        FAIL_TO_PASS=["tests/test_version.py::test_compare"],
    )
    for kind in NoiseKind:
        try:
            patch = add_noise(task, task.patch, [kind, kind], rng=0)
        except NoiseNotApplicable:
            continue
        for path, text in apply_diff(task.snapshot, patch).items():  # type: ignore[arg-type]
            if path.endswith(".py"):
                ast.parse(text)  # a method's unused copy lands at module level, dedented
    copy = add_noise(task, task.patch, [NoiseKind.DEAD_CODE], rng=0)
    assert "+def _old_compare(self, other):" in copy
