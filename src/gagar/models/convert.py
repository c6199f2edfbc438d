"""GGUF to a Hugging Face folder, once: config, fp32 safetensors, tokenizer with its chat template.

transformers loads a GGUF (dequantizing it) but refuses to ``save_pretrained`` the result, so the
conversion builds a fresh model from the loaded config and copies the state dict into it; every key
must match. The folder is written under a temporary name beside ``out`` and renamed into place, so an
interrupted conversion never leaves a folder that looks complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gagar.models.cache import PROVENANCE_FILE, Provenance

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "UnsupportedArchitecture",
    "convert_gguf",
    "gguf_architecture",
    "sha256_file",
]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
"""GGUF architectures the conversion is tested for (both are policy architectures elsewhere too)."""


class UnsupportedArchitecture(ValueError):
    """The GGUF holds an architecture the conversion does not take."""


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """The sha256 hex digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def gguf_architecture(path: str | os.PathLike[str]) -> str:
    """The ``general.architecture`` of a GGUF file (memory-mapped; nothing is dequantized).

    Raises:
        ValueError: the file is not a readable GGUF or names no architecture.
    """
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except KeyError:
        raise ValueError(f"{path}: GGUF without general.architecture") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable GGUF file ({exc})") from None


def _load_gguf(path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) from a GGUF file, offline, weights dequantized to float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: the file is all there is
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model, tokenizer


def convert_gguf(
    gguf: str | os.PathLike[str],
    out: str | os.PathLike[str],
    provenance: Mapping[str, Any] | None = None,
    *,
    sha256: str | None = None,
) -> Path:
    """Convert a llama or qwen2 GGUF file to a Hugging Face folder at ``out``; returns ``out``.

    ``provenance`` (package, version, licence, source, name) is recorded with the file's sha256
    (``sha256`` when the caller has already computed it) in ``provenance.json``.

    Raises:
        FileNotFoundError: ``gguf`` does not exist.
        UnsupportedArchitecture: its architecture is not one of :data:`SUPPORTED_ARCHITECTURES`.
        FileExistsError: ``out`` exists (remove it, or install into another folder).
        ValueError: the loaded weights do not fit the model built from the loaded config.
    """
    import transformers
    from transformers import AutoModelForCausalLM

    source, target = Path(gguf), Path(out)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such GGUF file")
    architecture = gguf_architecture(source)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"{source}: architecture {architecture!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    if target.exists():
        raise FileExistsError(f"{target}: already exists; remove it to convert again")
    digest = sha256 or sha256_file(source)
    loaded, tokenizer = _load_gguf(source)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain float32, not GGUF blocks
    config._name_or_path = provenance.get("name", source.stem) if provenance else source.stem
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{source}: weights do not fit the config (missing {missing}, unexpected {unexpected})"
        )
    model.eval()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        record = Provenance(
            **dict(provenance or {}),
            gguf_file=source.name,
            gguf_sha256=digest,
            architecture=architecture,
            dtype="float32",
            transformers_version=transformers.__version__,
            files={p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()},
        )
        (tmp / PROVENANCE_FILE).write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
        for path in (tmp, *tmp.iterdir()):  # mkdtemp and safetensors make them private; a cache is shared
            path.chmod(0o755 if path.is_dir() else 0o644)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
