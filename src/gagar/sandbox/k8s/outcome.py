"""From a finished (or stuck) pod to a TestResult: pod status checks, log summary, the judge's verdict.

Status mapping: image pull failures, container-creation errors, evictions for node
pressure, pods that never start and runners killed before they finished (a pod failed
without a deadline, eviction or OOM) are ``infra_error`` (never the policy's fault); a pod
past its activeDeadlineSeconds is a ``timeout``; an OOM-killed container is ``failed``;
a patch that does not apply is ``error``; an evaluation past its own deadline inside the pod
is a ``timeout``; otherwise, from the runner's summary of each evaluation of the pod (its
termination message, else its log), the local backend's judge
(:func:`gagar.sandbox.verdict.judge`) decides from what the in-pod runner reset, the library
files the patch changed, and the judge plugin's report: ``passed`` (resolved), ``failed``,
``error`` or ``hack``.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from gagar.sandbox.hacks import JudgeConfig, reset_flags, source_flags
from gagar.sandbox.k8s.pod_runner import OVERFLOW as RESULT_OVERFLOW
from gagar.sandbox.k8s.pod_runner import RESULT_TAG
from gagar.sandbox.pristine import JudgeReport, Reference, Reset, SourceChange, node_ids
from gagar.sandbox.process import RunOutcome
from gagar.sandbox.verdict import Judgement, judge
from gagar.schema.result import HackFlag, Status, TestResult
from gagar.schema.task import Task

__all__ = [
    "IMAGE_ERRORS",
    "OVERFLOW",
    "PodCheck",
    "check_pod",
    "decode_result",
    "group_results",
    "parse_summary",
    "result_from_summary",
    "termination_message",
]

IMAGE_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_CREATE_ERRORS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})

PodState = Literal["waiting", "running", "finished", "infra_error", "timeout", "oom_killed", "evicted_limit"]


@dataclass(frozen=True)
class PodCheck:
    """What a pod's status says: keep waiting, or how it ended (with the reason)."""

    state: PodState
    reason: str | None = None


def _container_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list((pod.get("status") or {}).get("containerStatuses") or [])


def _unscheduled_reason(pod: dict[str, Any]) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason')}: {cond.get('message')}"
    return None


def _ended(statuses: list[dict[str, Any]]) -> str:
    """How the sandbox container terminated, in words."""
    for cs in statuses:
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:
            return f"exit code {term.get('exitCode')} ({term.get('reason') or 'no reason'})"
    return "no container status"


def check_pod(pod: dict[str, Any]) -> PodCheck:
    """Classify a pod in its API (JSON) form; 'waiting' carries why it is not running yet, if known.

    A watch event's object is that form; a client model converts with ``objects.to_dict``.
    """
    status = pod.get("status") or {}
    phase, reason, message = status.get("phase"), status.get("reason"), status.get("message") or ""
    statuses = _container_statuses(pod)
    if phase in ("Succeeded", "Failed"):
        if reason == "DeadlineExceeded":
            return PodCheck("timeout", f"pod ran past activeDeadlineSeconds ({message})")
        if reason == "Evicted":
            limit_hit = "exceeds" in message or "usage of" in message
            return PodCheck("evicted_limit" if limit_hit else "infra_error", f"evicted: {message}")
        for cs in statuses:
            term = (cs.get("state") or {}).get("terminated")
            if term is not None and term.get("reason") == "OOMKilled" and phase == "Failed":
                return PodCheck("oom_killed", "OOMKilled: the tests exceeded the memory limit")
        if phase == "Failed":  # the runner exits 0 once it has judged its group: it was killed
            return PodCheck("infra_error", f"the pod's runner did not finish: {_ended(statuses)}")
        return PodCheck("finished")
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting is not None and waiting.get("reason") in IMAGE_ERRORS | _CREATE_ERRORS:
            return PodCheck("infra_error", f"{waiting.get('reason')}: {waiting.get('message')}")
    if phase == "Running":
        return PodCheck("running")
    return PodCheck("waiting", _unscheduled_reason(pod))


def termination_message(pod: dict[str, Any], container: str = "sandbox") -> str | None:
    """The terminated container's message, None when it has not terminated or left none."""
    for cs in _container_statuses(pod):
        if cs.get("name") == container:
            term = (cs.get("state") or {}).get("terminated") or {}
            return term.get("message")
    return None


