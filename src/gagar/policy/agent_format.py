"""The single-turn agent format: a compact prompt in, SEARCH/REPLACE edit blocks out.

The prompt holds the problem statement and the relevant file(s): those defining a function or
class the statement names, then those mentioning one, test files last. A demonstration answer
is built from a patch as *minimal* blocks: each SEARCH is the changed lines plus just enough
neighbouring lines to occur once in the file, which keeps answers short enough for a tiny model.
Answers are parsed by the sandbox's strict parser (:mod:`gagar.sandbox.edits`), which says why
an answer does not parse.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from transformers import PreTrainedTokenizerBase

from gagar import pyast
from gagar.sandbox.edits import (
    UNCHANGED,
    EditBlock,
    apply_edit_blocks,
    edit_blocks_to_diff,
    parse_edit_blocks,
)
from gagar.schema.task import Task
from gagar.schema.trajectory import Message
from gagar.tasks.diffs import apply_diff

__all__ = [
    "INSTRUCTION",
    "Scope",
    "answer_from_patch",
    "answer_from_snapshots",
    "build_prompt",
    "mentioned_names",
    "minimal_edits",
    "named_definition",
    "parse_answer",
    "relevant_files",
    "render_blocks",
]

INSTRUCTION = "Fix the issue. Answer with SEARCH/REPLACE blocks."
Scope = Literal["function", "file"]
_NAME_RE = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)`|\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def mentioned_names(text: str) -> list[str]:
    """Identifiers the text names in backticks or calls as ``name(``, in order, without duplicates."""
    names: list[str] = []
    for match in _NAME_RE.finditer(text):
        name = (match.group(1) or match.group(2)).split(".")[-1]
        if name not in names:
            names.append(name)
    return names


def _is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.startswith("test_") or name.endswith("_test.py") or "tests/" in path or name == "conftest.py"


def relevant_files(task: Task, max_files: int = 1) -> list[str]:
    """Up to ``max_files`` snapshot paths, most relevant first (definitions, then mentions; no tests)."""
    snapshot = task.snapshot or {}
    names = mentioned_names(task.problem_statement)

    def score(path: str) -> tuple[int, int, str]:
        text = snapshot[path]
        defines = sum(bool(re.search(rf"^\s*(?:def|class)\s+{re.escape(n)}\b", text, re.M)) for n in names)
        mentions = sum(n in text for n in names)
        return (-defines, -mentions, path)

    candidates = [p for p in snapshot if p.endswith(".py") and not _is_test_file(p)]
    return sorted(candidates, key=score)[:max_files]


def _definition_span(text: str, names: Sequence[str]) -> tuple[int, int] | None:
    """0-based [start, end) lines of the first top-level or nested def/class named in ``names``."""
    try:
        tree = pyast.parse(text)
    except SyntaxError:
        return None
    defs = {
        node.name: node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    for name in names:
        if name in defs:
            node = defs[name]
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            return start, node.end_lineno or node.lineno
    return None


def named_definition(task: Task, path: str) -> tuple[int, str] | None:
    """The first line (1-based) and the text of the definition in ``path`` of the first function or
    class the statement names (what the single-turn prompt shows), or None when it names none there."""
    text = (task.snapshot or {}).get(path)
    span = None if text is None else _definition_span(text, mentioned_names(task.problem_statement))
    if span is None:
        return None
    return span[0] + 1, "".join(text.splitlines(keepends=True)[span[0] : span[1]])


def _shown_text(text: str, span: tuple[int, int] | None, budget_lines: int | None) -> tuple[str, str]:
    """(header suffix, text) of a file narrowed to ``span`` and/or ``budget_lines`` lines around it."""
    lines = text.splitlines(keepends=True)
    start, end = span if span is not None else (0, len(lines))
    if budget_lines is not None and end - start > budget_lines:
        end = start + budget_lines
    if (start, end) == (0, len(lines)):
        return "", text
    return f" (lines {start + 1}-{end})", "".join(lines[start:end])


def _user_message(task: Task, shown: Mapping[str, tuple[str, str]]) -> str:
    """Instruction, statement, the shown files, and last the file to edit.

    The closing ``Edit: <path>`` line puts the path right before the answer, whose first line it is:
    a tiny model copies it from there far more reliably than from the file header further up.
    """
    files = "".join(f"\n{path}{where}\n```\n{text}```\n" for path, (where, text) in shown.items())
    return f"{INSTRUCTION}\n\n{task.problem_statement.strip()}\n{files}\nEdit: {next(iter(shown))}"


def build_prompt(
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_tokens: int = 1024,
    max_files: int = 1,
    scope: Scope = "function",
) -> tuple[list[Message], list[int]]:
    """The chat messages and their token ids (chat template, generation prompt) for ``task``.

    ``scope="function"`` shows only the definition of the function the statement names (the
    compact default for a tiny model; whole files when no named definition is found);
    ``scope="file"`` shows whole files. If the prompt exceeds ``max_prompt_tokens``, extra files
    are dropped, then the shown text is cut to fewer and fewer lines until it fits.

    Raises:
        ValueError: if the task has no snapshot, or not even the statement with one line fits.
    """
    if task.snapshot is None:
        raise ValueError(f"{task.instance_id}: the single-turn format needs a bundled snapshot")
    names = mentioned_names(task.problem_statement)
    paths = relevant_files(task, max_files)
    spans = {p: _definition_span(task.snapshot[p], names) if scope == "function" else None for p in paths}
    budget: int | None = None
    while True:
        shown = {p: _shown_text(task.snapshot[p], spans[p], budget) for p in paths}
        messages = [Message(role="user", content=_user_message(task, shown))]
        ids = tokenizer.apply_chat_template([m.model_dump() for m in messages], add_generation_prompt=True)
        ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
        if len(ids) <= max_prompt_tokens:
            return messages, ids
        if len(paths) > 1:
            paths = paths[:-1]
            continue
        longest = max((len(text.splitlines()) for _, text in shown.values()), default=0)
        budget = longest // 2
        if budget < 1:
            raise ValueError(f"{task.instance_id}: prompt does not fit in {max_prompt_tokens} tokens")


def _unique(text: str, needle: str) -> bool:
    """True when ``needle`` (whole lines) starts at exactly one line boundary of ``text`` (as the parser)."""
    if not needle:
        return False
    hits, start = 0, 0
    while (pos := text.find(needle, start)) != -1 and hits < 2:
        hits += pos == 0 or text[pos - 1] == "\n"
        start = pos + 1
    return hits == 1


def minimal_edits(old: str, new: str) -> list[tuple[str, str]]:
    """(search, replace) pairs turning ``old`` into ``new``, each search as short as uniqueness allows.

    Each change is grown by whole neighbouring lines (before first, then after) until its search
    text occurs exactly once in ``old``; changes whose spans meet are merged.
    """
    a_lines, b_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    ops = [
        op
        for op in difflib.SequenceMatcher(None, a_lines, b_lines, autojunk=False).get_opcodes()
        if op[0] != "equal"
    ]
    spans: list[list[int]] = []
    for _, i1, i2, j1, j2 in ops:
        a, b, c, d = i1, i2, j1, j2
        grow_before = True
        while not _unique(old, "".join(a_lines[a:b])) and (a > 0 or b < len(a_lines)):
            if (grow_before and a > 0) or b >= len(a_lines):
                a, c = a - 1, c - 1
            else:
                b, d = b + 1, d + 1
            grow_before = not grow_before
        if spans and a <= spans[-1][1]:
            a, c = spans[-1][0], spans[-1][2]
            spans.pop()
        spans.append([a, b, c, d])
    return [("".join(a_lines[a:b]), "".join(b_lines[c:d])) for a, b, c, d in spans]


def render_blocks(edits: Sequence[tuple[str, str, str]]) -> str:
    """SEARCH/REPLACE blocks for (path, search, replace) triples; texts are whole lines."""
    out = []
    for path, search, replace in edits:
        out.append(f"{path}\n<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n")
    return "\n".join(out)


def answer_from_snapshots(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """The minimal SEARCH/REPLACE answer turning ``before`` into ``after``.

    Raises:
        ValueError: if a file is deleted (the format cannot express it) or a text lacks a final newline.
    """
    edits: list[tuple[str, str, str]] = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, ""), after.get(path)
        if new is None:
            raise ValueError(f"{path}: deleted; SEARCH/REPLACE blocks cannot delete files")
        if old == new:
            continue
        if (old and not old.endswith("\n")) or (new and not new.endswith("\n")):
            raise ValueError(f"{path}: no final newline; blocks hold whole lines")
        edits.extend((path, s, r) for s, r in minimal_edits(old, new))
    return render_blocks(edits)


def answer_from_patch(snapshot: Mapping[str, str], patch: str) -> str:
    """The minimal answer for a unified diff, checked to reproduce the patched files exactly.

    Raises:
        ValueError: if the patch does not apply, or the blocks do not reproduce its result.
    """
    after = apply_diff(snapshot, patch)
    answer = answer_from_snapshots(snapshot, after)
    changed = {p: t for p, t in after.items() if snapshot.get(p) != t}
    reproduced = apply_edit_blocks(dict(snapshot), parse_edit_blocks(answer))
    if any(reproduced.get(p) != t for p, t in changed.items()):
        raise ValueError("the minimal blocks do not reproduce the patch (a search text stopped being unique)")
    return answer


def resolve_paths(blocks: Sequence[EditBlock], files: Mapping[str, str]) -> list[EditBlock]:
    """Point a block whose file does not exist at the one file with its name that holds its SEARCH text.

    Models (small ones especially) often get the package directory of a path wrong while naming the
    module and quoting its code right; the SEARCH text then says which file was meant. A block is
    retargeted only when exactly one existing file has the same file name and contains the SEARCH
    text; anything else is left for the strict parser to refuse.
    """
    resolved = []
    for block in blocks:
        if block.path not in files and block.search:
            name = block.path.rsplit("/", 1)[-1]
            matches = [
                p for p, text in files.items() if p.rsplit("/", 1)[-1] == name and block.search in text
            ]
            if len(matches) == 1:
                block = EditBlock(matches[0], block.search, block.replace)
        resolved.append(block)
    return resolved


def parse_answer(answer: str, files: Mapping[str, str]) -> tuple[str, str | None]:
    """(model_patch, parse_error) for an answer: the unified diff, or ``""`` and why it failed."""
    try:
        blocks = resolve_paths(parse_edit_blocks(answer), files)
        patch = edit_blocks_to_diff(dict(files), blocks)
    except ValueError as exc:
        return "", str(exc) or type(exc).__name__
    if not patch.strip():
        return "", UNCHANGED
    return patch, None
