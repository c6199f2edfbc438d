"""The catalogue the task generator draws from: domains of small, correct functions.

Each :class:`FunctionTemplate` is a correct function (``string.Template`` source with
``$name`` and constant placeholders), the example calls its tests make, and the
one-line mutations that inject a bug. Expected values are never written here: the
generator computes them by running the correct function, so constants can vary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["DOMAINS", "BugKind", "Case", "Domain", "FunctionTemplate", "Mutation"]


class BugKind(StrEnum):
    """The kinds of injected bug."""

    WRONG_OPERATOR = "wrong_operator"
    OFF_BY_ONE = "off_by_one"
    WRONG_CONSTANT = "wrong_constant"
    WRONG_COMPARISON = "wrong_comparison"
    SWAPPED_ARGUMENTS = "swapped_arguments"
    MISSED_EDGE_CASE = "missed_edge_case"
    WRONG_CALL = "wrong_call"
    WRONG_VARIABLE = "wrong_variable"
    WRONG_BOOLEAN = "wrong_boolean"


@dataclass(frozen=True)
class Case:
    """One test: call the function with ``args`` (Python source) and expect the correct
    result, or the exception named by ``raises``. The test is ``test_<function>_<test>``."""

    test: str
    args: str
    raises: str | None = None


@dataclass(frozen=True)
class Mutation:
    """Replace ``old`` (unique in the module, one line) by ``new``; both may use placeholders."""

    kind: BugKind
    old: str
    new: str


@dataclass(frozen=True)
class FunctionTemplate:
    """A correct function, its test cases and the bugs that can be injected into it."""

    names: tuple[str, ...]
    source: str
    cases: tuple[Case, ...]
    mutations: tuple[Mutation, ...]
    constants: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """Placeholder -> (correct, mistyped) pairs: ``$X`` renders the first, ``$X_BUG`` the second."""
    imports: tuple[str, ...] = ()
    test_imports: tuple[str, ...] = ()
    held_out: tuple[Case, ...] = ()
    """Checks of the same behaviours on other inputs: they go to the judge's tests only, never the
    snapshot or the problem statement, so a fix that special-cases the shown calls fails them."""


@dataclass(frozen=True)
class Domain:
    """A module of related functions."""

    modules: tuple[str, ...]
    summary: str
    functions: tuple[FunctionTemplate, ...]


K = BugKind

PRICING = Domain(
    modules=("pricing", "billing", "checkout"),
    summary="Prices, taxes and order totals.",
    functions=(
        FunctionTemplate(
            names=("apply_discount", "discounted_price", "price_after_discount"),
            source='''def $name(price, rate):
    """Return ``price`` reduced by the fraction ``rate`` (0 <= rate <= 1)."""
    if rate < 0 or rate > 1:
        raise ValueError("rate must be between 0 and 1")
    return round(price * (1 - rate), 2)
''',
            cases=(
                Case("reduces_price", "100, 0.2"),
                Case("zero_rate_keeps_price", "59.99, 0"),
                Case("full_rate_is_free", "80, 1"),
                Case("rejects_negative_rate", "10, -0.1", "ValueError"),
                Case("rejects_rate_above_one", "10, 1.5", "ValueError"),
            ),
            held_out=(
                Case("reduces_large_price", "249.99, 0.35"),
                Case("zero_rate_keeps_small_price", "7.5, 0"),
                Case("full_rate_frees_any_price", "19.99, 1"),
                Case("rejects_slightly_negative_rate", "42, -0.01", "ValueError"),
                Case("rejects_rate_of_two", "42, 2", "ValueError"),
            ),
            mutations=(
                Mutation(K.WRONG_OPERATOR, "price * (1 - rate)", "price * (1 + rate)"),
                Mutation(K.WRONG_COMPARISON, "rate > 1:", "rate >= 1:"),
                Mutation(K.WRONG_COMPARISON, "if rate < 0 or", "if rate <= 0 or"),
                Mutation(K.WRONG_BOOLEAN, "rate < 0 or rate", "rate < 0 and rate"),
            ),
        ),
        FunctionTemplate(
            names=("add_tax", "with_vat", "gross_amount"),
            source='''def $name(amount):
    """Return ``amount`` with value-added tax included, rounded to the cent."""
    vat_rate = $VAT
    return round(amount * (1 + vat_rate), 2)
''',
            constants={"VAT": (("0.2", "0.02"), ("0.21", "0.12"), ("0.07", "0.7"), ("0.25", "0.52"))},
            cases=(Case("adds_tax", "100"), Case("small_amount", "9.99"), Case("zero_amount", "0")),
            held_out=(
                Case("adds_tax_to_large_amount", "1234.5"),
                Case("adds_tax_to_cents", "0.99"),
            ),
            mutations=(
                Mutation(K.WRONG_CONSTANT, "vat_rate = $VAT", "vat_rate = $VAT_BUG"),
                Mutation(K.WRONG_OPERATOR, "amount * (1 + vat_rate)", "amount * (1 - vat_rate)"),
            ),
        ),
        FunctionTemplate(
            names=("order_total", "basket_total", "invoice_total"),
            source='''def $name(unit_price, quantity, shipping):
    """Cost of ``quantity`` items at ``unit_price``; shipping is free from $FREE items on."""
    if quantity >= $FREE:
        shipping = 0
    return round(unit_price * quantity + shipping, 2)
''',
            constants={"FREE": (("10", "100"), ("12", "21"), ("5", "50"), ("20", "200"))},
            cases=(
                Case("below_threshold_pays_shipping", "2.5, 3, 4.99"),
                Case("at_threshold_ships_free", "2.5, $FREE, 4.99"),
                Case("large_order", "1.25, 40, 4.99"),
            ),
            held_out=(
                Case("few_items_pay_shipping", "3.0, 2, 5.49"),
                Case("threshold_quantity_ships_free", "4.75, $FREE, 2.99"),
                Case("bulk_order", "0.5, 300, 6.5"),
            ),
            mutations=(
                Mutation(K.WRONG_COMPARISON, "quantity >= $FREE", "quantity > $FREE"),
                Mutation(K.WRONG_CONSTANT, "quantity >= $FREE", "quantity >= $FREE_BUG"),
                Mutation(K.WRONG_OPERATOR, "quantity + shipping", "quantity - shipping"),
            ),
        ),
        FunctionTemplate(
            names=("split_bill", "share_per_person", "split_evenly"),
            source='''def $name(total, people):
    """Split ``total`` between ``people``, rounding each share up to the cent."""
    if people <= 0:
        raise ValueError("people must be positive")
    return math.ceil(total * 100 / people) / 100
''',
            imports=("import math",),
            cases=(
                Case("even_split", "90, 3"),
                Case("rounds_share_up", "100, 3"),
                Case("single_person_pays_all", "12.5, 1"),
                Case("rejects_zero_people", "10, 0", "ValueError"),
            ),
            held_out=(
                Case("even_split_of_other_total", "120, 4"),
                Case("rounds_small_share_up", "10, 3"),
                Case("one_person_pays_other_total", "7.25, 1"),
                Case("rejects_zero_people_for_other_total", "55, 0", "ValueError"),
            ),
            mutations=(
                Mutation(K.WRONG_COMPARISON, "people <= 0", "people < 0"),
                Mutation(K.WRONG_CALL, "math.ceil(", "math.floor("),
                Mutation(K.SWAPPED_ARGUMENTS, "total * 100 / people", "people * 100 / total"),
            ),
        ),
    ),
)

INVENTORY = Domain(
    modules=("inventory", "stock", "warehouse"),
    summary="Stock levels, reordering and valuation.",
    functions=(
        FunctionTemplate(
            names=("items_to_restock", "low_stock", "restock_list"),
            source='''def $name(stock, threshold):
    """Names of the items whose quantity in ``stock`` is below ``threshold``, sorted."""
    return sorted(item for item, qty in stock.items() if qty < threshold)
''',
            cases=(
                Case("lists_low_items", "{'bolt': 2, 'nut': 10, 'gear': 0}, 5"),
                Case("item_at_threshold_is_fine", "{'bolt': 5, 'nut': 4}, 5"),
                Case("empty_stock", "{}, 3"),
            ),
            held_out=(
                Case("lists_other_low_items", "{'washer': 1, 'spring': 7, 'clip': 3}, 4"),
                Case("item_at_other_threshold_is_fine", "{'clip': 8, 'pin': 2}, 8"),
            ),
            mutations=(
                Mutation(K.WRONG_COMPARISON, "qty < threshold", "qty <= threshold"),
                Mutation(K.WRONG_COMPARISON, "if qty < threshold", "if qty > threshold"),
            ),
        ),
        FunctionTemplate(
            names=("take_from_stock", "remove_units", "withdraw_items"),
            source='''def $name(stock, item, count):
    """A copy of ``stock`` with ``count`` units of ``item`` taken out."""
    available = stock.get(item, 0)
    if count > available:
        raise ValueError(f"only {available} of {item!r} in stock")
    updated = dict(stock)
    updated[item] = available - count
    return updated
''',
            cases=(
                Case("takes_units", "{'bolt': 10, 'nut': 3}, 'bolt', 4"),
                Case("takes_everything", "{'nut': 4}, 'nut', 4"),
                Case("rejects_too_many", "{'nut': 4}, 'nut', 5", "ValueError"),
                Case("rejects_unknown_item", "{'nut': 4}, 'gear', 1", "ValueError"),
            ),
            held_out=(
                Case("takes_other_units", "{'pin': 9, 'clip': 2}, 'clip', 1"),
                Case("takes_all_of_other_item", "{'pin': 7}, 'pin', 7"),
                Case("rejects_one_too_many", "{'clip': 2}, 'clip', 3", "ValueError"),
                Case("rejects_other_unknown_item", "{'clip': 2}, 'spring', 1", "ValueError"),
            ),
            mutations=(
                Mutation(K.WRONG_COMPARISON, "count > available", "count >= available"),
                Mutation(K.WRONG_OPERATOR, "available - count", "available + count"),
                Mutation(K.MISSED_EDGE_CASE, "stock.get(item, 0)", "stock.get(item, count)"),
            ),
        ),
        FunctionTemplate(
            names=("reorder_quantity", "units_to_order", "order_size"),
            source='''def $name(on_hand, target, pack_size):
    """Units to order to bring ``on_hand`` up to ``target``, in whole packs of ``pack_size``."""
    missing = max(target - on_hand, 0)
    packs = -(-missing // pack_size)
    return packs * pack_size
''',
            cases=(
                Case("rounds_up_to_whole_packs", "3, 20, 6"),
                Case("exact_number_of_packs", "8, 20, 4"),
                Case("nothing_missing", "25, 20, 6"),
            ),
            held_out=(
                Case("rounds_small_order_up", "1, 10, 4"),
                Case("exact_packs_of_three", "2, 14, 3"),
                Case("well_stocked", "30, 12, 5"),
            ),
            mutations=(
                Mutation(K.OFF_BY_ONE, "packs = -(-missing // pack_size)", "packs = missing // pack_size"),
                Mutation(K.SWAPPED_ARGUMENTS, "max(target - on_hand, 0)", "max(on_hand - target, 0)"),
                Mutation(K.WRONG_CALL, "max(target - on_hand, 0)", "min(target - on_hand, 0)"),
            ),
        ),
        FunctionTemplate(
            names=("stock_value", "inventory_value", "total_value"),
            source='''def $name(stock, prices):
    """Value of ``stock`` at ``prices``; items without a price count as zero."""
    total = 0.0
    for item, qty in stock.items():
        total += qty * prices.get(item, 0.0)
    return round(total, 2)
''',
            cases=(
                Case("sums_items", "{'bolt': 10, 'nut': 4}, {'bolt': 0.25, 'nut': 0.1}"),
                Case("missing_price_counts_zero", "{'gear': 3, 'nut': 2}, {'nut': 1.5}"),
                Case("empty_stock", "{}, {'bolt': 1.0}"),
            ),
            held_out=(
                Case("sums_other_items", "{'pin': 3, 'clip': 5}, {'pin': 1.5, 'clip': 0.2}"),
                Case("unpriced_item_counts_zero_again", "{'spring': 4, 'pin': 1}, {'pin': 2.25}"),
            ),
            mutations=(
                Mutation(K.MISSED_EDGE_CASE, "prices.get(item, 0.0)", "prices[item]"),
                Mutation(K.WRONG_OPERATOR, "qty * prices", "qty + prices"),
            ),
        ),
    ),
)

TEXT = Domain(
    modules=("text", "strings", "formatting"),
    summary="Small helpers for strings shown to users.",
    functions=(
        FunctionTemplate(
            names=("truncate", "shorten", "clip_text"),
            source='''def $name(text, limit):
    """Shorten ``text`` to at most ``limit`` characters, ending with '...' when cut."""
    if len(text) <= limit:
        return text
    return text[: limit - 3] + "..."
''',
            cases=(
                Case("short_text_unchanged", "'hello', 10"),
                Case("exact_length_unchanged", "'hello', 5"),
                Case("cuts_long_text", "'hello world', 8"),
            ),
            held_out=(
                Case("short_text_kept", "'abc', 7"),
                Case("text_at_limit_kept", "'python', 6"),
                Case("cuts_other_long_text", "'a longer sentence', 10"),
            ),
            mutations=(
                Mutation(K.WRONG_COMPARISON, "len(text) <= limit", "len(text) < limit"),
                Mutation(K.OFF_BY_ONE, "text[: limit - 3]", "text[: limit - 2]"),
            ),
        ),
        FunctionTemplate(
            names=("slugify", "make_slug", "to_slug"),
            source='''def $name(title):
    """Lower-case ``title`` and join its words with '$SEP'."""
    words = title.lower().split()
    return "$SEP".join(words)
''',
            constants={"SEP": (("-", "_"), ("_", "-"))},
            cases=(
                Case("joins_words", "'Hello World'"),
                Case("collapses_spaces", "'  Many   spaces here '"),
                Case("single_word", "'Python'"),
            ),
            held_out=(
                Case("joins_other_words", "'Read The Docs'"),
                Case("collapses_other_spaces", "' Several   blank  words '"),
                Case("single_other_word", "'Gagar'"),
            ),
            mutations=(
                Mutation(K.WRONG_CALL, "title.lower()", "title.upper()"),
                Mutation(K.WRONG_CONSTANT, 'return "$SEP"', 'return "$SEP_BUG"'),
                Mutation(K.MISSED_EDGE_CASE, "title.lower().split()", 'title.lower().split(" ")'),
            ),
        ),
        FunctionTemplate(
            names=("count_words", "word_count", "count_long_words"),
            source='''def $name(text, min_length=1):
    """Number of words in ``text`` with at least ``min_length`` letters."""
    return sum(1 for word in text.split() if len(word) >= min_length)
''',
            cases=(
                Case("counts_words", "'the quick brown fox'"),
                Case("skips_short_words", "'a bb ccc dddd', 3"),
                Case("empty_text", "''"),
            ),
            held_out=(
                Case("counts_one_letter_words", "'a dog and a cat'"),
                Case("skips_other_short_words", "'to be or not to be', 3"),
                Case("blank_text", "'   '"),
            ),
            mutations=(
                Mutation(K.WRONG_COMPARISON, "len(word) >= min_length", "len(word) > min_length"),
                Mutation(K.MISSED_EDGE_CASE, "text.split()", 'text.split(" ")'),
            ),
        ),
        FunctionTemplate(
            names=("initials", "name_initials", "get_initials"),
            source='''def $name(full_name):
    """Initials of ``full_name``, upper-case, each followed by a dot."""
    parts = full_name.split()
    return "".join(part[0].upper() + "." for part in parts)
''',
            cases=(
                Case("two_names", "'ada lovelace'"),
                Case("three_names", "'grace brewster hopper'"),
                Case("empty_name", "''"),
            ),
            held_out=(
                Case("two_other_names", "'alan turing'"),
                Case("four_names", "'john ronald reuel tolkien'"),
            ),
            mutations=(
                Mutation(K.OFF_BY_ONE, "part[0].upper()", "part[1].upper()"),
                Mutation(K.WRONG_CALL, "part[0].upper()", "part[0].lower()"),
            ),
        ),
    ),
)

GEOMETRY = Domain(
    modules=("geometry", "shapes", "planar"),
    summary="Areas, distances and boxes in the plane.",
    functions=(
        FunctionTemplate(
            names=("rectangle_area", "rect_area", "area_of_rectangle"),
            source='''def $name(width, height):
    """Area of a rectangle; negative sides are rejected."""
    if width < 0 or height < 0:
        raise ValueError("sides must be non-negative")
    return width * height
''',
            cases=(
                Case("multiplies_sides", "3, 4"),
                Case("zero_width", "0, 5"),
                Case("fractional_side", "2.5, 6"),
                Case("rejects_negative_side", "-1, 2", "ValueError"),
            ),
            held_out=(
                Case("multiplies_other_sides", "7, 2"),
                Case("zero_height", "4, 0"),
                Case("zero_width_tall", "0, 9"),
                Case("fractional_sides", "0.5, 1.5"),
                Case("rejects_negative_height", "3, -2", "ValueError"),
            ),
            mutations=(
                Mutation(K.WRONG_OPERATOR, "return width * height", "return width + height"),
                Mutation(K.WRONG_BOOLEAN, "width < 0 or height", "width < 0 and height"),
            ),
        ),
        FunctionTemplate(
            names=("circle_area", "disc_area", "area_of_circle"),
            source='''def $name(radius):
    """Area of a circle of ``radius``, rounded to three decimals."""
    return round(math.pi * radius**2, 3)
''',
            imports=("import math",),
            cases=(Case("unit_circle", "1"), Case("radius_three", "3"), Case("zero_radius", "0")),
            held_out=(
                Case("radius_two", "2"),
                Case("half_radius", "0.5"),
            ),
            mutations=(
                Mutation(K.WRONG_OPERATOR, "radius**2", "radius * 2"),
                Mutation(K.WRONG_CONSTANT, "math.pi * radius", "3.14 * radius"),
            ),
        ),
        FunctionTemplate(
            names=("distance", "euclidean_distance", "point_distance"),
            source='''def $name(p, q):
    """Distance between points ``p`` and ``q`` given as (x, y), rounded to three decimals."""
    dx = q[0] - p[0]
    dy = q[1] - p[1]
    return round(math.hypot(dx, dy), 3)
''',
            imports=("import math",),
            cases=(
                Case("three_four_five", "(0, 0), (3, 4)"),
                Case("shifted_points", "(1, 2), (4, 6)"),
                Case("same_point", "(2, -1), (2, -1)"),
            ),
            held_out=(
                Case("shifted_other_points", "(2, 3), (5, 7)"),
                Case("same_other_point", "(-3, 4), (-3, 4)"),
            ),
            mutations=(
                Mutation(K.WRONG_VARIABLE, "dy = q[1] - p[1]", "dy = q[1] - p[0]"),
                Mutation(K.WRONG_OPERATOR, "dx = q[0] - p[0]", "dx = q[0] + p[0]"),
            ),
        ),
        FunctionTemplate(
            names=("bounding_box", "bbox", "enclosing_box"),
            source='''def $name(points):
    """Smallest (min_x, min_y, max_x, max_y) box containing ``points``."""
    if not points:
        raise ValueError("no points given")
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    return (min(xs), min(ys), max(xs), max(ys))
''',
            cases=(
                Case("spans_points", "[(1, 5), (-2, 3), (4, -1)]"),
                Case("single_point", "[(2, 7)]"),
                Case("rejects_empty", "[]", "ValueError"),
            ),
            held_out=(
                Case("spans_other_points", "[(0, 2), (3, -4), (-1, 1)]"),
                Case("single_other_point", "[(-5, 3)]"),
                Case("rejects_no_points", "()", "ValueError"),
            ),
            mutations=(
                Mutation(K.SWAPPED_ARGUMENTS, "(min(xs), min(ys), max", "(min(ys), min(xs), max"),
                Mutation(K.WRONG_CALL, "max(xs), max(ys))", "max(xs), min(ys))"),
            ),
        ),
    ),
)

STATS = Domain(
    modules=("stats", "metrics", "numeric"),
    summary="Summary statistics over plain lists of numbers.",
    functions=(
        FunctionTemplate(
            names=("mean", "average", "arithmetic_mean"),
            source='''def $name(values):
    """Arithmetic mean of ``values``; 0.0 for an empty list."""
    return sum(values) / len(values) if values else 0.0
''',
            cases=(Case("of_four_values", "[1, 2, 3, 4]"), Case("single_value", "[5]"), Case("empty", "[]")),
            held_out=(
                Case("of_three_values", "[2, 4, 9]"),
                Case("empty_tuple", "()"),
            ),
            mutations=(
                Mutation(K.MISSED_EDGE_CASE, "len(values) if values else 0.0", "len(values)"),
                Mutation(K.OFF_BY_ONE, "/ len(values)", "/ (len(values) + 1)"),
            ),
        ),
        FunctionTemplate(
            names=("clamp", "bound", "limit_to_range"),
            source='''def $name(value, low, high):
    """Limit ``value`` to the closed range [low, high]."""
    if low > high:
        raise ValueError("low must not exceed high")
    return max(low, min(value, high))
''',
            cases=(
                Case("inside_range", "5, 0, 10"),
                Case("below_range", "-3, 0, 10"),
                Case("above_range", "12, 0, 10"),
                Case("degenerate_range", "7, 3, 3"),
                Case("rejects_inverted_range", "1, 5, 2", "ValueError"),
            ),
            held_out=(
                Case("inside_other_range", "0.5, -1, 1"),
                Case("below_other_range", "-20, -5, 5"),
                Case("above_other_range", "99, 1, 50"),
                Case("degenerate_other_range", "-2, -4, -4"),
                Case("rejects_other_inverted_range", "0, 10, -10", "ValueError"),
            ),
            mutations=(
                Mutation(K.SWAPPED_ARGUMENTS, "max(low, min(value, high))", "max(high, min(value, low))"),
                Mutation(K.WRONG_COMPARISON, "if low > high", "if low >= high"),
            ),
        ),
        FunctionTemplate(
            names=("median", "middle_value", "median_of"),
            source='''def $name(values):
    """Median of ``values``; raises ValueError when empty."""
    if not values:
        raise ValueError("median of an empty list")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
''',
            cases=(
                Case("odd_length", "[3, 1, 2]"),
                Case("even_length", "[4, 1, 3, 2]"),
                Case("single_value", "[7]"),
                Case("rejects_empty", "[]", "ValueError"),
            ),
            held_out=(
                Case("odd_length_again", "[9, 5, 7, 1, 3]"),
                Case("even_length_again", "[10, 40, 20, 30]"),
                Case("single_other_value", "[-2]"),
                Case("rejects_empty_tuple", "()", "ValueError"),
            ),
            mutations=(
                Mutation(
                    K.OFF_BY_ONE,
                    "(ordered[middle - 1] + ordered[middle])",
                    "(ordered[middle] + ordered[middle + 1])",
                ),
                Mutation(K.MISSED_EDGE_CASE, "ordered = sorted(values)", "ordered = list(values)"),
            ),
        ),
        FunctionTemplate(
            names=("percent_change", "relative_change", "growth_percent"),
            source='''def $name(old, new):
    """Change from ``old`` to ``new`` in percent, rounded to one decimal."""
    if old == 0:
        raise ValueError("old value must not be zero")
    return round((new - old) / old * 100, 1)
''',
            cases=(
                Case("increase", "50, 75"),
                Case("decrease", "200, 150"),
                Case("no_change", "8, 8"),
                Case("rejects_zero_base", "0, 5", "ValueError"),
            ),
            held_out=(
                Case("other_increase", "40, 50"),
                Case("other_decrease", "80, 60"),
                Case("no_change_again", "3, 3"),
                Case("rejects_zero_base_again", "0, 1", "ValueError"),
            ),
            mutations=(
                Mutation(K.SWAPPED_ARGUMENTS, "(new - old) / old", "(old - new) / old"),
                Mutation(K.WRONG_VARIABLE, "(new - old) / old", "(new - old) / new"),
            ),
        ),
        FunctionTemplate(
            names=("moving_average", "rolling_mean", "window_averages"),
            source='''def $name(values, window):
    """Averages of each run of ``window`` consecutive ``values``, rounded to three decimals."""
    if window <= 0:
        raise ValueError("window must be positive")
    starts = range(len(values) - window + 1)
    return [round(sum(values[i : i + window]) / window, 3) for i in starts]
''',
            cases=(
                Case("pairs", "[1, 2, 3, 4], 2"),
                Case("whole_list", "[2, 4, 6], 3"),
                Case("window_longer_than_values", "[1, 2], 3"),
                Case("rejects_zero_window", "[1, 2], 0", "ValueError"),
            ),
            held_out=(
                Case("triples", "[3, 6, 9, 12], 3"),
                Case("window_of_one", "[5, 7], 1"),
                Case("window_longer_than_other_values", "[4], 2"),
                Case("rejects_other_zero_window", "[4, 5, 6], 0", "ValueError"),
            ),
            mutations=(
                Mutation(K.OFF_BY_ONE, "len(values) - window + 1", "len(values) - window"),
                Mutation(K.WRONG_COMPARISON, "if window <= 0", "if window < 0"),
            ),
        ),
    ),
)

DATES = Domain(
    modules=("dates", "calendar_utils", "schedule"),
    summary="Date ranges and calendar arithmetic.",
    functions=(
        FunctionTemplate(
            names=("days_between", "days_in_range", "inclusive_days"),
            source='''def $name(start, end):
    """Number of days from ``start`` to ``end``, counting both ends."""
    if end < start:
        raise ValueError("end is before start")
    return (end - start).days + 1
''',
            test_imports=("from datetime import date",),
            cases=(
                Case("january", "date(2024, 1, 1), date(2024, 1, 31)"),
                Case("same_day", "date(2024, 3, 5), date(2024, 3, 5)"),
                Case("leap_february", "date(2024, 2, 1), date(2024, 2, 29)"),
                Case("rejects_reversed_range", "date(2024, 3, 5), date(2024, 3, 1)", "ValueError"),
            ),
            held_out=(
                Case("march", "date(2023, 3, 1), date(2023, 3, 31)"),
                Case("same_other_day", "date(2023, 7, 4), date(2023, 7, 4)"),
                Case("non_leap_february", "date(2023, 2, 1), date(2023, 2, 28)"),
                Case("rejects_other_reversed_range", "date(2023, 9, 2), date(2023, 8, 30)", "ValueError"),
            ),
            mutations=(
                Mutation(K.OFF_BY_ONE, "(end - start).days + 1", "(end - start).days"),
                Mutation(K.WRONG_COMPARISON, "if end < start", "if end <= start"),
            ),
        ),
        FunctionTemplate(
            names=("is_weekend", "falls_on_weekend", "weekend_day"),
            source='''def $name(day):
    """Whether ``day`` is a Saturday or a Sunday."""
    return day.weekday() >= 5
''',
            test_imports=("from datetime import date",),
            cases=(
                Case("saturday", "date(2024, 6, 8)"),
                Case("sunday", "date(2024, 6, 9)"),
                Case("monday", "date(2024, 6, 10)"),
                Case("friday", "date(2024, 6, 7)"),
            ),
            held_out=(
                Case("another_saturday", "date(2023, 9, 16)"),
                Case("another_sunday", "date(2023, 9, 17)"),
                Case("another_monday", "date(2023, 9, 18)"),
                Case("another_friday", "date(2023, 9, 15)"),
            ),
            mutations=(
                Mutation(K.WRONG_COMPARISON, "day.weekday() >= 5", "day.weekday() > 5"),
                Mutation(K.WRONG_CONSTANT, "day.weekday() >= 5", "day.weekday() >= 6"),
            ),
        ),
        FunctionTemplate(
            names=("ranges_overlap", "periods_overlap", "overlaps"),
            source='''def $name(first, second):
    """Whether the inclusive (start, end) date ranges ``first`` and ``second`` share a day."""
    return first[0] <= second[1] and second[0] <= first[1]
''',
            test_imports=("from datetime import date",),
            cases=(
                Case(
                    "overlapping",
                    "(date(2024, 1, 1), date(2024, 1, 10)), (date(2024, 1, 5), date(2024, 1, 20))",
                ),
                Case(
                    "touching_ends",
                    "(date(2024, 1, 1), date(2024, 1, 10)), (date(2024, 1, 10), date(2024, 1, 12))",
                ),
                Case(
                    "disjoint", "(date(2024, 1, 1), date(2024, 1, 3)), (date(2024, 2, 1), date(2024, 2, 3))"
                ),
            ),
            held_out=(
                Case(
                    "contained_range",
                    "(date(2023, 5, 1), date(2023, 5, 31)), (date(2023, 5, 10), date(2023, 5, 12))",
                ),
                Case(
                    "touching_other_ends",
                    "(date(2023, 6, 1), date(2023, 6, 5)), (date(2023, 6, 5), date(2023, 6, 9))",
                ),
                Case(
                    "disjoint_other",
                    "(date(2023, 3, 1), date(2023, 3, 2)), (date(2023, 4, 1), date(2023, 4, 2))",
                ),
            ),
            mutations=(
                Mutation(K.WRONG_COMPARISON, "second[0] <= first[1]", "second[0] < first[1]"),
                Mutation(K.WRONG_BOOLEAN, "second[1] and second", "second[1] or second"),
            ),
        ),
        FunctionTemplate(
            names=("quarter_of", "fiscal_quarter", "quarter"),
            source='''def $name(day):
    """Calendar quarter (1 to 4) of ``day``."""
    return (day.month - 1) // 3 + 1
''',
            test_imports=("from datetime import date",),
            cases=(
                Case("january", "date(2024, 1, 15)"),
                Case("end_of_march", "date(2024, 3, 31)"),
                Case("april", "date(2024, 4, 1)"),
                Case("december", "date(2024, 12, 31)"),
            ),
            held_out=(
                Case("february", "date(2023, 2, 14)"),
                Case("end_of_june", "date(2023, 6, 30)"),
                Case("october", "date(2023, 10, 5)"),
                Case("start_of_july", "date(2023, 7, 1)"),
            ),
            mutations=(
                Mutation(K.OFF_BY_ONE, "(day.month - 1) // 3", "day.month // 3"),
                Mutation(K.WRONG_CONSTANT, "// 3 + 1", "// 4 + 1"),
            ),
        ),
        FunctionTemplate(
            names=("format_duration", "duration_text", "hms"),
            source='''def $name(seconds):
    """Format a duration in whole seconds as 'H:MM:SS'."""
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
''',
            cases=(Case("under_a_minute", "42"), Case("over_an_hour", "3725"), Case("exact_hours", "7200")),
            held_out=(
                Case("seconds_only", "7"),
                Case("hours_minutes_seconds", "5025"),
                Case("whole_hour", "3600"),
            ),
            mutations=(
                Mutation(K.SWAPPED_ARGUMENTS, "divmod(seconds, 60)", "divmod(60, seconds)"),
                Mutation(K.WRONG_CONSTANT, "divmod(minutes, 60)", "divmod(minutes, 100)"),
            ),
        ),
    ),
)

DOMAINS: tuple[Domain, ...] = (PRICING, INVENTORY, TEXT, GEOMETRY, STATS, DATES)
"""Every domain; a generated package uses two to four of them, one module each."""
