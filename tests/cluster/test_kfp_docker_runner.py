"""The RL pipeline through kfp.local's DockerRunner: each task in its stage image, two steps, the
same results as the SubprocessRunner.

kfp.local runs lightweight components in containers (``base_image``, here the image the task's
``set_container_image`` names: the CPU variants of ``make images``); it refuses container
components, which the pipeline has none of. The Docker API is ``DOCKER_HOST`` (dockerd, or
``podman system service`` as scripts/test-cluster.sh starts it). The sandbox task, which in its
image runs as uid 1000 and cannot drop to sandbox uids, uses the Kubernetes backend against the
test cluster (host network, an embedded-certificate kubeconfig under the pipeline root); the
subprocess run uses the local backend. Same seeds, same tiny policy and tasks: the trajectories and
every metric but the timings (verdicts, kept groups, advantages, tokens) must agree. The tiny policy
is untrained, so no group has a passing member and no update moves the weights: what this pins is
the path through the images, not the optimiser.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a cluster: KUBECONFIG is not set"),
    pytest.mark.skipif(
        not os.environ.get("DOCKER_HOST"), reason="needs a Docker API: DOCKER_HOST is not set"
    ),
]

STEPS = 2


def _embedded_kubeconfig(path: Path) -> str:
    """The KUBECONFIG with its certificate files inlined (a container sees none of them)."""
    config = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    for entry, keys in (
        ("clusters", ("certificate-authority",)),
        ("users", ("client-certificate", "client-key")),
    ):
        for item in config[entry]:
            body = item["cluster" if entry == "clusters" else "user"]
            for key in keys:
                if key in body:
                    body[f"{key}-data"] = base64.b64encode(Path(body.pop(key)).read_bytes()).decode()
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)
    return str(path)


def _arguments(root: Path, policy: Path, tasks: Path, backend: str) -> dict[str, Any]:
    return {
        "policy": str(policy),
        "tasks": str(tasks),
        "storage": str(root / "store"),
        "rollout_group_size": 2,
        "rollout_train_batch_groups": 2,
        "rollout_gen_batch_groups": 2,
        "rollout_max_new_tokens": 16,
        "optim_minibatch_size": 4,
        "sandbox_backend": backend,
        "sandbox_workers": "2",
    }


def _trajectories(run_root: Path) -> list[list[dict[str, Any]]]:
    """Each rollout task's trajectories (patch and ids), in step order."""
    files = sorted(run_root.rglob("trajectories"), key=lambda p: p.stat().st_mtime)
    keep = ("trajectory_id", "instance_id", "group_id", "model_patch")
    return [[{k: json.loads(line)[k] for k in keep} for line in f.read_text().splitlines()] for f in files]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fresh_namespace, sandbox_image):
    from fixtures.policy import untrained_policy_and_tasks
    from gagar.pipeline.local import ContainerSettings, run_local

    inputs = tmp_path_factory.mktemp("inputs")
    policy, tasks = untrained_policy_and_tasks(inputs)
    subprocess_out = tmp_path_factory.mktemp("subprocess")
    sub = run_local(_arguments(subprocess_out, policy, tasks, "local"), out=subprocess_out, steps=STEPS)

    docker_out = tmp_path_factory.mktemp("docker")
    docker_out.chmod(0o755)
    root = docker_out / "kfp-root"
    root.mkdir()
    (root / "inputs").mkdir()
    policy_in, tasks_in = untrained_policy_and_tasks(root / "inputs")
    namespace = fresh_namespace("gagar-kfp-docker")
    environment = (
        ("KUBECONFIG", _embedded_kubeconfig(root / "kubeconfig")),
        ("GAGAR_KUBERNETES__NAMESPACE", namespace),
        ("GAGAR_KUBERNETES__IMAGE", sandbox_image),
    )
    container = ContainerSettings(image_variant="cpu", network_mode="host", environment=environment)
    docker = run_local(
        _arguments(root, policy_in, tasks_in, "kubernetes"), out=docker_out, steps=STEPS, container=container
    )
    return sub, docker


def test_both_runs_complete_every_step(runs) -> None:
    sub, docker = runs
    assert [r["step"] for r in sub.steps] == [r["step"] for r in docker.steps] == list(range(STEPS))
    print(f"subprocess: {sub.summary()}\ndocker: {docker.summary()}")


@pytest.mark.parametrize(
    "key",
    [
        "rollout/trajectories",
        "rollout/resolved_rate",
        "sandbox/evaluations",
        "sampling/groups_kept",
        "credit/moved_ratio",
    ],
)
def test_step_metrics_agree(runs, key: str) -> None:
    sub, docker = runs
    assert [r.get(key) for r in sub.steps] == [r.get(key) for r in docker.steps]


def test_every_metric_but_timings_agrees(runs) -> None:
    sub, docker = runs
    for a, b in zip(sub.steps, docker.steps, strict=True):
        keys = {k for k in a if not k.startswith("perf/") and "duration" not in k}
        assert keys == {k for k in b if not k.startswith("perf/") and "duration" not in k}
        for key in sorted(keys):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key


def test_trajectories_agree(runs) -> None:
    sub, docker = runs
    assert _trajectories(sub.pipeline_root) == _trajectories(docker.pipeline_root)
