"""`gagar pipeline compile` images: --image, else GAGAR_IMAGES__<STAGE>, else the registry and tag."""

from __future__ import annotations

import pytest

from gagar.cli.pipeline import stage_images
from gagar.pipeline.platform import PlatformOptions


def test_a_flag_wins_over_the_environment_and_unnamed_stages_keep_the_registry() -> None:
    env = {"GAGAR_IMAGES__ROLLOUT": "env/rollout:1", "GAGAR_IMAGES__TRAIN": "env/train:1", "GAGAR_OTHER": "x"}
    assert stage_images(["train=flag/train:2"], env) == (
        ("rollout", "env/rollout:1"),
        ("train", "flag/train:2"),
    )
    assert stage_images([], {"GAGAR_IMAGES__SANDBOX": ""}) == ()  # empty means unset


def test_platform_options_refuse_an_image_for_an_unknown_stage() -> None:
    with pytest.raises(ValueError, match="unknown stage 'prepare'"):
        PlatformOptions(images=(("prepare", "x/y:1"),))
