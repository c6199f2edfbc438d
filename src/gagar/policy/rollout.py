"""Rollout: sample a group of answers per task and record them as trajectories (DESIGN.md §3).

With the ``single`` agent the single-turn prompt (:func:`gagar.policy.agent_format.build_prompt`) of
each task is sampled ``group_size`` times through any
:class:`~gagar.policy.generation.GenerationBackend`; each answer is parsed into a unified diff
(``model_patch``, empty with a ``parse_error`` when it does not parse). With the ``tool-loop`` agent
each of the ``group_size`` members is a conversation (:func:`gagar.policy.tool_loop.run_tool_loops`),
all conversations of a call advancing one turn per engine call. With the ``tool-call`` agent the
conversations are native tool calls run in a sandboxed session each (:mod:`gagar.policy.tool_calls`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from gagar.policy.agent import AgentKind, AgentSettings, fine_tuned_agent
from gagar.policy.agent_format import build_prompt, parse_answer
from gagar.policy.generation import GenerationBackend, Sample
from gagar.policy.prefix_cache import PrefixCachingBackend
from gagar.policy.tool_loop import TestRunner, run_tool_loops
from gagar.schema.task import Task
from gagar.schema.trajectory import Message, SamplingParams, Trajectory

if TYPE_CHECKING:
    from gagar.policy.demos import DemoAnswer, Demonstration

log = logging.getLogger(__name__)

MULTI_TURN_CACHE_TOKENS = 1 << 20
"""Token budget of the prefix cache a multi-turn agent's in-process engine keeps. A conversation's new
turn replaces its previous entry and the store is emptied when a call's conversations end, so it holds
about the live conversations' prompts (100 conversations of 3,072 tokens: 307,200 tokens, 14 GB of
key/values for SmolLM2-135M in float32; bound it with ``agent.max_live``); the budget only caps that.
Least recently used entries are evicted past it, and a batch whose conversations cycle through a store
too small for them all would miss on every turn, so it must hold a whole batch."""


class DemoBudget(Protocol):
    """What building demonstrations reads of an SFT run's settings (:class:`gagar.policy.sft.SFTConfig`)."""

    max_prompt_tokens: int
    max_answer_tokens: int
    correction_share: float
    noise_kinds: Sequence[str]
    seed: int


__all__ = [
    "MULTI_TURN_CACHE_TOKENS",
    "Agent",
    "SampleContext",
    "SingleShotAgent",
    "ToolCallAgent",
    "ToolLoopAgent",
    "agent_for",
    "group_id_of",
    "make_backend",
    "rollout",
    "to_trajectory",
    "warn_if_fine_tuned_otherwise",
]


def make_backend(
    policy: str,
    kind: str = "hf",
    endpoint: str | None = None,
    model_name: str | None = None,
    agent: AgentSettings | None = None,
) -> tuple[GenerationBackend, PreTrainedTokenizerBase]:
    """Generation backend ``kind`` (``hf``, ``vllm``, ``openai``) for a policy directory, and its tokenizer.

    The tokenizer always comes from ``policy``: prompts are built and answers decoded locally. Given
    the ``agent`` that will sample it, a policy fine-tuned for another prompt is named in a warning
    (:func:`warn_if_fine_tuned_otherwise`), and a multi-turn agent on ``hf`` gets the prefix-caching
    engine (:class:`~gagar.policy.prefix_cache.PrefixCachingBackend`): a conversation is sent whole
    every turn, and only what no earlier call computed is prefilled.

    Raises:
        ValueError: an unknown kind, or ``openai`` without an endpoint.
    """
    from transformers import AutoTokenizer

    if agent is not None:
        warn_if_fine_tuned_otherwise(policy, agent)
    if kind == "hf":
        from gagar.policy.generation import BATCH_SIZE, HFBackend
        from gagar.policy.model import load_policy

        model, tokenizer = load_policy(policy)
        if agent is not None and agent_for(agent).samples_conversations:
            return PrefixCachingBackend(model, tokenizer, MULTI_TURN_CACHE_TOKENS, BATCH_SIZE), tokenizer
        return HFBackend(model, tokenizer), tokenizer
    tokenizer = AutoTokenizer.from_pretrained(policy)
    if kind == "vllm":
        from gagar.policy.vllm_backend import VLLMBackend

        return VLLMBackend(policy, [tokenizer.eos_token_id]), tokenizer
    if kind == "openai":
        if endpoint is None:
            raise ValueError("the openai backend needs an endpoint URL (…/v1)")
        from gagar.policy.openai_backend import OpenAIBackend

        name = model_name or Path(policy).name
        return OpenAIBackend(endpoint, name, [tokenizer.eos_token_id]), tokenizer
    raise ValueError(f"unknown backend {kind!r}: choose hf, vllm or openai")


