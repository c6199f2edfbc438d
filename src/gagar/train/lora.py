"""LoRA adapters (peft) on top of the SFT checkpoint: wrap, load, save, publish, merge for export.

With ``lora.enabled`` the policy update trains only a low-rank adapter; the base (the SFT
checkpoint directory) never changes. An adapter directory is peft's ``save_pretrained`` layout
(``adapter_config.json``, ``adapter_model.safetensors``) whose ``base_model_name_or_path`` is the
absolute path of the base, so :func:`gagar.policy.model.load_policy` loads either kind of directory.

Versions: after ``n`` completed updates the policy is ``policy-step-{n}``
(:func:`adapter_version`); the trainer publishes it to ``{run_dir}/adapters/policy-step-{n}``
(:func:`publish_adapter`), where a vLLM server with ``--enable-lora`` loads it by that name.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoTokenizer, PreTrainedTokenizerBase

if TYPE_CHECKING:
    from peft import PeftModel

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_FILES",
    "ADAPTER_PREFIX",
    "QWEN2_TARGET_MODULES",
    "LoraSettings",
    "adapter_base",
    "adapter_updates",
    "adapter_version",
    "export_merged",
    "is_adapter_dir",
    "load_adapter",
    "load_trainable",
    "prune_adapters",
    "publish_adapter",
    "unwrap",
    "wrap",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILES = (ADAPTER_CONFIG, "adapter_model.safetensors")
"""What a published adapter holds (what vLLM's ``/v1/load_lora_adapter`` reads)."""
QWEN2_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP projections of a Qwen2 decoder layer."""


class LoraSettings(BaseModel):
    """Whether the update trains a LoRA adapter instead of all weights, and its shape."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Train a LoRA adapter on the frozen SFT checkpoint; False updates every weight."""
    rank: int = Field(default=8, ge=1)
    """Rank r of each low-rank update."""
    alpha: float = Field(default=16.0, gt=0)
    """Scale numerator: the update is ``(alpha / rank) · B A``."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter's input during training (0 keeps the PPO ratio exactly 1 at the start)."""
    target_modules: list[str] = Field(default_factory=lambda: list(QWEN2_TARGET_MODULES), min_length=1)
    """Module names the adapter wraps (Qwen2 attention and MLP projections by default)."""
    publish_uri: str | None = None
    """Artifact store (``s3://bucket/prefix`` or a directory) each adapter is also published to."""
    keep_adapters: int | None = Field(default=3, ge=2)
    """Newest adapters kept under ``{run_dir}/adapters`` (None: all). At least 2: the server may still
    serve the previous one while the newest loads. The store's copies are never pruned."""


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


def _peft_config(settings: LoraSettings):
    from peft import LoraConfig, TaskType

    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
    )


def wrap(
    model: torch.nn.Module, settings: LoraSettings, base_dir: str | os.PathLike[str], seed: int = 0
) -> PeftModel:
    """A peft model training a fresh adapter on ``model`` (whose weights are frozen in place).

    ``A`` is initialised from ``seed`` without touching the global generator; ``B`` is zero, so the
    wrapped model's logits equal the base's exactly until the first update. ``base_dir`` (made
    absolute) is recorded as the adapter's base.
    """
    from peft import get_peft_model

    model.config._name_or_path = str(Path(base_dir).resolve())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, _peft_config(settings))
    peft_model.peft_config["default"].base_model_name_or_path = str(Path(base_dir).resolve())
    return peft_model


def unwrap(model: PeftModel) -> torch.nn.Module:
    """The base model with the adapter merged into its weights (``W + (alpha / r) · B A``), peft removed."""
    return model.merge_and_unload()


def _tokenizer_dir(adapter_dir: Path, base: Path) -> Path:
    """The adapter's own tokenizer when it carries one (a checkpoint does), else the base's."""
    return adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base


def load_adapter(
    path: str | os.PathLike[str],
    *,
    trainable: bool = False,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Base + adapter of the adapter directory ``path`` (eval mode), and the tokenizer.

    With ``trainable`` only the adapter's parameters require gradients.
    """
    from peft import PeftModel

    from gagar.policy.model import load_policy

    base_dir = adapter_base(path)
    base, _ = load_policy(base_dir, device=device, dtype=dtype)
    model = PeftModel.from_pretrained(base, str(path), is_trainable=trainable)
    model.eval()
    return model, AutoTokenizer.from_pretrained(_tokenizer_dir(Path(path), base_dir))


def _check_matches(path: Path, settings: LoraSettings) -> None:
    """Refuse to continue an adapter whose shape differs from the configured one."""
    saved = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    expected = {"r": settings.rank, "lora_alpha": settings.alpha, "lora_dropout": settings.dropout}
    wrong = {k: (saved.get(k), v) for k, v in expected.items() if saved.get(k) != v}
    if sorted(saved.get("target_modules") or []) != sorted(settings.target_modules):
        wrong["target_modules"] = (saved.get("target_modules"), settings.target_modules)
    if wrong:
        details = ", ".join(f"{k}: saved {a!r}, configured {b!r}" for k, (a, b) in wrong.items())
        raise ValueError(f"{path}: adapter does not match the lora settings ({details})")


def load_trainable(
    policy: str | os.PathLike[str], settings: LoraSettings, seed: int = 0
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The model the LoRA update trains: ``policy``'s adapter when it is one, else a fresh one on it."""
    from gagar.policy.model import load_policy

    path = Path(policy)
    if is_adapter_dir(path):
        _check_matches(path, settings)
        return load_adapter(path, trainable=True)
    base, tokenizer = load_policy(path)
    return wrap(base, settings, path, seed=seed), tokenizer


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


def export_merged(adapter_dir: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Merge the adapter into its base's weights and save a plain Hugging Face policy to ``out``.

    The result loads without peft (e.g. for a full-weight vLLM engine or as the next SFT base).
    """
    from gagar.policy.model import save_policy

    model, tokenizer = load_adapter(adapter_dir)
    save_policy(unwrap(model), tokenizer, out)
    return Path(out)
