"""Settings from the environment: each settings class has its own ``GAGAR_<NAME>__`` prefix, and a
variable no class reads is refused with a hint (:mod:`gagar.settings_env`)."""

from __future__ import annotations

import re

import pytest

from gagar.settings_env import check_environment, families, unknown_settings
from gagar.train.config import TrainConfig, load_config


def test_each_settings_class_has_a_prefix_of_its_own() -> None:
    found = families(TrainConfig)
    assert len(set(found.values())) == len(found)
    for prefix in ("GAGAR_LIMITS__", "GAGAR_LOCAL_SANDBOX__", "GAGAR_KUBERNETES__", "GAGAR_SANDBOX__",
                   "GAGAR_ROLLOUT__", "GAGAR_STORAGE__"):  # fmt: skip
        assert prefix in found


@pytest.mark.parametrize(
    ("variable", "hint"),
    [
        ("GAGAR_ROLLOUT__GROUP_SIZ", "did you mean GAGAR_ROLLOUT__GROUP_SIZE?"),
        ("GAGAR_LIMITS__WALLTIME", "did you mean GAGAR_LIMITS__WALL_TIME_S?"),
        ("GAGAR_ROLOUT__GROUP_SIZE", "did you mean GAGAR_ROLLOUT__"),
        # the sandbox limits moved to their own prefix: the old spelling is no setting of the sandbox section
        ("GAGAR_SANDBOX__WALL_TIME_S", "SandboxSettings has no such setting"),
        ("GAGAR_ROLLOUT__AGENT__MAX_TURN", "RolloutSettings has no such setting"),
    ],
)
def test_an_unknown_variable_is_refused_with_a_hint(variable: str, hint: str) -> None:
    with pytest.raises(
        ValueError, match=f"unknown setting in the environment: {re.escape(variable)}: .*{re.escape(hint)}"
    ):
        check_environment(TrainConfig, {variable: "1"})


def test_known_variables_pass() -> None:
    environ = {
        "GAGAR_ROLLOUT__GROUP_SIZE": "4",
        "GAGAR_ROLLOUT__AGENT__KIND": "tool-loop",
        "GAGAR_ADVANTAGE__TIERS__LAMBDA_MAX": "2",
        "GAGAR_SANDBOX__WORKERS": "2",
        "GAGAR_LIMITS__WALL_TIME_S": "30",
        "GAGAR_LOCAL_SANDBOX__BASE_UID": "200000",
        "GAGAR_KUBERNETES__NAMESPACE": "sandbox",
        "GAGAR_STORAGE__ENDPOINT": "http://minio:9000",
        "GAGAR_SEED": "3",  # one underscore: not a family, not checked here
        "GAGAR_KFP_HOST": "http://kfp",
        "HOME": "/root",
    }
    assert unknown_settings(environ, TrainConfig) == []
    check_environment(TrainConfig, environ)


def test_every_unknown_variable_is_counted() -> None:
    with pytest.raises(ValueError, match=r"\(and 1 more\)"):
        check_environment(TrainConfig, {"GAGAR_ROLLOUT__GROUP_SIZ": "4", "GAGAR_LIMITS__WALLTIME": "3"})


def test_load_config_refuses_a_typo_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GAGAR_ROLLOUT__GROUP_SIZ", "4")
    with pytest.raises(ValueError, match="GAGAR_ROLLOUT__GROUP_SIZ"):
        load_config(overrides={"tasks": "t.jsonl", "policy": "p"})
    monkeypatch.delenv("GAGAR_ROLLOUT__GROUP_SIZ")
    monkeypatch.setenv("GAGAR_ROLLOUT__GROUP_SIZE", "4")
    assert load_config(overrides={"tasks": "t.jsonl", "policy": "p"}).rollout.group_size == 4


def test_the_sandbox_settings_read_their_own_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    from gagar.sandbox.k8s.config import KubernetesSandboxConfig
    from gagar.sandbox.limits import SandboxLimits
    from gagar.sandbox.local import LocalSandboxSettings

    monkeypatch.setenv("GAGAR_LIMITS__WALL_TIME_S", "7")
    monkeypatch.setenv("GAGAR_LOCAL_SANDBOX__BASE_UID", "123456")
    monkeypatch.setenv("GAGAR_KUBERNETES__NAMESPACE", "elsewhere")
    assert SandboxLimits().wall_time_s == 7
    assert LocalSandboxSettings().base_uid == 123456
    assert KubernetesSandboxConfig().namespace == "elsewhere"
