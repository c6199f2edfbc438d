"""The patch-quality oracle and the noise catalogue on a small hand-written repository."""

from __future__ import annotations

import ast

import pytest

from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, make_diff
from gagar.tasks.noise import NOISE_KINDS, NoiseKind, NoiseNotApplicable, add_noise
from gagar.tasks.oracle import changed_scopes, score_patch
from gagar.tasks.scopes import line_scopes

PRICING = '''"""Prices."""

RATE = 0.2


def discount(price, rate):
    """Price after discount."""
    return round(price * (1 + rate), 2)


def total(prices):
    """Sum of prices."""
    running = 0.0
    for price in prices:
        running += price
    return running


class Cart:
    def size(self, items):
        count = len(items)
        return count
'''
SNAPSHOT = {
    "shop/__init__.py": '"""shop."""\n\n__version__ = "0.1.0"\n',
    "shop/pricing.py": PRICING,
    "tests/test_pricing.py": "from shop.pricing import discount\n\n\ndef test_discount():\n"
    "    assert discount(100, 0.2) == 80.0\n",
}
FIXED = {**SNAPSHOT, "shop/pricing.py": PRICING.replace("(1 + rate)", "(1 - rate)")}


def _task() -> Task:
    patch = make_diff(SNAPSHOT, FIXED)
    return Task(instance_id="shop-1", repo="synth/shop", snapshot=SNAPSHOT, problem_statement="p",
                patch=patch, FAIL_TO_PASS=["tests/test_pricing.py::test_discount"])  # fmt: skip


def _edit(old: str, new: str, path: str = "shop/pricing.py", base: dict | None = None) -> str:
    base = base or FIXED
    return make_diff(SNAPSHOT, {**base, path: base[path].replace(old, new)})


def test_line_scopes_name_functions_methods_and_module_statements():
    scopes = line_scopes("m.py", PRICING)
    assert scopes[PRICING.splitlines().index("RATE = 0.2")] == "m.py:<module>:RATE"
    assert scopes[PRICING.splitlines().index("    return round(price * (1 + rate), 2)")] == "m.py:discount"
    assert scopes[PRICING.splitlines().index("        count = len(items)")] == "m.py:Cart.size"
    assert line_scopes("README.md", "a\nb\n") == ["README.md:<file>"] * 2


def test_gold_patch_is_clean_and_best():
    task = _task()
    quality = score_patch(task, task.patch)
    assert quality.clean
    assert quality.quality == 1.0
    assert (quality.diff_size, quality.gold_size, quality.lines_outside_gold) == (2, 2, 0)
    assert changed_scopes(SNAPSHOT, task.patch) == [("shop/pricing.py", "shop/pricing.py:discount")] * 2


def test_a_slightly_longer_fix_in_the_same_function_is_clean():
    patch = _edit(
        '    """Price after discount."""\n', '    """Price after discount."""\n    rate = float(rate)\n'
    )
    quality = score_patch(_task(), patch)
    assert quality.clean
    assert quality.diff_size == 3
    assert quality.quality < 1.0


def test_changes_outside_gold_are_counted_and_named():
    other_function = _edit("running += price", "running = running + price")
    quality = score_patch(_task(), other_function)
    assert not quality.clean
    assert quality.lines_outside_gold == 2
    assert quality.outside_scopes == ["shop/pricing.py:total"]
    other_file = make_diff(SNAPSHOT, {**FIXED, "shop/__init__.py": SNAPSHOT["shop/__init__.py"] + "X = 1\n"})
    quality = score_patch(_task(), other_file)
    assert not quality.clean
    assert quality.files_beyond_gold == 1
    assert quality.files_touched == 2
    module_constant = _edit("RATE = 0.2", "RATE = 0.25")
    assert score_patch(_task(), module_constant).outside_scopes == ["shop/pricing.py:<module>:RATE"]


def test_empty_patch_is_not_clean_and_ranks_below_gold():
    quality = score_patch(_task(), "")
    assert not quality.clean
    assert quality.diff_size == 0
    assert quality.quality < 1.0


def test_task_without_snapshot_needs_files():
    task = _task().model_copy(update={"snapshot": None, "base_commit": "0" * 40})
    with pytest.raises(ValueError, match="no bundled snapshot"):
        score_patch(task, task.patch)
    assert score_patch(task, task.patch, snapshot=SNAPSHOT).clean


