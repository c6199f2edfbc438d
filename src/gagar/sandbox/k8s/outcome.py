"""From a finished (or stuck) pod to a TestResult: pod status checks, log summary, junit outcomes.

Status mapping: image pull failures, container-creation errors, evictions for node
pressure and pods that never start are ``infra_error`` (never the policy's fault); a pod
past its activeDeadlineSeconds is a ``timeout``; an OOM-killed container is ``failed``;
a patch that does not apply is ``error``; otherwise the tests' junit report decides
``passed`` (resolved) or ``failed``.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client

from gagar.sandbox.junit import node_id
from gagar.sandbox.process import RunOutcome
from gagar.sandbox.results import Outcome, Status, TestResult
from gagar.sandbox.verdict import Verdict, expected_outcomes, verdict
from gagar.tasks.schema import Task

__all__ = [
    "IMAGE_ERRORS",
    "PodCheck",
    "check_pod",
    "junit_outcomes",
    "parse_summary",
    "result_from_summary",
]

IMAGE_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_CREATE_ERRORS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
_RANK = {Outcome.PASSED: 0, Outcome.SKIPPED: 1, Outcome.FAILED: 2, Outcome.ERROR: 3}

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


def _node_id(case: ET.Element) -> str:
    """pytest node id of a junit testcase; xunit1's ``file`` attribute tells the module from classes."""
    file = case.get("file")
    return node_id(case.get("classname", ""), case.get("name", ""), lambda path: file is None or path == file)


def _case_outcome(case: ET.Element) -> Outcome:
    tags = {child.tag for child in case}
    if "error" in tags:
        return Outcome.ERROR
    if "failure" in tags:
        return Outcome.FAILED
    return Outcome.SKIPPED if "skipped" in tags else Outcome.PASSED


def junit_outcomes(xml_text: str) -> dict[str, Outcome]:
    """Outcome per pytest node id of a junit XML report; a test reported twice keeps its worst outcome.

    Raises ValueError when the text is not XML.
    """
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise ValueError(f"junit report is not XML: {exc}") from None
    outcomes: dict[str, Outcome] = {}
    for case in root.iter("testcase"):
        node, outcome = _node_id(case), _case_outcome(case)
        if node not in outcomes or _RANK[outcome] > _RANK[outcomes[node]]:
            outcomes[node] = outcome
    return outcomes


def _tests_result(task: Task, summary: dict[str, Any], log: str) -> tuple[Verdict, dict[str, Outcome]]:
    """The local backend's verdict on the pod's test run, and the outcomes with missing tests marked."""
    junit, expected = summary.get("junit"), [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    try:
        found = junit_outcomes(junit) if junit else None
    except ValueError:
        found = None
    code = summary.get("exit_code")
    run = RunOutcome(
        returncode=code if isinstance(code, int) else None,
        timed_out=False,
        output_exceeded=False,
        duration_s=0.0,
        output_bytes=len(log),
        log=log,
    )
    return verdict(run, found, expected), expected_outcomes(found or {}, expected)


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
    (status, resolved, reason), tests = _tests_result(task, summary, log)
    return TestResult(**base, status=status, resolved=resolved, tests=tests, reason=reason, log=log)
