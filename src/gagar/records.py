"""JSONL records: validated reading with line-numbered errors, atomic writing.

Every data contract of the pipeline (Task, Trajectory, TestResult, Grade) is a
pydantic model deriving from :class:`Record`. Readers accept and carry unknown
fields, so a trajectories file is also a predictions file for the sandbox.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "SCHEMA_VERSION",
    "Record",
    "RecordError",
    "atomic_write_bytes",
    "atomic_write_text",
    "iter_records",
    "read_records",
    "write_records",
]

SCHEMA_VERSION = 1

R = TypeVar("R", bound="Record")


class Record(BaseModel):
    """Base of every JSONL record: unknown fields are kept and written back."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    schema_version: int = SCHEMA_VERSION


class RecordError(ValueError):
    """A record that does not validate, naming the file, the line and the field."""

    def __init__(self, source: str, line: int, field: str | None, message: str) -> None:
        self.source, self.line, self.field = source, line, field
        where = f"{source}:{line}" + (f": field '{field}'" if field else "")
        super().__init__(f"{where}: {message}")


def _first_error(exc: ValidationError) -> tuple[str | None, str]:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or None
    return field, err["msg"].removeprefix("Value error, ")


def iter_records(path: str | os.PathLike[str], model: type[R]) -> Iterator[R]:
    """Yield the records of a JSONL file, validated as ``model``; blank lines are skipped.

    Raises:
        RecordError: on the first line that is not JSON or does not validate.
    """
    source = str(path)
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(source, lineno, None, f"not valid JSON ({exc.msg})") from None
            if not isinstance(data, dict):
                raise RecordError(source, lineno, None, f"expected a JSON object, got {type(data).__name__}")
            try:
                yield model.model_validate(data)
            except ValidationError as exc:
                field, msg = _first_error(exc)
                raise RecordError(source, lineno, field, msg) from None


def read_records(path: str | os.PathLike[str], model: type[R]) -> list[R]:
    """All records of a JSONL file (see :func:`iter_records`)."""
    return list(iter_records(path, model))


def _dump(record: BaseModel | dict[str, Any]) -> str:
    if isinstance(record, BaseModel):
        return record.model_dump_json()
    return json.dumps(record, ensure_ascii=False)


def write_records(path: str | os.PathLike[str], records: Iterable[BaseModel | dict[str, Any]]) -> int:
    """Write records as JSONL atomically (temporary file, fsync, rename); returns the count."""
    lines = [_dump(r) for r in records]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Text version of :func:`atomic_write_bytes` (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"))
