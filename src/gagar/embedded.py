"""The embedded default: everything the main job needs on one CPU machine, built once and cached.

``prepare(work_dir)`` lays out, under ``work_dir``:

- ``sft-tasks.jsonl``: generated train-split tasks for SFT demonstrations (unverified: their test
  lists are never used, so no pytest run is needed to make them);
- ``rl-tasks.jsonl``: other train-split tasks for RL, verified with real pytest runs;
- ``heldout-tasks.jsonl``: held-out tasks (repositories never seen in training), verified;
- ``policy/``: the pre-RL SFT checkpoint (``gagar policy sft`` with its default settings).

Each piece is reused when it is already there, and the SFT resumes from its last checkpoint when
a previous preparation was interrupted.

The pre-RL policy of the default settings ships with the package (:data:`SHIPPED_POLICY`, about
4 MB), built by ``make embedded`` (:func:`build_policy`) with its ``SHA256SUMS`` and a
``recipe.json`` naming the command, the settings, a fingerprint of the demonstrations it learnt from
(:func:`demo_fingerprint`) and the hash of its weights after the first :data:`PROBE_STEP` steps.
``prepare`` copies it instead of training (about 20 minutes on one core) when its settings and
fingerprint match the code at hand; otherwise it trains as before. Its SFT is bit-exact
reproducible in one build environment (:func:`build_environment`: the torch build and the CPU
kernels it dispatches to, transformers, numpy): one thread, fixed seeds, batches a pure function of
``(seed, step)``. Another CPU instruction set or library version computes other last bits, so the
recipe keeps the probe hash of each environment the build was reproduced in
(``gagar policy embedded --record-probe``, after checking the demonstrations are unchanged); a build
that reaches any recorded hash reproduces that build bit for bit, whatever its environment.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gagar.policy.agent import AgentKind
from gagar.policy.sft import SFTConfig

__all__ = [
    "BUILD_COMMAND",
    "PROBE_STEP",
    "RECIPE_FILE",
    "SHIPPED_POLICY",
    "SUMS_FILE",
    "EmbeddedDefault",
    "EmbeddedSettings",
    "build_environment",
    "build_policy",
    "demo_fingerprint",
    "expected_probes",
    "prepare",
    "record_probe",
    "shipped_mismatch",
    "weights_sha256",
]

log = logging.getLogger(__name__)


class EmbeddedSettings(BaseModel):
    """Sizes of the embedded default."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    """Seeds every generated task set and the SFT run."""
    sft_tasks: int = Field(default=4000, ge=1)
    """Tasks whose gold patches become SFT demonstrations."""
    rl_tasks: int = Field(default=48, ge=1)
    """Tasks the RL steps sample from."""
    heldout_tasks: int = Field(default=0, ge=0)
    """Held-out tasks for evaluation (0: none; the experiment makes its own)."""
    workers: int = Field(default=2, ge=1)
    """Processes generating verified tasks."""
    sft: SFTConfig = Field(default_factory=SFTConfig)
    """The pre-RL SFT run (``gagar policy sft`` defaults; its seed is ``seed``)."""


@dataclass(frozen=True)
class EmbeddedDefault:
    """Paths of a prepared embedded default."""

    sft_tasks: Path | None
    """The SFT tasks; None when the shipped policy was used (nothing to train on)."""
    rl_tasks: Path
    heldout_tasks: Path | None
    policy: Path


# RL and held-out task sets draw from seed namespaces far from the SFT set's.
_RL_SEED_OFFSET = 1_000
_HELDOUT_SEED_OFFSET = 2_000


def _tasks(path: Path, n: int, seed: int, split: str, *, verify: bool, workers: int) -> Path:
    from gagar.tasks.generate import generate_tasks
    from gagar.tasks.loaders import write_tasks

    if not path.exists():
        log.info("generating %d %s tasks into %s", n, split, path)
        write_tasks(path, generate_tasks(n, seed, split, workers=workers, verify=verify))  # type: ignore[arg-type]
    return path


def prepare(
    work_dir: str | Path, settings: EmbeddedSettings | None = None, *, progress: bool = True
) -> EmbeddedDefault:
    """Build (or reuse) the task sets and the SFT policy of the embedded default under ``work_dir``.

    The policy is the shipped one (:data:`SHIPPED_POLICY`) when it was built from these settings by
    this code (:func:`shipped_mismatch`), else trained here.
    """
    from gagar.policy.sft import train_sft
    from gagar.records import read_records
    from gagar.schema.task import Task

    s = settings or EmbeddedSettings()
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    rl = _tasks(
        work / "rl-tasks.jsonl", s.rl_tasks, s.seed + _RL_SEED_OFFSET, "train", verify=True, workers=s.workers
    )
    heldout = None
    if s.heldout_tasks:
        heldout = _tasks(
            work / "heldout-tasks.jsonl",
            s.heldout_tasks,
            s.seed + _HELDOUT_SEED_OFFSET,
            "heldout",
            verify=True,
            workers=s.workers,
        )
    policy = work / "policy"
    sft_path = work / "sft-tasks.jsonl"
    sft: Path | None = sft_path if sft_path.exists() else None
    if not (policy / "config.json").is_file():
        mismatch = shipped_mismatch(s)
        if mismatch is None:
            log.info("using the shipped pre-RL policy %s (built by %s)", SHIPPED_POLICY, BUILD_COMMAND)
            _copy_files(SHIPPED_POLICY, policy, _shipped_files(SHIPPED_POLICY))
        else:
            log.info("the shipped pre-RL policy does not apply (%s): training one into %s", mismatch, policy)
            sft = _tasks(sft_path, s.sft_tasks, s.seed, "train", verify=False, workers=1)
            train_sft(read_records(sft, Task), policy, _sft_config(s), resume=True, progress=progress)
    return EmbeddedDefault(sft_tasks=sft, rl_tasks=rl, heldout_tasks=heldout, policy=policy)


# --------------------------------------------------------------------------- the shipped policy

SHIPPED_POLICY = Path(__file__).parent / "data" / "embedded-policy"
"""The pre-RL policy of the default :class:`EmbeddedSettings`, as ``make embedded`` wrote it."""
BUILD_COMMAND = "make embedded"
"""The one command that rebuilds :data:`SHIPPED_POLICY` (``gagar policy embedded``)."""
PROBE_STEP = 100
"""The build records the weights' hash after this many steps, so a test can check reproduction cheaply."""
RECIPE_FILE, SUMS_FILE = "recipe.json", "SHA256SUMS"
_FINGERPRINT_TASKS = 64
# what the SFT run leaves beside the policy that is not the policy (timings, plots, resumable state)
_NOT_SHIPPED = {"sft_metrics.json", "loss_curve.png", RECIPE_FILE, SUMS_FILE}


