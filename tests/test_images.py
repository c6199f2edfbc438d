"""Every stage has one image: pinned base, exact dependency versions, non-root, kfp preinstalled."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from gagar.pipeline.images import CPU_BASE, CPU_BUILD_ARGS, CPU_TORCH, stage_image

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["rollout", "sandbox", "grader", "redistribute", "train"]


def _dockerfile(stage: str) -> str:
    return (ROOT / "images" / stage / "Dockerfile").read_text()


def _base(text: str) -> str:
    """The base image of a Dockerfile, ``${ARG}`` resolved to the argument's default."""
    (base,) = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    defaults = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, flags=re.M))
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], base)


@pytest.mark.parametrize("stage", STAGES)
def test_image_is_pinned_and_non_root(stage):
    text = _dockerfile(stage)
    base = _base(text)
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


@pytest.mark.parametrize("stage", sorted(CPU_BUILD_ARGS))
def test_cpu_variant_sets_only_arguments_its_dockerfile_declares(stage):
    text = _dockerfile(stage)
    declared = set(re.findall(r"^ARG\s+(\w+)", text, flags=re.M))
    assert set(CPU_BUILD_ARGS[stage]) <= declared
    assert _base(text) == CPU_BASE or CPU_BUILD_ARGS[stage].get("BASE") == CPU_BASE
    assert CPU_BUILD_ARGS[stage]["TORCH"] == CPU_TORCH
    # the CPU torch comes from the bind-mounted local wheels, never copied into a layer
    assert "--mount=type=bind,source=images/wheels,target=/wheels" in text
    assert "--find-links /wheels" in text


def test_cpu_torch_is_the_pinned_torch():
    assert CPU_TORCH.split("+")[0] == "torch==2.13.0"
    assert f'"{CPU_TORCH.split("+")[0]}"' in (ROOT / "pyproject.toml").read_text()


def test_only_cuda_stages_have_a_cpu_variant():
    assert set(CPU_BUILD_ARGS) == {"rollout", "grader", "train"}
    assert set(CPU_BUILD_ARGS) <= set(STAGES)


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_has_a_smoke_run(stage):
    spec = importlib.util.spec_from_file_location("images_smoke", ROOT / "images" / "smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert stage in module.SMOKES


def test_cpu_variant_names():
    assert stage_image("train", variant="cpu").endswith(":0.1.0-cpu")
    assert stage_image("sandbox", variant="cpu") == stage_image("sandbox")
    with pytest.raises(ValueError, match="variant"):
        stage_image("train", variant="rocm")


def test_compiled_tasks_name_the_cpu_variants():
    from gagar.pipeline.argo import build_workflow
    from gagar.pipeline.platform import PlatformOptions

    spec = build_workflow(platform=PlatformOptions(image_variant="cpu"))["spec"]
    images = {t["container"]["image"] for t in spec["templates"] if "container" in t}
    assert images == {stage_image(s, variant="cpu") for s in STAGES}
    assert {i for i in images if i.endswith("-cpu")} == {
        stage_image(s, variant="cpu") for s in CPU_BUILD_ARGS
    }
