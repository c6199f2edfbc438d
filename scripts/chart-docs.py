#!/usr/bin/env python3
"""Write the values table of helm/gagar/README.md from the ``# --`` comments of values.yaml (helm-docs style).

python scripts/chart-docs.py           # rewrite the table between the README's markers
python scripts/chart-docs.py --check   # exit 1 if the README is out of date or a key is undocumented
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ValueDoc", "parse_values", "render_table", "undocumented_keys", "update_readme"]

CHART_DIR = Path(__file__).resolve().parents[1] / "helm" / "gagar"
BEGIN, END = "<!-- values-table:begin -->", "<!-- values-table:end -->"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")
_DOC = re.compile(r"^ *# -- (?P<text>.+)$")


@dataclass(frozen=True)
class ValueDoc:
    """One documented key of values.yaml: its dotted path, default and description."""

    path: str
    default: Any
    description: str


def _lookup(values: dict[str, Any], path: list[str]) -> Any:
    node: Any = values
    for part in path:
        node = node[part]
    return node


def parse_values(text: str) -> tuple[list[ValueDoc], list[str]]:
    """Documented keys of a values.yaml text, and the paths of every key line met.

    A ``# -- text`` comment documents the key on the next line, including everything nested
    under it; an undocumented key is a group whose children carry their own comments.
    """
    values = yaml.safe_load(text) or {}
    docs: list[ValueDoc] = []
    seen: list[str] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing undocumented groups
    pending: str | None = None
    skip_deeper_than: int | None = None
    for line in text.splitlines():
        doc = _DOC.match(line)
        if doc:
            pending = doc["text"].strip()
            continue
        match = _KEY.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        if skip_deeper_than is not None and indent > skip_deeper_than:
            continue
        skip_deeper_than = None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [key for _, key in stack] + [match["key"]]
        seen.append(".".join(path))
        if pending is not None:
            docs.append(ValueDoc(".".join(path), _lookup(values, path), pending))
            skip_deeper_than = indent
            pending = None
        else:
            stack.append((indent, match["key"]))
    return docs, seen


def undocumented_keys(text: str) -> list[str]:
    """Keys with neither a ``# --`` comment nor documented children (leaves nobody described)."""
    docs, seen = parse_values(text)
    documented = {d.path for d in docs}
    return [
        path
        for path in seen
        if path not in documented and not any(d.startswith(path + ".") for d in documented)
    ]


def _type_of(value: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}.get(
        type(value), "null"
    )


def render_table(docs: list[ValueDoc]) -> str:
    """A Markdown table: key, type, default, description."""
    rows = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for d in docs:
        default = json.dumps(d.default, separators=(",", ":")).replace("|", r"\|")
        description = d.description.replace("|", r"\|")
        rows.append(f"| {d.path} | {_type_of(d.default)} | `{default}` | {description} |")
    return "\n".join(rows)


def update_readme(readme: str, table: str) -> str:
    """The README text with the table between its markers replaced."""
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"README lacks the markers {BEGIN} and {END}")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the README is out of date")
    args = parser.parse_args()
    text = (CHART_DIR / "values.yaml").read_text()
    missing = undocumented_keys(text)
    if missing:
        print("values.yaml keys without a '# --' comment: " + ", ".join(missing), file=sys.stderr)
        return 1
    readme_path = CHART_DIR / "README.md"
    current = readme_path.read_text()
    wanted = update_readme(current, render_table(parse_values(text)[0]))
    if args.check:
        if current != wanted:
            print(f"{readme_path} is out of date: run python scripts/chart-docs.py", file=sys.stderr)
            return 1
        return 0
    readme_path.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
