"""Multi-turn SFT demonstrations: the tool loop replayed on a script built from a gold or unclean patch.

Each demonstration is a conversation of the tool-loop agent (:mod:`gagar.policy.tool_loop`)::

    VIEW <the file the patch changes>
    SEARCH <a line the fix replaces>          (half of the demonstrations)
    EDIT <blocks>                            the final patch, or first the patch plus an unnecessary
    RUN_TESTS                                modification, tested, then an EDIT taking it out again
    (EDIT <the correction>, RUN_TESTS)       (``correction_share`` of the clean ones)
    SUBMIT

The script is replayed through the real tool loop, so the VIEW and SEARCH answers are the workspace's
own and the tokens, chat template and loss mask are exactly a rollout's. RUN_TESTS is answered with
the report of a run in which the repository's own tests (PASS_TO_PASS) all pass, without running it:
the gold patch passes them by construction of a task, and the unnecessary modifications of
:mod:`gagar.tasks.noise` are test-neutral. The final patch is the gold one or, for the demonstrations
:func:`gagar.policy.demos.demo_answers` made noisy, the gold one with an unnecessary modification.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from gagar.policy.agent import AgentSettings
from gagar.policy.agent_format import answer_from_patch, answer_from_snapshots
from gagar.policy.demos import DemoAnswer, Demonstration, noisy_patch
from gagar.policy.generation import Sample
from gagar.policy.tool_loop import check_append_only, run_tool_loops
from gagar.policy.visible_tests import run_report
from gagar.sandbox.edits import apply_edit_blocks, parse_edit_blocks
from gagar.schema.result import Outcome, Status, TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import SamplingParams, Trajectory
from gagar.tasks.diffs import make_diff

__all__ = ["ReplayBackend", "demo_script", "passing_report", "tool_loop_demos"]


def passing_report(task: Task, max_chars: int) -> str:
    """What RUN_TESTS answers when every visible test of ``task`` passes."""
    tests = dict.fromkeys(task.PASS_TO_PASS, Outcome.PASSED)
    result = TestResult(trajectory_id="demo", instance_id=task.instance_id, status=Status.PASSED, tests=tests)
    return run_report(result, max_chars)


def _first_replaced_line(snapshot: dict[str, str], after: dict[str, str]) -> str | None:
    for path in sorted(after):
        old, new = snapshot.get(path, "").splitlines(), set(after[path].splitlines())
        for line in old:
            if line.strip() and line not in new and len(line.strip()) >= 4:
                return line.strip()
    return None


def demo_script(
    demo: DemoAnswer, rng: random.Random, correction_share: float, noise_kinds: Sequence[str]
) -> list[str]:
    """The assistant turns of one demonstration (module docstring).

    Raises:
        ValueError: the answer's blocks do not apply to the task's snapshot.
    """
    snapshot = demo.task.snapshot or {}
    final = apply_edit_blocks(dict(snapshot), parse_edit_blocks(demo.answer))
    changed = sorted(p for p in final if snapshot.get(p) != final[p])
    if not changed:
        raise ValueError(f"{demo.task.instance_id}: the answer changes nothing")
    script = [f"VIEW {changed[0]}"]
    replaced = _first_replaced_line(snapshot, final)
    if replaced is not None and rng.random() < 0.5:
        script.append(f"SEARCH {replaced}")
    if not demo.noisy and noise_kinds and rng.random() < correction_share:
        try:
            unclean = noisy_patch(demo.task, rng.choice(noise_kinds), rng)
            first = apply_edit_blocks(dict(snapshot), parse_edit_blocks(answer_from_patch(snapshot, unclean)))
            correction = answer_from_snapshots(first, final)
            opening = answer_from_snapshots(snapshot, first)
        except ValueError:
            pass
        else:
            if correction.strip():
                return [
                    *script,
                    f"EDIT\n{opening}",
                    "RUN_TESTS",
                    f"EDIT\n{correction}",
                    "RUN_TESTS",
                    "SUBMIT",
                ]
    return [*script, f"EDIT\n{demo.answer}", "RUN_TESTS", "SUBMIT"]


def replay_refusal(replayed: Trajectory, demo: DemoAnswer) -> str | None:
    """Why a replayed demonstration is not taught, as its count (``dropped_too_long``: it did not end
    on submit within the budgets; ``skipped``: the replayed edits did not reproduce the answer), or
    None when it is."""
    if replayed.finish_reason != "submit":
        return "dropped_too_long"
    snapshot = demo.task.snapshot or {}
    answer = make_diff(snapshot, apply_edit_blocks(dict(snapshot), parse_edit_blocks(demo.answer)))
    return None if replayed.model_patch == answer else "skipped"


class ReplayBackend:
    """A generation backend replying with one script's turns, in order (log-probs 0: not sampled)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, script: list[str]) -> None:
        self.tokenizer, self.script = tokenizer, list(script)
        self.stop_token_ids = (tokenizer.eos_token_id,)

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        ids = [
            *self.tokenizer.encode(self.script.pop(0), add_special_tokens=False),
            self.tokenizer.eos_token_id,
        ]
        return [[Sample(ids, [0.0] * len(ids), "stop")]]


def tool_loop_demos(
    answers: Sequence[DemoAnswer],
    tokenizer: PreTrainedTokenizerBase,
    agent: AgentSettings,
    correction_share: float,
    noise_kinds: Sequence[str],
    seed: int,
) -> tuple[list[Demonstration], Counter[str]]:
    """One multi-turn demonstration per answer: the loss on the assistant turns only.

    Returns the demonstrations and counts: ``corrected`` (an edit taken out again), ``dropped_too_long``
    (the conversation did not end on SUBMIT within ``agent``'s budgets), ``skipped`` (no script).
    """
    if not 0.0 <= correction_share <= 1.0:
        raise ValueError(f"correction_share must be in [0, 1], got {correction_share}")
    rng = random.Random(seed)
    demos: list[Demonstration] = []
    counts: Counter[str] = Counter()
    budget = agent.model_copy(update={"max_seconds": None})
    if answers:
        check_append_only(tokenizer, answers[0].task)  # a template that cannot work fails here, loudly
    for demo in answers:
        try:
            script = demo_script(demo, rng, correction_share, noise_kinds)
        except ValueError:
            counts["skipped"] += 1
            continue
        loop = budget.model_copy(update={"max_turns": len(script)})
        job = (demo.task, demo.task.instance_id, demo.task.instance_id)
        try:
            [t] = run_tool_loops(
                [job], ReplayBackend(tokenizer, script), tokenizer,
                SamplingParams(max_new_tokens=agent.max_tokens),
                loop, lambda jobs: [passing_report(task, agent.max_tool_chars) for task, _ in jobs],
            )  # fmt: skip
        except ValueError:
            counts["dropped_too_long"] += 1  # the first prompt alone exceeds the budget
            continue
        if (refused := replay_refusal(t, demo)) is not None:
            counts[refused] += 1
            continue
        counts["corrected"] += script.count("RUN_TESTS") > 1
        demos.append(
            Demonstration(
                demo.task.instance_id,
                t.prompt_token_ids,
                t.response_token_ids,
                demo.noisy,
                answer_mask=[bool(m) for m in t.loss_mask],
            )
        )
    return demos, counts
