"""Augmented SFT demonstrations: a renamed task is the same task under fresh names."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.policy.agent_format import build_prompt
from gagar.policy.augment import (
    package_of,
    random_identifier,
    random_package_name,
    rename_locals,
    rename_package,
)
from gagar.policy.demos import demo_answers
from gagar.policy.tokenizer import train_tokenizer
from gagar.sandbox.base import Prediction
from gagar.sandbox.local import LocalBackend
from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, make_diff
from gagar.tasks.generate import generate_tasks
from gagar.tasks.oracle import touched_function
from gagar.tasks.scopes import function_named


@pytest.fixture(scope="module")
def generated():
    return generate_tasks(2, seed=11, split="train", workers=1)


def _gold_and_empty_resolve(task: Task) -> list[bool]:
    results = LocalBackend(workers=1).evaluate(
        [
            (task, Prediction(instance_id=task.instance_id, model_patch=task.patch)),
            (task, Prediction(instance_id=task.instance_id, model_patch="")),
        ]
    )
    return [r.resolved for r in results]


def test_renamed_task_is_fixed_by_its_gold_patch_and_names_only_the_new_package(generated) -> None:
    task = generated[0]
    old = package_of(task)
    renamed = rename_package(task, "zorblekit")
    assert old is not None
    assert package_of(renamed) == "zorblekit"
    everything = "".join(
        [*renamed.snapshot, *renamed.snapshot.values(), renamed.patch, renamed.problem_statement]
    )
    assert old not in everything
    assert _gold_and_empty_resolve(renamed) == [True, False]
    tokenizer = train_tokenizer(list(renamed.snapshot.values()), 400)
    messages, _ = build_prompt(renamed, tokenizer)
    assert messages[0].content.splitlines()[-1].startswith("Edit: zorblekit/")


def test_rename_refuses_bad_names(generated) -> None:
    task = generated[0]
    with pytest.raises(ValueError, match="not a valid package name"):
        rename_package(task, "class")
    with pytest.raises(ValueError, match="already occurs"):
        rename_package(task, "pytest")


def test_rename_share_follows_the_setting(generated) -> None:
    answers, counts = demo_answers(generated * 20, noise_share=0.0, seed=0, rename_share=0.5)
    assert 10 <= counts["renamed"] <= 30
    assert {package_of(a.task) for a in answers} > {package_of(generated[0])}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_package_names_are_identifiers(seed: int) -> None:
    name = random_package_name(random.Random(seed))
    assert name.isidentifier()
    assert name.islower()
    assert 4 <= len(name) <= 13


def _parameters(task: Task) -> list[str]:
    path, qualname = touched_function(task.snapshot, task.patch)
    span = function_named(task.snapshot[path], qualname)
    assert span is not None
    return [a.arg for a in span.node.args.args]


@pytest.mark.parametrize("index", [0, 1])
def test_renamed_locals_task_is_fixed_by_its_gold_patch(generated, index: int) -> None:
    task = generated[index]
    renamed = rename_locals(task, random.Random(index))
    assert renamed.snapshot != task.snapshot
    assert _parameters(renamed) != _parameters(task) or renamed.patch != task.patch
    assert len(renamed.patch.splitlines()) == len(task.patch.splitlines())
    assert {p for p, t in renamed.snapshot.items() if t != task.snapshot[p]} == {
        touched_function(task.snapshot, task.patch)[0]
    }
    assert _gold_and_empty_resolve(renamed) == [True, False]


def test_rename_locals_keeps_names_the_tests_or_the_statement_use(generated) -> None:
    task = generated[0]
    params = _parameters(task)
    assert params
    test_path = next(p for p in task.snapshot if "test" in p)
    pinned = task.model_copy(
        update={"snapshot": {**task.snapshot, test_path: task.snapshot[test_path] + f"\n# {params[0]}\n"}}
    )
    assert _parameters(rename_locals(pinned, random.Random(0)))[0] == params[0]
    in_statement = task.model_copy(update={"problem_statement": f"{task.problem_statement} ({params[0]})"})
    assert _parameters(rename_locals(in_statement, random.Random(0)))[0] == params[0]


def test_rename_locals_refuses_a_fix_outside_functions(generated) -> None:
    task = generated[0]
    readme_only = make_diff(
        task.snapshot, {**task.snapshot, "README.md": task.snapshot["README.md"] + "More.\n"}
    )
    moved = task.model_copy(update={"patch": readme_only})
    with pytest.raises(ValueError, match="touches no function"):
        rename_locals(moved, random.Random(0))


def test_locals_share_follows_the_setting(generated) -> None:
    answers, counts = demo_answers(generated * 20, noise_share=0.0, seed=0, locals_share=0.5)
    assert 10 <= counts["locals_renamed"] <= 30
    assert counts["locals_renamed"] + counts["locals_failed"] <= 40
    for answer in answers:
        assert apply_diff(answer.task.snapshot, answer.task.patch)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_identifiers_are_fresh_looking_snake_case(seed: int) -> None:
    name = random_identifier(random.Random(seed))
    assert name.isidentifier()
    assert name == name.lower()
    assert all(2 <= len(word) // 2 <= 3 for word in name.split("_"))
