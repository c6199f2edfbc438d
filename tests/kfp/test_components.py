"""Component folders as in kubeflow/pipelines-components, and the two test tiers of every component:
its Python function called directly (``component.python_func``), and the component alone through
``kfp.local`` (each input file copied in by a one-line component), on the tiniest real inputs.

A kfp.local run costs about a second of orchestration plus the component's imports and work: the
ones that import torch in their subprocess (rollout, train, grader_sft: ~8 s each) are slow."""

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import dsl, local
from kfp.dsl import Dataset, Markdown, Metrics, Model

from fixtures.policy import untrained_policy_and_tasks
from fixtures.records import one_generation_batch
from gagar import rl_step
from gagar.advantage import Estimator
from gagar.pipeline.graph import RL_STEP
from gagar.pipeline.parameters import parameters_from_config
from gagar.records import read_records, write_records
from gagar.schema import Grade, KeptBatch, Status, TestResult, Trajectory
from gagar.train.config import AdvantageSettings, RolloutSettings, TrainConfig

FOLDERS_BY_NAME = {
    p.name: p
    for root in importlib.import_module("gagar.components").__path__  # the checkout's components/ too
    for p in Path(root).iterdir()
    if (p / "component.py").is_file()
}
FOLDERS = sorted(FOLDERS_BY_NAME)


def component(name: str) -> Any:
    return getattr(importlib.import_module(f"gagar.components.{name}.component"), name)


def test_every_component_folder_looks_the_same() -> None:
    assert {s.name for s in RL_STEP} <= set(FOLDERS)  # folder, component and stage share one name
    for name in FOLDERS:
        folder = FOLDERS_BY_NAME[name]
        assert (folder / "README.md").is_file(), name
        meta = yaml.safe_load((folder / "metadata.yaml").read_text())
        assert meta["name"] == name
        assert {"tier", "stability", "dependencies", "lastVerified"} <= set(meta)
        image = component(name).component_spec.implementation.container.image
        assert f"/gagar-{meta['image']}:" in image, (name, image)


def test_every_component_has_both_test_tiers() -> None:
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    for name in FOLDERS:
        assert f"{name}_called_directly" in tested, name
        assert f"{name}_through_kfp_local" in tested, name


# --------------------------------------------------------------------------- inputs


def settings(storage: Path, tasks: Path | str = "tasks.jsonl", policy: Path | str = "models/initial",
             **sections: Any) -> dict[str, Any]:  # fmt: skip
    """The pipeline's parameters (what every component takes as ``settings``) of a run of ``tasks``
    and ``policy`` with its store at ``storage``, two sandbox workers and ``sections`` changed."""
    values = {"tasks": str(tasks), "policy": str(policy), "sandbox": {"workers": 2}} | sections
    return {**parameters_from_config(TrainConfig.from_values(values)), "storage": str(storage)}


