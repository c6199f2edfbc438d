"""A group pod's runner in the sandbox image under a container engine, as a restricted pod runs it:
uid 65532, every capability dropped, no new privileges, a read-only root, no network, 512 MiB.

The hostile suite (the local sandbox's cases, plus the "leftovers" case of test_k8s_groups), each
case followed in its pod by the checker that resolves only if nothing of it is visible, in pods
of 8: every case is contained, every checker resolves, every group's account fits its
termination message. Slow (about 90 s); runs where the engine has the sandbox image
(``make images``). The same batch through a real cluster is tests/cluster/test_sandbox_pods.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import test_k8s_groups as groups
import test_sandbox_hostile as hostile

from gagar.pipeline.images import stage_image
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
from gagar.sandbox.k8s.outcome import decode_result, group_results
from gagar.sandbox.limits import SandboxLimits
from gagar.schema.result import Status, TestResult

ENGINE = os.environ.get("GAGAR_TASK_IMAGES__ENGINE", "podman")
IMAGE = os.environ.get("GAGAR_K8S_TEST_IMAGE") or stage_image("sandbox")


def _has_image() -> bool:
    if shutil.which(ENGINE) is None:
        return False
    return (
        subprocess.run([ENGINE, "image", "inspect", IMAGE], capture_output=True, check=False).returncode == 0
    )


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _has_image(), reason=f"{ENGINE} with the sandbox image {IMAGE} is needed"),
]
CONFIG = KubernetesSandboxConfig(
    image=IMAGE, limits=SandboxLimits(wall_time_s=25, cpu_time_s=25, memory_bytes=384 << 20)
)


def run_pod(seq: int, patches: dict[str, str], scratch: Path) -> list[TestResult]:
    """One pod's group through the engine; its results from the termination-message file."""
    task = hostile._task()
    preds = [
        Prediction(instance_id=task.instance_id, model_patch=p, trajectory_id=k) for k, p in patches.items()
    ]
    plan = plan_pod(CONFIG, "0" * 12, seq, task, preds)
    inputs, workspace, tmp, out = (scratch / n for n in ("input", "workspace", "tmp", "out"))
    for folder in (inputs, workspace, tmp, out):
        folder.mkdir(parents=True)
        folder.chmod(0o777)
    for name, text in {
        **build_code_configmap(CONFIG, "0" * 12).data,
        **build_configmap(CONFIG, plan).data,
    }.items():
        (inputs / name).write_text(text)
    message = out / "termination-log"
    message.write_text("")
    message.chmod(0o666)
    uid = str(CONFIG.run_as_user)
    argv = [
        ENGINE, "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges", "--user", f"{uid}:{uid}", "--memory", "512m",
        "-e", "HOME=/tmp", "-e", "TMPDIR=/tmp",
        "-v", f"{inputs}:{INPUT_DIR}:ro", "-v", f"{workspace}:{WORKSPACE_DIR}", "-v", f"{tmp}:{TMP_DIR}",
        "-v", f"{message}:{RESULT_PATH}",
        IMAGE, CONFIG.runner_python, f"{INPUT_DIR}/runner.py", INPUT_DIR, WORKSPACE_DIR, RESULT_PATH, TMP_DIR,
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    group = decode_result(message.read_text(), plan.nonce, CONFIG.max_report_bytes)
    assert isinstance(group, dict), f"the account did not fit or decode: {message.read_text()[:100]}"
    return group_results(task, list(patches), group, 0.0, CONFIG.max_log_chars, "", CONFIG.judge)


def test_hostile_cases_in_group_pods_leave_their_neighbours_alone(tmp_path: Path) -> None:
    cases = hostile._hostile(1, tmp_path / "host")
    cases["leftovers"] = hostile._calc(groups.HOSTILE_BODY)
    checker = hostile._calc(groups.CHECKER_BODY)
    patches = {"good": cases.pop("good"), "empty": cases.pop("empty")}
    for name, patch in cases.items():
        patches[name], patches[f"after-{name}"] = patch, checker
    keys = list(patches)
    results: dict[str, TestResult] = {}
    for seq, start in enumerate(range(0, len(keys), 8)):
        chunk = {k: patches[k] for k in keys[start : start + 8]}
        results.update({r.trajectory_id: r for r in run_pod(seq, chunk, tmp_path / f"pod-{seq}")})
    assert (results["good"].status, results["empty"].status) == (Status.PASSED, Status.FAILED)
    for name in cases:
        after = results[f"after-{name}"]
        assert (after.status, after.resolved) == (Status.PASSED, True), (name, after.reason, after.log[-800:])
        if name != "leftovers":  # its add() is right; the point is its neighbour
            assert not results[name].resolved, (name, results[name])
            assert results[name].status != Status.INFRA_ERROR, (name, results[name].reason)
    assert results["busy_loop"].status == results["sleeper"].status == Status.TIMEOUT
    assert results["memory_bomb"].status == Status.FAILED
    assert not (tmp_path / "host").exists()
