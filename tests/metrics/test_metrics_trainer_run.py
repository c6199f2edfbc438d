"""`gagar train` marks its run active while it steps and finished (succeeded or failed) at the end."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fixtures.services import Pushgateway, http_get
from gagar.train.config import TrainConfig
from gagar.train.trainer import Trainer


def _trainer(gateway: Pushgateway, tmp_path: Path, run: str, fail_at: int | None) -> Trainer:
    config = TrainConfig(
        tasks=tmp_path / "tasks.jsonl",
        policy=tmp_path,
        run_dir=tmp_path / run,
        steps=2,
        metrics={"pushgateway": gateway.url, "job": "gagar-trainer-test"},
    )
    trainer = Trainer(config, progress=False)

    def step(number: int) -> dict[str, Any]:  # the step's phases are tested elsewhere: only its metrics here
        if number == fail_at:
            raise RuntimeError("the rollout server went away")
        return {"step": float(number), "sandbox/passed": 2.0, "rollout/resolved_rate": 0.5}

    trainer.step = step  # type: ignore[method-assign]
    return trainer


def _value(gateway: Pushgateway, name: str, run: str, extra: str = "") -> float:
    text = http_get(f"{gateway.url}/metrics").decode()
    matches = [
        float(m.group(2))
        for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE)
        if f'run="{run}"' in m.group(1) and extra in m.group(1)
    ]
    assert len(matches) == 1, (name, run, text)
    return matches[0]


def test_a_finished_run_is_inactive_and_keeps_its_totals(pushgateway: Pushgateway, tmp_path: Path) -> None:
    _trainer(pushgateway, tmp_path, "ok-run", fail_at=None).run()
    assert _value(pushgateway, "gagar_run_active", "ok-run") == 0
    assert _value(pushgateway, "gagar_run_failed", "ok-run") == 0
    assert _value(pushgateway, "gagar_run_finished_timestamp_seconds", "ok-run") > 0  # marked, not unset
    assert _value(pushgateway, "gagar_trajectories_total", "ok-run", 'status="passed"') == 4


def test_a_failed_run_is_inactive_and_failed(pushgateway: Pushgateway, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="went away"):
        _trainer(pushgateway, tmp_path, "bad-run", fail_at=1).run()
    assert _value(pushgateway, "gagar_run_active", "bad-run") == 0
    assert _value(pushgateway, "gagar_run_failed", "bad-run") == 1
    assert _value(pushgateway, "gagar_train_step", "bad-run") == 0  # step 0's push stays
