"""``--param name=value`` options: each value checked against the type of the pipeline parameter it names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gagar.errors import UserError

__all__ = ["typed_params"]

_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "text"}


def typed_params(items: Sequence[str]) -> dict[str, Any]:
    """``["group_size=8", "lora=true"]`` -> ``{"group_size": 8, "lora": True}``, in the parameters' types.

    Raises:
        UserError: an item without ``=``, a name given twice, or a value that is not of its
            parameter's type, naming the parameter (``--param group_size=abc: group_size takes an
            integer, got 'abc'``). A name that is no pipeline parameter keeps its text: the pipeline
            checks names itself, all at once.
    """
    from gagar.pipeline.argo_entry import convert
    from gagar.pipeline.client import parse_params
    from gagar.pipeline.graph import parameter

    try:
        texts = parse_params(list(items))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    values: dict[str, Any] = {}
    for name, text in texts.items():
        try:
            kind = parameter(name).type
        except ValueError:  # not a parameter: the pipeline's own check names every unknown one
            values[name] = text
            continue
        try:
            values[name] = convert(text, kind)
        except ValueError:
            raise UserError(
                f"--param {name}={text}: {name} takes {_KINDS.get(kind, kind.__name__)}, got {text!r}"
            ) from None
    return values
