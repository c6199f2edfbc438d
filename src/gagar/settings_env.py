"""Settings read from the environment: which ``GAGAR_<NAME>__`` family belongs to which settings class,
and a check that refuses a variable no class reads (a typo would otherwise pass silently).

Each settings class has a prefix of its own: the training config's sections (``GAGAR_ROLLOUT__``,
``GAGAR_SANDBOX__``, …), the sandbox limits (``GAGAR_LIMITS__``), the local and Kubernetes sandbox
backends (``GAGAR_LOCAL_SANDBOX__``, ``GAGAR_KUBERNETES__``), the judge (``GAGAR_JUDGE__``), the
artifact store (``GAGAR_STORAGE__``) and the task images (``GAGAR_TASK_IMAGES__``). Variables with a
single underscore (``GAGAR_SEED``, ``GAGAR_KFP_HOST``) are not families and are not checked here.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping

from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo

__all__ = ["check_environment", "families", "unknown_settings"]


def families(train_config: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """``GAGAR_<NAME>__`` prefix -> the settings model whose fields it sets; ``train_config``'s
    sections each have their own (:class:`gagar.train.config.TrainConfig`, passed in by its module)."""
    from gagar.sandbox.hacks import JudgeConfig
    from gagar.sandbox.k8s.config import KubernetesSandboxConfig
    from gagar.sandbox.limits import SandboxLimits
    from gagar.sandbox.local import LocalSandboxSettings
    from gagar.storage.settings import StorageSettings
    from gagar.tasks.images import ImageSettings

    found: dict[str, type[BaseModel]] = {
        "GAGAR_LIMITS__": SandboxLimits,
        "GAGAR_LOCAL_SANDBOX__": LocalSandboxSettings,
        "GAGAR_KUBERNETES__": KubernetesSandboxConfig,
        "GAGAR_JUDGE__": JudgeConfig,
        "GAGAR_STORAGE__": StorageSettings,
        "GAGAR_TASK_IMAGES__": ImageSettings,
    }
    for name, info in train_config.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            prefix = f"GAGAR_{name.upper()}__"
            if prefix in found:
                raise ValueError(f"two settings classes read {prefix}*")
            found[prefix] = info.annotation
    return found


def _names(name: str, info: FieldInfo) -> Iterator[str]:
    yield name.upper()
    alias = info.validation_alias
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if alias else []
    for choice in choices:
        if isinstance(choice, str):
            yield choice.upper().rpartition("__")[2]


def _known(model: type[BaseModel], key: str) -> bool:
    """Whether ``key`` (what follows the prefix, nested with ``__``) names a field of ``model``."""
    head, _, rest = key.partition("__")
    for name, info in model.model_fields.items():
        if head in set(_names(name, info)):
            if not rest:
                return True
            nested = info.annotation
            return isinstance(nested, type) and issubclass(nested, BaseModel) and _known(nested, rest)
    return False


def unknown_settings(environ: Mapping[str, str], train_config: type[BaseModel]) -> list[str]:
    """The ``GAGAR_<NAME>__…`` variables of ``environ`` that no settings class reads, each with a hint."""
    known = families(train_config)
    problems = []
    for variable in sorted(environ):
        if not variable.startswith("GAGAR_") or "__" not in variable:
            continue
        prefix = variable[: variable.index("__") + 2]
        model = known.get(prefix)
        if model is None:
            close = difflib.get_close_matches(prefix, known, n=1)
            hint = f" (did you mean {close[0]}…?)" if close else ""
            problems.append(f"{variable}: no settings read {prefix}*{hint}")
        elif not _known(model, variable[len(prefix) :]):
            fields = [f"{prefix}{name.upper()}" for name in model.model_fields]
            close = difflib.get_close_matches(variable, fields, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{variable}: {model.__name__} has no such setting{hint}")
    return problems


def check_environment(train_config: type[BaseModel], environ: Mapping[str, str] | None = None) -> None:
    """Refuse a ``GAGAR_<NAME>__`` variable no settings class reads (``train_config``'s sections
    included).

    Raises:
        ValueError: one line naming the first unknown variable (and how many more there are).
    """
    problems = unknown_settings(os.environ if environ is None else environ, train_config)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(f"unknown setting in the environment: {problems[0]}{more}")
