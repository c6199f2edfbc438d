"""``gagar advantages``: GRPO and GAGAR advantages for a JSONL file of graded trajectories."""

from __future__ import annotations

from pathlib import Path

import typer

from gagar.advantage import Decay
from gagar.advantage_io import advantages_for_records, read_advantage_records, summarize
from gagar.records import write_records


def advantages(
    input_path: Path = typer.Option(
        ...,
        "--in",
        exists=True,
        dir_okay=False,
        help="JSONL records with group_id, resolved (or reward) and rank.",
    ),
    output_path: Path = typer.Option(
        ...,
        "--out",
        dir_okay=False,
        help="Where to write the records with grpo_advantage and gagar_advantage.",
    ),
    decay: Decay = typer.Option(Decay.GEOMETRIC, help="How a rank becomes a weight."),
    gamma: float = typer.Option(0.5, help="Geometric decay factor per rank."),
    floor: float = typer.Option(0.1, help="Smallest weight for linear and score decay."),
    norm_std: bool = typer.Option(
        True, help="Divide by the group's std (GRPO); --no-norm-std centres only (Dr. GRPO)."
    ),
) -> None:
    """Write each record's GRPO and GAGAR advantages side by side; report how much credit moved."""
    try:
        records = read_advantage_records(input_path)
        out = advantages_for_records(records, decay=decay, gamma=gamma, floor=floor, norm_std=norm_std)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--in") from None
    write_records(output_path, out)
    typer.echo(summarize(out))
