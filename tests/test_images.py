"""Every stage has one image: pinned base, exact dependency versions, non-root, kfp preinstalled."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["rollout", "sandbox", "grader", "redistribute", "train"]


def _dockerfile(stage: str) -> str:
    return (ROOT / "images" / stage / "Dockerfile").read_text()


@pytest.mark.parametrize("stage", STAGES)
def test_image_is_pinned_and_non_root(stage):
    text = _dockerfile(stage)
    (base,) = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert ":" in base, f"{stage}: base image {base} has no tag"
    assert not base.endswith(":latest"), f"{stage}: base image {base} is not pinned"
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users, f"{stage}: no USER line"
    assert users[-1].split(":")[0] not in {"0", "root"}
    assert "constraints.txt" in text


@pytest.mark.parametrize("stage", STAGES)
def test_image_extras_exist_in_pyproject(stage):
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for group in re.findall(r'"\.\[([a-z,]+)\]"', _dockerfile(stage)):
        assert set(group.split(",")) <= extras


def test_constraints_pin_exact_versions_matching_pyproject():
    lines = [
        line
        for line in (ROOT / "images" / "constraints.txt").read_text().splitlines()
        if line and line[0] != "#"
    ]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][^\s]*", line) for line in lines), lines
    pins = dict(line.split("==") for line in lines)
    assert pins["kfp"] == "2.17.3"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"kfp==2.17.3"' in pyproject
    assert '"torch==2.13.0"' in pyproject


def test_only_gpu_stages_carry_torch():
    for stage in ("sandbox", "redistribute"):
        assert "policy" not in _dockerfile(stage), f"{stage} should not install torch"
