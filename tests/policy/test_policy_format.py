"""The single-turn agent format: prompts, minimal demonstration answers, strict parsing."""

from __future__ import annotations

from gagar.policy.agent_format import (
    answer_from_patch,
    build_prompt,
    mentioned_names,
    minimal_edits,
    parse_answer,
    relevant_files,
)
from gagar.policy.tokenizer import train_tokenizer
from gagar.sandbox.edits import apply_edit_blocks, parse_edit_blocks
from gagar.tasks.diffs import apply_diff


def test_mentioned_names_reads_backticks_and_calls() -> None:
    assert mentioned_names("`pkg.mod.area` breaks; area(2) and `x` fail") == ["area", "x"]


def test_relevant_file_is_the_defining_module(tasks) -> None:
    assert relevant_files(tasks[0]) == ["calc/ops.py"]


def test_minimal_search_is_the_changed_line_when_unique() -> None:
    old = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    new = old.replace("return 2", "return 3")
    assert minimal_edits(old, new) == [("    return 2\n", "    return 3\n")]


def test_minimal_search_grows_until_unique() -> None:
    old = "def f():\n    return 1\n\n\ndef g():\n    return 1\n"
    new = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    [(search, replace)] = minimal_edits(old, new)
    assert search == "def g():\n    return 1\n"
    assert replace == "def g():\n    return 2\n"


def test_gold_answer_reproduces_the_gold_patch(tasks) -> None:
    for task in tasks:
        answer = answer_from_patch(task.snapshot, task.patch)
        fixed = apply_edit_blocks(task.snapshot, parse_edit_blocks(answer))
        assert fixed == apply_diff(task.snapshot, task.patch)
        patch, error = parse_answer(answer, task.snapshot)
        assert error is None
        assert apply_diff(task.snapshot, patch) == fixed


def test_parse_answer_says_why(tasks) -> None:
    files = tasks[0].snapshot
    assert parse_answer("", files) == ("", "no edit blocks found")
    _, error = parse_answer("calc/ops.py\n<<<<<<< SEARCH\n    return a - b\n", files)
    assert "divider" in error
    _, error = parse_answer("calc/ops.py\n<<<<<<< SEARCH\nnope\n=======\nx\n>>>>>>> REPLACE\n", files)
    assert "not found" in error
    same = "calc/ops.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a - b\n>>>>>>> REPLACE\n"
    assert parse_answer(same, files) == ("", "the edit blocks change nothing")


def test_prompt_shows_the_named_function_and_fits(tasks) -> None:
    task = tasks[1]
    tokenizer = train_tokenizer(list(task.snapshot.values()), vocab_size=400)
    messages, ids = build_prompt(task, tokenizer, max_prompt_tokens=1024)
    text = messages[0].content
    assert "def scale(values, factor):" in text
    assert "def clamp" not in text
    assert "calc/ops.py (lines 9-11)" in text
    assert text.endswith("\nEdit: calc/ops.py")
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    whole, whole_ids = build_prompt(task, tokenizer, max_prompt_tokens=1024, scope="file")
    assert "def clamp" in whole[0].content
    _, cut = build_prompt(task, tokenizer, max_prompt_tokens=len(whole_ids) - 20, scope="file")
    assert len(cut) <= len(whole_ids) - 20


def test_a_wrong_package_directory_is_resolved_by_file_name_and_search_text():
    from gagar.policy.agent_format import resolve_paths
    from gagar.sandbox.edits import EditBlock

    files = {
        "shop/pricing.py": "def total(a, b):\n    return a - b\n",
        "stock/pricing.py": "def count(a):\n    return a\n",
        "tests/test_pricing.py": "from shop.pricing import total\n",
    }
    blocks = [
        EditBlock("wrongpkg/pricing.py", "    return a - b\n", "    return a + b\n"),  # one match: resolved
        EditBlock("wrongpkg/pricing.py", "    return", "    yield"),  # in both files: left alone
        EditBlock("wrongpkg/pricing.py", "not anywhere\n", "x\n"),  # in neither: left alone
        EditBlock("notes/new.md", "", "created\n"),  # a new file: left alone
    ]
    assert [b.path for b in resolve_paths(blocks, files)] == [
        "shop/pricing.py",
        "wrongpkg/pricing.py",
        "wrongpkg/pricing.py",
        "notes/new.md",
    ]
    answer = (
        "wrongpkg/pricing.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n"
    )
    patch, error = parse_answer(answer, files)
    assert error is None
    assert "+++ b/shop/pricing.py" in patch
