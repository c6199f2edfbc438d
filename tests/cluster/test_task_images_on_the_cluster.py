"""Task environments on the cluster: tasks synthesized from two real libraries, their images built by
``gagar tasks build-images``, loaded into the node, and judged by the Kubernetes backend in their own
images (no backend default image): gold resolves every task, empty none.

Needs what ``make test-cluster`` gives: KUBECONFIG, the engine that built the stage images
(GAGAR_TASK_IMAGES__ENGINE, podman by default) with their base, and the node's Docker socket
(GAGAR_TEST_NODE_DOCKER) to load the images into. Downloads from PyPI; set GAGAR_TEST_SYNTH_DIR to
keep the downloads and environments between runs.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gagar.cli import app
from gagar.sandbox.base import Prediction
from gagar.sandbox.k8s import KubernetesBackend, KubernetesSandboxConfig
from gagar.sandbox.k8s.config import ResourceSpec
from gagar.sandbox.limits import SandboxLimits
from gagar.schema.result import Status
from gagar.schema.task import Task
from gagar.tasks.loaders import load_tasks, write_tasks
from gagar.tasks.synthesize import synthesize_from_pypi

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a cluster: KUBECONFIG is not set"),
    pytest.mark.skipif(not os.environ.get("GAGAR_TEST_NODE_DOCKER"), reason="needs the node's Docker socket"),
]

LIBRARIES = ("inflection==0.5.1", "semver==3.0.2")
PER_LIBRARY = 2
ENGINE = os.environ.get("GAGAR_TASK_IMAGES__ENGINE", "podman")


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
def tasks(synth_dir: Path, tmp_path_factory) -> list[Task]:
    """The synthesized tasks, their images built by the command and loaded into the node."""
    envs = synth_dir / "envs"
    envs.mkdir(exist_ok=True)
    for folder in (synth_dir, envs):
        folder.chmod(0o755)
    synthesized: list[Task] = []
    for spec in LIBRARIES:
        synthesized += synthesize_from_pypi(
            spec, PER_LIBRARY, seed=0, work_dir=synth_dir / "work", env_dir=envs
        ).tasks
    work = tmp_path_factory.mktemp("images")
    write_tasks(work / "in.jsonl", synthesized)
    argv = ["tasks", "build-images", "--tasks", str(work / "in.jsonl"), "--out", str(work / "out.jsonl"),
            "--engine", ENGINE]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    built = load_tasks(work / "out.jsonl")
    for image in sorted({t.environment.image for t in built if t.environment.image}):
        save = subprocess.Popen([ENGINE, "save", image], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", os.environ["GAGAR_TEST_NODE_DOCKER"], "load"], stdin=save.stdout,
                       check=True, capture_output=True)  # fmt: skip
        assert save.wait() == 0
    return built


def test_synthesized_tasks_are_judged_in_their_own_images_on_the_cluster(
    tasks: list[Task], core, api_client, fresh_namespace
) -> None:
    from kubernetes import client

    environments = {tuple(sorted(t.environment.requirements)) for t in tasks}
    assert len({t.environment.image for t in tasks}) == len(environments)  # one image per environment
    config = KubernetesSandboxConfig(
        namespace=fresh_namespace("gagar-sbx-images"),
        image=None,  # every task names its own
        limits=SandboxLimits(wall_time_s=120),
        start_deadline_s=180,
        resources=ResourceSpec(cpu_request="100m", memory_request="128Mi", ephemeral_storage_request="64Mi"),
    )
    backend = KubernetesBackend(config, core, client.NetworkingV1Api(api_client))
    jobs = [
        (t, Prediction(instance_id=t.instance_id, model_patch=patch, trajectory_id=f"{t.instance_id}:{k}"))
        for t in tasks
        for k, patch in (("gold", t.patch), ("empty", ""))
    ]
    results = {r.trajectory_id: r for r in backend.evaluate(jobs)}
    gold = [results[f"{t.instance_id}:gold"] for t in tasks]
    empty = [results[f"{t.instance_id}:empty"] for t in tasks]
    assert [(r.status, r.resolved) for r in gold] == [(Status.PASSED, True)] * len(tasks), [
        (r.trajectory_id, r.status, r.reason, r.log[-800:]) for r in gold
    ]
    assert not any(r.resolved for r in empty), [(r.trajectory_id, r.status) for r in empty]
    assert backend.last_run.pods_created == len(tasks)  # gold and empty of a task share its pod
