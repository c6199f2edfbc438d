"""Read and write task files (SWE-bench-compatible JSONL or parquet) and split them by repository.

A SWE-bench, SWE-Gym or SWE-smith instance file loads unchanged, with unknown fields carried
through a round trip. In parquet, columns holding objects (a bundled ``snapshot``, the
``environment``) are stored as JSON text and named in the file's metadata, so any reader sees
plain columns and :func:`load_tasks` restores them. A null in a column the Task model does not
know is read as an absent field (parquet rows share their columns).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gagar.records import RecordError, atomic_write_bytes, read_records, write_records
from gagar.schema.task import Task

__all__ = ["TaskFileError", "load_tasks", "split_by_repo", "write_tasks"]

_JSON_COLUMNS_KEY = b"gagar.json_columns"


class TaskFileError(RecordError):
    """A malformed row of a parquet task file, naming the file, the row (1-based) and the field."""

    def __init__(self, source: str, row: int, field: str | None, message: str) -> None:
        self.source, self.line, self.field = source, row, field
        where = f"{source}: row {row}" + (f": field '{field}'" if field else "")
        ValueError.__init__(self, f"{where}: {message}")


def _is_parquet(path: str | os.PathLike[str]) -> bool:
    return Path(path).suffix.lower() in (".parquet", ".pq")


def _read_parquet(path: str | os.PathLike[str]) -> list[Task]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    json_columns = set(json.loads(meta.get(_JSON_COLUMNS_KEY, b"[]")))
    tasks = []
    for row_number, full_row in enumerate(table.to_pylist(), start=1):
        # A column is shared by all rows: a null in a field the model does not know means "absent".
        row = {k: v for k, v in full_row.items() if v is not None or k in Task.model_fields}
        for column in json_columns:
            if isinstance(row.get(column), str):
                row[column] = json.loads(row[column])
        try:
            tasks.append(Task.model_validate(row))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or None
            raise TaskFileError(str(path), row_number, field, err["msg"]) from None
    return tasks


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Every task of a ``.jsonl`` or ``.parquet`` file.

    Raises:
        RecordError: naming the line (JSONL) or row (parquet, :class:`TaskFileError`) and the field.
    """
    if _is_parquet(path):
        return _read_parquet(path)
    return read_records(path, Task)


def _needs_json(values: Iterable[Any]) -> bool:
    """Whether a column must be stored as JSON text: it holds objects or non-string lists."""
    for value in values:
        if isinstance(value, dict):
            return True
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            return True
    return False


def _write_parquet(path: str | os.PathLike[str], tasks: Sequence[Task]) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [t.model_dump(mode="json") for t in tasks]
    columns = sorted({key for row in rows for key in row})
    json_columns = [c for c in columns if _needs_json(row.get(c) for row in rows)]
    for row in rows:
        for column in json_columns:
            if row.get(column) is not None:
                row[column] = json.dumps(row[column], ensure_ascii=False)
    table = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows])
    table = table.replace_schema_metadata({_JSON_COLUMNS_KEY: json.dumps(json_columns).encode()})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def write_tasks(path: str | os.PathLike[str], tasks: Iterable[Task]) -> int:
    """Write ``tasks`` atomically as JSONL, or parquet for a ``.parquet`` path; returns the count."""
    tasks = list(tasks)
    if _is_parquet(path):
        _write_parquet(path, tasks)
        return len(tasks)
    return write_records(path, tasks)


def split_by_repo(
    tasks: Sequence[Task], heldout_fraction: float, seed: int = 0
) -> tuple[list[Task], list[Task]]:
    """(train, heldout): whole repositories go to one side, so no repository is in both.

    Repositories are shuffled with ``seed`` and moved to held-out until it holds at least
    ``heldout_fraction`` of the tasks; the order of tasks inside each side is preserved.
    """
    if not 0.0 <= heldout_fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1], got {heldout_fraction}")
    sizes: dict[str, int] = {}
    for task in tasks:
        sizes[task.repo] = sizes.get(task.repo, 0) + 1
    repos = sorted(sizes)
    random.Random(seed).shuffle(repos)
    heldout: set[str] = set()
    target = heldout_fraction * len(tasks)
    for repo in repos:
        if sum(sizes[r] for r in heldout) >= target:
            break
        heldout.add(repo)
    return [t for t in tasks if t.repo not in heldout], [t for t in tasks if t.repo in heldout]
