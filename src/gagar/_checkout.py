"""Where the top-level ``components/`` and ``pipelines/`` folders are found.

They live beside ``pyproject.toml`` in a checkout (the layout users of kubeflow/pipelines-components
expect) and the wheel maps them into the package as :mod:`gagar.components` and
:mod:`gagar.pipelines`. In a checkout (an editable install, or ``src`` on the path) those two
packages extend their search path to the top-level folder, so both layouts import the same way.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["checkout_folder"]

_ROOT = Path(__file__).resolve().parent.parent.parent  # src/gagar/ -> the checkout, when there is one


def checkout_folder(name: str) -> list[str]:
    """``[<checkout>/<name>]`` when this package runs from a checkout that has that folder, else ``[]``."""
    folder = _ROOT / name
    return [str(folder)] if (_ROOT / "pyproject.toml").is_file() and folder.is_dir() else []