def warn_if_fine_tuned_otherwise(policy: str, agent: AgentSettings) -> dict[str, tuple[str, str]]:
    """Log one warning when ``policy`` was fine-tuned (``gagar policy sft``) for an agent whose prompt
    differs from ``agent``'s (kind, call format, definition shown): sampled so, a policy reads
    prompts and is asked for calls it never saw, and scores far below what it was measured at.
    Returns the differences (setting: fine-tuned, sampled)."""
    trained = fine_tuned_agent(policy)
    differences = trained.prompt_differences(agent) if trained is not None else {}
    if differences:
        log.warning(
            "%s was fine-tuned for another agent prompt than it is sampled with: %s (set the agent to match)",
            policy,
            ", ".join(f"{name} {was} there, {now} here" for name, (was, now) in differences.items()),
        )
    return differences


def group_id_of(task: Task, step: int, gen_batch: int) -> str:
    """The group id names the step and the generation batch, so a task drawn again by a later
    generation batch of the same step forms a group of its own."""
    return f"{task.instance_id}/step{step}" + (f"-gen{gen_batch}" if gen_batch else "")


def to_trajectory(
    task: Task,
    messages: list[Message],
    prompt_ids: list[int],
    sample: Sample,
    tokenizer: PreTrainedTokenizerBase,
    member: int,
    step: int,
    params: SamplingParams,
    policy_version: str | None,
    gen_batch: int = 0,
) -> Trajectory:
    """The trajectory record of one sampled answer (member ``member`` of the task's group at ``step``)."""
    response = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
    patch, error = parse_answer(response, task.snapshot or {})
    group_id = group_id_of(task, step, gen_batch)
    return Trajectory(
        trajectory_id=f"{group_id}/{member}",
        instance_id=task.instance_id,
        group_id=group_id,
        step=step,
        messages=[*messages, Message(role="assistant", content=response)],
        prompt=tokenizer.decode(prompt_ids),
        response=response,
        prompt_token_ids=prompt_ids,
        response_token_ids=sample.token_ids,
        old_logprobs=sample.logprobs,
        loss_mask=[1] * len(sample.token_ids),
        model_patch=patch,
        parse_error=error,
        turns=1,
        n_prompt_tokens=len(prompt_ids),
        n_response_tokens=len(sample.token_ids),
        finish_reason=sample.finish_reason,
        policy_version=policy_version,
        sampling=params,
    )


class SampleContext:
    """What an agent needs besides its tasks to sample one engine call's worth of groups."""

    def __init__(
        self,
        backend: GenerationBackend,
        tokenizer: PreTrainedTokenizerBase,
        group_size: int,
        step: int,
        gen_batch: int,
        policy_version: str | None,
        max_prompt_tokens: int,
        run_tests: TestRunner | None,
        sandbox: object | None = None,
    ) -> None:
        self.backend, self.tokenizer, self.group_size = backend, tokenizer, group_size
        self.step, self.gen_batch, self.policy_version = step, gen_batch, policy_version
        self.max_prompt_tokens, self.run_tests = max_prompt_tokens, run_tests
        self.sandbox = sandbox
        """The sandbox backend the agent's sessions run in (the tool-call agent's)."""


class Agent(Protocol):
    """How the policy answers a task: what it samples, whether it needs the sandbox while sampling,
    and whether evaluation may overlap its generation. :func:`agent_for` gives the one
    :class:`~gagar.policy.agent.AgentSettings` names; every sampling path (the step's rollout, SFT's
    evaluation, ``gagar policy eval``) goes through it."""

    settings: AgentSettings
    samples_conversations: bool
    """Each trajectory is a conversation of turns (tool output between them masked), not one answer."""
    needs_sandbox: bool
    """Runs the repository's visible tests in the sandbox while it samples."""

    @property
    def overlaps_evaluation(self) -> bool:
        """The judge may evaluate one engine call's answers while the next is sampled."""
        ...

    def sample(self, tasks: Sequence[Task], params: SamplingParams, ctx: SampleContext) -> list[Trajectory]:
        """``ctx.group_size`` trajectories per task, task by task, from one engine call's worth of work."""
        ...

    def context_tokens(self, max_prompt_tokens: int, max_answer_tokens: int) -> int:
        """The longest sequence a policy for this agent must take (prompt and answer, or a conversation)."""
        ...

    def vocabulary(self) -> tuple[str, ...]:
        """Text of the agent's own format a tokenizer trained from scratch must know beside the tasks'."""
        ...

    def demonstrations(
        self, answers: Sequence[DemoAnswer], tokenizer: PreTrainedTokenizerBase, budget: DemoBudget
    ) -> tuple[list[Demonstration], Counter[str]]:
        """SFT demonstrations in the agent's format from the tasks' answers, and their counts."""
        ...


