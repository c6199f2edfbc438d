"""The crash-resume script: five SIGKILLs at random points of a real run, each followed by --resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "crash_resume.py"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_survives_five_kills_with_every_step_kept_and_weights_bit_equal(tmp_path: Path):
    summary_path = tmp_path / "summary.json"
    cmd = [sys.executable, str(SCRIPT), "--steps", "12", "--kills", "5", "--seed", "3"]
    result = subprocess.run(
        [*cmd, "--work", str(tmp_path / "work"), "--summary", str(summary_path)],
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["problems"] == []
    assert summary["kills"] == 5
    assert summary["checkpoint_steps"] == summary["logged_steps"] == list(range(1, 13))
    assert summary["corrupt"] == []
    assert summary["partial_left"] == []
    assert summary["metrics_equal"]
    assert summary["params_equal"]
