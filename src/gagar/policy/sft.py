"""Supervised fine-tuning to the pre-RL checkpoint: plain torch, answer-token loss plus prompt LM loss.

``train_sft`` trains (or, for a real checkpoint, fine-tunes) the policy on demonstrations built from
gold patches (:mod:`gagar.policy.demos`), with AdamW, linear warm-up then cosine decay, gradient
clipping, a tqdm progress bar, a loss curve saved as ``loss_curve.png``, and resumable checkpoints:
every ``checkpoint_every`` steps model, optimizer, step, losses and RNG state are written to
``checkpoints/step-NNNNNN`` atomically (a temporary directory renamed into place), and ``resume``
continues from the last complete one. Batches are a pure function of ``(seed, step)``, so a resumed
run follows the same loss curve as an uninterrupted one. The result is saved in Hugging Face format.

Each batch holds demonstrations of similar length (:func:`batch_indices`), so little compute goes to
padding; :func:`sft_loss` says why the prompt tokens carry a loss too.

A pretrained ``init_policy`` (``gagar models install``'s folder, docs/models.md) is fine-tuned with
:meth:`SFTConfig.fine_tune`'s settings, by default a LoRA adapter that is merged into the base when
the run ends (the adapter alone is kept in ``sft_adapter/``); its own tokenizer and chat template
render the prompts.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from tqdm import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from gagar.policy.agent import SFT_CONFIG_FILE, AgentKind, AgentSettings
from gagar.policy.demos import DEFAULT_NOISE_KINDS, Demonstration, demo_answers
from gagar.policy.model import ModelSize, build_model, load_policy, save_policy
from gagar.policy.rollout import agent_for
from gagar.policy.tokenizer import train_tokenizer
from gagar.records import atomic_write_text
from gagar.schema.task import Task
from gagar.train.lora import LoraSettings
from gagar.train.loss import micro_batches

__all__ = [
    "PRETRAINED_DEFAULTS",
    "SFTConfig",
    "SFTResult",
    "batch_indices",
    "collate",
    "lr_factor",
    "plot_losses",
    "run_sft",
    "sft_loss",
    "token_counts",
    "train_sft",
]

CONFIG_FILE, METRICS_FILE, CURVE_FILE, CKPT_DIR, ADAPTER_DIR = (
    SFT_CONFIG_FILE,
    "sft_metrics.json",
    "loss_curve.png",
    "checkpoints",
    "sft_adapter",
)


class SFTConfig(BaseModel):
    """Settings of one SFT run (defaults: the embedded tiny policy on 2 shared CPU cores).

    The defaults are the measured setting of docs/policy.md: on 4,000 generated train tasks
    (``gagar tasks generate --no-verify``) they give 79% parse rate, 77% pass@1 and 40% unclean
    resolving answers on 100 held-out tasks (seed 1: 76%, 76%, 30%), in about 21 minutes on one core.
    2,400 steps give 94% parse rate but also 94% pass@1, too little left for RL; a flat bug prior
    (``--mutations all``) does worse (54% parse).
    """

    model_config = ConfigDict(extra="forbid")

    init_policy: str | None = None
    """A Hugging Face checkpoint to fine-tune; None trains the tokenizer and the tiny model from scratch."""
    lora: LoraSettings = Field(default_factory=LoraSettings)
    """With ``lora.enabled`` (fine-tuning only) train a LoRA adapter on the frozen ``init_policy``; the
    saved policy is the base with the adapter merged in (a plain Hugging Face folder every policy path
    loads), and the adapter alone is kept beside it in ``sft_adapter/``."""
    vocab_size: int = 4096
    """BPE vocabulary size of the trained tokenizer (from scratch only)."""
    hidden_size: int = ModelSize.hidden_size
    """The tiny model's shape (from scratch only); defaults are :class:`ModelSize`'s."""
    num_layers: int = ModelSize.num_layers
    num_heads: int = ModelSize.num_heads
    num_kv_heads: int = ModelSize.num_kv_heads
    intermediate_size: int = ModelSize.intermediate_size
    steps: int = 1200
    """Optimizer steps."""
    batch_size: int = 16
    """Demonstrations per step."""
    lr: float = 5e-3
    """Peak learning rate."""
    prompt_loss_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the prompt tokens' LM loss beside the answer tokens' (see :func:`sft_loss`)."""
    warmup_steps: int = 30
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    noise_share: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of demonstrations carrying unnecessary modifications."""
    rename_share: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of demonstrations moved to a randomly named package (see :mod:`gagar.policy.augment`)."""
    locals_share: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of demonstrations whose fixed function's parameters and locals get random names."""
    wrong_share: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of demonstrations answering with a wrong fix (:func:`gagar.policy.demos.wrong_fix`): a start
    that writes answers which parse and fail (single-answer agent only)."""
    noise_kinds: list[str] = Field(default_factory=lambda: list(DEFAULT_NOISE_KINDS))
    """Kinds a noisy demonstration draws one of: ``split_signature`` or catalogue kinds
    (:class:`gagar.tasks.noise.NoiseKind`); see :data:`gagar.policy.demos.DEFAULT_NOISE_KINDS`."""
    max_prompt_tokens: int = 1024
    max_answer_tokens: int = 256
    agent: AgentSettings = Field(default_factory=AgentSettings)
    """The agent the demonstrations teach: single (a SEARCH/REPLACE answer to the compact prompt,
    within ``max_prompt_tokens`` and ``max_answer_tokens``) or tool-loop (a conversation of
    :mod:`gagar.policy.tool_demos`, within ``agent.max_tokens``)."""
    correction_share: float = Field(default=0.3, ge=0.0, le=1.0)
    """Tool-loop: share of clean demonstrations whose first edit carries an unnecessary
    modification that a later edit takes out again."""
    seed: int = 0
    checkpoint_every: int = 100
    """Steps between resumable checkpoints."""
    keep_checkpoints: int = 2
    micro_batch_tokens: int | None = Field(default=None, ge=1)
    """Most padded tokens (rows times the longest row) in one forward and backward pass: a step's
    demonstrations beyond it are split into passes whose gradients add up before the step's one
    optimizer step, so the step is the same and its activation memory bounded (long multi-turn
    demonstrations); a demonstration longer than this runs alone. Unset: a step's batch at once."""
    num_threads: int | None = 1
    """torch intra-op threads; None keeps torch's default. One thread trained 1.7 times faster than two
    on the 2-core machine shared with other jobs (2,400 against 1,400 tokens/s)."""

    @model_validator(mode="after")
    def _lora_needs_a_base(self) -> SFTConfig:
        if self.lora.enabled and self.init_policy is None:
            raise ValueError("lora.enabled fine-tunes a pretrained model: set init_policy too")
        if self.wrong_share and self.agent.kind is not AgentKind.SINGLE:
            raise ValueError(f"wrong_share builds single answers; the {self.agent.kind.value} agent has none")
        return self

    @classmethod
    def fine_tune(cls, init_policy: str, **overrides: Any) -> SFTConfig:
        """The settings for fine-tuning ``init_policy``: :data:`PRETRAINED_DEFAULTS`, then ``overrides``."""
        return cls(init_policy=init_policy, **{**PRETRAINED_DEFAULTS, **overrides})

    @property
    def model_size(self) -> ModelSize:
        """The tiny model's shape."""
        return ModelSize(
            self.hidden_size,
            self.num_layers,
            self.num_heads,
            self.num_kv_heads,
            self.intermediate_size,
            agent_for(self.agent).context_tokens(self.max_prompt_tokens, self.max_answer_tokens),
        )


