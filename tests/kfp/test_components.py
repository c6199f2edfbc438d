"""Component folders as in kubeflow/pipelines-components, and the two test tiers of a component:
its Python function called directly, and the component through ``kfp.local``."""

import importlib
import json
from pathlib import Path

import pytest
import yaml
from kfp.dsl import Dataset, Markdown, Metrics

from fixtures.records import one_generation_batch
from gagar.pipeline.graph import RL_STEP
from gagar.stages import select_stage

COMPONENTS = Path(importlib.import_module("gagar.pipeline.components").__file__).parent
FOLDERS = sorted(p.name for p in COMPONENTS.iterdir() if (p / "component.py").is_file())


def test_every_component_folder_looks_the_same() -> None:
    assert {s.name for s in RL_STEP} <= set(FOLDERS)  # folder, component and stage share one name
    for name in FOLDERS:
        folder = COMPONENTS / name
        assert (folder / "README.md").is_file(), name
        meta = yaml.safe_load((folder / "metadata.yaml").read_text())
        assert meta["name"] == name
        assert {"tier", "stability", "dependencies", "lastVerified"} <= set(meta)
        component = getattr(importlib.import_module(f"gagar.pipeline.components.{name}.component"), name)
        image = component.component_spec.implementation.container.image
        assert f"/gagar-{meta['image']}:" in image, (name, image)


def _inputs(root: Path) -> dict[str, Path]:
    """One generation batch of two groups (one mixed, one all-fail), the mixed group's grade, and
    the selection dynamic sampling makes of it (what the grade stage hands redistribute)."""
    paths = one_generation_batch(root)
    paths["selection"] = root / "selection.jsonl"
    select_stage(
        trajectories=[paths["trajectories"]],
        results=[paths["results"]],
        out=paths["selection"],
        train_batch_groups=2,
    )
    return paths


def _check_batch(batch: Path, metrics: dict[str, float]) -> None:
    rows = [json.loads(line) for line in batch.read_text().splitlines()]
    assert [r["trajectory_id"] for r in rows] == ["a/0", "a/1", "a/2"]
    assert rows[1]["advantage"] > rows[0]["advantage"] > 0 > rows[2]["advantage"]
    assert metrics["sampling/dropped/all_fail"] == 1.0
    assert metrics["credit/moved_ratio"] > 0


def test_redistribute_called_directly(tmp_path: Path) -> None:
    from gagar.pipeline.components.redistribute.component import redistribute

    paths = _inputs(tmp_path)
    batch, metrics = Dataset(uri=str(tmp_path / "batch")), Metrics(uri=str(tmp_path / "metrics"))
    credit = Markdown(uri=str(tmp_path / "credit"))
    redistribute.python_func(
        selection=Dataset(uri=str(paths["selection"])),
        grades=Dataset(uri=str(paths["grades"])),
        batch=batch,
        metrics=metrics,
        credit=credit,
    )
    _check_batch(Path(batch.path), metrics.metadata)
    assert "Credit redistribution" in Path(credit.path).read_text()


@pytest.mark.slow
def test_redistribute_through_kfp_local(tmp_path: Path) -> None:
    from kfp import dsl, local

    from gagar.pipeline.components.redistribute.component import redistribute

    paths = _inputs(tmp_path)

    @dsl.component(base_image="python:3.11", install_kfp_package=False)
    def dataset(path: str, out: dsl.Output[dsl.Dataset]):
        import shutil

        shutil.copyfile(path, out.path)

    @dsl.pipeline(name="redistribute-only")
    def only(selection: str, grades: str):
        given = {"selection": selection, "grades": grades}
        inputs = {name: dataset(path=value).outputs["out"] for name, value in given.items()}
        redistribute(**inputs)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    only(selection=str(paths["selection"]), grades=str(paths["grades"]))
    batch = next((tmp_path / "root").rglob("batch"))
    metrics = next(
        p for p in (tmp_path / "root").rglob("executor_output.json") if p.parent.name == "redistribute"
    )
    logged = json.loads(metrics.read_text())["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    _check_batch(batch, logged)