@pytest.mark.parametrize("kind", list(NoiseKind))
def test_each_noise_kind_is_deterministic_keeps_the_fix_and_is_not_clean(kind: NoiseKind):
    task = _task()
    noisy = add_noise(task, task.patch, kinds=[kind], rng=7)
    assert noisy == add_noise(task, task.patch, kinds=[kind], rng=7)
    patched = apply_diff(SNAPSHOT, noisy)
    assert "(1 - rate)" in patched["shop/pricing.py"]
    assert patched["tests/test_pricing.py"] == SNAPSHOT["tests/test_pricing.py"]
    for path, text in patched.items():
        if path.endswith(".py"):
            ast.parse(text)
    quality = score_patch(task, noisy)
    assert quality.quality < score_patch(task, task.patch).quality
    if kind in (
        NoiseKind.DUPLICATED_LOGIC,
        NoiseKind.WIDENED_FIX,
    ):  # inside the fix, within the size tolerance
        assert quality.axes.implementation_precision > 0
    else:
        assert not quality.clean


def test_axes_name_where_a_candidate_loses():
    task = _task()
    gold = score_patch(task, task.patch).axes
    assert (gold.solution_fit, gold.implementation_precision, gold.minimal_change) == (1.0, 0, 0)
    assert (gold.out_of_scope, gold.code_style) == (0, 0)
    printed = score_patch(task, add_noise(task, task.patch, kinds=["debug_print"], rng=0))
    assert printed.axes.code_style == 1
    assert printed.axes.implementation_precision == 1  # the print, in the fixed function
    assert printed.axes.out_of_scope == 2  # "import sys" and a blank line at module level
    imported = score_patch(task, add_noise(task, task.patch, kinds=["unused_import"], rng=0))
    assert any("unused import" in f for f in imported.style)
    kept = score_patch(task, add_noise(task, task.patch, kinds=["commented_out"], rng=0))
    assert kept.style == ["shop/pricing.py:8: commented-out code"]
    elsewhere = score_patch(task, _edit("running += price", "running = running + price", base=SNAPSHOT))
    assert elsewhere.axes.out_of_scope == 2
    assert elsewhere.axes.solution_fit == 0.0
    assert elsewhere.quality < score_patch(task, task.patch).quality


def test_a_flagged_patch_ranks_below_every_honest_one():
    task = _task()
    hack = _edit(
        '"""Price after discount."""', '"""Price after discount."""\n    import sys; sys._getframe(1)'
    )
    flagged = score_patch(task, hack)
    assert [f.kind for f in flagged.hack_flags] == ["introspection"]
    assert not flagged.clean
    assert flagged.quality < score_patch(task, add_noise(task, task.patch, rng=1)).quality


def test_all_kinds_together_rank_below_one_kind():
    task = _task()
    one = score_patch(task, add_noise(task, task.patch, kinds=[NoiseKind.COMMENT], rng=1))
    everything = score_patch(task, add_noise(task, task.patch, rng=1))
    assert everything.quality < one.quality < 1.0
    assert everything.diff_size > one.diff_size


def test_rename_changes_only_names_and_debug_print_uses_stderr():
    task = _task()
    renamed = apply_diff(SNAPSHOT, add_noise(task, task.patch, kinds=["rename_local"], rng=0))
    assert renamed["shop/pricing.py"] != FIXED["shop/pricing.py"]
    printed = apply_diff(SNAPSHOT, add_noise(task, task.patch, kinds=["debug_print"], rng=0))[
        "shop/pricing.py"
    ]
    assert "file=sys.stderr)" in printed
    assert "\nimport sys\n" in printed


def test_inapplicable_kind_is_refused_only_when_requested():
    lonely = {"m.py": "def f(x):\n    return x + 1\n"}
    fixed = {"m.py": "def f(x):\n    return x - 1\n"}
    task = Task(instance_id="m-1", repo="synth/m", snapshot=lonely, problem_statement="p",
                patch=make_diff(lonely, fixed), FAIL_TO_PASS=["t::x"])  # fmt: skip
    with pytest.raises(NoiseNotApplicable, match="comment: no function outside the fix"):
        add_noise(task, task.patch, kinds=["comment"])
    assert "DEBUG f:" in add_noise(task, task.patch)
    with pytest.raises(ValueError, match="not_a_kind"):
        add_noise(task, task.patch, kinds=["not_a_kind"])
    assert set(NOISE_KINDS) == set(NoiseKind)


def test_rename_skips_locals_used_inside_f_strings():
    source = 'def f(x):\n    return x + 1\n\n\ndef g(n):\n    label = n * 2\n    return f"{label}"\n'
    fixed = {"m.py": source.replace("x + 1", "x - 1")}
    task = Task(instance_id="m-1", repo="synth/m", snapshot={"m.py": source}, problem_statement="p",
                patch=make_diff({"m.py": source}, fixed), FAIL_TO_PASS=["t::x"])  # fmt: skip
    with pytest.raises(NoiseNotApplicable, match="rename_local"):
        add_noise(task, task.patch, kinds=["rename_local"])