PRETRAINED_DEFAULTS: dict[str, Any] = {
    "steps": 450,
    "batch_size": 4,
    "lr": 1e-3,
    "warmup_steps": 10,
    "prompt_loss_weight": 0.0,
    "noise_share": 0.7,
    "lora": LoraSettings(enabled=True, rank=16, alpha=32.0),
}
"""What :meth:`SFTConfig.fine_tune` changes from the tiny policy's defaults for a pretrained model such
as SmolLM2-135M-Instruct (docs/models.md): a LoRA adapter, a fine-tuning learning rate, no prompt loss
(a pretrained model already copies from its context; the loss on answers alone also skips the output
layer on prompt positions), 450 steps of small batches (about 75 minutes of one CPU core; 300 steps
parsed 85-91% of held-out answers, 450 parse 95-96%), and more noisy demonstrations than the tiny
policy's: SmolLM2 writes the catalogue's unnecessary modifications less often than its demonstrations
do (46% noisy gave 19% unclean resolving answers, 67% gave 31-41%), and those are what GAGAR's
redistribution acts on."""


@dataclass(frozen=True)
class SFTResult:
    """What a run produced."""

    out_dir: Path
    losses: list[float]
    """Mean answer-token loss per step, shape (steps,)."""
    n_demos: int
    n_noisy: int
    seconds: float
    """Wall time of this invocation (training and data preparation)."""
    demo_counts: dict[str, int] = field(default_factory=dict)
    """What building the demonstrations did (``clean``, ``noisy``, ``wrong``, ...: :func:`demo_answers`)."""


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 10% at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def batch_indices(lengths: Sequence[int], batch_size: int, seed: int, step: int) -> np.ndarray:
    """Indices of the demonstrations of one step, shape (batch_size,): a pure function of (seed, step).

    A random window of ``4 * batch_size`` demonstrations of similar length (in the order of
    ``lengths``, wrapping around) and ``batch_size`` of them drawn without replacement: batches are
    padded little (uniform draws pad about a third of the tokens) and every demonstration is
    equally likely to be drawn.
    """
    order = np.argsort(np.asarray(lengths), kind="stable")
    rng = np.random.default_rng([seed, step])
    window = min(len(order), 4 * batch_size)
    start = rng.integers(0, len(order))
    return order[(start + rng.choice(window, min(batch_size, window), replace=False)) % len(order)]


