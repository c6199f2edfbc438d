"""Two scheduled-like runs of the pipeline through kfp.local push growing totals to a real Pushgateway.

Each run is one step in a fresh pipeline run resuming the same store, as a nightly recurring run
would; the second run's pushed ``_total`` counters hold both runs' counts (not one step's), the run
is marked active while it trains and finished by its last step, so no stall alert fires between runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fixtures.services import Pushgateway, http_get
from gagar.embedded import SHIPPED_POLICY
from gagar.pipeline.local import run_local
from gagar.pipeline.parameters import parameters_from_config
from gagar.records import write_records
from gagar.tasks.generate import generate_tasks
from gagar.train.config import TrainConfig

pytestmark = pytest.mark.slow


def _pushed(gateway: Pushgateway) -> dict[str, float]:
    """``{sample name{labels}: value}`` of every gagar sample the Pushgateway holds."""
    text = http_get(f"{gateway.url}/metrics").decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("gagar_"):
                labels = ",".join(
                    f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("instance",)
                )
                found[f"{sample.name}{{{labels}}}"] = sample.value
    return found


def _sum(pushed: dict[str, float], name: str) -> float:
    """The sum of a metric's samples over its labels (evaluations by status, …)."""
    matches = [v for k, v in pushed.items() if k.startswith(f"{name}{{")]
    assert matches, f"nothing pushed as {name}"
    return sum(matches)


def test_two_runs_push_totals_that_grow(pushgateway: Pushgateway, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    write_records(tasks, generate_tasks(2, seed=1000, split="train"))
    config = TrainConfig.from_values(
        {
            "tasks": str(tasks),
            "policy": str(SHIPPED_POLICY),
            "rollout": {"group_size": 2, "gen_batch_groups": 2, "train_batch_groups": 1, "max_gen_batches": 1,
                        "max_new_tokens": 96},
            "sandbox": {"workers": 2},
            "optim": {"minibatch_size": 4},
            "metrics": {"pushgateway": pushgateway.url, "job": "gagar-nightly"},
        }
    )  # fmt: skip
    arguments = {**parameters_from_config(config), "storage": str(tmp_path / "store")}

    first = run_local(arguments, out=tmp_path / "run-1", steps=1, max_gen_batches=1)
    after_first = _pushed(pushgateway)
    second = run_local(arguments, out=tmp_path / "run-2", steps=1, max_gen_batches=1)
    after_second = _pushed(pushgateway)

    assert [r["step"] for r in first.steps] == [0]
    assert [r["step"] for r in second.steps] == [1]  # the second run resumed the store
    evaluations = "gagar_sandbox_evaluations_total"
    assert _sum(after_first, evaluations) == first.steps[0]["sandbox/evaluations"] == 4.0
    assert _sum(after_second, evaluations) == 8.0  # both runs' evaluations: a total that grows
    trajectories = "gagar_trajectories_total"
    assert _sum(after_second, trajectories) > _sum(after_first, trajectories)
    for pushed in (after_first, after_second):  # each run's last step marked it finished, not failed
        assert _sum(pushed, "gagar_run_active") == 0.0
        assert _sum(pushed, "gagar_run_failed") == 0.0
