"""``gagar serve``: long-running servers: the warm vLLM policy server, the LLM grader, the adapter
sync, and a small in-process transformers server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gagar.cli.core import GagarGroup

__all__ = ["app"]

PREFIX_CACHE_TOKENS = 32768
"""``gagar serve grader --prefix-cache``'s default: the prompts of 32 grading conversations of about
1,000 tokens (about 1.5 GB of key/values for SmolLM2-135M in fp32)."""

app = typer.Typer(
    cls=GagarGroup, help="Long-running servers that outlive the pipeline steps.", no_args_is_help=True
)


@app.callback()
def _group() -> None:
    """Long-running servers that outlive the pipeline steps."""


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.command()
def policy(
    model: Path = typer.Option(
        ..., "--model", exists=True, file_okay=False, help="Base policy directory (Hugging Face format)."
    ),
    enable_lora: bool = typer.Option(
        False, "--enable-lora", help="Serve LoRA adapters, loadable at runtime (policy-step-N)."
    ),
    port: int | None = typer.Option(None, help="Port on 127.0.0.1 (default: a free one)."),
    max_lora_rank: int = typer.Option(16, "--max-lora-rank", help="Largest adapter rank accepted."),
    served_model_name: str = typer.Option("policy", help="Name of the base model in API requests."),
    max_model_len: int = typer.Option(1024, help="Longest prompt + response in tokens."),
    dtype: str = typer.Option("auto", help="Weights' dtype: auto, float32, bfloat16."),
    enforce_eager: bool = typer.Option(
        False, "--enforce-eager", help="Skip graph compilation: faster start, slower sampling."
    ),
    python: Path | None = typer.Option(
        None, help="The vLLM environment's python (env GAGAR_VLLM_PYTHON; default .venv-vllm/bin/python)."
    ),
    startup_timeout: float = typer.Option(300, help="Seconds to wait for /health."),
    max_num_batched_tokens: int | None = typer.Option(
        None,
        "--max-num-batched-tokens",
        min=1,
        help="Tokens one engine step may take; above a generation batch's prompt tokens for the tool loop "
        "(docs/agent.md).",
    ),
) -> None:
    """Start vLLM's OpenAI-compatible server for MODEL on loopback; stop it with Ctrl-C."""
    import signal

    from gagar.policy.vllm_server import PolicyServerError, start_policy_server

    try:
        server = start_policy_server(
            model, port=port, enable_lora=enable_lora, max_lora_rank=max_lora_rank, python=python,
            startup_timeout_s=startup_timeout, served_model_name=served_model_name,
            max_model_len=max_model_len, dtype=dtype, enforce_eager=enforce_eager,
            max_num_batched_tokens=max_num_batched_tokens,
        )  # fmt: skip
    except PolicyServerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    # SIGTERM (a pod or supervisor stopping us) and SIGINT (Ctrl-C, even where a shell ignored it) both
    # stop the vLLM process group before this process exits
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    _serve_until_exit(
        server, f"serving {model} as {served_model_name!r} at {server.base_url} (log {server.log_path})"
    )


@app.command("transformers")
def transformers(
    policy: Path = typer.Option(..., "--policy", exists=True, file_okay=False, help="Policy directory."),
    port: int = typer.Option(8000, help="Port on 127.0.0.1."),
) -> None:
    """Serve a policy directory in process with transformers as an OpenAI-compatible /v1/completions
    endpoint on loopback until interrupted (small models, tests; `gagar serve policy` is vLLM)."""
    import time

    from gagar.policy.generation import HFBackend
    from gagar.policy.model import load_policy
    from gagar.policy.server import running_server

    model, tokenizer = load_policy(policy)
    with running_server(HFBackend(model, tokenizer), tokenizer, policy.name, port) as url:
        typer.echo(f"serving {policy} at {url}")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