def _sft_config(s: EmbeddedSettings) -> Any:
    return s.sft.model_copy(update={"seed": s.seed})


def _recipe_settings(s: EmbeddedSettings) -> dict[str, Any]:
    """What the policy depends on: the SFT settings and tasks, not the RL or held-out sets (nor the
    LoRA settings of a run that trains no adapter, nor how often it checkpoints, nor the micro-batches of
    a run that makes none)."""
    config = _sft_config(s)
    unused = {"checkpoint_every", "keep_checkpoints"} | (set() if config.lora.enabled else {"lora"})
    if config.micro_batch_tokens is None:
        unused.add("micro_batch_tokens")
    if not config.wrong_share:
        unused.add("wrong_share")
    if config.agent.kind is AgentKind.SINGLE:  # the multi-turn settings shape no single-shot demonstration
        unused |= {"agent", "correction_share"}
    return {"seed": s.seed, "sft_tasks": s.sft_tasks, "sft": config.model_dump(mode="json", exclude=unused)}


def demo_fingerprint(settings: EmbeddedSettings, tokenizer: Any) -> str:
    """sha256 of the settings and of the tokenized demonstrations of the first generated SFT tasks.

    It changes when anything that shapes the SFT data changes: task generation, the noise
    catalogue, the demonstrations, the prompt format, or the tokenizer. About two seconds.
    """
    from gagar.policy.demos import demo_answers, tokenize_demos
    from gagar.tasks.generate import generate_tasks

    s, c = settings, _sft_config(settings)
    tasks = generate_tasks(min(_FINGERPRINT_TASKS, s.sft_tasks), s.seed, "train", verify=False)
    answers, _ = demo_answers(
        tasks, c.noise_share, c.seed, c.noise_kinds, c.rename_share, c.locals_share, c.wrong_share
    )
    demos, _ = tokenize_demos(answers, tokenizer, c.max_prompt_tokens, c.max_answer_tokens)
    digest = hashlib.sha256(json.dumps(_recipe_settings(s), sort_keys=True).encode())
    for d in demos:
        digest.update(json.dumps([d.instance_id, d.prompt_ids, d.answer_ids, d.noisy]).encode())
    return digest.hexdigest()