class _AgentBase:
    """What both agents share: their settings, and evaluation beside generation unless the agent
    itself uses the sandbox while it samples."""

    samples_conversations: bool
    needs_sandbox: bool

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings

    @property
    def overlaps_evaluation(self) -> bool:
        return not self.needs_sandbox


class SingleShotAgent(_AgentBase):
    """One SEARCH/REPLACE answer to a compact prompt (:mod:`gagar.policy.agent_format`)."""

    samples_conversations = False
    needs_sandbox = False

    def context_tokens(self, max_prompt_tokens: int, max_answer_tokens: int) -> int:
        return max_prompt_tokens + max_answer_tokens

    def vocabulary(self) -> tuple[str, ...]:
        return ()

    def demonstrations(
        self, answers: Sequence[DemoAnswer], tokenizer: PreTrainedTokenizerBase, budget: DemoBudget
    ) -> tuple[list[Demonstration], Counter[str]]:
        from gagar.policy.demos import tokenize_demos

        demos, dropped = tokenize_demos(
            answers, tokenizer, budget.max_prompt_tokens, budget.max_answer_tokens
        )
        return demos, Counter({"dropped_too_long": dropped})

    def sample(self, tasks: Sequence[Task], params: SamplingParams, ctx: SampleContext) -> list[Trajectory]:
        prompts = [build_prompt(t, ctx.tokenizer, ctx.max_prompt_tokens) for t in tasks]
        groups = ctx.backend.generate([ids for _, ids in prompts], params, ctx.group_size)
        return [
            to_trajectory(
                task,
                messages,
                ids,
                sample,
                ctx.tokenizer,
                member,
                ctx.step,
                params,
                ctx.policy_version,
                ctx.gen_batch,
            )
            for task, (messages, ids), samples in zip(tasks, prompts, groups, strict=True)
            for member, sample in enumerate(samples)
        ]


def conversation_jobs(tasks: Sequence[Task], ctx: SampleContext) -> list[tuple[Task, str, str]]:
    """``(task, trajectory id, group id)`` of every conversation a multi-turn agent runs: ``group_size``
    members of each task's group."""
    jobs = []
    for task in tasks:
        group = group_id_of(task, ctx.step, ctx.gen_batch)
        jobs += [(task, f"{group}/{member}", group) for member in range(ctx.group_size)]
    return jobs


class ToolLoopAgent(_AgentBase):
    """A conversation of VIEW, SEARCH, EDIT, RUN_TESTS and SUBMIT turns (:mod:`gagar.policy.tool_loop`),
    every conversation of a call advancing one turn per engine call."""

    samples_conversations = True
    needs_sandbox = True

    def context_tokens(self, max_prompt_tokens: int, max_answer_tokens: int) -> int:
        return max(max_prompt_tokens + max_answer_tokens, self.settings.max_tokens)

    def vocabulary(self) -> tuple[str, ...]:
        from gagar.policy.agent import COMMANDS
        from gagar.policy.tool_loop import SYSTEM_PROMPT

        return (SYSTEM_PROMPT, " ".join(COMMANDS), "edit applied passed failed submitted")

    def demonstrations(
        self, answers: Sequence[DemoAnswer], tokenizer: PreTrainedTokenizerBase, budget: DemoBudget
    ) -> tuple[list[Demonstration], Counter[str]]:
        from gagar.policy.tool_demos import tool_loop_demos

        return tool_loop_demos(
            answers, tokenizer, self.settings, budget.correction_share, budget.noise_kinds, budget.seed
        )

    def sample(self, tasks: Sequence[Task], params: SamplingParams, ctx: SampleContext) -> list[Trajectory]:
        jobs = conversation_jobs(tasks, ctx)
        return run_tool_loops(
            jobs,
            ctx.backend,
            ctx.tokenizer,
            params,
            self.settings,
            ctx.run_tests,
            ctx.step,
            ctx.policy_version,
        )


