"""LoRA adapter directories: their layout, version names, atomic publishing and pruning.

An adapter directory is peft's ``save_pretrained`` layout (``adapter_config.json``,
``adapter_model.safetensors``) whose ``base_model_name_or_path`` is the absolute path of the base;
:func:`gagar.policy.model.load_policy` loads it (base + adapter), and :mod:`gagar.train.lora`
trains one. Versions: after ``n`` completed updates the policy is ``policy-step-{n}``
(:func:`adapter_version`); the trainer publishes it to ``{run_dir}/adapters/policy-step-{n}``
(:func:`publish_adapter`), where a vLLM server with ``--enable-lora`` loads it by that name.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_FILES",
    "ADAPTER_PREFIX",
    "adapter_base",
    "adapter_updates",
    "adapter_version",
    "is_adapter_dir",
    "prune_adapters",
    "publish_adapter",
    "rebase_adapter",
    "tokenizer_dir",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILES = (ADAPTER_CONFIG, "adapter_model.safetensors")
"""What a published adapter holds (what vLLM's ``/v1/load_lora_adapter`` reads)."""


ADAPTER_PREFIX = "policy-step-"


def adapter_version(updates: int) -> str:
    """The version name of the policy after ``updates`` completed updates: ``policy-step-{updates}``."""
    if updates < 1:
        raise ValueError(f"an adapter exists only after an update; got {updates} updates")
    return f"{ADAPTER_PREFIX}{updates}"


def adapter_updates(version: str) -> int | None:
    """The update count in an adapter version name (inverse of :func:`adapter_version`); else None."""
    count = version.removeprefix(ADAPTER_PREFIX)
    return int(count) if count != version and count.isdigit() else None


def is_adapter_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a peft adapter directory (it has ``adapter_config.json``)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | os.PathLike[str]) -> Path:
    """The base model directory an adapter directory names.

    Raises:
        ValueError: naming the file when it is unreadable or names no existing directory.
    """
    config_path = Path(path) / ADAPTER_CONFIG
    try:
        base = json.loads(config_path.read_text(encoding="utf-8"))["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{config_path}: no readable base_model_name_or_path ({exc})") from None
    if not base or not Path(base).is_dir():
        raise ValueError(f"{config_path}: base model {base!r} is not a directory on this machine")
    return Path(base)


def rebase_adapter(path: str | os.PathLike[str], base: str | os.PathLike[str]) -> None:
    """Point the adapter in ``path`` at the base model directory ``base`` (made absolute).

    An adapter records its base's absolute path; one restored on another machine (the next train
    pod) finds it there only after the base is fetched again and the record is rewritten.
    """
    config_path = Path(path) / ADAPTER_CONFIG
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = str(Path(base).resolve())
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def tokenizer_dir(adapter_dir: Path, base: Path) -> Path:
    """The adapter's own tokenizer when it carries one (a checkpoint does), else the base's."""
    return adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base


def publish_adapter(
    source: str | os.PathLike[str], adapters_root: str | os.PathLike[str], version: str
) -> Path:
    """Copy the adapter files of ``source`` to ``adapters_root/version`` atomically; returns that directory.

    The files land in a temporary directory that is renamed into place, so a reader (the policy
    server) sees a complete adapter or none. An existing ``version`` with the same files is kept (a
    resumed run publishes again); one with other files (a redone update) is replaced.

    Raises:
        FileNotFoundError: ``source`` lacks one of :data:`ADAPTER_FILES`.
    """
    source, root = Path(source), Path(adapters_root)
    target = root / version
    missing = [name for name in ADAPTER_FILES if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{source}: not an adapter directory (missing {', '.join(missing)})")
    if all(_same_file(source / name, target / name) for name in ADAPTER_FILES):
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=root))
    try:
        for name in ADAPTER_FILES:
            shutil.copyfile(source / name, tmp / name)
            with open(tmp / name, "rb") as fh:
                os.fsync(fh.fileno())
        if target.exists():
            old = root / f".old-{version}-{os.getpid()}"
            os.replace(target, old)
            shutil.rmtree(old)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def prune_adapters(adapters_root: str | os.PathLike[str], keep: int) -> list[Path]:
    """Remove all but the ``keep`` newest ``policy-step-N`` adapters (by N); returns those removed."""
    versions = {path: adapter_updates(path.name) for path in Path(adapters_root).glob(f"{ADAPTER_PREFIX}*")}
    published = sorted((p for p, n in versions.items() if n is not None), key=lambda p: versions[p])
    removed = published[: max(0, len(published) - keep)]
    for path in removed:
        shutil.rmtree(path)
    return removed


def _same_file(a: Path, b: Path) -> bool:
    return b.is_file() and a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()