def weights_sha256(state: dict[str, Any]) -> str:
    """sha256 of a state dict's tensors (names, dtypes, shapes, bytes), in name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().contiguous().cpu()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _shipped_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in _NOT_SHIPPED)


def _copy_files(src: Path, dst: Path, names: Iterable[str]) -> None:
    """Copy ``names`` from ``src`` into a fresh ``dst``, atomically (a temporary folder renamed)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}-", dir=dst.parent))
    os.chmod(tmp, 0o755)
    for name in names:
        shutil.copy2(src / name, tmp / name)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)


def _sums(folder: Path, names: Iterable[str]) -> str:
    return "".join(f"{_file_sha256(folder / n)}  {n}\n" for n in names)


def shipped_mismatch(settings: EmbeddedSettings, folder: Path = SHIPPED_POLICY) -> str | None:
    """Why the shipped policy does not fit ``settings`` and this code, or None when it does.

    It fits when its files match its ``SHA256SUMS``, its recipe names the same settings, and the
    demonstrations this code builds hash as they did when it was trained (:func:`demo_fingerprint`).
    """
    from transformers import AutoTokenizer

    recipe_path, sums_path = folder / RECIPE_FILE, folder / SUMS_FILE
    if not recipe_path.is_file() or not sums_path.is_file():
        return f"{folder} holds no {RECIPE_FILE} and {SUMS_FILE}"
    recipe = json.loads(recipe_path.read_text())
    if recipe.get("settings") != _recipe_settings(settings):
        return "it was built with other settings"
    for line in sums_path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if not (folder / name).is_file() or _file_sha256(folder / name) != digest:
            return f"{name} does not match {SUMS_FILE}"
    if demo_fingerprint(settings, AutoTokenizer.from_pretrained(folder)) != recipe.get("fingerprint"):
        return "the SFT demonstrations this code builds differ from those it learnt from"
    return None


