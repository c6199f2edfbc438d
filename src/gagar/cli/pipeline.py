"""``gagar pipeline compile|upload``: the pipelines as KFP or Argo YAML, and into a KFP server."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import typer

from gagar import __version__
from gagar.cli.core import GagarGroup
from gagar.pipeline.images import DEFAULT_REGISTRY, STAGES

__all__ = ["app", "stage_images"]

app = typer.Typer(
    cls=GagarGroup,
    name="pipeline",
    help="Compile (KFP or Argo) and upload the pipelines.",
    no_args_is_help=True,
)

HOST_HELP = "URL of the KFP API server [env: GAGAR_KFP_HOST]."
IMAGE_ENV = "GAGAR_IMAGES__"
"""Prefix of the environment variables naming a stage's image (the chart's settings ConfigMap)."""


def stage_images(flags: Sequence[str], environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """``(stage, image)`` of every stage named by ``--image STAGE=IMAGE`` or ``GAGAR_IMAGES__<STAGE>``.

    A flag wins over the environment. Stages named by neither keep the registry/tag image.

    Raises:
        ValueError: a flag without ``=``, an unknown stage, or an empty image, naming it.
    """
    found = {
        stage: environ[f"{IMAGE_ENV}{stage.upper()}"]
        for stage in STAGES
        if environ.get(f"{IMAGE_ENV}{stage.upper()}")
    }
    for flag in flags:
        stage, sep, ref = flag.partition("=")
        if not sep or not ref:
            raise ValueError(
                f"--image {flag!r}: expected STAGE=IMAGE, e.g. rollout=registry.local/gagar-rollout:1"
            )
        if stage not in STAGES:
            raise ValueError(f"--image {flag!r}: unknown stage {stage!r}, choose from {', '.join(STAGES)}")
        found[stage] = ref
    return tuple(sorted(found.items()))


def _secret_keys(text: str) -> tuple[str, str]:
    access, sep, secret = text.partition(",")
    if not sep or not access or not secret or "," in secret:
        raise ValueError(f"--store-secret-keys {text!r}: expected ACCESS_KEY_KEY,SECRET_KEY_KEY")
    return access, secret


@app.command("compile")
def compile_(
    out: Path = typer.Option(..., "--out", dir_okay=False, help="YAML file to write."),
    pipeline: str = typer.Option("rl", "--pipeline", help="rl, grader-sft or evaluation (kfp only)."),
    target: str = typer.Option("kfp", "--target", help="kfp (Kubeflow Pipelines) or argo (Argo Workflows)."),
    steps_per_run: int = typer.Option(1, "--steps-per-run", min=1, help="RL steps each run (rl only)."),
    max_gen_batches: int = typer.Option(
        3, "--max-gen-batches", min=1, help="Generation batches a step may draw, refills included (rl only)."
    ),
    image_registry: str = typer.Option(DEFAULT_REGISTRY, help="Registry of the stage images."),
    image_tag: str = typer.Option(__version__, help="Tag of the stage images."),
    image_variant: str = typer.Option(
        "", help="'cpu': the CPU variants of the CUDA stage images (make images); '' the release images."
    ),
    image: list[str] = typer.Option(
        [],
        "--image",
        help="Full image of one stage as STAGE=IMAGE (repeatable); overrides --image-registry/--image-tag "
        "for that stage [env: GAGAR_IMAGES__<STAGE>, e.g. GAGAR_IMAGES__ROLLOUT].",
    ),
    pull_secret: list[str] = typer.Option(
        [], "--pull-secret", help="Image pull Secret of every task (repeatable)."
    ),
    store_secret: str = typer.Option(
        "mlpipeline-minio-artifact", help="Secret with the S3 keys ('' passes none, e.g. with IRSA)."
    ),
    store_secret_keys: str = typer.Option(
        "accesskey,secretkey", help="ACCESS_KEY_KEY,SECRET_KEY_KEY: the keys of the S3 keys in that Secret."
    ),
    settings_configmap: str = typer.Option(
        "gagar-settings", help="The chart's settings ConfigMap, <release>-settings ('' for none)."
    ),
    gpus: bool = typer.Option(True, "--gpus/--no-gpus", help="One GPU for the rollout and train tasks."),
    resources: list[str] = typer.Option(
        [],
        "--resources",
        help="A stage image's CPU and memory, STAGE=CPU_REQUEST/CPU_LIMIT,MEMORY_REQUEST/MEMORY_LIMIT "
        "(repeatable), e.g. train=4/8,32Gi/64Gi; stages not named keep their defaults.",
    ),
    timeout_s: int = typer.Option(6 * 3600, min=1, help="Deadline of every task, in seconds."),
    retries: int = typer.Option(2, min=0, help="Retries of a failed task (never the train task)."),
    schedule: str | None = typer.Option(
        None, "--schedule", help="argo: write a CronWorkflow on this 5-field cron, e.g. '0 2 * * *'."
    ),
    timezone: str = typer.Option("UTC", "--timezone", help="argo: time zone of --schedule."),
    starting_deadline_s: int = typer.Option(
        3600, "--starting-deadline-s", min=0, help="argo: skip a scheduled run missed by longer."
    ),
    name: str = typer.Option("gagar-rl", "--name", help="argo: CronWorkflow name / Workflow name prefix."),
    namespace: str | None = typer.Option(None, "--namespace", help="argo: namespace in the manifest."),
    service_account: str = typer.Option(
        "gagar-runner", "--service-account", help="argo: ServiceAccount of the stage pods ('' for default)."
    ),
    sandbox_service_account: str = typer.Option(
        "gagar-runner",
        "--sandbox-service-account",
        help="argo: ServiceAccount allowed to create sandbox pods.",
    ),
    artifact_repository: str = typer.Option(
        "gagar-argo-artifacts/s3",
        "--artifact-repository",
        help="argo: CONFIGMAP/KEY of the S3 artifact repository ('' for the namespace default).",
    ),
    param: list[str] = typer.Option(
        [],
        "--param",
        help="A parameter's default in the compiled pipeline, name=value (repeatable), e.g. "
        "sandbox_backend=kubernetes; gagar pipeline parameters lists them.",
    ),
) -> None:
    """Compile a pipeline to the YAML the Kubeflow UI uploads, or to an Argo Workflow / CronWorkflow."""
    from gagar.pipeline.platform import PlatformOptions, parse_resources

    options = PlatformOptions(
        image_registry=image_registry,
        image_tag=image_tag,
        image_variant=image_variant or None,
        images=stage_images(image, os.environ),
        pull_secrets=tuple(pull_secret),
        store_secret=store_secret or None,
        store_secret_keys=_secret_keys(store_secret_keys),
        settings_configmap=settings_configmap or None,
        gpus=(("rollout", 1), ("train", 1)) if gpus else (),
        resources=tuple(parse_resources(item) for item in resources),
        timeout_s=timeout_s,
        retries=retries,
    )
    if target == "argo":
        from gagar.cli.params import typed_params
        from gagar.pipeline.argo import ArgoOptions, CronSchedule, compile_argo, parse_repository

        if pipeline != "rl":
            raise ValueError(f"--target argo compiles the rl pipeline only, not {pipeline!r}")
        values = typed_params(param)  # names and values checked before anything is written
        argo = ArgoOptions(
            name=name,
            namespace=namespace,
            service_account=service_account or None,
            sandbox_service_account=sandbox_service_account or None,
            artifact_repository=parse_repository(artifact_repository),
            parameters=tuple(values.items()),
        )
        cron = CronSchedule(schedule, timezone, starting_deadline_s) if schedule else None
        manifest = compile_argo(
            out,
            steps_per_run=steps_per_run,
            platform=options,
            argo=argo,
            schedule=cron,
            max_gen_batches=max_gen_batches,
        )
    elif target == "kfp":
        if schedule:
            raise ValueError("--schedule is for --target argo (KFP: gagar schedule)")
        from gagar.cli.params import typed_params
        from gagar.pipeline.build import compile_pipeline, executor_images

        path = compile_pipeline(
            pipeline,
            out,
            steps_per_run=steps_per_run,
            options=options,
            max_gen_batches=max_gen_batches if pipeline == "rl" else None,
            defaults=typed_params(param),
        )
    else:
        raise ValueError(f"unknown target {target!r}: choose kfp or argo")
    if target == "argo":
        typer.echo(f"wrote {out} (Argo {manifest['kind']} {name}, {steps_per_run} RL step(s) a run)")
        return
    images = sorted(set(executor_images(path).values()))
    typer.echo(f"wrote {path} ({pipeline}, {len(images)} images: {', '.join(images)})")


@app.command("upload")
def upload(
    host: str = typer.Option(..., "--host", envvar="GAGAR_KFP_HOST", help=HOST_HELP),
    package: Path = typer.Option(..., "--package", exists=True, dir_okay=False, help="Compiled YAML."),
    name: str = typer.Option("gagar-rl", "--name", help="Pipeline name in KFP."),
    version: str = typer.Option(..., "--version", help="Name of the new pipeline version."),
) -> None:
    """Upload a compiled pipeline as a new version (creating the pipeline when missing)."""
    from gagar.pipeline.client import connect
    from gagar.pipeline.client import upload as upload_package

    pipeline_id, version_id = upload_package(connect(host), package, name, version)
    typer.echo(
        f"uploaded {package} as {name} version {version} (pipeline {pipeline_id}, version {version_id})"
    )


@app.command("parameters")
def parameters(
    markdown: bool = typer.Option(False, "--markdown", help="A Markdown table instead of plain lines."),
) -> None:
    """List the pipelines' parameters: name, type, default and what each means (the training config's
    settings, generated from it)."""
    from gagar.pipeline.parameters import PARAMETERS

    if markdown:
        typer.echo("| parameter | type | default | description |\n|---|---|---|---|")
    for p in PARAMETERS:
        default = "(required)" if p.default is None else repr(p.default)
        if markdown:
            typer.echo(f"| `{p.name}` | {p.type.__name__} | {default} | {p.description} |")
        else:
            typer.echo(f"{p.name} ({p.type.__name__}, {default}): {p.description}")
