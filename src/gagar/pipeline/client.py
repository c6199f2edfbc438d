"""Upload a compiled pipeline and schedule recurring runs through the KFP API (``kfp.Client``).

:class:`Schedule` validates everything the API would reject late (a 5-field cron, a concurrency
below 1, a malformed ``--param``) before any request; :func:`create_schedule` then finds the
pipeline version and experiment, replaces a recurring run of the same name and creates the new one.
Each run of the schedule resumes from the latest checkpoint in the store (see
:mod:`gagar.pipeline.store`), so ``max_concurrency`` should stay 1.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gagar.pipeline.parameters import ParameterValue

__all__ = [
    "Schedule",
    "connect",
    "create_schedule",
    "find_version_id",
    "parse_params",
    "upload",
    "validate_cron",
]

_CRON_FIELD = re.compile(r"^[0-9A-Za-z*?/,#LW-]+$")
TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
"""Environment variable naming the file of a ServiceAccount token for multi-user KFP."""


def validate_cron(expression: str) -> str:
    """``expression`` if it is a 6-field cron (seconds first, as KFP's scheduler reads it).

    Raises:
        ValueError: naming the expression and how many fields it has.
    """
    fields = expression.split()
    if len(fields) != 6:
        raise ValueError(
            f"cron {expression!r} has {len(fields)} fields; KFP needs 6, seconds first "
            "(e.g. '0 0 2 * * *' for 02:00 every day)"
        )
    bad = [f for f in fields if not _CRON_FIELD.match(f)]
    if bad:
        raise ValueError(f"cron {expression!r}: field {bad[0]!r} is not a cron field")
    return " ".join(fields)


def parse_params(items: list[str]) -> dict[str, ParameterValue]:
    """``["rollout_group_size=8", ...]`` -> ``{"rollout_group_size": 8}``: each name checked against
    the pipeline's parameters and each value against its type, before anything is sent to KFP.

    Raises:
        ValueError: one line naming the item: not name=value, an unknown name (with the close ones),
            a value not of the parameter's type, or a name given twice.
    """
    from gagar.pipeline.parameters import convert

    params: dict[str, ParameterValue] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--param {item!r}: use name=value")
        if name in params:
            raise ValueError(f"--param {name!r} is given twice")
        params[name] = convert(name, value)
    return params


@dataclass(frozen=True)
class Schedule:
    """A recurring run of a pipeline version, validated on construction."""

    pipeline: str
    version: str
    experiment: str
    name: str
    cron: str
    max_concurrency: int = 1
    catchup: bool = False
    service_account: str | None = None
    params: dict[str, ParameterValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cron", validate_cron(self.cron))
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        for attr in ("pipeline", "version", "experiment", "name"):
            if not getattr(self, attr).strip():
                raise ValueError(f"a schedule needs a {attr}")

    def request(self, experiment_id: str, pipeline_id: str, version_id: str) -> dict[str, Any]:
        """Keyword arguments of ``kfp.Client.create_recurring_run`` for this schedule."""
        return {
            "experiment_id": experiment_id,
            "job_name": self.name,
            "cron_expression": self.cron,
            "max_concurrency": self.max_concurrency,
            "no_catchup": not self.catchup,
            "params": dict(self.params),
            "pipeline_id": pipeline_id,
            "version_id": version_id,
            "enabled": True,
            "service_account": self.service_account,
        }


def connect(host: str) -> Any:
    """A ``kfp.Client`` for ``host``, authenticated with the token file ``$KF_PIPELINES_SA_TOKEN_PATH``
    names when it is set (the chart mounts a projected ServiceAccount token there)."""
    import kfp

    token = None
    path = os.environ.get(TOKEN_PATH_ENV)
    if path:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"{TOKEN_PATH_ENV}={path}: cannot read the token ({exc})") from None
    return kfp.Client(host=host, existing_token=token)


def upload(client: Any, package: str | os.PathLike[str], name: str, version: str) -> tuple[str, str]:
    """Upload ``package`` as version ``version`` of pipeline ``name`` (created when missing).

    Returns (pipeline id, version id).
    """
    pipeline_id = client.get_pipeline_id(name)
    if pipeline_id is None:
        pipeline_id = client.upload_pipeline(str(package), pipeline_name=name).pipeline_id
    uploaded = client.upload_pipeline_version(
        str(package), pipeline_version_name=version, pipeline_id=pipeline_id
    )
    return pipeline_id, uploaded.pipeline_version_id


def _name_filter(name: str) -> str:
    return json.dumps({"predicates": [{"key": "display_name", "operation": "EQUALS", "string_value": name}]})


def find_version_id(client: Any, pipeline_id: str, version: str) -> str:
    """Id of the version named ``version`` of a pipeline. Raises ValueError when it has none."""
    found = client.list_pipeline_versions(pipeline_id, page_size=1, filter=_name_filter(version))
    versions = found.pipeline_versions or []
    if not versions:
        raise ValueError(f"pipeline {pipeline_id} has no version named {version!r}: upload it first")
    return versions[0].pipeline_version_id


def create_schedule(client: Any, schedule: Schedule) -> str:
    """Create ``schedule``'s recurring run, replacing one of the same name; returns its id.

    Raises:
        ValueError: the pipeline or its version does not exist.
    """
    pipeline_id = client.get_pipeline_id(schedule.pipeline)
    if pipeline_id is None:
        raise ValueError(f"no pipeline named {schedule.pipeline!r}: upload it first (gagar pipeline upload)")
    version_id = find_version_id(client, pipeline_id, schedule.version)
    experiment_id = client.create_experiment(name=schedule.experiment).experiment_id
    existing = client.list_recurring_runs(experiment_id=experiment_id, filter=_name_filter(schedule.name))
    for old in existing.recurring_runs or []:
        client.delete_recurring_run(old.recurring_run_id)
    created = client.create_recurring_run(**schedule.request(experiment_id, pipeline_id, version_id))
    return created.recurring_run_id
