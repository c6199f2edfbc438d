"""Package renaming for SFT demonstrations: the renamed task is the same task under a fresh name."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.policy.agent_format import build_prompt
from gagar.policy.demos import demo_answers, package_of, random_package_name, rename_package
from gagar.policy.tokenizer import train_tokenizer
from gagar.sandbox.base import Prediction
from gagar.sandbox.local import LocalBackend
from gagar.tasks.generate import generate_tasks


@pytest.fixture(scope="module")
def generated():
    return generate_tasks(2, seed=11, split="train", workers=1)


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
    results = LocalBackend(workers=1).evaluate(
        [
            (renamed, Prediction(instance_id=renamed.instance_id, model_patch=renamed.patch)),
            (renamed, Prediction(instance_id=renamed.instance_id, model_patch="")),
        ]
    )
    assert [r.resolved for r in results] == [True, False]
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