OVERFLOW: Final = "overflow"
"""decode_result's answer for a runner whose summary did not fit its termination message."""


def decode_result(message: str | None, nonce: str, max_bytes: int) -> dict[str, Any] | str | None:
    """The runner's summary from a termination message (see ``pod_runner.encode_result``).

    Returns the summary; :data:`OVERFLOW` when the runner said it did not fit (read the log);
    None when the message is absent, carries another nonce or does not decode. Decompression
    stops past ``max_bytes``, so a crafted message cannot inflate without bound.
    """
    if not message:
        return None
    parts = message.strip().split(" ")
    if len(parts) != 3 or parts[0] != RESULT_TAG or parts[1] != nonce:
        return None
    if parts[2] == RESULT_OVERFLOW:
        return OVERFLOW
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(parts[2], validate=True), max_bytes)
        if inflater.unconsumed_tail:
            return None
        summary = json.loads(raw)
    except (ValueError, zlib.error):
        return None
    return summary if isinstance(summary, dict) else None


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
    status, collected, code = raw.get("exitstatus"), raw.get("collected"), raw.get("code")
    return JudgeReport(
        configured=bool(raw.get("configured")),
        exitstatus=status if isinstance(status, int) else None,
        tests={str(k): str(v) for k, v in tests.items()},
        foreign=[str(f) for f in raw.get("foreign", [])],
        hacks=[
            (str(h[0]), str(h[1]))
            for h in raw.get("hacks", [])
            if isinstance(h, list | tuple) and len(h) == 2
        ],
        code=code if isinstance(code, dict) else None,
        collected=collected if isinstance(collected, int) else None,
        collect_errors=node_ids(raw.get("collect_errors")),
    )


def _reference(raw: Any) -> Reference | None:
    """The pristine test files as the runner compiled them before the tests ran (None: not sent)."""
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("code"), dict)
        or not isinstance(raw.get("tests"), dict)
    ):
        return None
    return Reference(code=raw["code"], tests=raw["tests"])


def _tests_result(task: Task, summary: dict[str, Any], log: str, config: JudgeConfig) -> Judgement:
    """The local backend's verdict on the pod's test run."""
    code = summary.get("exit_code")
    sent = summary.get("output_bytes")
    run = RunOutcome(
        returncode=code if isinstance(code, int) else None,
        timed_out=False,
        output_exceeded=summary.get("output_exceeded") is True,
        duration_s=0.0,
        output_bytes=sent if isinstance(sent, int) else len(log),
        log=log,
    )
    flags = _judged_flags(summary.get("judged"), config)
    return judge(
        run, _report(summary.get("report")), task, flags, config, _reference(summary.get("reference"))
    )


_STAGE_ERRORS = {
    "setup": (Status.INFRA_ERROR, "the pod could not lay out the repository"),
    "timeout": (Status.TIMEOUT, "the evaluation ran past its deadline in the pod (limits.wall_time_s)"),
    "lost": (Status.ERROR, "the evaluation's process ended without a result (killed from inside?)"),
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


def group_results(
    task: Task,
    keys: Sequence[str],
    group: dict[str, Any] | None,
    duration_s: float,
    max_log_chars: int,
    pod_log: str = "",
    config: JudgeConfig | None = None,
) -> list[TestResult]:
    """One TestResult per key, from the runner's account of its pod (None: it printed none).

    ``group`` is ``{"results": [summary, ...], "reference": ...}`` in the order of ``keys``; the
    shared reference goes to every summary that carries none of its own. An evaluation the
    account lacks is ``infra_error``.
    """
    raw = group.get("results") if isinstance(group, dict) else None
    summaries = raw if isinstance(raw, list) else []
    reference = group.get("reference") if isinstance(group, dict) else None
    out = []
    for position, key in enumerate(keys):
        summary = summaries[position] if position < len(summaries) else None
        if not isinstance(summary, dict):
            out.append(result_from_summary(task, key, None, duration_s, max_log_chars, pod_log, config))
            continue
        if "reference" not in summary and reference is not None:
            summary = {**summary, "reference": reference}
        took = summary.get("duration_s")
        took = float(took) if isinstance(took, int | float) else duration_s
        out.append(result_from_summary(task, key, summary, took, max_log_chars, pod_log, config))
    return out