@app.command()
def grader(
    model: Path = typer.Option(
        ...,
        "--model",
        exists=True,
        file_okay=False,
        help="The LLM grader's folder (`gagar grader sft --kind llm`).",
    ),
    port: int | None = typer.Option(None, help="Port on 127.0.0.1 (default: a free one)."),
    served_model_name: str = typer.Option("grader", help="Name of the model in API requests."),
    max_model_len: int = typer.Option(2048, help="Longest prompt + response in tokens (vLLM)."),
    engine: str = typer.Option(
        "auto", help="vllm, own (gagar.policy.server) or auto: vLLM where its environment exists."
    ),
    python: Path | None = typer.Option(
        None, help="The vLLM environment's python (env GAGAR_VLLM_PYTHON; default .venv-vllm/bin/python)."
    ),
    enforce_eager: bool = typer.Option(
        False, "--enforce-eager", help="vLLM: skip graph compilation (faster start, slower sampling)."
    ),
    startup_timeout: float = typer.Option(300, help="Seconds to wait for /health."),
    max_batch: int = typer.Option(
        32, min=1, help="own: most sequences decoded together (concurrent gradings; 1: one at a time)."
    ),
    dtype: str = typer.Option(
        "float32",
        help="Precision of the weights: float32, bfloat16 (faster on CPUs with AMX or AVX512-BF16, but a "
        "small grader's answers may break: measure it), or auto: bfloat16 where the CPU multiplies it in "
        "hardware, else float32.",
    ),
    prefix_cache: int = typer.Option(
        PREFIX_CACHE_TOKENS,
        min=0,
        help="own: tokens of earlier prompts whose key/values are kept, so a turn prefills only its new "
        "tokens (0: off, every prompt prefilled whole).",
    ),
) -> None:
    """Serve the LLM grader warm on loopback (chat and completions APIs) until interrupted; point
    `gagar grade --grader llm --endpoint URL` and `grader.endpoint` of `gagar train` at the URL it prints."""
    import signal
    import time

    from gagar.grader.llm_sft import check_trained_opening
    from gagar.policy.model import serving_dtype
    from gagar.policy.vllm_server import PolicyServerError, find_vllm_python, start_policy_server

    if engine not in ("auto", "vllm", "own"):
        raise typer.BadParameter(f"engine must be auto, vllm or own, got {engine!r}")
    try:
        check_trained_opening(model)
        precision = serving_dtype(dtype)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    vllm_python = python or find_vllm_python()
    if engine == "vllm" or (engine == "auto" and vllm_python is not None and Path(vllm_python).is_file()):
        try:
            server = start_policy_server(
                model, port=port, enable_lora=False, python=vllm_python, startup_timeout_s=startup_timeout,
                served_model_name=served_model_name, max_model_len=max_model_len, dtype=precision,
                enforce_eager=enforce_eager,
            )  # fmt: skip
        except PolicyServerError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        _serve_until_exit(
            server, f"serving grader {model} as {served_model_name!r} at {server.base_url} (vLLM)"
        )
    import torch

    from gagar.policy.generation import GenerationBackend, HFBackend
    from gagar.policy.model import load_policy
    from gagar.policy.prefix_cache import PrefixCachingBackend
    from gagar.policy.server import running_server

    weights, tokenizer = load_policy(model, dtype=getattr(torch, precision))
    backend: GenerationBackend = (
        PrefixCachingBackend(weights, tokenizer, prefix_cache)
        if prefix_cache
        else HFBackend(weights, tokenizer, batch_size=max_batch)
    )
    with running_server(backend, tokenizer, served_model_name, port or 0, max_batch=max_batch) as url:
        typer.echo(
            f"serving grader {model} ({precision}) as {served_model_name!r} at {url} (gagar.policy.server)"
        )
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return


@app.command("adapter-sync")
def adapter_sync(
    storage: str = typer.Option(
        ..., "--storage", help="The run's store (s3://bucket/prefix or a directory)."
    ),
    dest: Path = typer.Option(Path("/adapters"), "--dest", help="Where the policy server reads adapters."),
    interval_s: float = typer.Option(10.0, "--interval-s", min=0.1, help="Seconds between store polls."),
    keep: int = typer.Option(3, "--keep", min=2, help="Newest adapters kept on disk."),
    once: bool = typer.Option(False, "--once", help="Sync once and exit (an initContainer)."),
) -> None:
    """Mirror the adapters the train stage publishes (adapters/policy-step-N) beside the policy server.

    The chart runs it as the policy server's sidecar: the rollout stage then asks the server to load
    /adapters/policy-step-N. Store settings come from GAGAR_STORAGE__* / AWS_* as for every stage.
    """
    import time

    from gagar.pipeline.store import sync_adapters

    while True:
        for version in sync_adapters(storage, dest, keep):
            typer.echo(f"synced {version} to {dest / version}")
        if once:
            return
        time.sleep(interval_s)


def _serve_until_exit(server: Any, banner: str) -> None:
    """Print ``banner`` and wait on a started vLLM server until interrupted (return) or it exits (exit 1)."""
    import time

    with server:
        typer.echo(banner)
        try:
            while server.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            return
    typer.echo(f"vLLM server exited with {server.process.returncode}; log {server.log_path}", err=True)
    raise typer.Exit(1)
