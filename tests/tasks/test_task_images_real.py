"""Tasks synthesized from two real libraries, their images built by ``build_images`` with podman, and
each task judged in its own image as a Kubernetes pod would judge it: the pod runner as uid 65532,
no network, a read-only root, the pod's inputs (the run's code ConfigMap and the pod's own) mounted
read-only, the result read back from its termination-message file and judged by the host's code.

Gold resolves every task, empty none. Slow (downloads from PyPI, builds two images); runs where
podman has the base image (``make images`` imports it). Set ``GAGAR_TEST_SYNTH_DIR`` to keep the
downloads and environments between runs. The cluster version is
tests/cluster/test_task_images_on_the_cluster.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gagar.sandbox.base import Prediction
from gagar.sandbox.k8s import KubernetesSandboxConfig, plan_pod
from gagar.sandbox.k8s.objects import (
    INPUT_DIR,
    RESULT_PATH,
    TMP_DIR,
    WORKSPACE_DIR,
    build_code_configmap,
    build_configmap,
)
from gagar.sandbox.k8s.outcome import OVERFLOW, decode_result, group_results, parse_summary
from gagar.schema.result import Status, TestResult
from gagar.schema.task import Task
from gagar.tasks.images import CliEngine, ImageSettings, build_images
from gagar.tasks.synthesize import synthesize_from_pypi

LIBRARIES = ("inflection==0.5.1", "semver==3.0.2")
ENGINE = os.environ.get("GAGAR_TASK_IMAGES__ENGINE", "podman")


def _engine_ready() -> bool:
    if shutil.which(ENGINE) is None:
        return False
    base = ImageSettings().base_image
    return (
        subprocess.run([ENGINE, "image", "inspect", base], capture_output=True, check=False).returncode == 0
    )


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _engine_ready(), reason=f"{ENGINE} with the base image is needed (make images)"),
]


@pytest.fixture(scope="module")
def synth_dir() -> Iterator[Path]:
    kept = os.environ.get("GAGAR_TEST_SYNTH_DIR")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        yield Path(kept)
        return
    with tempfile.TemporaryDirectory(prefix="gagar-synth-", dir="/tmp") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def tasks(synth_dir: Path) -> list[Task]:
    envs = synth_dir / "envs"
    envs.mkdir(exist_ok=True)
    for folder in (synth_dir, envs):
        folder.chmod(0o755)
    out: list[Task] = []
    for spec in LIBRARIES:
        out += synthesize_from_pypi(spec, 1, seed=0, work_dir=synth_dir / "work", env_dir=envs).tasks
    assert len(out) == len(LIBRARIES)
    return out


def judge_in_image(task: Task, patches: dict[str, str], scratch: Path) -> list[TestResult]:
    """One pod's group judged in ``task.environment.image`` through the container engine."""
    config = KubernetesSandboxConfig(image_repo_dir="/testbed")
    preds = [
        Prediction(instance_id=task.instance_id, model_patch=p, trajectory_id=k) for k, p in patches.items()
    ]
    plan = plan_pod(config, "0" * 12, 0, task, preds)
    inputs, workspace, tmp, out = (scratch / n for n in ("input", "workspace", "tmp", "out"))
    for folder in (inputs, workspace, tmp, out):
        folder.mkdir(parents=True)
        folder.chmod(0o777)
    for name, text in {
        **build_code_configmap(config, "0" * 12).data,
        **build_configmap(config, plan).data,
    }.items():
        (inputs / name).write_text(text)
    (out / "termination-log").write_text("")
    (out / "termination-log").chmod(0o666)
    uid = str(config.run_as_user)
    argv = [
        ENGINE, "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges", "--user", f"{uid}:{uid}",
        "-e", "HOME=/tmp", "-e", "TMPDIR=/tmp",
        "-v", f"{inputs}:{INPUT_DIR}:ro", "-v", f"{workspace}:{WORKSPACE_DIR}", "-v", f"{tmp}:{TMP_DIR}",
        "-v", f"{out / 'termination-log'}:{RESULT_PATH}",
        task.environment.image or "", config.runner_python, f"{INPUT_DIR}/runner.py",
        INPUT_DIR, WORKSPACE_DIR, RESULT_PATH, TMP_DIR,
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    group = decode_result((out / "termination-log").read_text(), plan.nonce, config.max_report_bytes)
    if group == OVERFLOW:  # a library file the patch changed is too large for 4 KiB: the host reads the log
        group = parse_summary(proc.stdout, plan.nonce)
    assert isinstance(group, dict), (out / "termination-log").read_text()[:200]
    return group_results(task, list(patches), group, 0.0, config.max_log_chars, "", config.judge)


def test_synthesized_tasks_are_judged_in_their_own_images(tasks: list[Task], tmp_path: Path) -> None:
    images = ImageSettings(engine=ENGINE)
    built, report = build_images(tasks, images, CliEngine(ENGINE))
    environments = {tuple(sorted(t.environment.requirements)) for t in tasks}
    assert len({t.environment.image for t in built}) == len(environments)  # one image per environment
    assert len(report.built) + len(report.existing) == 1 + len(environments)
    for task in built:
        gold, empty = judge_in_image(task, {"gold": task.patch, "empty": ""}, tmp_path / task.instance_id)
        assert (gold.status, gold.resolved, gold.hacks) == (Status.PASSED, True, []), (gold.reason, gold.log)
        assert (empty.status, empty.resolved) != (Status.PASSED, True), empty
        assert not empty.resolved
