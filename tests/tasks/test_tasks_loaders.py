"""Task files: SWE-bench records load unchanged, errors name line or row and field, parquet round trips."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gagar.records import RecordError
from gagar.schema.task import Task
from gagar.tasks.loaders import TaskFileError, load_tasks, split_by_repo, write_tasks

SWE_BENCH_RECORD = {
    "repo": "astropy/astropy",
    "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": "diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py\n--- a/x\n+++ b/x\n",
    "test_patch": "diff --git a/astropy/modeling/tests/test_separable.py "
    "b/astropy/modeling/tests/test_separable.py\n",
    "problem_statement": "Modeling's `separability_matrix` does not compute separability correctly "
    "for nested CompoundModels\n",
    "hints_text": "",
    "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3",
    "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
    "PASS_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_coord_matrix"]',
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
}


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_swe_bench_record_loads_unchanged(tmp_path: Path):
    path = tmp_path / "swe.jsonl"
    _write_jsonl(path, [SWE_BENCH_RECORD])
    (task,) = load_tasks(path)
    dumped = task.model_dump()
    for key, value in SWE_BENCH_RECORD.items():
        expected = json.loads(value) if key in ("FAIL_TO_PASS", "PASS_TO_PASS") else value
        assert dumped[key] == expected, key


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_carries_unknown_fields(tmp_path: Path, suffix: str):
    bundled = Task(
        instance_id="synth__pkg-1",
        repo="synth/pkg",
        snapshot={"pkg/a.py": "X = 1\n", "tests/test_a.py": "def test_x():\n    assert True\n"},
        problem_statement="`f` is wrong",
        patch="",
        FAIL_TO_PASS=["tests/test_a.py::test_x"],
        environment={"python": "/usr/bin/python3", "requirements": ["numpy"]},
        bug_kind="off_by_one",
        tags=[1, 2],
    )
    tasks = [Task.model_validate(SWE_BENCH_RECORD), bundled]
    path = tmp_path / f"tasks{suffix}"
    assert write_tasks(path, tasks) == 2
    loaded = load_tasks(path)
    assert [t.model_dump() for t in loaded] == [t.model_dump() for t in tasks]
    assert loaded[0].created_at == "2022-03-03T15:14:54Z"
    assert loaded[1].snapshot == bundled.snapshot
    assert loaded[1].tags == [1, 2]


def test_jsonl_error_names_line_and_field(tmp_path: Path):
    bad = {**SWE_BENCH_RECORD, "FAIL_TO_PASS": "[not json"}
    path = tmp_path / "bad.jsonl"
    _write_jsonl(path, [SWE_BENCH_RECORD, bad])
    with pytest.raises(RecordError, match=r"bad\.jsonl:2: field 'FAIL_TO_PASS': .*not a JSON list") as info:
        load_tasks(path)
    assert (info.value.line, info.value.field) == (2, "FAIL_TO_PASS")
    missing = {k: v for k, v in SWE_BENCH_RECORD.items() if k != "problem_statement"}
    _write_jsonl(path, [missing])
    with pytest.raises(RecordError, match=r"bad\.jsonl:1: field 'problem_statement'"):
        load_tasks(path)


def test_parquet_error_names_row_and_field(tmp_path: Path):
    rows = [SWE_BENCH_RECORD, {**SWE_BENCH_RECORD, "instance_id": ""}]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(TaskFileError, match=r"bad\.parquet: row 2: field 'instance_id'") as info:
        load_tasks(path)
    assert isinstance(info.value, RecordError)
    assert info.value.line == 2


def test_plain_parquet_with_list_columns_loads(tmp_path: Path):
    row = {**SWE_BENCH_RECORD, "FAIL_TO_PASS": ["a::b"], "PASS_TO_PASS": []}
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    (task,) = load_tasks(path)
    assert task.FAIL_TO_PASS == ["a::b"]
    assert task.version == "4.3"


def _task(repo: str, i: int) -> Task:
    return Task(instance_id=f"{repo}-{i}", repo=repo, base_commit="0" * 40, problem_statement="p",
                patch="", FAIL_TO_PASS=["t::x"])  # fmt: skip


@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.5, 1.0])
def test_split_by_repo_never_shares_a_repository(fraction: float):
    tasks = [_task(f"org/repo{r}", i) for r in range(10) for i in range(r % 3 + 1)]
    train, heldout = split_by_repo(tasks, fraction, seed=3)
    assert {t.repo for t in train}.isdisjoint({t.repo for t in heldout})
    assert sorted(t.instance_id for t in train + heldout) == sorted(t.instance_id for t in tasks)
    assert len(heldout) >= fraction * len(tasks)
    assert split_by_repo(tasks, fraction, seed=3) == (train, heldout)
    with pytest.raises(ValueError, match="heldout_fraction"):
        split_by_repo(tasks, 1.5)
