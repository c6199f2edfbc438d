"""``--param name=value`` options: each name checked against the pipeline's parameters and each value
against its type (:func:`gagar.pipeline.client.parse_params`), as one-line user errors."""

from __future__ import annotations

from collections.abc import Sequence

from gagar.errors import UserError
from gagar.pipeline.parameters import ParameterValue

__all__ = ["typed_params"]


def typed_params(items: Sequence[str]) -> dict[str, ParameterValue]:
    """``["rollout_group_size=8", "lora_enabled=true"]`` -> ``{"rollout_group_size": 8, ...}``, typed.

    Raises:
        UserError: an item without ``=``, a name given twice, a name that is no pipeline parameter
            (with the close ones), or a value that is not of its parameter's type, naming it.
    """
    from gagar.pipeline.client import parse_params

    try:
        return parse_params(list(items))
    except ValueError as exc:
        raise UserError(str(exc)) from None
