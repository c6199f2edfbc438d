"""SFT demonstrations: a task's prompt and a SEARCH/REPLACE answer built from its gold patch.

A configurable share of demonstrations carries a test-neutral unnecessary modification, so the
pre-RL checkpoint sometimes writes clean fixes and sometimes drags in edits the oracle calls not
clean: the behaviour GAGAR's credit redistribution then acts on. A noise kind is either one of the
catalogue of :mod:`gagar.tasks.noise` or ``split_signature`` (:func:`split_signature`). The tiny
policy's prompt shows only the function to fix, so the default kinds are the ones it can reproduce
from that view: the catalogue's kinds that land inside the fixed function, and the split signature.

A ``wrong_share`` of demonstrations answers with a wrong fix instead (:func:`wrong_fix`): an edit of the
function to fix that quotes the file, applies and leaves the bug, so a start can write answers that
parse and fail, as a pre-RL policy does.

Shares of demonstrations are augmented with fresh names the model cannot have seen
(:mod:`gagar.policy.augment`): ``rename_share`` moves the task to a randomly named package,
``locals_share`` renames the parameters and locals of the function the fix touches. Both make copying
from the prompt the only way to predict the path and the SEARCH text.
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from gagar import pyast
from gagar.policy.agent_format import answer_from_patch, build_prompt
from gagar.policy.augment import package_of, random_package_name, rename_locals, rename_package
from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, changed_lines, make_diff
from gagar.tasks.mutate import find_mutations
from gagar.tasks.oracle import touched_function
from gagar.tasks.scopes import function_named

__all__ = [
    "DEFAULT_NOISE_KINDS",
    "SPLIT_SIGNATURE",
    "DemoAnswer",
    "Demonstration",
    "demo_answers",
    "noisy_patch",
    "split_signature",
    "tokenize_demos",
    "wrong_fix",
]

SPLIT_SIGNATURE = "split_signature"
DEFAULT_NOISE_KINDS = (SPLIT_SIGNATURE, "commented_out", "duplicated_logic", "widened_fix")
"""The prompt shows only the function the statement names, so the default noise edits that function
in ways predictable from the view: its signature split one parameter a line, and the catalogue's
in-function kinds (a statement kept commented out, a computation done twice, a ``None`` guard nobody
asked for). The catalogue's other kinds edit code the prompt does not show (other functions, imports,
other files), which a policy cannot reproduce from its view."""

_DEF_LINE = re.compile(r"(\s*)(async def|def) (\w+)\((.+)\)(\s*->\s*[^:]+)?:\n")


def split_signature(snapshot: Mapping[str, str], patch: str) -> str:
    """``patch`` plus the fixed function's signature split one parameter a line (the AST is unchanged).

    All added lines fall inside the function the fix touches, and a one-parameter signature alone
    adds four changed lines, so the result exceeds the oracle's size tolerance: not clean.

    Raises:
        ValueError: the fix touches no function, or its signature is not on one splittable line.
    """
    fixed = apply_diff(snapshot, patch)
    path, qualname = touched_function(snapshot, patch)
    text = fixed[path]
    span = function_named(text, qualname)
    if span is None:
        raise ValueError(f"{path}:{qualname} is not a function")
    lines = text.splitlines(keepends=True)
    match = _DEF_LINE.fullmatch(lines[span.node.lineno - 1])
    if match is None or any(c in match.group(4) for c in "([{*"):
        raise ValueError(f"{path}:{qualname}: the signature is not one line of plain parameters")
    indent, keyword, name, params, returns = match.groups()
    exploded = [f"{indent}{keyword} {name}(\n"]
    exploded += [f"{indent}    {p.strip()},\n" for p in params.split(",") if p.strip()]
    exploded.append(f"{indent}){returns or ''}:\n")
    lines[span.node.lineno - 1 : span.node.lineno] = exploded
    new_text = "".join(lines)
    if ast.dump(pyast.parse(new_text)) != ast.dump(pyast.parse(text)):
        raise ValueError(f"{path}:{qualname}: splitting the signature changes the code")
    return make_diff(snapshot, {**fixed, path: new_text})


def noisy_patch(task: Task, kind: str, rng: random.Random) -> str:
    """The gold patch plus one unnecessary modification of ``kind`` (``split_signature`` or a catalogue kind).

    Raises:
        ValueError: the kind has nothing to act on in this task, or is unknown.
    """
    if task.snapshot is None:
        raise ValueError(f"{task.instance_id}: no bundled snapshot")
    if kind == SPLIT_SIGNATURE:
        return split_signature(task.snapshot, task.patch)
    from gagar.tasks.noise import add_noise  # the catalogue is only needed for its kinds

    return add_noise(task, task.patch, [kind], rng)


def wrong_fix(task: Task, rng: random.Random) -> str:
    """A patch that edits the function the gold patch fixes and leaves the bug: one AST mutation
    (:func:`gagar.tasks.mutate.find_mutations`) of the unfixed function, on a line the gold patch
    changes where one exists, never the gold fix itself. It quotes the file and applies; whether it
    fails the tests is not checked here (an equivalent mutant may pass).

    Raises:
        ValueError: no bundled snapshot, the fix touches no function, or nothing in it can be mutated.
    """
    if task.snapshot is None:
        raise ValueError(f"{task.instance_id}: no bundled snapshot")
    path, qualname = touched_function(task.snapshot, task.patch)
    text = task.snapshot[path]
    span = function_named(text, qualname)
    if span is None:
        raise ValueError(f"{path}:{qualname} is not a function")
    fixed = apply_diff(task.snapshot, task.patch)[path]
    in_function = set(range(span.node.lineno, (span.node.end_lineno or span.node.lineno) + 1))
    mutants = [m for m in find_mutations(text, in_function) if m.apply(text) != fixed]
    if not mutants:
        raise ValueError(f"{path}:{qualname}: nothing to mutate")
    fixed_lines = set(changed_lines(text, fixed)[0])
    on_the_bug = [m for m in mutants if m.line in fixed_lines]
    mutant = rng.choice(on_the_bug or mutants)
    return make_diff(task.snapshot, {**task.snapshot, path: mutant.apply(text)})


@dataclass(frozen=True)
class DemoAnswer:
    """The answer text a demonstration teaches for one task."""

    task: Task
    answer: str
    noisy: bool
    wrong: bool = False
    """The answer is a wrong fix (:func:`wrong_fix`)."""


@dataclass(frozen=True)
class Demonstration:
    """A tokenized demonstration: the loss falls on ``answer_ids`` only."""

    instance_id: str
    prompt_ids: list[int]
    answer_ids: list[int]
    """Answer tokens followed by the EOS token."""
    noisy: bool
    answer_mask: list[bool] | None = None
    """Which answer tokens carry the loss (a multi-turn answer masks the tool results); None: all."""


def demo_answers(
    tasks: Sequence[Task],
    noise_share: float,
    seed: int,
    noise_kinds: Sequence[str] = DEFAULT_NOISE_KINDS,
    rename_share: float = 0.0,
    locals_share: float = 0.0,
    wrong_share: float = 0.0,
) -> tuple[list[DemoAnswer], Counter[str]]:
    """One answer per task: the gold patch, or with probability ``noise_share`` the gold patch plus one
    unnecessary modification of a kind drawn uniformly from ``noise_kinds``; with probability
    ``wrong_share``, drawn first, a wrong fix instead (:func:`wrong_fix`). With probability
    ``rename_share`` the task is first moved to a randomly named package (:func:`rename_package`), and
    with probability ``locals_share`` its fixed function's locals get random names (:func:`rename_locals`).

    Returns the answers and a count of what happened (``clean``, ``noisy``, ``wrong``, ``renamed``,
    ``locals_renamed``; ``wrong_failed``: nothing to mutate, the task is answered as without it;
    ``noise_failed``: the catalogue found nothing to add, the clean answer is used; ``skipped``: no
    answer could be built).
    """
    for name, share in (
        ("noise_share", noise_share),
        ("rename_share", rename_share),
        ("locals_share", locals_share),
        ("wrong_share", wrong_share),
    ):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {share}")
    if noise_share > 0 and not noise_kinds:
        raise ValueError("noise_share > 0 needs at least one noise kind")
    rng = random.Random(seed)
    out: list[DemoAnswer] = []
    counts: Counter[str] = Counter()
    for task in tasks:
        if task.snapshot is None:
            counts["skipped"] += 1
            continue
        if rng.random() < rename_share and package_of(task) is not None:
            task = rename_package(task, random_package_name(rng))
            counts["renamed"] += 1
        if locals_share and rng.random() < locals_share:  # no draw when off: earlier streams stay the same
            try:
                task = rename_locals(task, rng)
                counts["locals_renamed"] += 1
            except ValueError:
                counts["locals_failed"] += 1
        patch, noisy, wrong = task.patch, False, False
        if wrong_share and rng.random() < wrong_share:  # no draw when off: earlier streams stay the same
            try:
                patch, wrong = wrong_fix(task, rng), True
            except ValueError:
                counts["wrong_failed"] += 1
        if not wrong and rng.random() < noise_share:
            try:
                patch, noisy = noisy_patch(task, rng.choice(noise_kinds), rng), True
            except ValueError:
                counts["noise_failed"] += 1
        try:
            answer = answer_from_patch(task.snapshot, patch)
        except ValueError:
            counts["skipped"] += 1
            continue
        counts["wrong" if wrong else "noisy" if noisy else "clean"] += 1
        out.append(DemoAnswer(task, answer, noisy, wrong))
    return out, counts


def tokenize_demos(
    answers: Sequence[DemoAnswer],
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_tokens: int,
    max_answer_tokens: int,
) -> tuple[list[Demonstration], int]:
    """Tokenized demonstrations, and how many were dropped for not fitting the token budgets."""
    demos: list[Demonstration] = []
    dropped = 0
    for item in answers:
        try:
            _, prompt_ids = build_prompt(item.task, tokenizer, max_prompt_tokens)
        except ValueError:
            dropped += 1
            continue
        answer_ids = [*tokenizer.encode(item.answer, add_special_tokens=False), tokenizer.eos_token_id]
        if len(answer_ids) > max_answer_tokens:
            dropped += 1
            continue
        demos.append(Demonstration(item.task.instance_id, prompt_ids, answer_ids, item.noisy))
    return demos, dropped
