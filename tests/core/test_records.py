"""JSONL records: line-numbered errors, unknown fields carried, atomic writes."""

from __future__ import annotations

import json
import os

import pytest

from gagar.records import RecordError, atomic_write_text, read_records, write_records
from gagar.sandbox.base import Prediction
from gagar.schema.task import TASK_SCHEMA_VERSION, Task

SWE_BENCH_LIKE = {
    "instance_id": "astropy__astropy-12907",
    "repo": "astropy/astropy",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "problem_statement": "Modeling's separability_matrix does not compute separability correctly",
    "patch": "diff --git a/x.py b/x.py\n",
    "test_patch": "diff --git a/t.py b/t.py\n",
    "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6]"]',
    "PASS_TO_PASS": "[]",
    "version": "4.3",
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
    "created_at": "2022-03-03T15:14:54Z",
}


def test_swe_bench_instance_loads_unchanged_and_round_trips(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(SWE_BENCH_LIKE) + "\n\n")
    (task,) = read_records(path, Task)
    assert task.FAIL_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6]"]
    assert task.PASS_TO_PASS == []
    write_records(tmp_path / "out.jsonl", [task])
    again = json.loads((tmp_path / "out.jsonl").read_text())
    assert again["version"] == "4.3"
    assert again["created_at"] == SWE_BENCH_LIKE["created_at"]
    assert again["schema_version"] == TASK_SCHEMA_VERSION


def test_errors_name_the_line_and_the_field(tmp_path):
    path = tmp_path / "tasks.jsonl"
    broken = dict(SWE_BENCH_LIKE, FAIL_TO_PASS="[not json")
    path.write_text(json.dumps(SWE_BENCH_LIKE) + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(RecordError, match=r"tasks.jsonl:2: field 'FAIL_TO_PASS': not a JSON list") as info:
        read_records(path, Task)
    assert (info.value.line, info.value.field) == (2, "FAIL_TO_PASS")

    path.write_text("{oops\n")
    with pytest.raises(RecordError, match=r":1: not valid JSON"):
        read_records(path, Task)

    path.write_text(json.dumps({k: v for k, v in SWE_BENCH_LIKE.items() if k != "base_commit"}) + "\n")
    with pytest.raises(RecordError, match="needs a base_commit or a bundled snapshot"):
        read_records(path, Task)


def test_a_trajectory_record_is_a_prediction(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text(
        json.dumps({"trajectory_id": "t-1", "instance_id": "i", "model_patch": "", "turns": 3}) + "\n"
    )
    (pred,) = read_records(path, Prediction)
    assert pred.key == "t-1"
    assert pred.model_extra == {"turns": 3}


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "results.jsonl"
    atomic_write_text(target, "old\n")

    with pytest.raises(TypeError):
        write_records(target, [{"ok": 1}, {"not serialisable": object()}])
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["results.jsonl"]


def test_a_version_1_task_file_still_loads_and_keeps_its_version(tmp_path):
    v1 = dict(SWE_BENCH_LIKE, schema_version=1)
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(v1) + "\n")
    (task,) = read_records(path, Task)
    assert task.schema_version == 1
    assert task.held_out_checks == []


def test_held_out_checks_must_be_fail_to_pass_tests(tmp_path):
    bad = dict(SWE_BENCH_LIKE, held_out_checks=["tests/test_x.py::test_not_listed"])
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=r"held_out_checks must be FAIL_TO_PASS tests.*test_not_listed"):
        read_records(path, Task)


def test_a_hack_result_names_its_kind_and_evidence():
    from gagar.schema.result import HackFlag, HackKind, Status, TestResult

    result = TestResult(
        trajectory_id="t", instance_id="i", status=Status.HACK,
        hacks=[HackFlag(kind=HackKind.TEST_INFRASTRUCTURE, evidence="conftest.py: added")],
    )  # fmt: skip
    again = TestResult.model_validate_json(result.model_dump_json())
    assert again.hacks[0].kind is HackKind.TEST_INFRASTRUCTURE
    assert not again.resolved