def write_selection(
    trajectories: Path, results: Path, out: Path, train_batch_groups: int
) -> rl_step.Selection:
    """Dynamic sampling over the one generation batch in ``trajectories`` and ``results``, its
    selection written to ``out`` (the select stage's output)."""
    batch = rl_step.generation_batch(
        read_records(trajectories, Trajectory), read_records(results, TestResult)
    )
    chosen = rl_step.select(
        [batch], RolloutSettings(train_batch_groups=train_batch_groups, max_gen_batches=1)
    )
    write_records(out, [chosen.kept_batch])
    return chosen


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two groups of two generated tasks (one mixed, one all-fail; the passing members carry the gold
    patch), the mixed group's grade, and the selection dynamic sampling makes of them."""
    root = tmp_path_factory.mktemp("records")
    paths = one_generation_batch(root)
    paths["selection"] = root / "selection.jsonl"
    write_selection(paths["trajectories"], paths["results"], paths["selection"], train_batch_groups=2)
    return paths


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny untrained policy (one layer, 32 wide) for the same generated tasks."""
    return untrained_policy_and_tasks(tmp_path_factory.mktemp("policy"))[0]


@pytest.fixture(scope="module")
def train_inputs(
    tmp_path_factory: pytest.TempPathFactory, records: dict[str, Path], policy: Path
) -> dict[str, Path]:
    """The policy's own trajectories (one group of two) with the first one passing, and the
    train batch redistribute makes of them: what the train component needs."""
    from gagar.pipeline import store_stages

    root = tmp_path_factory.mktemp("train-inputs")
    paths = {name: root / f"{name}.jsonl" for name in ("trajectories", "results", "grades", "selection")}
    store_stages.rollout(
        settings=settings(root / "store", records["tasks"], policy, rollout=ROLLOUT), policy=str(policy),
        tasks=str(records["tasks"]), trajectories=str(paths["trajectories"]), step=0, gen_batch=0,
    )  # fmt: skip
    rows = read_records(paths["trajectories"], Trajectory)
    write_records(
        paths["results"],
        [
            TestResult(
                trajectory_id=t.trajectory_id,
                instance_id=t.instance_id,
                status=Status.PASSED if i == 0 else Status.FAILED,
                resolved=i == 0,
            )
            for i, t in enumerate(rows)
        ],
    )
    write_records(paths["grades"], [])
    chosen = write_selection(
        paths["trajectories"], paths["results"], paths["selection"], train_batch_groups=1
    )
    paths["batch"] = root / "batch.jsonl"
    entries, _ = rl_step.advantages(AdvantageSettings(algo=Estimator.GRPO), chosen.kept_batch, None)
    write_records(paths["batch"], entries)
    return paths


def _dataset(path: Path) -> Dataset:
    return Dataset(uri=str(path))


def _out(root: Path, name: str, kind: type = Dataset) -> Any:
    return kind(uri=str(root / name))


# --------------------------------------------------------------------------- kfp.local


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def _copied(path: str, out: dsl.Output[dsl.Dataset]):
    import shutil

    shutil.copyfile(path, out.path)


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def _logged(values: dict, out: dsl.Output[dsl.Metrics]):
    for key, value in values.items():
        out.log_metric(key, value)


@dataclass
class LocalRun:
    """The files one component wrote in a kfp.local run and what its executor reported."""

    task: Path
    executor_output: dict[str, Any]

    def metrics(self, output: str = "metrics") -> dict[str, float]:
        return self.executor_output["artifacts"][output]["artifacts"][0]["metadata"]


def run_alone(
    name: str,
    root: Path,
    files: dict[str, Path],
    metrics: dict[str, dict[str, float]] | None = None,
    **arguments: Any,
) -> LocalRun:
    """Run component ``name`` alone through kfp.local (SubprocessRunner, this interpreter) with
    ``files`` as its input Datasets, ``metrics`` as its input Metrics and ``arguments``."""
    op = component(name)

    @dsl.pipeline(name=f"{name.replace('_', '-')}-alone")
    def alone():
        inputs = {arg: _copied(path=str(path)).outputs["out"] for arg, path in files.items()}
        inputs |= {arg: _logged(values=values).outputs["out"] for arg, values in (metrics or {}).items()}
        op(**inputs, **arguments)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    alone()
    task_name = name.replace("_", "-")
    found = [p for p in root.rglob("executor_output.json") if p.parent.name == task_name]
    assert len(found) == 1, found
    return LocalRun(found[0].parent, json.loads(found[0].read_text()))


# --------------------------------------------------------------------------- prepare


def _check_prepared(tasks: Path, step: int, start_policy: str, policy: str) -> None:
    assert (step, start_policy) == (0, policy)  # an empty store: step 0 samples from the initial policy
    assert len(tasks.read_text().splitlines()) == 2


def test_prepare_called_directly(tmp_path: Path, records: dict[str, Path]) -> None:
    tasks = _out(tmp_path, "tasks")
    step, start = component("prepare").python_func(
        settings=settings(tmp_path / "store", records["tasks"], "models/initial"), tasks=tasks
    )
    _check_prepared(Path(tasks.path), step, start, "models/initial")


def test_prepare_refuses_bad_settings(tmp_path: Path, records: dict[str, Path]) -> None:
    bad = settings(tmp_path / "store", records["tasks"]) | {"rollout_group_size": 0}
    with pytest.raises(ValueError, match="parameter rollout_group_size"):
        component("prepare").python_func(settings=bad, tasks=_out(tmp_path, "tasks"))


def test_prepare_through_kfp_local(tmp_path: Path, records: dict[str, Path]) -> None:
    run = run_alone(
        "prepare",
        tmp_path / "root",
        {},
        settings=settings(tmp_path / "store", records["tasks"], "models/initial"),
    )
    values = run.executor_output["parameterValues"]
    _check_prepared(run.task / "tasks", values["step"], values["policy"], "models/initial")


# --------------------------------------------------------------------------- rollout


def _check_rollout(trajectories: Path, metrics: dict[str, float]) -> None:
    rows = read_records(trajectories, Trajectory)
    assert len(rows) == 2
    assert len({t.group_id for t in rows}) == 1
    assert all(0 < t.n_response_tokens <= 8 for t in rows)
    assert metrics["rollout/trajectories"] == 2.0


ROLLOUT = {"gen_batch_groups": 1, "group_size": 2, "max_new_tokens": 8}


def test_rollout_called_directly(tmp_path: Path, records: dict[str, Path], policy: Path) -> None:
    trajectories, metrics = _out(tmp_path, "trajectories"), _out(tmp_path, "metrics", Metrics)
    component("rollout").python_func(
        settings=settings(tmp_path / "store", records["tasks"], policy, rollout=ROLLOUT), policy=str(policy),
        step=0, gen_batch=0, tasks=_dataset(records["tasks"]), trajectories=trajectories, metrics=metrics,
    )  # fmt: skip
    _check_rollout(Path(trajectories.path), metrics.metadata)


@pytest.mark.slow
def test_rollout_through_kfp_local(tmp_path: Path, records: dict[str, Path], policy: Path) -> None:
    run = run_alone(
        "rollout", tmp_path / "root", {"tasks": records["tasks"]},
        settings=settings(tmp_path / "store", records["tasks"], policy, rollout=ROLLOUT), policy=str(policy),
        step=0, gen_batch=0,
    )  # fmt: skip
    _check_rollout(run.task / "trajectories", run.metrics())


# --------------------------------------------------------------------------- sandbox and evaluate


def _check_results(results: Path) -> None:
    resolved = {r.trajectory_id: r.resolved for r in read_records(results, TestResult)}
    assert resolved == {"a/0": True, "a/1": True, "a/2": False, "b/0": False, "b/1": False, "b/2": False}


def test_sandbox_called_directly(tmp_path: Path, records: dict[str, Path]) -> None:
    results, metrics = _out(tmp_path, "results"), _out(tmp_path, "metrics", Metrics)
    component("sandbox").python_func(
        settings=settings(tmp_path / "store"), tasks=_dataset(records["tasks"]),
        trajectories=_dataset(records["trajectories"]), results=results, metrics=metrics,
    )  # fmt: skip
    _check_results(Path(results.path))
    assert metrics.metadata["sandbox/evaluations"] == 6.0


def test_sandbox_through_kfp_local(tmp_path: Path, records: dict[str, Path]) -> None:
    files = {name: records[name] for name in ("tasks", "trajectories")}
    run = run_alone("sandbox", tmp_path / "root", files, settings=settings(tmp_path / "store"))
    _check_results(run.task / "results")
    assert run.metrics()["sandbox/evaluations"] == 6.0


def test_evaluate_called_directly(tmp_path: Path, records: dict[str, Path]) -> None:
    results, metrics = _out(tmp_path, "results"), _out(tmp_path, "metrics", Metrics)
    component("evaluate").python_func(
        settings=settings(tmp_path / "store"), tasks=_dataset(records["tasks"]),
        trajectories=_dataset(records["trajectories"]), results=results, metrics=metrics,
    )  # fmt: skip
    _check_results(Path(results.path))
    assert metrics.metadata["eval/pass_at_1"] == pytest.approx(2 / 6)


def test_evaluate_through_kfp_local(tmp_path: Path, records: dict[str, Path]) -> None:
    files = {name: records[name] for name in ("tasks", "trajectories")}
    run = run_alone("evaluate", tmp_path / "root", files, settings=settings(tmp_path / "store"))
    _check_results(run.task / "results")
    assert run.metrics()["eval/pass_at_1"] == pytest.approx(2 / 6)


# --------------------------------------------------------------------------- gather and select

BATCH_METRICS = {
    "rollout_metrics": {"rollout/trajectories": 6.0, "perf/rollout_s": 1.5},
    "sandbox_metrics": {"sandbox/evaluations": 6.0, "perf/sandbox_s": 2.5},
}


def _check_gathered(storage: Path, short: bool) -> None:
    assert short  # one mixed group kept of the two the train batch wants: draw another batch
    batch = storage / "generation" / "step-000000" / "batch-0"
    assert sorted(p.name for p in batch.iterdir()) == ["metrics.json", "results.jsonl", "trajectories.jsonl"]


def test_gather_called_directly(tmp_path: Path, records: dict[str, Path]) -> None:
    metrics = {name: Metrics(uri=str(tmp_path / name), metadata=v) for name, v in BATCH_METRICS.items()}
    files = {name: _dataset(records[name]) for name in ("trajectories", "results")}
    store = tmp_path / "store"
    short = component("gather").python_func(
        settings=settings(store, rollout={"train_batch_groups": 2}), step=0, gen_batch=0, **files, **metrics
    )
    _check_gathered(store, short)
    full = component("gather").python_func(
        settings=settings(store, rollout={"train_batch_groups": 1}), step=0, gen_batch=0, **files, **metrics
    )
    assert not full
    last = component("gather").python_func(  # short, but the run allows no other batch
        settings=settings(store, rollout={"train_batch_groups": 2, "max_gen_batches": 1}), step=0,
        gen_batch=0, **files, **metrics,
    )  # fmt: skip
    assert not last


def test_gather_through_kfp_local(tmp_path: Path, records: dict[str, Path]) -> None:
    files = {name: records[name] for name in ("trajectories", "results")}
    run = run_alone(
        "gather", tmp_path / "root", files, BATCH_METRICS,
        settings=settings(tmp_path / "store", rollout={"train_batch_groups": 2}), step=0, gen_batch=0,
    )  # fmt: skip
    _check_gathered(tmp_path / "store", run.executor_output["parameterValues"]["Output"])


@pytest.fixture
def gathered(tmp_path: Path, records: dict[str, Path]) -> Path:
    """A store holding the records' generation batch as batch 0 of step 0."""
    from gagar.pipeline import store

    storage = tmp_path / "store"
    store.put_generation_batch(
        str(storage), 0, 0, records["trajectories"], records["results"],
        {**BATCH_METRICS["rollout_metrics"], **BATCH_METRICS["sandbox_metrics"]},
    )  # fmt: skip
    return storage


