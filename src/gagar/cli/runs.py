"""``gagar runs watch``: follow a run of the Argo Workflow target through the Argo server."""

from __future__ import annotations

import typer

from gagar.cli.core import GagarGroup

__all__ = ["app"]

app = typer.Typer(
    cls=GagarGroup, name="runs", help="Follow pipeline runs on Argo Workflows.", no_args_is_help=True
)


@app.command("watch")
def watch(
    name: str = typer.Argument(..., help="Workflow name (a CronWorkflow's runs: <cron name>-<timestamp>)."),
    namespace: str = typer.Option(
        "argo", "--namespace", "-n", envvar="ARGO_NAMESPACE", help="Namespace [env: ARGO_NAMESPACE]."
    ),
    server: str = typer.Option(
        "", "--server", envvar="ARGO_SERVER", help="Argo server, host:port or URL [env: ARGO_SERVER]."
    ),
    token: str | None = typer.Option(
        None, "--token", envvar="ARGO_TOKEN", help="Bearer token, `argo auth token` [env: ARGO_TOKEN]."
    ),
    secure: bool = typer.Option(
        True, "--secure/--plaintext", envvar="ARGO_SECURE", help="HTTPS for host:port [env: ARGO_SECURE]."
    ),
    insecure_skip_verify: bool = typer.Option(
        False,
        "--insecure-skip-verify",
        envvar="ARGO_INSECURE_SKIP_VERIFY",
        help="Accept any TLS certificate [env: ARGO_INSECURE_SKIP_VERIFY].",
    ),
    interval_s: float = typer.Option(10.0, "--interval-s", min=0.1, help="Seconds between polls."),
    once: bool = typer.Option(False, "--once", help="Print the current state once and exit."),
) -> None:
    """Print the workflow's steps (phase, duration) and failed sandbox pods until it finishes.

    Exits 0 when it succeeded (or is still running with --once), 1 when it failed.
    """
    from gagar.pipeline.argo_watch import ArgoApiError, ArgoServer, format_summary, server_url
    from gagar.pipeline.argo_watch import watch as follow

    try:
        client = ArgoServer(server_url(server, secure), token, verify_tls=not insecure_skip_verify)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    shown: object = None
    try:
        for summary in follow(client, namespace, name, interval_s=interval_s, max_polls=1 if once else None):
            state = (summary.phase, [(row.task, row.phase) for row in summary.steps])
            if state != shown:  # print when a phase changes, not on every poll
                typer.echo(format_summary(summary))
                shown = state
    except ArgoApiError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if summary.phase in ("Failed", "Error"):
        raise typer.Exit(1)
