"""``gagar policy``: train and evaluate the pre-RL policy, and (wired top-level) ``gagar rollout``."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import typer

from gagar.cli.core import GagarGroup
from gagar.policy.agent import AgentKind, AgentSettings, CallFormat
from gagar.sandbox.runner import BackendName
from gagar.train.config import RolloutSettings

__all__ = ["app", "rollout"]

app = typer.Typer(
    cls=GagarGroup, help="The policy: SFT to the pre-RL checkpoint, its evaluation.", no_args_is_help=True
)


def _default(model: type, name: str) -> str:
    """`` [default: …]`` of a settings field, for a help text (the default is declared there only)."""
    value = model.model_fields[name].get_default(call_default_factory=True)
    return f" (default: {getattr(value, 'value', value)})" if value is not None else " (default: unset)"


AGENT_OPTION = typer.Option(
    None,
    "--agent",
    help="single (one SEARCH/REPLACE answer), tool-loop (multi-turn, own commands) or tool-call "
    "(multi-turn, native tool calls in a sandboxed session)." + _default(AgentSettings, "kind"),
    show_default=False,
)
MAX_TURNS_OPTION = typer.Option(
    None, "--max-turns", min=1, help="Tool loop: most assistant turns." + _default(AgentSettings, "max_turns")
)
MAX_TOKENS_OPTION = typer.Option(
    None,
    "--max-trajectory-tokens",
    min=16,
    help="Tool loop: most tokens of a conversation (prompt included)."
    + _default(AgentSettings, "max_tokens"),
)
MAX_SECONDS_OPTION = typer.Option(
    None,
    "--max-trajectory-seconds",
    min=0.001,
    help="Tool loop: wall-clock budget of a conversation." + _default(AgentSettings, "max_seconds"),
)
CALL_FORMAT_OPTION = typer.Option(
    None,
    "--call-format",
    help="Tool-call agent, a chat template without a tools section: the call format asked for, json "
    "(Hermes) or xml (Qwen3-Coder, code unescaped); sample with the one the policy was fine-tuned on."
    + _default(AgentSettings, "call_format"),
    show_default=False,
)
SHOW_DEFINITION_OPTION = typer.Option(
    None,
    "--show-definition/--no-show-definition",
    help="Tool-call agent: the first message also shows the definition of the function the statement "
    "names, as the single-turn prompt does." + _default(AgentSettings, "show_definition"),
    show_default=False,
)
MAX_LIVE_OPTION = typer.Option(
    None,
    "--max-live",
    min=1,
    help="Tool loop: most conversations advancing together; the rest wait, their clock not started "
    "(default: all).",
)


def agent_settings(**given: object) -> AgentSettings:
    """The agent settings the options name, the rest at their defaults."""
    return AgentSettings(**{k: v for k, v in given.items() if v is not None})


SANDBOX_OPTION = typer.Option(
    BackendName.LOCAL,
    "--sandbox",
    help="Where the tool loop's RUN_TESTS and the tool-call agent's sessions run (visible tests only).",
)


class Backend(StrEnum):
    """Generation backends for ``gagar rollout``."""

    HF = "hf"
    VLLM = "vllm"
    OPENAI = "openai"


@app.command()
def sft(
    tasks: Path = typer.Option(..., "--tasks", exists=True, dir_okay=False, help="Training tasks (JSONL)."),
    out: Path = typer.Option(..., "--out", help="Output directory: the policy in Hugging Face format."),
    steps: int | None = typer.Option(None, help="Optimizer steps (default from SFTConfig.steps)."),
    batch_size: int | None = typer.Option(
        None, help="Demonstrations per step (default from SFTConfig.batch_size)."
    ),
    lr: float | None = typer.Option(None, help="Peak learning rate (default from SFTConfig.lr)."),
    noise_share: float | None = typer.Option(
        None,
        help="Share of demonstrations with unnecessary modifications (default from SFTConfig.noise_share).",
    ),
    wrong_share: float | None = typer.Option(
        None,
        min=0.0,
        max=1.0,
        help="Share of demonstrations answering with a wrong fix, one that applies and leaves the bug "
        "(default from SFTConfig.wrong_share).",
    ),
    init_policy: Path | None = typer.Option(
        None,
        exists=True,
        file_okay=False,
        help="A Hugging Face folder to fine-tune instead (e.g. `gagar models install`'s); its defaults are "
        "PRETRAINED_DEFAULTS: LoRA, lr 1e-3, no prompt loss, 450 steps, noise share 0.7.",
    ),
    lora: bool | None = typer.Option(
        None, "--lora/--full", help="With --init-policy: train a LoRA adapter (default) or every weight."
    ),
    lora_rank: int | None = typer.Option(None, min=1, help="LoRA rank (default 16)."),
    lora_alpha: float | None = typer.Option(None, help="LoRA alpha (default 32)."),
    lora_targets: str | None = typer.Option(
        None, help="Comma-separated module names the adapter wraps (default: attention and MLP projections)."
    ),
    seed: int = typer.Option(0, help="Seed of the data order and initialisation."),
    threads: int | None = typer.Option(None, help="torch CPU threads (default from SFTConfig.num_threads)."),
    micro_batch_tokens: int | None = typer.Option(
        None,
        min=1,
        help="Most padded tokens in one forward and backward pass; a step's batch beyond it is split into "
        "passes whose gradients add up (the same step, bounded memory; default: the batch at once).",
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last complete checkpoint in OUT."),
    agent: AgentKind | None = AGENT_OPTION,
    max_trajectory_tokens: int | None = MAX_TOKENS_OPTION,
    call_format: CallFormat | None = CALL_FORMAT_OPTION,
    show_definition: bool | None = SHOW_DEFINITION_OPTION,
    correction_share: float | None = typer.Option(
        None, min=0.0, max=1.0, help="Tool loop: share of clean demonstrations with an edit later corrected."
    ),
) -> None:
    """Train the policy on demonstrations built from the tasks' gold patches (unset options: SFTConfig's)."""
    from gagar.policy.sft import SFTConfig, train_sft
    from gagar.records import read_records
    from gagar.schema.task import Task

    given = {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "noise_share": noise_share,
        "wrong_share": wrong_share,
        "num_threads": threads,
        "micro_batch_tokens": micro_batch_tokens,
        "correction_share": correction_share,
    }
    chosen = {k: v for k, v in given.items() if v is not None}
    chosen["agent"] = agent_settings(
        kind=agent,
        max_tokens=max_trajectory_tokens,
        call_format=call_format,
        show_definition=show_definition,
    )
    lora_given = {
        "enabled": lora,
        "rank": lora_rank,
        "alpha": lora_alpha,
        "target_modules": lora_targets.split(",") if lora_targets else None,
    }
    lora_given = {k: v for k, v in lora_given.items() if v is not None}
    if init_policy is None:
        if lora_given:
            raise typer.BadParameter("LoRA options fine-tune a pretrained model", param_hint="--init-policy")
        config = SFTConfig(seed=seed, **chosen)
    else:
        preset = SFTConfig.fine_tune(str(init_policy))
        chosen["lora"] = preset.lora.model_copy(update=lora_given)
        config = SFTConfig.fine_tune(str(init_policy), seed=seed, **chosen)
    result = train_sft(read_records(tasks, Task), out, config, resume=resume)
    wrong = result.demo_counts.get("wrong", 0)
    typer.echo(
        f"saved {out} ({result.n_demos} demonstrations, {result.n_noisy} noisy"
        + (f", {wrong} wrong" if wrong else "")
        + f"; final loss {result.losses[-1]:.3f}; {result.seconds:.0f} s)"
    )


@app.command()
def embedded(
    out: Path | None = typer.Option(
        None, "--out", help="Where to write the policy (default: the shipped gagar/data/embedded-policy)."
    ),
    record_probe: bool = typer.Option(
        False,
        "--record-probe",
        help="Instead of rebuilding: reproduce the shipped build's first steps in this environment (CPU "
        "kernels, library versions) and record their weight hash in its recipe, after checking the "
        "demonstrations are unchanged.",
    ),
) -> None:
    """Build the embedded default's pre-RL policy from scratch, reproducibly (what `make embedded` runs).

    Rewrites the policy, its recipe.json and SHA256SUMS; `gagar run` uses them when they match the code.
    """
    from gagar.embedded import SHIPPED_POLICY, build_policy

    if record_probe:
        from gagar.embedded import record_probe as record

        entry = record(out or SHIPPED_POLICY)
        typer.echo(
            f"recorded step-probe weights {entry['probe_weights_sha256'][:12]}… for {entry['environment']}"
        )
        return
    target = out or SHIPPED_POLICY
    recipe = build_policy(target)
    typer.echo(
        f"wrote {target} in {recipe['built_with']['build_seconds']:.0f} s "
        f"(step-{recipe['probe_step']} weights sha256 {recipe['probe_weights_sha256'][:12]}…)"
    )


@app.command("eval")
def evaluate(
    policy: Path = typer.Option(..., "--policy", exists=True, file_okay=False, help="Policy directory."),
    tasks: Path = typer.Option(..., "--tasks", exists=True, dir_okay=False, help="Verified tasks (JSONL)."),
    out: Path = typer.Option(..., "--out", help="Folder for trajectories, results, per-answer records."),
    samples: int = typer.Option(1, min=1, help="Answers sampled per task."),
    temperature: float | None = typer.Option(
        None, min=0.01, help="Sampling temperature." + _default(RolloutSettings, "temperature")
    ),
    max_new_tokens: int | None = typer.Option(
        None, min=1, help="Longest answer." + _default(RolloutSettings, "max_new_tokens")
    ),
    seed: int = typer.Option(0, help="Run seed (with --step, seeds the task draw and the sampling)."),
    workers: int | None = typer.Option(None, min=1, help="Sandbox workers (default: all cores)."),
    agent: AgentKind | None = AGENT_OPTION,
    max_turns: int | None = MAX_TURNS_OPTION,
    max_trajectory_tokens: int | None = MAX_TOKENS_OPTION,
    max_trajectory_seconds: float | None = MAX_SECONDS_OPTION,
    max_live: int | None = MAX_LIVE_OPTION,
    call_format: CallFormat | None = CALL_FORMAT_OPTION,
    show_definition: bool | None = SHOW_DEFINITION_OPTION,
) -> None:
    """Parse rate, pass@1, clean fixes, turns, tokens and tool use, each patch run in the sandbox."""
    from gagar.experiment.config import EvalSettings
    from gagar.experiment.evaluation import evaluate_policy

    chosen = agent_settings(
        kind=agent, max_turns=max_turns, max_tokens=max_trajectory_tokens, max_seconds=max_trajectory_seconds,
        max_live=max_live, call_format=call_format, show_definition=show_definition,
    )  # fmt: skip
    sampling = RolloutSettings(
        **{
            k: v
            for k, v in (("temperature", temperature), ("max_new_tokens", max_new_tokens))
            if v is not None
        }
    )
    settings = EvalSettings(
        samples_per_task=samples,
        temperature=sampling.temperature,
        max_new_tokens=sampling.max_new_tokens,
        agent=chosen,
    )
    summary = evaluate_policy(
        policy=policy,
        tasks=tasks,
        settings=settings,
        out=out,
        arm="policy",
        seed=None,
        sampling_seed=seed,
        workers=workers,
    )
    typer.echo(json.dumps({**summary.quality.model_dump(), "seconds": round(summary.seconds, 1)}, indent=1))


def rollout(
    policy: Path = typer.Option(..., "--policy", exists=True, file_okay=False, help="Policy directory."),
    tasks: Path = typer.Option(..., "--tasks", exists=True, dir_okay=False, help="Tasks (JSONL)."),
    out: Path = typer.Option(..., "--out", help="Trajectories (JSONL), written atomically."),
    group_size: int | None = typer.Option(
        None, "--group-size", help="Answers sampled per task (G)." + _default(RolloutSettings, "group_size")
    ),
    groups: int | None = typer.Option(
        None,
        "--groups",
        min=1,
        help="Tasks drawn (seeded by --seed and --step) (default: every task, in order).",
    ),
    temperature: float | None = typer.Option(
        None, help="Sampling temperature." + _default(RolloutSettings, "temperature")
    ),
    top_p: float | None = typer.Option(
        None, help="Nucleus sampling mass." + _default(RolloutSettings, "top_p")
    ),
    max_new_tokens: int | None = typer.Option(
        None, help="Most tokens per answer." + _default(RolloutSettings, "max_new_tokens")
    ),
    seed: int = typer.Option(0, help="Run seed (with --step, seeds the task draw and the sampling)."),
    step: int = typer.Option(0, help="RL step recorded in the trajectories."),
    backend: Backend = typer.Option(Backend.HF, help="Generation backend."),
    endpoint: str | None = typer.Option(None, help="Base URL (…/v1) for --backend openai."),
    model_name: str | None = typer.Option(
        None, help="Served model name (openai backend; default: DIR name)."
    ),
    agent: AgentKind | None = AGENT_OPTION,
    max_turns: int | None = MAX_TURNS_OPTION,
    max_trajectory_tokens: int | None = MAX_TOKENS_OPTION,
    max_trajectory_seconds: float | None = MAX_SECONDS_OPTION,
    max_live: int | None = MAX_LIVE_OPTION,
    call_format: CallFormat | None = CALL_FORMAT_OPTION,
    show_definition: bool | None = SHOW_DEFINITION_OPTION,
    sandbox: BackendName = SANDBOX_OPTION,
) -> None:
    """Sample GROUP_SIZE answers per task and write them as trajectories (the pipeline's rollout stage)."""
    from gagar.stages import rollout_stage

    given = {
        "group_size": group_size, "gen_batch_groups": groups, "temperature": temperature, "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "agent": agent_settings(
            kind=agent, max_turns=max_turns, max_tokens=max_trajectory_tokens,
            max_seconds=max_trajectory_seconds, max_live=max_live, call_format=call_format,
            show_definition=show_definition,
        ),
    }  # fmt: skip
    metrics = rollout_stage(
        policy=policy, tasks=tasks, out=out, step=step, seed=seed, every_task=groups is None,
        settings=RolloutSettings(**{k: v for k, v in given.items() if v is not None}),
        backend=backend.value, endpoint=endpoint, model_name=model_name, sandbox=sandbox,
    )  # fmt: skip
    n = int(metrics["rollout/trajectories"])
    parsed = round(metrics["rollout/parse_rate"] * n)
    typer.echo(json.dumps({"trajectories": n, "parsed": parsed, "out": str(out)}))
