"""Refill in the pipelines: gather (once per generation batch) and select (once a step) count and keep
exactly what in-process dynamic sampling (``gagar.rl_step.select``) does on the same batches.

The pipeline draws batch b+1 only when gather-b says ``short``; in process, ``select`` consumes a
lazy stream of batches. Both must stop at the same batch and keep the same trajectories, with the
same ``sampling/…`` counts (generated, kept, dropped by reason, infra errors).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gagar import rl_step
from gagar.pipeline import store_stages
from gagar.pipeline.parameters import parameters_from_config
from gagar.records import read_records, write_records
from gagar.schema import KeptBatch, Status, TestResult, Trajectory
from gagar.schema.selection import GeneratedBatch
from gagar.train.config import RolloutSettings, TrainConfig

OUTCOMES = st.sampled_from(["pass", "fail", "infra"])


def _batch(b: int, groups: list[list[str]]) -> GeneratedBatch:
    trajectories, results = [], []
    for g, members in enumerate(groups):
        for m, outcome in enumerate(members):
            tid, gid = f"t{g}-gen{b}/{m}", f"t{g}/step0-gen{b}"
            trajectories.append(Trajectory(trajectory_id=tid, instance_id=f"t{g}", group_id=gid))
            status = {"pass": Status.PASSED, "fail": Status.FAILED, "infra": Status.INFRA_ERROR}[outcome]
            results.append(
                TestResult(trajectory_id=tid, instance_id=f"t{g}", status=status, resolved=outcome == "pass")
            )
    return GeneratedBatch(trajectories, results)


def run_pipeline_selection(
    root: Path, batches: list[GeneratedBatch], train_batch_groups: int, max_gen_batches: int
) -> tuple[int, KeptBatch, dict[str, float]]:
    """What the pipeline's gather and select stages do with ``batches`` (batch b+1 drawn only while
    gather says short): (batches drawn, the selection, select's metrics)."""
    storage = str(root / "store")
    rollout = {"train_batch_groups": train_batch_groups, "max_gen_batches": max_gen_batches}
    config = TrainConfig.from_values({"tasks": "tasks.jsonl", "policy": "policy", "rollout": rollout})
    settings = {**parameters_from_config(config), "storage": storage}
    drawn = 0
    for b in range(max_gen_batches):
        paths = {name: root / f"{name}-{b}.jsonl" for name in ("trajectories", "results")}
        write_records(paths["trajectories"], batches[b].trajectories)
        write_records(paths["results"], batches[b].results)
        outcome = store_stages.gather(
            settings=settings, step=0, gen_batch=b, trajectories=str(paths["trajectories"]),
            results=str(paths["results"]), rollout_metrics={}, sandbox_metrics={},
        )  # fmt: skip
        drawn += 1
        if b == max_gen_batches - 1:
            assert not outcome.short  # no batch is asked for beyond what the run allows
        if not outcome.short:
            break
    out = {name: root / f"selected-{name}.jsonl" for name in ("trajectories", "results", "selection")}
    metrics = store_stages.select(
        settings=settings, step=0, **{name: str(path) for name, path in out.items()}
    )
    (kept,) = read_records(out["selection"], KeptBatch)
    assert len(read_records(out["trajectories"], Trajectory)) == int(
        metrics["sampling/trajectories_generated"]
    )
    assert len(read_records(out["results"], TestResult)) == int(metrics["sampling/trajectories_generated"])
    return drawn, kept, metrics


@settings(max_examples=25, deadline=None)
@given(
    data=st.lists(
        st.lists(st.lists(OUTCOMES, min_size=2, max_size=4), min_size=1, max_size=3), min_size=3, max_size=3
    ),
    train_batch_groups=st.integers(1, 4),
    max_gen_batches=st.integers(1, 3),
)
def test_pipeline_refill_counts_equal_in_process_selection(
    tmp_path_factory, data: list[list[list[str]]], train_batch_groups: int, max_gen_batches: int
) -> None:
    batches = [_batch(b, groups) for b, groups in enumerate(data)]
    root = tmp_path_factory.mktemp("refill")
    drawn, kept, metrics = run_pipeline_selection(root, batches, train_batch_groups, max_gen_batches)

    consumed: list[int] = []

    def lazily() -> object:
        for b, batch in enumerate(batches):
            consumed.append(b)
            yield batch

    expected = rl_step.select(
        lazily(), RolloutSettings(train_batch_groups=train_batch_groups, max_gen_batches=max_gen_batches)
    )
    assert drawn == len(consumed) == int(expected.metrics["sampling/gen_batches"])
    assert kept == expected.kept_batch
    assert {k: v for k, v in metrics.items() if k.startswith("sampling/")} == expected.metrics
    assert (
        metrics["sandbox/evaluations"]
        == metrics["rollout/trajectories"]
        == float(sum(len(b.trajectories) for b in batches[:drawn]))
    )


def test_a_second_attempt_of_a_step_forgets_the_first_attempts_batches(tmp_path: Path) -> None:
    """A step that failed after drawing two batches and is run again from batch 0 (now full at
    once) selects over the new batch 0 alone, not the stale batch 1."""
    short = [_batch(0, [["fail", "fail"]]), _batch(1, [["pass", "fail"]])]
    run_pipeline_selection(tmp_path / "first", short, train_batch_groups=2, max_gen_batches=2)
    full = [_batch(0, [["pass", "fail"], ["fail", "pass"]])]
    root = tmp_path / "first"  # the same store
    drawn, kept, metrics = run_pipeline_selection(
        root, full + short[1:], train_batch_groups=2, max_gen_batches=2
    )
    assert drawn == 1
    assert metrics["sampling/gen_batches"] == 1.0
    assert {k.gen_batch for k in kept.kept} == {0}
