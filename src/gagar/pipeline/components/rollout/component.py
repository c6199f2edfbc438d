"""Rollout: sample a group of answers per task from the current policy (one generation batch)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("rollout"), install_kfp_package=False)
def rollout(
    policy: str,
    step: int,
    storage: str,
    tasks: Input[Dataset],
    trajectories: Output[Dataset],
    metrics: Output[Metrics],
    gen_batch: int = 0,
    groups: int = 16,
    group_size: int = 8,
    seed: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 256,
    backend: str = "hf",
    endpoint: str = "",
    served_model: str = "policy",
    adapters_dir: str = "",
    agent: str = "single",
    max_turns: int = 8,
    max_trajectory_tokens: int = 2048,
    max_trajectory_seconds: float = 600.0,
    max_live_conversations: int = 0,
    sandbox: str = "kubernetes",
    sandbox_workers: int = 0,
):
    """Sample ``group_size`` trajectories for each of ``groups`` tasks (``gagar.stages.rollout_stage``).

    Args:
        policy: the policy to sample from (``prepare``'s output): a model directory or store reference.
        step: the RL step (seeds task selection and sampling; names the groups).
        tasks: the training tasks (JSONL).
        trajectories: the sampled trajectories (JSONL).
        metrics: ``rollout/…`` metrics and ``perf/rollout_s``.
        gen_batch: which generation batch of the step (0, 1, … for refills; seeds the tasks drawn).
        groups: tasks sampled (the generation batch; oversample over the train batch).
        group_size: trajectories per task.
        seed: run seed.
        temperature: sampling temperature.
        top_p: nucleus sampling mass.
        max_new_tokens: longest answer.
        backend: ``hf`` (in process), ``vllm`` (in process, GPU), ``openai`` (a server) or ``server``
            (the warm policy server, made to serve the step's LoRA adapter first).
        endpoint: OpenAI-compatible base URL of the ``openai`` and ``server`` backends; empty otherwise.
        storage: the run's artifact store (where the ``server`` backend's adapters are published).
        served_model: the server's name for its base model (the version sampled before any update).
        adapters_dir: where the server reads published adapters; empty: the local store's ``adapters/``.
        agent: ``single`` (one SEARCH/REPLACE answer) or ``tool-loop`` (multi-turn, tools, SUBMIT).
        max_turns: the tool loop's most assistant turns.
        max_trajectory_tokens: the tool loop's most tokens of a conversation (prompt included).
        max_trajectory_seconds: the tool loop's wall-clock budget of a conversation; 0: none.
        max_live_conversations: most conversations advancing together (the rest wait); 0: all.
        sandbox: where the tool loop's RUN_TESTS run the repository's own tests (never the judge's).
        sandbox_workers: parallel RUN_TESTS evaluations; 0: every core.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.rollout(
            policy=policy,
            tasks=tasks.path,
            trajectories=trajectories.path,
            step=step,
            gen_batch=gen_batch,
            groups=groups,
            group_size=group_size,
            seed=seed,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            backend=backend,
            endpoint=endpoint,
            storage=storage,
            served_model=served_model,
            adapters_dir=adapters_dir,
            agent=agent,
            max_turns=max_turns,
            max_trajectory_tokens=max_trajectory_tokens,
            max_trajectory_seconds=max_trajectory_seconds,
            max_live_conversations=max_live_conversations,
            sandbox=sandbox,
            sandbox_workers=sandbox_workers,
        ),
    )
