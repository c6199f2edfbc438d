"""``gagar grader sft|eval`` (train and measure the learned grader) and ``gagar grade`` (grade a rollout)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from gagar.cli.core import GagarGroup
from gagar.grader.llm import GROUP_TIMEOUT_S
from gagar.grader.llm_client import MAX_TOKENS
from gagar.grader.run import GraderKind
from gagar.tasks.noise import Elsewhere

__all__ = ["app", "grade"]

app = typer.Typer(
    cls=GagarGroup, name="grader", help="Train and evaluate the learned grader.", no_args_is_help=True
)

_FILE = {"exists": True, "dir_okay": False}


class KindSet(StrEnum):
    """Which catalogue kinds noise groups draw from (``gagar.grader.sft.KIND_SETS``)."""

    ALL = "all"
    TRAINING = "training"
    HELD_OUT = "held-out"


_ELSEWHERE_HELP = (
    "Where the kinds that edit outside the fix put their edits: anywhere (any function the fix does not "
    "touch) or reached (only functions the failing tests reach, a change spread along their path)."
)
_KINDS_HELP = (
    "Catalogue kinds the noise groups draw from: all, training (all but the held-out ones) or held-out "
    "(duplicated_logic, unused_import, defensive_check)."
)


class GraderSFTKind(StrEnum):
    """What ``gagar grader sft`` trains."""

    LEARNED = "learned"
    LLM = "llm"


@app.command("sft")
def sft(
    tasks: Path = typer.Option(..., **_FILE, help="Tasks JSONL (bundled files give oracle labels)."),
    out: Path = typer.Option(..., file_okay=False, help="Folder to save the grader in."),
    kind: GraderSFTKind = typer.Option(
        GraderSFTKind.LEARNED, help="learned (MLP scorer) or llm (tool loop)."
    ),
    init: Path | None = typer.Option(
        None,
        file_okay=False,
        exists=True,
        help="llm: pretrained model folder to fine-tune (default: tiny, from scratch).",
    ),
    full: bool = typer.Option(False, "--full", help="llm with --init: train every weight instead of LoRA."),
    trajectories: Path | None = typer.Option(None, **_FILE, help="Rollout trajectories JSONL."),
    results: Path | None = typer.Option(None, **_FILE, help="Sandbox results JSONL of the trajectories."),
    judgements: Path | None = typer.Option(None, **_FILE, help="Grades JSONL labelling rollout groups."),
    groups_per_task: int = typer.Option(3, min=0, help="Noise groups (ladders) built per task."),
    misleading_per_task: int | None = typer.Option(
        None,
        min=0,
        help="Groups per task where size misleads, a larger patch being the better one (default: learned "
        "1, llm 0: the LLM teacher scores size).",
    ),
    kinds: KindSet = typer.Option(KindSet.ALL, help=_KINDS_HELP),
    elsewhere: Elsewhere = typer.Option(Elsewhere.ANYWHERE, help=_ELSEWHERE_HELP),
    min_candidates: int | None = typer.Option(
        None, min=2, max=16, help="Smallest noise group (default: llm 2, learned --max-candidates)."
    ),
    max_candidates: int | None = typer.Option(
        None, min=2, max=16, help="Largest noise group, before a hack candidate (default: llm 8, learned 5)."
    ),
    hack_share: float | None = typer.Option(
        None, min=0.0, max=1.0, help="Share of groups given a hack candidate (default: llm 0.3, learned 0)."
    ),
    inject_share: float | None = typer.Option(
        None,
        min=0.0,
        max=1.0,
        help="Share of groups whose worse half carries text addressed to the grader, in the first three "
        "forms (default: llm 0.2, learned 0).",
    ),
    epochs: int = typer.Option(300, min=1, help="learned: training epochs (full batch)."),
    steps: int | None = typer.Option(None, min=1, help="llm: optimizer steps (default per starting point)."),
    batch_size: int | None = typer.Option(None, min=1, help="llm: transcripts per step."),
    resume: bool = typer.Option(False, "--resume", help="llm: continue from the last checkpoint in --out."),
    until_step: int | None = typer.Option(None, min=1, help="llm: stop after this step (resume later)."),
    seed: int = typer.Option(0, help="Seed of the noise groups, the candidate order and the model."),
) -> None:
    """Build labelled groups and SFT-train a grader on them: the learned scorer, or the LLM grader on
    teacher transcripts."""
    from gagar.grader.sft import (
        KIND_SETS,
        LEARNED_MISLEADING_PER_TASK,
        load_labelled_groups,
        with_hacks,
        with_injections,
    )

    if kind is GraderSFTKind.LEARNED and (init is not None or full):
        raise typer.BadParameter("--init and --full apply to --kind llm")
    try:
        llm = kind is GraderSFTKind.LLM
        smallest = min_candidates if min_candidates else (2 if llm else None)
        largest = max_candidates if max_candidates else (8 if llm else 5)
        misleading = (
            misleading_per_task
            if misleading_per_task is not None
            else (0 if llm else LEARNED_MISLEADING_PER_TASK)
        )
        if smallest is not None and smallest > largest:
            raise ValueError(f"--min-candidates {smallest} exceeds --max-candidates {largest}")
        groups = load_labelled_groups(
            tasks, trajectories, results, judgements, groups_per_task, seed, smallest, largest,
            misleading, KIND_SETS[kinds], elsewhere,
        )  # fmt: skip
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    share = hack_share if hack_share is not None else (0.3 if kind is GraderSFTKind.LLM else 0.0)
    injected = inject_share if inject_share is not None else (0.2 if kind is GraderSFTKind.LLM else 0.0)
    groups = with_hacks(with_injections(groups, injected, seed), share, seed)
    if kind is GraderSFTKind.LEARNED:
        from gagar.grader.learned import ScorerConfig
        from gagar.grader.sft import train_grader

        train_grader(groups, out, ScorerConfig(epochs=epochs, seed=seed))
        typer.echo(f"trained on {len(groups)} groups; saved to {out}")
        return
    from gagar.grader.llm_sft import build_transcripts, grader_sft_config, train_llm_grader

    overrides = {k: v for k, v in {"steps": steps, "batch_size": batch_size}.items() if v is not None}
    config = grader_sft_config(str(init) if init else None, full, seed=seed, **overrides)
    try:
        result = train_llm_grader(build_transcripts(groups, seed), out, config, resume, True, until_step)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    done = "stopped at a checkpoint" if until_step is not None and until_step < config.steps else "saved"
    typer.echo(
        f"trained on {result.n_demos} transcripts of {len(groups)} groups, final loss "
        f"{result.losses[-1]:.3f}, {result.seconds:.0f} s; {done} in {out}"
    )


@app.command("eval")
def eval_(
    tasks: Path = typer.Option(..., **_FILE, help="Held-out tasks JSONL."),
    grader: GraderKind = typer.Option(GraderKind.LEARNED, help="Which grader to evaluate."),
    grader_model: Path | None = typer.Option(None, file_okay=False, help="Learned grader folder."),
    endpoint: str | None = typer.Option(None, help="OpenAI-compatible /v1 URL for the llm grader."),
    model: str | None = typer.Option(None, help="Model name at --endpoint; default the first it lists."),
    api: str = typer.Option("chat", help="Endpoint flavour: chat or completions."),
    max_turns: int | None = typer.Option(
        None, min=1, help="Most tool-calling turns of the llm grader (default: grader.max_turns's)."
    ),
    max_tokens: int = typer.Option(MAX_TOKENS, min=1, help="Most tokens of one llm grader turn."),
    timeout: float = typer.Option(
        GROUP_TIMEOUT_S, min=1.0, help="Seconds the llm grader may spend on one group."
    ),
    trajectories: Path | None = typer.Option(None, **_FILE, help="Held-out rollout trajectories JSONL."),
    results: Path | None = typer.Option(None, **_FILE, help="Sandbox results JSONL of the trajectories."),
    judgements: Path | None = typer.Option(None, **_FILE, help="Grades JSONL labelling rollout groups."),
    groups_per_task: int = typer.Option(
        3, min=0, help="Noise groups (ladders) built per task (0: rollout groups only)."
    ),
    misleading_per_task: int = typer.Option(
        0, min=0, help="Groups per task where size misleads (a larger patch is the better one)."
    ),
    kinds: KindSet = typer.Option(KindSet.ALL, help=_KINDS_HELP),
    elsewhere: Elsewhere = typer.Option(Elsewhere.ANYWHERE, help=_ELSEWHERE_HELP),
    hack_share: float = typer.Option(0.3, min=0.0, max=1.0, help="Share of groups given a hack candidate."),
    min_candidates: int | None = typer.Option(
        None, min=2, max=16, help="Smallest noise group; each draws min..max candidates (default: max each)."
    ),
    max_candidates: int = typer.Option(
        5, min=2, max=16, help="Largest noise group, before a hack candidate."
    ),
    limit: int | None = typer.Option(None, min=1, help="Evaluate the first N groups only."),
    reverse_check: bool = typer.Option(True, help="Grade every group again with the candidates reversed."),
    inject_worse: bool = typer.Option(
        False,
        help="Grade every group again with text addressed to the grader in its worse half; report the "
        "Kendall tau between the two rankings and the share of injected candidates flagged.",
    ),
    markdown: bool = typer.Option(False, "--markdown", help="Print a row of docs/grader.md's table."),
    seed: int = typer.Option(1, help="Seed of the noise groups."),
) -> None:
    """Report a grader's agreement with held-out labels: Kendall's tau, top-1, agreement per oracle axis,
    fallbacks, position disagreement under candidate reversal, hack recall and seconds per group."""
    from gagar.grader.run import make_grader
    from gagar.grader.sft import KIND_SETS, evaluate, load_labelled_groups, with_hacks

    try:
        groups = load_labelled_groups(
            tasks, trajectories, results, judgements, groups_per_task, seed, min_candidates, max_candidates,
            misleading_per_task, KIND_SETS[kinds], elsewhere,
        )  # fmt: skip
        chosen = make_grader(
            grader, model_dir=grader_model, endpoint=endpoint, model=model, api=api,  # type: ignore[arg-type]
            max_turns=max_turns, timeout_s=timeout, max_tokens=max_tokens,
        )  # fmt: skip
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    groups = with_hacks(groups, hack_share, seed)[:limit]
    report = evaluate(chosen, groups, reverse_check=reverse_check, progress=True, inject=inject_worse)
    typer.echo(report.markdown_row() if markdown else report.line())
    if markdown and report.fallback_reasons:
        typer.echo(f"fallbacks: {dict(sorted(report.fallback_reasons.items()))}", err=True)


def grade(
    tasks: Path = typer.Option(..., **_FILE, help="Tasks JSONL."),
    trajectories: Path = typer.Option(..., **_FILE, help="Trajectories JSONL (with group_id, model_patch)."),
    results: Path = typer.Option(..., **_FILE, help="Sandbox results JSONL."),
    out: Path = typer.Option(..., dir_okay=False, help="Where to write grades.jsonl."),
    workspace: Path = typer.Option(..., file_okay=False, help="Root of the shared group workspaces."),
    grader: GraderKind = typer.Option(GraderKind.HEURISTIC, help="Which grader ranks the candidates."),
    grader_model: Path | None = typer.Option(None, file_okay=False, help="Learned grader folder."),
    endpoint: str | None = typer.Option(None, help="OpenAI-compatible /v1 URL for the llm grader."),
    model: str | None = typer.Option(None, help="Model name at --endpoint; default the first it lists."),
    api: str = typer.Option("chat", help="Endpoint flavour: chat or completions."),
    max_turns: int | None = typer.Option(
        None, min=1, help="Most tool-calling turns of the llm grader (default: grader.max_turns's)."
    ),
    timeout: float = typer.Option(
        GROUP_TIMEOUT_S, min=1.0, help="Seconds the llm grader may spend on one group."
    ),
    position_guard: float | None = typer.Option(
        None, help="Grade twice in opposite orders; tie when the Kendall distance exceeds this."
    ),
    repos_dir: Path | None = typer.Option(None, file_okay=False, help="Local clones for base_commit tasks."),
) -> None:
    """Rank the passing trajectories of every group; a failing grader ties the group (plain GRPO)."""
    from gagar.stages import grade_stage

    try:
        metrics = grade_stage(
            tasks=tasks, trajectories=[trajectories], results=[results], out=out, workspace=workspace,
            grader=grader, grader_model=grader_model, endpoint=endpoint, model=model, api=api,
            max_turns=max_turns, timeout_s=timeout, position_guard=position_guard, repos_dir=repos_dir,
        )  # fmt: skip
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    reasons = {k.rpartition("/")[2]: v for k, v in metrics.items() if k.startswith("grader/fallbacks/")}
    typer.echo(
        f"{metrics['grader/groups']:.0f} groups graded ({metrics['grader/trivial']:.0f} trivial, "
        f"{metrics['grader/copies']:.0f} candidates graded through an identical one), "
        f"{metrics['grader/fallbacks']:.0f} fallbacks: "
        + (", ".join(f"{r} {n:.0f}" for r, n in sorted(reasons.items())) or "none")
    )
