"""Mutation operators: valid, different, single-edit mutants, deterministic, only inside functions."""

from __future__ import annotations

import ast
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.tasks.mutate import OPERATORS, Mutation, find_mutations

EVERY_OPERATOR = textwrap.dedent(
    '''
    """Module docstring: 1 < 2 is not mutated."""

    LIMIT: int = 10


    def clamp(values: list[int], low: int = 0) -> list[int]:
        """Docstring with 3 + 4."""
        out = []
        for v in values[1:]:
            if v is None:
                continue
            if v < low and v != -1:
                out.append(low)
                v += 1
            elif v in (5, 6):
                pass
            out.append(max(v, low) * 2)
        return out


    def is_small(x):
        return x <= LIMIT


    def flag():
        return True
    '''
)


def _apply_all(source: str) -> list[tuple[Mutation, str]]:
    return [(m, m.apply(source)) for m in find_mutations(source)]


def test_every_operator_fires_on_a_function_that_offers_it() -> None:
    found = {m.operator for m in find_mutations(EVERY_OPERATOR)}
    assert found == set(OPERATORS)


def test_docstrings_annotations_and_module_level_code_are_left_alone() -> None:
    for m, _ in _apply_all(EVERY_OPERATOR):
        line = EVERY_OPERATOR.splitlines()[m.line - 1]
        assert "Docstring" not in line
        assert "LIMIT: int" not in line
        assert "def " not in EVERY_OPERATOR[m.start : m.end]


def test_mutants_change_behaviour_as_described() -> None:
    source = "def below(a, b):\n    return a < b\n"
    by_desc = {m.description: m.apply(source) for m in find_mutations(source)}
    assert set(by_desc) == {"'<' -> '<='", "return value negated"}
    namespace: dict = {}
    exec(by_desc["'<' -> '<='"], namespace)
    assert namespace["below"](2, 2) is True  # the original says False


def test_line_filter_keeps_only_executed_lines() -> None:
    lines = {11}
    picked = find_mutations(EVERY_OPERATOR, lines)
    assert picked
    assert all(m.line == 11 for m in picked)
    assert find_mutations(EVERY_OPERATOR, set()) == []


def test_columns_after_non_ascii_text_are_character_offsets() -> None:
    source = 'def f(s):\n    return len("héllo wörld") - len(s)\n'
    (arith,) = [m for m in find_mutations(source) if m.operator == "arith"]
    assert arith.apply(source) == 'def f(s):\n    return len("héllo wörld") + len(s)\n'


def test_formatting_outside_the_edit_is_kept() -> None:
    source = "def f(a,b):  # odd   spacing\n    x = (a  +  b)   # keep\n    return x\n"
    (plus,) = [m for m in find_mutations(source) if m.description == "'+' -> '-'"]
    assert plus.apply(source) == "def f(a,b):  # odd   spacing\n    x = (a  -  b)   # keep\n    return x\n"


def test_unparsable_source_gives_no_mutations() -> None:
    assert find_mutations("def f(:\n") == []


# -- properties over generated functions ---------------------------------------------------------------

_leaf = st.sampled_from(["a", "b", "c", "0", "1", "2", "True", "False", "None", "a[1:2]"])


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(children, st.sampled_from(["+", "-", "*", "//", "%", "/"]), children)
    compare = st.tuples(
        children, st.sampled_from(["<", "<=", ">", ">=", "==", "!=", "in", "is not"]), children
    )
    boolean = st.tuples(children, st.sampled_from(["and", "or"]), children)
    call = st.tuples(st.sampled_from(["g", "h"]), children, children)
    return st.one_of(
        st.builds(lambda t: f"({t[0]} {t[1]} {t[2]})", binary | compare | boolean),
        st.builds(lambda t: f"{t[0]}({t[1]}, {t[2]})", call),
        st.builds(lambda e: f"(not {e})", children),
    )


_expr = st.recursive(_leaf, _combine, max_leaves=4)
_stmt = st.one_of(
    st.builds(lambda e: f"x = {e}", _expr),
    st.builds(lambda c, e: f"if {c}:\n    return {e}", _expr, _expr),
    st.builds(lambda c, e, f: f"if {c}:\n    x = {e}\n    x += {f}\nelse:\n    x = 0", _expr, _expr, _expr),
)
_function = st.builds(
    lambda body, ret: (
        "def f(a, b, c):\n" + textwrap.indent("\n".join([*body, f"return {ret}"]), "    ") + "\n"
    ),
    st.lists(_stmt, min_size=1, max_size=4),
    _expr,
)


@settings(max_examples=40, deadline=None)
@given(_function)
def test_every_mutant_is_valid_python_and_differs(source: str) -> None:
    original = ast.dump(ast.parse(source))
    mutations = find_mutations(source)
    assert mutations, "every generated function returns a value, so return_value applies"
    for m, mutant in _apply_all(source):
        assert ast.dump(ast.parse(mutant)) != original, m


@settings(max_examples=40, deadline=None)
@given(_function)
def test_every_mutant_is_one_contiguous_edit_of_its_own_node(source: str) -> None:
    for m, mutant in _apply_all(source):
        assert m.operator in OPERATORS
        assert mutant[: m.start] == source[: m.start]
        assert mutant[len(mutant) - (len(source) - m.end) :] == source[m.end :]
        assert source.count("\n", 0, m.start) + 1 <= m.line <= source.count("\n", 0, m.end) + 1


@settings(max_examples=30, deadline=None)
@given(_function)
def test_mutations_are_deterministic_and_sorted(source: str) -> None:
    first, second = find_mutations(source), find_mutations(source)
    assert first == second
    assert [(m.start, m.end) for m in first] == sorted((m.start, m.end) for m in first)