class ToolCallAgent(_AgentBase):
    """Native tool calls (``bash``, ``str_replace_editor``, ``submit``) rendered by the model's chat
    template, each conversation in a sandboxed session of its own (:mod:`gagar.policy.tool_calls`)."""

    samples_conversations = True
    needs_sandbox = True

    def context_tokens(self, max_prompt_tokens: int, max_answer_tokens: int) -> int:
        return max(max_prompt_tokens + max_answer_tokens, self.settings.max_tokens)

    def vocabulary(self) -> tuple[str, ...]:
        from gagar.policy.tool_calls import SYSTEM_PROMPT, TOOLS, hermes_system

        return (
            hermes_system(SYSTEM_PROMPT, TOOLS, self.settings.call_format),
            "<tool_call> </tool_call> <tool_response> </tool_response>",
        )

    def demonstrations(
        self, answers: Sequence[DemoAnswer], tokenizer: PreTrainedTokenizerBase, budget: DemoBudget
    ) -> tuple[list[Demonstration], Counter[str]]:
        from gagar.policy.tool_call_demos import tool_call_demos

        return tool_call_demos(answers, tokenizer, self.settings, budget.seed)

    def sample(self, tasks: Sequence[Task], params: SamplingParams, ctx: SampleContext) -> list[Trajectory]:
        from gagar.policy.tool_calls import ToolCallKit
        from gagar.sandbox.session import open_session

        if ctx.sandbox is None:
            raise ValueError("the tool-call agent runs its tools in sandboxed sessions: it needs a sandbox")
        sandbox, chars = ctx.sandbox, self.settings.max_tool_chars
        kit = ToolCallKit(ctx.tokenizer, self.settings, lambda task: open_session(sandbox, task, chars))
        jobs = conversation_jobs(tasks, ctx)
        return run_tool_loops(
            jobs, ctx.backend, ctx.tokenizer, params, self.settings, None, ctx.step, ctx.policy_version,
            kit=kit,
        )  # fmt: skip


_AGENTS: dict[AgentKind, type[SingleShotAgent] | type[ToolLoopAgent] | type[ToolCallAgent]] = {
    AgentKind.SINGLE: SingleShotAgent,
    AgentKind.TOOL_LOOP: ToolLoopAgent,
    AgentKind.TOOL_CALL: ToolCallAgent,
}


def agent_for(settings: AgentSettings | None = None) -> Agent:
    """The agent ``settings`` name (default: single-shot)."""
    chosen = settings or AgentSettings()
    return _AGENTS[chosen.kind](chosen)


def rollout(
    tasks: Sequence[Task],
    backend: GenerationBackend,
    tokenizer: PreTrainedTokenizerBase,
    group_size: int,
    params: SamplingParams,
    step: int = 0,
    gen_batch: int = 0,
    max_prompt_tokens: int = 1024,
    tasks_per_call: int | None = None,
    policy_version: str | None = None,
    progress: bool = True,
    agent: AgentSettings | None = None,
    run_tests: TestRunner | None = None,
    sandbox: object | None = None,
) -> Iterator[Trajectory]:
    """Yield ``group_size`` trajectories per task, task by task, from ``agent`` (default: single).

    ``run_tests`` answers the tool loop's RUN_TESTS (:class:`gagar.policy.visible_tests.VisibleTests`);
    the tool-call agent's sessions run in ``sandbox``;
    ``max_prompt_tokens`` bounds the single-turn prompt, ``agent.max_tokens`` a whole conversation.

    ``tasks_per_call`` tasks go to the backend together (None: the whole generation batch in one
    call, which the backend batches as it runs best: ``HFBackend`` in rows of its ``batch_size``, a
    server with all requests in flight); with ``params.seed`` set, call ``c`` is seeded ``seed + c``,
    so the same arguments give the same trajectories.

    Raises:
        ValueError: ``group_size`` below 1, or a task whose prompt cannot be built (no snapshot, too long).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    chosen = agent_for(agent)
    ctx = SampleContext(
        backend, tokenizer, group_size, step, gen_batch, policy_version, max_prompt_tokens, run_tests, sandbox
    )
    bar = tqdm(total=len(tasks) * group_size, desc="rollout", unit="traj", disable=not progress)
    per_call = tasks_per_call or max(len(tasks), 1)
    for call, start in enumerate(range(0, len(tasks), per_call)):
        call_params = (
            params if params.seed is None else params.model_copy(update={"seed": params.seed + call})
        )
        sampled = chosen.sample(tasks[start : start + per_call], call_params, ctx)
        if isinstance(backend, PrefixCachingBackend):
            backend.store.clear()  # the call's conversations are over: nothing will extend their prefixes
        for (
            trajectory
        ) in sampled:  # every trajectory records the run's sampling settings, not the call's seed
            yield (
                trajectory
                if trajectory.sampling == params
                else trajectory.model_copy(update={"sampling": params})
            )
        bar.update(len(sampled))
    bar.close()
