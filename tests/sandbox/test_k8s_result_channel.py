"""The runner's termination message: at most 4 KiB, the log tail kept that fits, decoded back safely."""

from __future__ import annotations

import base64
import json
import random
import string
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.sandbox.k8s.outcome import OVERFLOW, check_pod, decode_result, termination_message
from gagar.sandbox.k8s.pod_runner import RESULT_MAX_BYTES, encode_result

NONCE = "ab" * 16


def summary(log: str, tests: int = 3) -> dict:
    report = {
        "configured": True,
        "exitstatus": 0,
        "tests": {f"t.py::test_{i}": "passed" for i in range(tests)},
    }
    return {"stage": "done", "exit_code": 0, "report": report, "judged": None, "log": log}


def group(*logs: str, tests: int = 3) -> dict:
    """A pod's account: one summary per log, the reference once."""
    return {"results": [summary(log, tests) for log in logs], "reference": {"code": {}, "tests": {}}}


def without_logs(account: dict) -> dict:
    return {**account, "results": [{k: v for k, v in s.items() if k != "log"} for s in account["results"]]}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(max_size=8_000), min_size=1, max_size=8), st.integers(min_value=0, max_value=20))
def test_message_fits_and_keeps_a_tail_of_each_log(logs: list[str], tests: int) -> None:
    original = group(*logs, tests=tests)
    message = encode_result(original, NONCE)
    assert len(message.encode("ascii")) <= RESULT_MAX_BYTES
    decoded = decode_result(message, NONCE, 1 << 20)
    assert isinstance(decoded, dict)
    assert without_logs(decoded) == without_logs(original)
    kept = [s["log"] for s in decoded["results"]]
    assert all(log.endswith(tail) for log, tail in zip(logs, kept, strict=True))
    keep = max(len(t) for t in kept)  # one length for every log: each keeps min(its own, keep)
    assert all(len(t) == min(len(log), keep) for t, log in zip(kept, logs, strict=True))


def test_an_incompressible_log_is_cut_to_what_fits() -> None:
    rng = random.Random(0)
    log = "".join(rng.choice(string.printable) for _ in range(20_000))
    decoded = decode_result(encode_result(group(log), NONCE), NONCE, 1 << 20)
    assert isinstance(decoded, dict)
    (kept,) = [s["log"] for s in decoded["results"]]
    assert 1000 < len(kept) < 4096
    assert log.endswith(kept)
    assert decode_result(encode_result(group("short"), NONCE), NONCE, 1 << 20)["results"][0]["log"] == "short"


def test_eight_incompressible_logs_share_the_room_equally() -> None:
    rng = random.Random(2)
    logs = ["".join(rng.choice(string.printable) for _ in range(5_000)) for _ in range(8)]
    decoded = decode_result(encode_result(group(*logs), NONCE), NONCE, 1 << 20)
    assert isinstance(decoded, dict)
    kept = [s["log"] for s in decoded["results"]]
    assert len({len(t) for t in kept}) == 1
    assert 100 < len(kept[0]) < 500
    assert all(log.endswith(t) for log, t in zip(logs, kept, strict=True))


def test_a_summary_too_large_without_its_log_says_overflow() -> None:
    rng = random.Random(1)
    names = ["".join(rng.choice(string.ascii_letters) for _ in range(40)) for _ in range(500)]
    big = group("x")
    big["results"][0]["report"]["tests"] = {name: "passed" for name in names}
    message = encode_result(big, NONCE)
    assert message.endswith(" -")
    assert decode_result(message, NONCE, 1 << 20) == OVERFLOW


def test_decoding_refuses_other_nonces_garbage_and_bombs() -> None:
    message = encode_result(group("log"), NONCE)
    assert decode_result(message, "cd" * 16, 1 << 20) is None
    assert decode_result(None, NONCE, 1 << 20) is None
    assert decode_result("Traceback (most recent call last): ...", NONCE, 1 << 20) is None
    assert decode_result(f"GAGAR1 {NONCE} not-base64!", NONCE, 1 << 20) is None
    bomb = base64.b64encode(zlib.compress(json.dumps({"log": "a" * 3_000_000}).encode(), 9)).decode()
    assert len(bomb) < RESULT_MAX_BYTES
    assert decode_result(f"GAGAR1 {NONCE} {bomb}", NONCE, 1 << 20) is None  # past max_bytes


def test_pod_json_classification_and_message() -> None:
    pod = {
        "metadata": {"name": "p"},
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [
                {"name": "sandbox", "state": {"terminated": {"exitCode": 0, "message": "m"}}}
            ],
        },
    }
    assert check_pod(pod).state == "finished"
    assert termination_message(pod) == "m"
    pulling = {
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull"}}}],
        }
    }
    assert check_pod(pulling).state == "infra_error"
    evicted = {
        "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
    }
    assert check_pod(evicted).state == "infra_error"
    assert check_pod({"status": {"phase": "Pending"}}).state == "waiting"
    killed = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"state": {"terminated": {"exitCode": 137, "reason": "Error"}}}],
        }
    }
    assert check_pod(killed).state == "infra_error"  # the runner was killed mid-group
    assert "exit code 137" in (check_pod(killed).reason or "")
    assert termination_message({"status": {"phase": "Running"}}) is None