def _check_selected(trajectories: Path, results: Path, selection: Path, metrics: dict[str, float]) -> None:
    assert len(read_records(trajectories, Trajectory)) == len(read_records(results, TestResult)) == 6
    (kept,) = read_records(selection, KeptBatch)
    assert [k.trajectory_id for k in kept.kept] == ["a/0", "a/1", "a/2"]
    assert metrics["sampling/dropped/all_fail"] == 1.0
    assert metrics["sampling/gen_batches"] == 1.0
    assert metrics["sandbox/evaluations"] == metrics["rollout/trajectories"] == 6.0
    assert (metrics["perf/rollout_s"], metrics["perf/sandbox_s"]) == (1.5, 2.5)


def test_select_called_directly(tmp_path: Path, gathered: Path) -> None:
    outputs = {name: _out(tmp_path, name) for name in ("trajectories", "results", "selection")}
    metrics = _out(tmp_path, "metrics", Metrics)
    component("select").python_func(
        settings=settings(gathered, rollout={"train_batch_groups": 2}), step=0, metrics=metrics, **outputs
    )
    _check_selected(*(Path(o.path) for o in outputs.values()), metrics.metadata)


def test_select_through_kfp_local(tmp_path: Path, gathered: Path) -> None:
    run = run_alone(
        "select",
        tmp_path / "root",
        {},
        settings=settings(gathered, rollout={"train_batch_groups": 2}),
        step=0,
    )
    _check_selected(*(run.task / n for n in ("trajectories", "results", "selection")), run.metrics())


