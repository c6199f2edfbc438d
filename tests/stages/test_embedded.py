"""The embedded default is built once, reused, and its task sets never overlap."""

from __future__ import annotations

from pathlib import Path

import yaml

from fixtures.policy import tiny_sft_config
from gagar.embedded import EmbeddedSettings, prepare
from gagar.records import read_records
from gagar.schema.task import Task
from gagar.train.config import load_config


def test_prepare_builds_once_and_reuses(tmp_path):
    settings = EmbeddedSettings(
        sft_tasks=6,
        rl_tasks=2,
        heldout_tasks=1,
        sft=tiny_sft_config(steps=2, checkpoint_every=2, noise_share=0.5),
    )
    first = prepare(tmp_path, settings, progress=False)
    assert (first.policy / "config.json").is_file()
    stamps = {
        p: p.stat().st_mtime_ns for p in (first.sft_tasks, first.rl_tasks, first.policy / "config.json")
    }
    again = prepare(tmp_path, settings, progress=False)
    assert again == first
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    sft = read_records(first.sft_tasks, Task)
    rl = read_records(first.rl_tasks, Task)
    held = read_records(first.heldout_tasks, Task)
    assert len(sft) == 6
    assert len(rl) == 2
    assert len(held) == 1
    assert not {t.repo for t in sft} & {t.repo for t in rl}
    assert not {t.repo for t in held} & ({t.repo for t in sft} | {t.repo for t in rl})


def test_the_shipped_local_config_loads():
    path = Path(__file__).resolve().parents[2] / "configs" / "local.yaml"
    config = load_config(path)
    assert config.advantage.algo.value == "gagar"
    assert config.policy == path.parent.parent / "runs" / "local" / "embedded" / "policy"
    assert yaml.safe_load(path.read_text())["rollout"]["group_size"] == config.rollout.group_size
