"""From a finished (or stuck) pod to a TestResult: pod status checks, log summary, the judge's verdict.

Status mapping: image pull failures, container-creation errors, evictions for node
pressure and pods that never start are ``infra_error`` (never the policy's fault); a pod
past its activeDeadlineSeconds is a ``timeout``; an OOM-killed container is ``failed``;
a patch that does not apply is ``error``; otherwise the local backend's judge
(:func:`gagar.sandbox.verdict.judge`) decides from what the in-pod runner reset, the library
files the patch changed, and the judge plugin's report: ``passed`` (resolved), ``failed``,
``error`` or ``hack``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client

from gagar.sandbox.hacks import JudgeConfig, reset_flags, source_flags
from gagar.sandbox.pristine import JudgeReport, Reset, SourceChange
from gagar.sandbox.process import RunOutcome
from gagar.sandbox.verdict import Judgement, judge
from gagar.schema.result import HackFlag, Status, TestResult
from gagar.schema.task import Task

__all__ = [
    "IMAGE_ERRORS",
    "PodCheck",
    "check_pod",
    "parse_summary",
    "result_from_summary",
]

IMAGE_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_CREATE_ERRORS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})

PodState = Literal["waiting", "running", "finished", "infra_error", "timeout", "oom_killed", "evicted_limit"]


@dataclass(frozen=True)
class PodCheck:
    """What a pod's status says: keep waiting, or how it ended (with the reason)."""

    state: PodState
    reason: str | None = None


def _container_statuses(pod: client.V1Pod) -> list[client.V1ContainerStatus]:
    return list((pod.status and pod.status.container_statuses) or [])


def _unscheduled_reason(pod: client.V1Pod) -> str | None:
    for cond in (pod.status and pod.status.conditions) or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"{cond.reason}: {cond.message}"
    return None


def check_pod(pod: client.V1Pod) -> PodCheck:
    """Classify a pod read from the API; 'waiting' carries why it is not running yet, if known."""
    status = pod.status or client.V1PodStatus()
    statuses = _container_statuses(pod)
    if status.phase in ("Succeeded", "Failed"):
        if status.reason == "DeadlineExceeded":
            return PodCheck("timeout", f"pod ran past activeDeadlineSeconds ({status.message})")
        if status.reason == "Evicted":
            limit_hit = "exceeds" in (status.message or "") or "usage of" in (status.message or "")
            return PodCheck("evicted_limit" if limit_hit else "infra_error", f"evicted: {status.message}")
        for cs in statuses:
            term = cs.state and cs.state.terminated
            if term is not None and term.reason == "OOMKilled":
                return PodCheck("oom_killed", "OOMKilled: the tests exceeded the memory limit")
        return PodCheck("finished")
    for cs in statuses:
        waiting = cs.state and cs.state.waiting
        if waiting is not None and waiting.reason in IMAGE_ERRORS | _CREATE_ERRORS:
            return PodCheck("infra_error", f"{waiting.reason}: {waiting.message}")
    if status.phase == "Running":
        return PodCheck("running")
    return PodCheck("waiting", _unscheduled_reason(pod))


def parse_summary(log: str, nonce: str) -> dict[str, Any] | None:
    """The runner's JSON summary from the pod log: the last block delimited by this evaluation's nonce."""
    pattern = re.compile(
        rf"^<<<GAGAR-RESULT {re.escape(nonce)}>>>\n(.*?)\n<<<GAGAR-END {re.escape(nonce)}>>>$", re.S | re.M
    )
    blocks = pattern.findall(log)
    if not blocks:
        return None
    try:
        summary = json.loads(blocks[-1])
    except json.JSONDecodeError:
        return None
    return summary if isinstance(summary, dict) else None


def _judged_flags(judged: Any, config: JudgeConfig) -> list[HackFlag]:
    """Flags from the runner's account of the model patch: what it reset, the library files it changed."""
    if not isinstance(judged, dict):
        return []
    resets = [Reset(str(p), str(h)) for p, h in judged.get("resets", [])]
    sources = [SourceChange(str(p), old, new) for p, old, new in judged.get("sources", [])]
    own = [str(name) for name in judged.get("own_packages", [])]
    return reset_flags(resets) + source_flags(sources, own, config.checks)


def _report(raw: Any) -> JudgeReport:
    """The plugin's report as the runner read it; a missing or malformed one is an unconfigured run."""
    if not isinstance(raw, dict):
        return JudgeReport(False, None, {}, [])
    tests = raw.get("tests") if isinstance(raw.get("tests"), dict) else {}
    status = raw.get("exitstatus")
    return JudgeReport(
        configured=bool(raw.get("configured")),
        exitstatus=status if isinstance(status, int) else None,
        tests={str(k): str(v) for k, v in tests.items()},
        foreign=[str(f) for f in raw.get("foreign", [])],
    )


def _tests_result(task: Task, summary: dict[str, Any], log: str, config: JudgeConfig) -> Judgement:
    """The local backend's verdict on the pod's test run."""
    code = summary.get("exit_code")
    run = RunOutcome(
        returncode=code if isinstance(code, int) else None,
        timed_out=False,
        output_exceeded=False,
        duration_s=0.0,
        output_bytes=len(log),
        log=log,
    )
    flags = _judged_flags(summary.get("judged"), config)
    return judge(run, _report(summary.get("report")), task, flags, config)


_STAGE_ERRORS = {
    "setup": (Status.INFRA_ERROR, "the pod could not lay out the repository"),
    "model_patch": (Status.ERROR, "the model patch does not apply"),
    "test_patch": (Status.ERROR, "the task's test patch does not apply after the model patch"),
}


def result_from_summary(
    task: Task,
    key: str,
    summary: dict[str, Any] | None,
    duration_s: float,
    max_log_chars: int,
    pod_log: str = "",
    config: JudgeConfig | None = None,
) -> TestResult:
    """The TestResult of a pod that finished, from its runner summary (None when it printed none)."""
    base = {"trajectory_id": key, "instance_id": task.instance_id, "duration_s": duration_s}
    if summary is None:
        reason = "the pod runner printed no result (see log)"
        return TestResult(**base, status=Status.INFRA_ERROR, reason=reason, log=pod_log[-max_log_chars:])
    log = str(summary.get("log", ""))[-max_log_chars:]
    stage = summary.get("stage")
    if stage in _STAGE_ERRORS:
        status, reason = _STAGE_ERRORS[stage]
        return TestResult(**base, status=status, reason=reason, log=log)
    j = _tests_result(task, summary, log, config or JudgeConfig())
    return TestResult(
        **base, status=j.status, resolved=j.resolved, tests=j.tests, reason=j.reason, hacks=j.hacks, log=log
    )
