"""``gagar advantages`` end to end through the real command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

RECORDS = [
    {"trajectory_id": "t1", "group_id": "g1", "resolved": True, "rank": 1},
    {"trajectory_id": "t2", "group_id": "g1", "resolved": True, "rank": 2},
    {"trajectory_id": "t3", "group_id": "g1", "resolved": False},
    {"trajectory_id": "t4", "group_id": "g2", "reward": 1, "rank": 1},
    {"trajectory_id": "t5", "group_id": "g2", "reward": 0},
]


def _gagar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gagar", *args], capture_output=True, text=True, check=False)


def test_writes_both_advantages_and_a_summary(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    proc = _gagar("advantages", "--in", str(src), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "5 trajectories in 2 groups (2 mixed); 3 passing; credit moved" in proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["trajectory_id"] for r in rows] == ["t1", "t2", "t3", "t4", "t5"]
    g1 = rows[:3]
    assert (
        g1[0]["gagar_advantage"]
        > g1[0]["grpo_advantage"]
        == g1[1]["grpo_advantage"]
        > g1[1]["gagar_advantage"]
    )
    assert g1[0]["gagar_advantage"] + g1[1]["gagar_advantage"] == pytest.approx(2 * g1[0]["grpo_advantage"])
    assert rows[2]["gagar_advantage"] == rows[2]["grpo_advantage"]
    assert rows[3]["gagar_advantage"] == rows[3]["grpo_advantage"]


def test_bad_record_is_named_and_nothing_is_written(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps({"group_id": "g", "resolved": True}) + "\n")
    proc = _gagar("advantages", "--in", str(src), "--out", str(out))
    assert proc.returncode == 2
    assert "record 2 (group 'g') passed but has no 'rank'" in " ".join(proc.stderr.split())
    assert not out.exists()


def test_version_and_help():
    assert _gagar("--version").stdout.strip().startswith("gagar ")
    assert "advantages" in _gagar("--help").stdout
