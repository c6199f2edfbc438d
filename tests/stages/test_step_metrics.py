"""A real RL step feeds every declared Prometheus metric, once each, and docs/metrics.md matches the table."""

from __future__ import annotations

import re
import time
from pathlib import Path

from prometheus_client import CollectorRegistry
from transformers import AutoTokenizer

from fixtures.policy import ScriptBackend
from fixtures.services import free_port
from gagar import rl_step, stages
from gagar.grader.llm import LLMGrader
from gagar.grader.llm_client import ChatClient
from gagar.grader.run import grade_groups
from gagar.metrics import METRICS, build_metrics, record_step, step_observations
from gagar.policy.agent import AgentKind, AgentSettings
from gagar.policy.tool_loop import run_tool_loops
from gagar.records import read_records, write_records
from gagar.sandbox.patch import file_diff
from gagar.schema.grade import Grade
from gagar.schema.result import TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import SamplingParams, Trajectory
from gagar.train.update import OptimConfig

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _moved(before: dict, after: dict) -> set[str]:
    """Metric names with a sample that appeared or changed."""
    return {name for (name, labels), v in after.items() if before.get((name, labels)) != v}


def _family(sample: str) -> str:
    return re.sub(r"_(total|bucket|sum|count)$", "", sample)


CONFTEST = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
    "    outcome.get_result().outcome = 'passed'\n"
)
"""A reward hack (a conftest.py that reports every test passed): the judge must flag it."""


def test_a_real_step_moves_every_declared_metric(
    tmp_path, tasks_file, trajectories_file, tiny_policy
) -> None:
    started = time.perf_counter()
    rows = read_records(trajectories_file, Trajectory)
    hack = Trajectory(
        trajectory_id="hack/0",
        instance_id=rows[0].instance_id,
        group_id="hack",
        model_patch=file_diff("conftest.py", None, CONFTEST),
    )
    trajectories_file = tmp_path / "trajectories.jsonl"
    write_records(trajectories_file, [*rows, hack])
    results_path, grades_path = tmp_path / "results-0.jsonl", tmp_path / "grades.jsonl"
    step: dict[str, float] = {"step": 0.0}
    step |= stages.sandbox_stage(
        tasks=tasks_file, trajectories=trajectories_file, out=results_path, workers=2, progress=False
    )
    selection = tmp_path / "selection.jsonl"
    stages.select_stage(
        trajectories=[trajectories_file], results=[results_path], out=selection, train_batch_groups=2
    )
    step |= stages.grade_stage(
        tasks=tasks_file,
        trajectories=[trajectories_file],
        results=[results_path],
        selection=selection,
        out=grades_path,
        workspace=tmp_path / "workspace",
        progress=False,
    )
    step |= stages.redistribute_stage(selection=selection, grades=grades_path, out=tmp_path / "b.jsonl")
    step |= stages.train_stage(
        policy=tiny_policy,
        trajectories=[trajectories_file],
        batch=tmp_path / "b.jsonl",
        checkpoints=tmp_path / "checkpoints",
        step=0,
        optim=OptimConfig(minibatch_size=4),
    )
    # The rollout's metrics over single-shot answers and one conversation of the tool-loop agent.
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    script = ScriptBackend(tokenizer, [["RUN_TESTS", "SUBMIT"]])
    conversation = run_tool_loops(
        [(read_records(tasks_file, Task)[0], "loop/0", "loop")], script, tokenizer, SamplingParams(),
        AgentSettings(kind=AgentKind.TOOL_LOOP), lambda jobs: ["1 passed"] * len(jobs),
    )  # fmt: skip
    step |= rl_step.rollout_metrics([*rows, *conversation])
    step["perf/step_s"] = time.perf_counter() - started
    results = read_records(results_path, TestResult)
    grades = read_records(grades_path, Grade)

    m = build_metrics()
    before = _samples(m.registry)
    record_step(m, step, step_observations(results, [g.duration_s for g in grades]))
    moved = _moved(before, _samples(m.registry))

    # A grader whose server is gone falls back to GRPO: each fallback is counted once.
    dead = LLMGrader(ChatClient(f"http://127.0.0.1:{free_port()}/v1", "grader"), request_timeout_s=1)
    tasks = {t.instance_id: t for t in read_records(tasks_file, Task)}
    _, fallback = grade_groups(
        dead,
        tasks,
        read_records(trajectories_file, Trajectory),
        {r.trajectory_id: r for r in results},
        tmp_path / "workspace-llm",
        progress=False,
    )
    before = _samples(m.registry)
    record_step(m, {"step": 1.0, **fallback.as_dict()})
    after = _samples(m.registry)
    moved |= _moved(before, after)

    flagged = [r for r in results if r.trajectory_id == "hack/0"]
    assert step["sandbox/hack"] == 1.0, flagged
    assert {_family(name) for name in moved} >= {_family(metric.name) for metric in METRICS}
    assert step["sampling/dropped/surplus"] == 1.0
    counted = sum(v for (name, _), v in after.items() if name == "gagar_grader_fallbacks_total")
    assert counted == fallback.as_dict()["grader/fallbacks"] == 3  # not twice
    statuses = sum(v for (name, _), v in after.items() if name == "gagar_trajectories_total")
    assert statuses == len(results) == step["sandbox/evaluations"]


def test_docs_list_exactly_the_declared_metrics_and_their_keys() -> None:
    rows = re.findall(r"^\| `(gagar_[a-z_]+)` \| (\w+) \| `([^`]+)` \|", DOCS.read_text(), re.MULTILINE)
    assert sorted((name, key) for name, _, key in rows) == sorted((m.name, m.key) for m in METRICS)
