"""The Task record: a SWE-bench instance, plus how to run its tests.

A SWE-bench, SWE-Gym or SWE-smith instance file loads unchanged: FAIL_TO_PASS and
PASS_TO_PASS may be lists or JSON-encoded strings, and unknown fields are carried.
Tasks generated or synthesized by gagar bundle the repository as ``snapshot``
(path -> file text) instead of a ``base_commit`` to check out.

Schema versions: 1 shipped the FAIL_TO_PASS tests inside the snapshot with an empty
``test_patch``; 2 (written now) keeps them out of the snapshot the policy reads and puts
them in ``test_patch``, applied after the model patch as in SWE-bench, with
``held_out_checks`` naming the FAIL_TO_PASS tests that check the same behaviour on inputs
the problem statement does not show. Version 1 files still load.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gagar.records import Record

__all__ = ["TASK_SCHEMA_VERSION", "Environment", "Task"]

TASK_SCHEMA_VERSION = 2


class Environment(BaseModel):
    """Where a task's tests run."""

    model_config = ConfigDict(extra="allow")

    image: str | None = None
    """Container image for the Kubernetes backend (e.g. a SWE-bench instance image)."""
    python: str | None = None
    """Python interpreter for the local backend; None means the sandbox's default."""
    requirements: list[str] = Field(default_factory=list)
    """Packages the tests need beyond the standard library and pytest."""


class Task(Record):
    """One repair task (DESIGN.md §3)."""

    schema_version: int = TASK_SCHEMA_VERSION
    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1)
    base_commit: str | None = None
    snapshot: dict[str, str] | None = None
    """The repository at the base commit, path -> text, for bundled tasks."""
    problem_statement: str
    patch: str
    """The gold patch (unified diff)."""
    test_patch: str = ""
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    held_out_checks: list[str] = Field(default_factory=list)
    """FAIL_TO_PASS tests of the fixed behaviour on inputs the problem statement does not show:
    a patch that passes the other FAIL_TO_PASS tests but fails one of these special-cases them."""
    environment: Environment = Field(default_factory=Environment)
    test_cmd: str | None = None
    """Command that runs the tests, e.g. ``python -m pytest -q``; None means the sandbox's pytest default."""

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_test_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list of test ids ({exc.msg})") from None
        return value

    @field_validator("environment", mode="before")
    @classmethod
    def _environment_from_image_name(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"image": value}
        return {} if value is None else value

    @model_validator(mode="after")
    def _has_a_repository(self) -> Task:
        if self.base_commit is None and self.snapshot is None:
            raise ValueError("needs a base_commit or a bundled snapshot of the repository")
        if not self.FAIL_TO_PASS:
            raise ValueError("FAIL_TO_PASS is empty: a task must have at least one failing test")
        if stray := sorted(set(self.held_out_checks) - set(self.FAIL_TO_PASS)):
            raise ValueError(f"held_out_checks must be FAIL_TO_PASS tests; not in FAIL_TO_PASS: {stray[0]!r}")
        return self
