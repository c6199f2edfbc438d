"""Train: one PPO-clip update on the step's batch; publishes checkpoint step-N to the artifact store."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("train"), install_kfp_package=False)
def train(
    storage: str,
    model: str,
    policy: str,
    step: int,
    trajectories: Input[Dataset],
    results: Input[Dataset],
    grades: Input[Dataset],
    batch: Input[Dataset],
    select_metrics: Input[Metrics],
    grade_metrics: Input[Metrics],
    redistribute_metrics: Input[Metrics],
    metrics: Output[Metrics],
    summary: Output[Markdown],
    seed: int = 0,
    lr: float = 2e-5,
    epochs: int = 1,
    minibatch_size: int = 16,
    keep_checkpoints: int = 3,
    pushgateway: str = "",
    lora: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    rollout_backend: str = "hf",
    served_model: str = "policy",
    nodes: int = 1,
    procs_per_node: int = 1,
    strategy: str = "ddp",
    runtime: str = "",
):
    """Update the policy (``gagar.stages.train_stage``) and publish ``checkpoints/step-N`` to the store.

    Args:
        storage: the run's artifact store: a local directory or ``s3://bucket/prefix``.
        policy: the policy the step sampled from (``prepare``'s output).
        step: the RL step; the checkpoint is published as ``checkpoints/step-N``.
        trajectories: the step's trajectories, every generation batch consumed (JSONL).
        results: their test results (JSONL; each run's seconds feed the sandbox duration histogram).
        grades: the kept groups' grades (JSONL; each group's seconds feed the grader histogram).
        batch: the train batch with advantages (JSONL).
        select_metrics: the select task's metrics: the step's sampling, rollout and sandbox
            metrics over every generation batch (merged into the step's record).
        grade_metrics: the grade task's metrics.
        redistribute_metrics: the redistribute task's metrics.
        metrics: ``loss/…``, ``policy/…`` and ``perf/train_s``.
        summary: Markdown summary of the step (resolved rate, groups kept and dropped, credit moved, loss).
        seed: run seed (minibatch order).
        lr: AdamW learning rate.
        epochs: passes over the batch.
        minibatch_size: trajectories per optimizer step.
        keep_checkpoints: checkpoints kept in the store.
        pushgateway: Prometheus Pushgateway URL the step's metrics go to; empty pushes nothing.
        model: the initial policy (the base a LoRA adapter is trained on).
        lora: train a LoRA adapter (published as ``adapters/policy-step-N``) instead of every weight.
        lora_rank: rank of the adapter.
        lora_alpha: scale numerator of the adapter.
        rollout_backend: the rollout's backend; with ``server`` every trajectory must carry the
            version the warm server sampled the step under.
        served_model: the policy server's name for its base model.
        nodes: nodes of a distributed update (a Kubeflow Trainer TrainJob).
        procs_per_node: processes per node (torchrun's --nproc-per-node).
        strategy: ``ddp`` or ``fsdp``.
        runtime: the ClusterTrainingRuntime of the TrainJob; empty updates in this pod.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.train(
            storage=storage,
            policy=policy,
            trajectories=trajectories.path,
            results=results.path,
            grades=grades.path,
            batch=batch.path,
            step=step,
            seed=seed,
            lr=lr,
            epochs=epochs,
            minibatch_size=minibatch_size,
            keep_checkpoints=keep_checkpoints,
            select_metrics=select_metrics.metadata,
            grade_metrics=grade_metrics.metadata,
            redistribute_metrics=redistribute_metrics.metadata,
            summary=summary.path,
            pushgateway=pushgateway,
            model=model,
            lora=lora,
            lora_rank=lora_rank,
            lora_alpha=lora_alpha,
            rollout_backend=rollout_backend,
            served_model=served_model,
            nodes=nodes,
            procs_per_node=procs_per_node,
            strategy=strategy,
            runtime=runtime,
        ),
    )