# --------------------------------------------------------------------------- grade


def _check_grade(grades: Path, metrics: dict[str, float]) -> None:
    assert [g.group_id for g in read_records(grades, Grade)] == ["a"]  # the kept group only
    assert metrics["grader/groups"] == 1.0


@pytest.mark.parametrize("algo", list(Estimator), ids=lambda a: a.value)
def test_grade_called_directly(tmp_path: Path, records: dict[str, Path], algo: Estimator) -> None:
    """Every estimator that uses a grader gets the kept groups graded (gagar-tiered and
    gagar-no-restore too); the others an empty grades file and no grader metrics."""
    grades, metrics = _out(tmp_path, "grades"), _out(tmp_path, "metrics", Metrics)
    component("grade").python_func(
        settings=settings(tmp_path / "store", advantage={"algo": algo.value}),
        tasks=_dataset(records["tasks"]), trajectories=_dataset(records["trajectories"]),
        results=_dataset(records["results"]),
        selection=_dataset(records["selection"]), grades=grades, metrics=metrics,
    )  # fmt: skip
    if algo.uses_grader:
        _check_grade(Path(grades.path), metrics.metadata)
    else:
        assert read_records(Path(grades.path), Grade) == []
        assert not any(key.startswith("grader/") for key in metrics.metadata)