def collate(demos: Sequence[Demonstration], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask``/``labels``, each (batch, max_len); -100 off answers
    and on the answer tokens a demonstration's ``answer_mask`` leaves out."""
    width = max(len(d.prompt_ids) + len(d.answer_ids) for d in demos)
    ids = torch.full((len(demos), width), pad_id, dtype=torch.long)
    labels = torch.full((len(demos), width), -100, dtype=torch.long)
    mask = torch.zeros((len(demos), width), dtype=torch.long)
    for row, d in enumerate(demos):
        seq = d.prompt_ids + d.answer_ids
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
        answer = torch.tensor(d.answer_ids)
        if d.answer_mask is not None:
            answer = answer.masked_fill(~torch.tensor(d.answer_mask, dtype=torch.bool), -100)
        labels[row, len(d.prompt_ids) : len(seq)] = answer
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _answer_and_prompt(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks ``(batch, width - 1)``: the positions whose next token is an answer token, a prompt token."""
    answer = batch["labels"][:, 1:] != -100
    return answer, (batch["attention_mask"][:, 1:] == 1) & ~answer


def token_counts(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """The answer and prompt tokens :func:`sft_loss` averages over in a :func:`collate` batch."""
    answer, prompt = _answer_and_prompt(batch)
    return int(answer.sum()), int(prompt.sum())


def sft_loss(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    prompt_weight: float = 0.0,
    counts: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to minimise, mean answer-token loss) for a :func:`collate` batch.

    The answer-token loss is the mean next-token cross-entropy over answer tokens, equal to the
    Hugging Face causal-LM loss on the batch's labels. ``prompt_weight`` > 0 adds that weight times
    the mean cross-entropy over the prompt tokens: predicting the prompt teaches a model trained from
    scratch to copy (paths, function names, code lines) far sooner than the answers alone do. With
    ``prompt_weight`` 0 the output layer runs on answer positions only (about a fifth of the tokens;
    the tiny model's output layer costs about as much as all its decoder layers).

    ``counts``: the :func:`token_counts` of the whole step when ``batch`` is one of its micro-batches;
    the means divide by them, so the passes' losses and gradients add up to the step's.
    """
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft-wrapped or not
    hidden = causal_lm.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    answer, prompt = _answer_and_prompt(batch)
    used = answer | prompt if prompt_weight > 0 else answer  # (batch, width - 1)
    logits = causal_lm.get_output_embeddings()(hidden.last_hidden_state[:, :-1][used]).float()
    tokens = torch.where(answer, batch["labels"][:, 1:], batch["input_ids"][:, 1:])[used]
    per_token = torch.nn.functional.cross_entropy(logits, tokens, reduction="none")  # (n_used,)
    answer_mean = _mean(per_token[answer[used]], None if counts is None else counts[0])
    if prompt_weight <= 0:
        return answer_mean, answer_mean.detach()
    prompt_mean = _mean(per_token[prompt[used]], None if counts is None else counts[1])
    return answer_mean + prompt_weight * prompt_mean, answer_mean.detach()


def _mean(values: torch.Tensor, count: int | None) -> torch.Tensor:
    """``values.mean()`` for a whole batch (bit for bit as the shipped policy was built), else their sum
    over the whole step's ``count``."""
    return values.mean() if count is None else values.sum() / max(count, 1)


def plot_losses(losses: Sequence[float], path: Path, title: str = "policy SFT") -> None:
    """Save the loss curve (raw and a 50-step moving average) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, alpha=0.35, label="step")
    if len(losses) >= 50:
        smooth = np.convolve(losses, np.ones(50) / 50, mode="valid")
        ax.plot(range(49, len(losses)), smooth, label="50-step mean")
    ax.set(xlabel="step", ylabel="answer-token loss (nats)", yscale="log", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _trained_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters SFT changes: all of them, or under LoRA the adapter's only (megabytes, not the base)."""
    frozen = any(not p.requires_grad for p in model.parameters())
    if not frozen:
        return model.state_dict()
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def _latest_checkpoint(out: Path) -> Path | None:
    done = sorted(p for p in (out / CKPT_DIR).glob("step-*") if (p / "state.pt").is_file())
    return done[-1] if done else None


def _save_checkpoint(
    out: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    losses: list[float],
    keep: int,
) -> None:
    final = out / CKPT_DIR / f"step-{step:06d}"
    tmp = out / CKPT_DIR / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {
        "step": step,
        "model": _trained_state(model),
        "optimizer": optimizer.state_dict(),
        "losses": losses,
        "torch_rng": torch.get_rng_state(),
    }
    torch.save(state, tmp / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in sorted((out / CKPT_DIR).glob("step-*"))[:-keep]:
        shutil.rmtree(old)


def _prepare(
    tasks: Sequence[Task], out: Path, config: SFTConfig, resume: bool
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, list[Demonstration], dict[str, int]]:
    """Tokenizer, fresh model and tokenized demonstrations (the tokenizer is reused on resume)."""
    answers, counts = demo_answers(
        tasks, config.noise_share, config.seed, config.noise_kinds, config.rename_share, config.locals_share,
        config.wrong_share,
    )  # fmt: skip
    if not answers:
        raise ValueError(f"no demonstration could be built from {len(tasks)} tasks ({dict(counts)})")
    if config.init_policy is not None:
        model, tokenizer = load_policy(config.init_policy)
        if config.lora.enabled:
            from gagar.train.lora import wrap

            model = wrap(model, config.lora, config.init_policy, seed=config.seed)
    else:
        if resume and (out / "tokenizer.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(out)
        else:
            corpus = [
                t for a in answers for t in (*a.task.snapshot.values(), a.task.problem_statement, a.answer)
            ]
            corpus += agent_for(config.agent).vocabulary()
            tokenizer = train_tokenizer(corpus, config.vocab_size)
            tokenizer.save_pretrained(out)
        model = build_model(tokenizer, config.model_size, config.seed)
    demos, agent_counts = agent_for(config.agent).demonstrations(answers, tokenizer, config)
    dropped = agent_counts.pop("dropped_too_long", 0)
    counts.update(agent_counts)
    if not demos:
        raise ValueError(f"every demonstration exceeds the token budgets ({dropped} dropped)")
    return model, tokenizer, demos, {**counts, "dropped_too_long": dropped}


Prepare = Callable[
    [Path, "SFTConfig", bool],
    tuple[torch.nn.Module, PreTrainedTokenizerBase, list[Demonstration], dict[str, int]],
]
"""Builds (model, tokenizer, demonstrations, counts) for a run in ``out`` (its tokenizer reused on resume)."""


def train_sft(
    tasks: Sequence[Task],
    out_dir: str | os.PathLike[str],
    config: SFTConfig = SFTConfig(),
    resume: bool = False,
    progress: bool = True,
    until_step: int | None = None,
) -> SFTResult:
    """Train the policy on demonstrations for ``tasks`` and save it to ``out_dir`` (Hugging Face format).

    ``until_step`` stops after that step with a checkpoint and without the final model (a time-sliced
    or preemptible job continues later with ``resume=True``).

    Raises:
        ValueError: no usable demonstration, or ``resume`` with a config differing from the saved one.
    """
    return run_sft(
        lambda out, cfg, again: _prepare(tasks, out, cfg, again),
        out_dir,
        config,
        resume,
        progress,
        until_step,
    )


def run_sft(
    prepare: Prepare,
    out_dir: str | os.PathLike[str],
    config: SFTConfig,
    resume: bool = False,
    progress: bool = True,
    until_step: int | None = None,
    title: str = "policy SFT",
) -> SFTResult:
    """The SFT loop on the demonstrations ``prepare`` builds (policy demonstrations, grader transcripts):
    checkpoints, resume, progress bar, loss curve, and the model saved in Hugging Face format."""
    started = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / CONFIG_FILE
    if resume and saved.is_file() and SFTConfig.model_validate_json(saved.read_text()) != config:
        raise ValueError(f"{saved}: the run was started with other settings; resume with the same ones")
    if not resume:
        shutil.rmtree(out / CKPT_DIR, ignore_errors=True)  # a fresh run never resumes another's checkpoints
    atomic_write_text(saved, config.model_dump_json(indent=2))
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    model, tokenizer, demos, counts = prepare(out, config, resume)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=config.lr, weight_decay=config.weight_decay)
    start, losses = 0, []
    ckpt = _latest_checkpoint(out) if resume else None
    if ckpt is not None:
        state = torch.load(ckpt / "state.pt", weights_only=False)
        model.load_state_dict(state["model"], strict=not config.lora.enabled)
        optimizer.load_state_dict(state["optimizer"])
        start, losses = state["step"], list(state["losses"])
        torch.set_rng_state(state["torch_rng"])
    model.train()
    lengths = [len(d.prompt_ids) + len(d.answer_ids) for d in demos]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    seen_tokens, loop_start = 0, time.perf_counter()
    bar = tqdm(
        range(start, config.steps), initial=start, total=config.steps, desc="sft", disable=not progress
    )
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = config.lr * lr_factor(step, config.warmup_steps, config.steps)
        picks = batch_indices(lengths, config.batch_size, config.seed, step)
        seen_tokens += sum(lengths[i] for i in picks)
        runs = micro_batches([lengths[i] for i in picks], config.micro_batch_tokens)
        batches = [collate([demos[picks[j]] for j in run], pad) for run in runs]
        totals = None  # one pass: its own means
        if len(batches) > 1:  # token counts add up over rows
            answers, prompts = zip(*(token_counts(b) for b in batches), strict=True)
            totals = (sum(answers), sum(prompts))
        optimizer.zero_grad(set_to_none=True)
        answer_loss = 0.0
        for batch in batches:
            loss, answer_part = sft_loss(model, batch, config.prompt_loss_weight, totals)
            loss.backward()
            answer_loss += answer_part.item()
        torch.nn.utils.clip_grad_norm_(trained, config.grad_clip)
        optimizer.step()
        losses.append(answer_loss)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        stopping = step + 1 == until_step
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps or stopping:
            _save_checkpoint(out, step + 1, model, optimizer, losses, config.keep_checkpoints)
        if stopping:
            bar.close()
            return SFTResult(
                out, losses, len(demos), sum(d.noisy for d in demos), time.perf_counter() - started, counts
            )
    model.eval()
    if config.lora.enabled:
        from gagar.train.lora import unwrap

        model.save_pretrained(out / ADAPTER_DIR)
        model = unwrap(model)
    save_policy(model, tokenizer, out)
    plot_losses(losses, out / CURVE_FILE, title)
    n_noisy = sum(d.noisy for d in demos)
    metrics = {
        "steps": config.steps,
        "final_loss": float(np.mean(losses[-50:])) if losses else None,
        "n_demos": len(demos),
        "n_noisy": n_noisy,
        "demo_counts": counts,
        "seconds": time.perf_counter() - started,
        "tokens_per_example": float(np.mean(lengths)),
        "tokens_per_s": seen_tokens / max(1e-9, time.perf_counter() - loop_start),
    }
    atomic_write_text(out / METRICS_FILE, json.dumps(metrics, indent=2))
    return SFTResult(out, losses, len(demos), n_noisy, metrics["seconds"], counts)
