"""Compiled pipelines: YAML that loads back with kfp, five stage images, parameters, platform settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import components
from typer.testing import CliRunner

from gagar import __version__
from gagar.cli.pipeline import app
from gagar.pipeline.build import build_pipeline, compile_pipeline, executor_images
from gagar.pipeline.images import STAGES, stage_image
from gagar.pipeline.parameters import PARAMETERS
from gagar.pipeline.platform import PlatformOptions

RL_PARAMETERS = {p.name for p in PARAMETERS}


def documents(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pipeline spec, platform spec) of a compiled file."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    spec = next(d for d in docs if "deploymentSpec" in d)
    platform = next((d for d in docs if "platforms" in d), {})
    return spec, platform


@pytest.fixture(scope="module")
def rl_two_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_pipeline("rl", tmp_path_factory.mktemp("rl") / "rl.yaml", steps_per_run=2)


def test_rl_names_five_distinct_stage_images(rl_two_steps: Path) -> None:
    images = set(executor_images(rl_two_steps).values())
    assert images == {stage_image(stage) for stage in STAGES}
    assert len(images) == 5
    assert all(image.endswith(f":{__version__}") for image in images)


def test_rl_loads_back_with_kfp_and_keeps_its_parameters(rl_two_steps: Path) -> None:
    loaded = components.load_component_from_file(str(rl_two_steps))
    assert loaded.name == "gagar-rl"
    assert set(loaded.component_spec.inputs) == RL_PARAMETERS
    assert {
        "policy",
        "tasks",
        "storage",
        "rollout_group_size",
        "advantage_algo",
        "grader_kind",
    } <= RL_PARAMETERS
    spec, _ = documents(rl_two_steps)
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["advantage_algo"]["defaultValue"] == "gagar"
    assert "defaultValue" not in defaults["storage"]  # the store has no default: every run names one


def test_steps_are_chained_train_before_the_next_prepare(rl_two_steps: Path) -> None:
    spec, _ = documents(rl_two_steps)
    tasks = spec["root"]["dag"]["tasks"]
    names = {t["taskInfo"]["name"]: key for key, t in tasks.items()}
    assert {"prepare-0", "train-0", "prepare-1", "train-1"} <= set(names)
    assert names["train-0"] in tasks[names["prepare-1"]]["dependentTasks"]
    assert all(
        t["cachingOptions"] == {} or not t["cachingOptions"].get("enableCache") for t in tasks.values()
    )
    assert "retryPolicy" not in tasks[names["train-0"]]  # train publishes a checkpoint: never retried
    generation = spec["components"][tasks[names["generation-0"]]["componentRef"]["name"]]["dag"]["tasks"]
    rollout = next(t for t in generation.values() if t["taskInfo"]["name"] == "rollout-0")
    assert rollout["retryPolicy"]["maxRetryCount"] == 2
    assert tasks[names["generation-0"]]["dependentTasks"] == [names["prepare-0"]]
    assert names["generation-0"] in tasks[names["select-0"]]["dependentTasks"]  # waits for every batch drawn


def test_platform_settings_are_compiled(rl_two_steps: Path) -> None:
    spec, platform = documents(rl_two_steps)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    train = next(config for name, config in executors.items() if name.startswith("exec-train"))
    assert train["secretAsEnv"][0]["secretName"] == "mlpipeline-minio-artifact"
    assert {e["envVar"] for e in train["secretAsEnv"][0]["keyToEnv"]} == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    }
    assert train["activeDeadlineSeconds"] == str(6 * 3600) or train["activeDeadlineSeconds"] == 6 * 3600
    sandbox = next(config for name, config in executors.items() if name.startswith("exec-sandbox"))
    assert "secretAsEnv" not in sandbox  # the sandbox never touches the store
    containers = spec["deploymentSpec"]["executors"]
    train_resources = next(e for n, e in containers.items() if n.startswith("exec-train"))["container"]
    assert train_resources["resources"]["accelerator"]["resourceCount"] == "1"


def test_registry_tag_and_cpu_only_options(tmp_path: Path) -> None:
    options = PlatformOptions(
        image_registry="registry.local:5000/ml", image_tag="dev", gpus=(), store_secret=None
    )
    path = compile_pipeline("rl", tmp_path / "rl.yaml", options=options)
    assert set(executor_images(path).values()) == {f"registry.local:5000/ml/gagar-{s}:dev" for s in STAGES}
    spec, platform = documents(path)
    assert all(
        "accelerator" not in e["container"].get("resources", {})
        for e in spec["deploymentSpec"]["executors"].values()
    )
    assert all(
        "secretAsEnv" not in c
        for c in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values()
    )


@pytest.mark.parametrize(("name", "stages"), [("grader-sft", 4), ("evaluation", 3)])
def test_grader_sft_and_evaluation_compile(tmp_path: Path, name: str, stages: int) -> None:
    path = compile_pipeline(name, tmp_path / f"{name}.yaml")
    assert len(set(executor_images(path).values())) == stages
    inputs = set(components.load_component_from_file(str(path)).component_spec.inputs)
    assert inputs >= RL_PARAMETERS  # the run's settings, as the RL pipeline takes them


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown pipeline 'nope'"):
        build_pipeline("nope")
    with pytest.raises(ValueError, match="rl pipeline only"):
        build_pipeline("evaluation", steps_per_run=2)
    with pytest.raises(ValueError, match="steps_per_run must be at least 1"):
        build_pipeline("rl", steps_per_run=0)
    with pytest.raises(ValueError, match="unknown stage"):
        stage_image("prepare")
    with pytest.raises(ValueError, match="timeout_s"):
        PlatformOptions(timeout_s=0)


def test_cli_compile(tmp_path: Path) -> None:
    out = tmp_path / "out" / "rl.yaml"
    result = CliRunner().invoke(
        app, ["compile", "--out", str(out), "--steps-per-run", "2", "--image-tag", "t1"]
    )
    assert result.exit_code == 0, result.output
    assert "5 images" in result.output
    assert all(image.endswith(":t1") for image in executor_images(out).values())
    bad = CliRunner().invoke(app, ["compile", "--out", str(out), "--pipeline", "nope"])
    assert bad.exit_code != 0
    assert "unknown pipeline" in bad.output


def test_compile_needs_no_checkout_on_the_path(tmp_path: Path) -> None:
    """The pipelines and components ship inside the package: compiling from another directory with
    only the installed package importable (no project root, no ``components``/``pipelines`` modules)
    works, as from a wheel."""
    import subprocess
    import sys

    import gagar

    package_root = str(Path(gagar.__file__).resolve().parents[1])
    code = (
        "import sys; from gagar.cli.pipeline import app; from typer.testing import CliRunner; "
        "r = CliRunner().invoke(app, ['compile', '--out', 'rl.yaml']); print(r.output); "
        "assert r.exit_code == 0, r.output; "
        "assert not {'components', 'pipelines'} & set(sys.modules), 'a checkout module was imported'"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": package_root, "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert executor_images(tmp_path / "rl.yaml")