def test_grade_through_kfp_local(tmp_path: Path, records: dict[str, Path]) -> None:
    files = {name: records[name] for name in ("tasks", "trajectories", "results", "selection")}
    run = run_alone("grade", tmp_path / "root", files, settings=settings(tmp_path / "store"))
    _check_grade(run.task / "grades", run.metrics())


# --------------------------------------------------------------------------- redistribute


def _check_batch(batch: Path, metrics: dict[str, float]) -> None:
    rows = [json.loads(line) for line in batch.read_text().splitlines()]
    assert [r["trajectory_id"] for r in rows] == ["a/0", "a/1", "a/2"]
    assert rows[1]["advantage"] > rows[0]["advantage"] > 0 > rows[2]["advantage"]
    assert metrics["sampling/dropped/all_fail"] == 1.0
    assert metrics["credit/moved_ratio"] > 0


def test_redistribute_called_directly(tmp_path: Path, records: dict[str, Path]) -> None:
    batch, metrics = _out(tmp_path, "batch"), _out(tmp_path, "metrics", Metrics)
    credit = _out(tmp_path, "credit", Markdown)
    component("redistribute").python_func(
        settings=settings(tmp_path / "store"), selection=_dataset(records["selection"]),
        grades=_dataset(records["grades"]), batch=batch, metrics=metrics, credit=credit,
    )  # fmt: skip
    _check_batch(Path(batch.path), metrics.metadata)
    assert "Credit redistribution" in Path(credit.path).read_text()


def test_redistribute_through_kfp_local(tmp_path: Path, records: dict[str, Path]) -> None:
    files = {name: records[name] for name in ("selection", "grades")}
    run = run_alone("redistribute", tmp_path / "root", files, settings=settings(tmp_path / "store"))
    _check_batch(run.task / "batch", run.metrics())
    assert "Credit redistribution" in (run.task / "credit").read_text()