def build_policy(
    out: Path = SHIPPED_POLICY,
    settings: EmbeddedSettings | None = None,
    *,
    until_step: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train the embedded pre-RL policy from scratch into ``out`` with its recipe and ``SHA256SUMS``.

    The run stops once at :data:`PROBE_STEP` to hash its weights (resuming is bit-exact), then
    trains to the end. With ``until_step`` (at most :data:`PROBE_STEP`) it stops there and writes
    nothing: it returns the recipe fields it has, for a reproduction check. Returns the recipe.
    """
    import torch

    from gagar.policy.sft import train_sft
    from gagar.tasks.generate import generate_tasks

    s = settings or EmbeddedSettings()
    config = _sft_config(s)
    started = time.perf_counter()
    probe = min(PROBE_STEP, until_step or PROBE_STEP, config.steps)
    tasks = generate_tasks(s.sft_tasks, s.seed, "train", verify=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".embedded-build-", dir=out.parent) as tmp:
        train_sft(tasks, tmp, config, until_step=probe, progress=progress)
        state = torch.load(Path(tmp) / "checkpoints" / f"step-{probe:06d}" / "state.pt", weights_only=False)
        recipe: dict[str, Any] = {
            "command": BUILD_COMMAND,
            "settings": _recipe_settings(s),
            "probe_step": probe,
            "probe_weights_sha256": weights_sha256(state["model"]),
        }
        if until_step is not None:
            return recipe
        train_sft(tasks, tmp, config, resume=True, progress=progress)
        from transformers import AutoTokenizer

        recipe["fingerprint"] = demo_fingerprint(s, AutoTokenizer.from_pretrained(tmp))
        recipe["built_with"] = {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "machine": platform.machine(),
            "build_seconds": round(time.perf_counter() - started, 1),
        }
        recipe["reproduced_in"] = [
            {"environment": build_environment(), "probe_weights_sha256": recipe["probe_weights_sha256"]}
        ]
        names = _shipped_files(Path(tmp))
        (Path(tmp) / RECIPE_FILE).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
        (Path(tmp) / SUMS_FILE).write_text(_sums(Path(tmp), names))
        _copy_files(Path(tmp), out, [*names, RECIPE_FILE, SUMS_FILE])
    log.info("wrote the embedded pre-RL policy to %s", out)
    return recipe


def build_environment() -> dict[str, str]:
    """What the SFT's last bits depend on besides the code and settings: the torch build and the CPU
    kernels it dispatches to, and the libraries that shape the model and the data order."""
    import numpy
    import tokenizers
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": numpy.__version__,
        "machine": platform.machine(),
    }


def expected_probes(recipe: dict[str, Any], environment: dict[str, str]) -> list[str]:
    """The step-``probe_step`` weight hashes a build in ``environment`` may reproduce: the one recorded
    for that environment first, then every other recorded one and the shipped build's own. Any of
    them is a bit-exact reproduction of a recorded build, so a library release that computes the same
    bits (a new transformers patch release, say) needs nothing recorded; one that changes them matches
    none until ``--record-probe`` records it."""
    recorded = [
        (r["environment"] == environment, r["probe_weights_sha256"]) for r in recipe.get("reproduced_in", [])
    ]
    ordered = [h for same, h in recorded if same] + [h for same, h in recorded if not same]
    return list(dict.fromkeys([*ordered, recipe["probe_weights_sha256"]]))


def record_probe(folder: Path = SHIPPED_POLICY, settings: EmbeddedSettings | None = None) -> dict[str, Any]:
    """Reproduce the shipped build up to its probe step in this environment and record the hash in
    its recipe (``reproduced_in``), replacing this environment's entry. Only after checking the
    demonstrations are the shipped ones (:func:`shipped_mismatch`): a changed task or demonstration
    needs a rebuild, not a new probe. Returns the entry.

    Raises:
        ValueError: the shipped policy does not fit the settings and this code.
    """
    s = settings or EmbeddedSettings()
    why = shipped_mismatch(s, folder)
    if why is not None:
        raise ValueError(f"{folder}: {why}; rebuild it with `make embedded` instead of recording a probe")
    recipe_path = folder / RECIPE_FILE
    recipe = json.loads(recipe_path.read_text())
    scratch = Path(tempfile.mkdtemp(prefix="gagar-probe-"))
    try:
        probe = build_policy(scratch / "policy", s, until_step=recipe["probe_step"], progress=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    entry = {"environment": build_environment(), "probe_weights_sha256": probe["probe_weights_sha256"]}
    kept = [r for r in recipe.get("reproduced_in", []) if r["environment"] != entry["environment"]]
    recipe["reproduced_in"] = [*kept, entry]
    recipe_path.write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
    return entry
