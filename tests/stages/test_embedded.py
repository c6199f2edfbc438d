"""The embedded default is built once, reused, and its task sets never overlap."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from fixtures.policy import tiny_sft_config
from gagar.embedded import (
    RECIPE_FILE,
    SHIPPED_POLICY,
    SUMS_FILE,
    EmbeddedSettings,
    build_environment,
    build_policy,
    expected_probes,
    prepare,
    shipped_mismatch,
)
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


STALE = "the shipped pre-RL policy is stale ({}): rebuild it with `make embedded` and commit the result"


def test_the_shipped_policy_fits_this_code():
    """Its files match their hashes, and the demonstrations this code builds are those it learnt from."""
    mismatch = shipped_mismatch(EmbeddedSettings())
    assert mismatch is None, STALE.format(mismatch)


def test_prepare_copies_the_shipped_policy_instead_of_training(tmp_path):
    embedded = prepare(tmp_path, EmbeddedSettings(rl_tasks=1, workers=1), progress=False)
    assert embedded.sft_tasks is None  # nothing was trained, so no SFT tasks were generated
    listed = [line.split("  ") for line in (SHIPPED_POLICY / SUMS_FILE).read_text().splitlines()]
    assert "model.safetensors" in {name for _, name in listed}
    for digest, name in listed:
        assert hashlib.sha256((embedded.policy / name).read_bytes()).hexdigest() == digest, name


def test_a_tampered_or_differently_built_policy_is_not_used(tmp_path):
    folder = tmp_path / "policy"
    shutil.copytree(SHIPPED_POLICY, folder)
    assert shipped_mismatch(EmbeddedSettings(seed=1), folder) == "it was built with other settings"
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    assert shipped_mismatch(EmbeddedSettings(), folder) == f"model.safetensors does not match {SUMS_FILE}"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 3 minutes on 2 quiet cores (4,000 tasks, 100 SFT steps); 10+ loaded
def test_make_embedded_reproduces_the_shipped_weights(tmp_path):
    """The build command, run again, follows the shipped run bit for bit (checked at its probe step:
    resuming is bit-exact, so the rest of the run is the same computation)."""
    recipe = json.loads((SHIPPED_POLICY / RECIPE_FILE).read_text())
    again = build_policy(tmp_path / "policy", until_step=recipe["probe_step"], progress=False)
    environment = build_environment()
    assert again["probe_weights_sha256"] in expected_probes(recipe, environment), STALE.format(
        f"`{recipe['command']}` no longer reproduces the weights after {recipe['probe_step']} steps in "
        f"{environment} (if this environment is new and the demonstrations unchanged, "
        "`gagar policy embedded --record-probe` records its hash)"
    )


def test_each_build_environment_has_its_own_probe_and_may_match_another() -> None:
    recipe = {
        "probe_weights_sha256": "shipped",
        "reproduced_in": [
            {"environment": {"cpu_capability": "AVX2"}, "probe_weights_sha256": "avx2"},
            {"environment": {"cpu_capability": "AVX512"}, "probe_weights_sha256": "avx512"},
        ],
    }
    assert expected_probes(recipe, {"cpu_capability": "AVX512"}) == ["avx512", "avx2", "shipped"]
    # a new environment (another library release) passes when it computes a recorded build's bits
    assert expected_probes(recipe, {"cpu_capability": "AVX512", "transformers": "next"}) == [
        "avx2", "avx512", "shipped"
    ]  # fmt: skip