# --------------------------------------------------------------------------- train

UPSTREAM = {
    "select_metrics": {"rollout/trajectories": 2.0, "sandbox/evaluations": 2.0},
    "grade_metrics": {"grader/groups": 1.0},
    "redistribute_metrics": {"sampling/groups_kept": 1.0},
}


def _check_trained(storage: Path, metrics: dict[str, float], card: dict[str, Any]) -> None:
    assert (storage / "checkpoints" / "step-000000" / "model" / "config.json").is_file()
    assert card["step"] == 0  # the Model artifact names the checkpoint published
    assert card["checkpoint"] == f"{storage}/checkpoints/step-000000"
    step = json.loads((storage / "metrics" / "step-000000.json").read_text())
    assert step["rollout/trajectories"] == 2.0
    assert step["sampling/groups_kept"] == 1.0
    assert step["grader/groups"] == 1.0
    assert metrics["perf/train_s"] > 0


def test_train_called_directly(tmp_path: Path, train_inputs: dict[str, Path], policy: Path) -> None:
    metrics, summary = _out(tmp_path, "metrics", Metrics), _out(tmp_path, "summary", Markdown)
    model = _out(tmp_path, "model", Model)
    upstream = {name: Metrics(uri=str(tmp_path / name), metadata=values) for name, values in UPSTREAM.items()}
    files = {name: _dataset(train_inputs[name]) for name in ("trajectories", "results", "grades", "batch")}
    component("train").python_func(
        settings=settings(tmp_path / "store", policy=policy, optim={"minibatch_size": 2}),
        policy=str(policy), step=0, ends_run=True, **files, **upstream, metrics=metrics, summary=summary,
        model=model,
    )  # fmt: skip
    _check_trained(tmp_path / "store", metrics.metadata, model.metadata)
    assert "## RL step 0" in Path(summary.path).read_text()


@pytest.mark.slow
def test_train_through_kfp_local(tmp_path: Path, train_inputs: dict[str, Path], policy: Path) -> None:
    files = {name: train_inputs[name] for name in ("trajectories", "results", "grades", "batch")}
    run = run_alone(
        "train", tmp_path / "root", files, UPSTREAM,
        settings=settings(tmp_path / "store", policy=policy, optim={"minibatch_size": 2}),
        policy=str(policy), step=0, ends_run=True,
    )  # fmt: skip
    _check_trained(tmp_path / "store", run.metrics(), run.metrics("model"))
    assert "## RL step 0" in (run.task / "summary").read_text()


# --------------------------------------------------------------------------- grader_sft


def _check_grader(model: Path, metrics: dict[str, float]) -> None:
    assert any(model.iterdir())
    assert metrics["grader_sft/train_groups"] >= 2  # the two tasks' noise groups and the rollout's
    assert -1.0 <= metrics["grader_sft/kendall_tau"] <= 1.0


GRADER_SFT = {"groups_per_task": 1, "epochs": 2}


def test_grader_sft_called_directly(tmp_path: Path, records: dict[str, Path]) -> None:
    model, metrics = _out(tmp_path, "grader_model", Model), _out(tmp_path, "metrics", Metrics)
    component("grader_sft").python_func(
        tasks=_dataset(records["tasks"]), trajectories=_dataset(records["trajectories"]),
        results=_dataset(records["results"]), eval_tasks=_dataset(records["tasks"]), grader_model=model,
        metrics=metrics, **GRADER_SFT,
    )  # fmt: skip
    _check_grader(Path(model.path), metrics.metadata)


@pytest.mark.slow
def test_grader_sft_through_kfp_local(tmp_path: Path, records: dict[str, Path]) -> None:
    files = {name: records[name] for name in ("tasks", "trajectories", "results")}
    run = run_alone("grader_sft", tmp_path / "root", {**files, "eval_tasks": records["tasks"]}, **GRADER_SFT)
    _check_grader(run.task / "grader_model", run.metrics())
