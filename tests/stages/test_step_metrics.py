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
from gagar.metrics import METRICS, RUN_ACTIVE_KEY, build_metrics, record_step, step_observations
from gagar.policy.agent import AgentKind, AgentSettings
from gagar.policy.tool_loop import run_tool_loops
from gagar.records import read_records, write_records
from gagar.sandbox.patch import file_diff
from gagar.schema.result import TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import SamplingParams, Trajectory
from gagar.train.config import TrainConfig

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
    results_path = tmp_path / "results-0.jsonl"
    step: dict[str, float] = {"step": 0.0}
    step |= stages.sandbox_stage(
        tasks=tasks_file, trajectories=trajectories_file, out=results_path, workers=2, progress=False
    )
    # The step's phases after evaluation, as every runner calls them.
    config = TrainConfig.from_values(
        {
            "tasks": str(tasks_file),
            "policy": str(tiny_policy),
            "rollout": {"train_batch_groups": 2, "max_gen_batches": 1},
            "optim": {"minibatch_size": 4},
        }
    )
    generated = rl_step.generation_batch(
        read_records(trajectories_file, Trajectory), read_records(results_path, TestResult)
    )
    selection = rl_step.select([generated], config.rollout)
    grades, grade_metrics = rl_step.grade(
        config, rl_step.make_grader(config), read_records(tasks_file, Task), selection.trajectories,
        selection.results, tmp_path / "workspace",
    )  # fmt: skip
    assert grades is not None
    step |= grade_metrics
    batch, advantage_metrics = rl_step.advantages(config.advantage, selection.kept_batch, grades)
    step |= selection.metrics | advantage_metrics
    step |= rl_step.update(
        config, policy=tiny_policy, trajectories=selection.trajectories, batch=batch,
        checkpoints=tmp_path / "checkpoints", step=0, policy_version=None, reference=None,
    )  # fmt: skip
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

    # The run's own gauges: every pushed step marks it active (publish_step), its end finished (finish_run).
    before = _samples(m.registry)
    record_step(m, {RUN_ACTIVE_KEY: 1.0})
    moved |= _moved(before, _samples(m.registry))
    before = _samples(m.registry)
    record_step(m, {RUN_ACTIVE_KEY: 0.0, "run/failed": 1.0, "run/finished": 1.0})
    moved |= _moved(before, _samples(m.registry))

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
