"""SEARCH/REPLACE edit blocks: the policy's answer format, parsed strictly and turned into a diff.

An answer is one or more blocks, separated by blank lines, each exactly::

    path/to/file.py
    <<<<<<< SEARCH
    exact lines to find
    =======
    replacement lines
    >>>>>>> REPLACE

An empty SEARCH section creates a new file. A non-empty SEARCH must match whole lines
of the file exactly once. :func:`edit_blocks_to_diff` turns applied blocks into a
git-style unified diff, so a trajectory's ``model_patch`` is always a diff.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gagar.sandbox.patch import PatchError, check_path, file_diff

__all__ = [
    "DIVIDER",
    "REPLACE",
    "SEARCH",
    "UNCHANGED",
    "EditApplyError",
    "EditBlock",
    "EditFormatError",
    "apply_edit_blocks",
    "edit_blocks_to_diff",
    "parse_edit_blocks",
]

SEARCH = "<<<<<<< SEARCH"
DIVIDER = "======="
REPLACE = ">>>>>>> REPLACE"
UNCHANGED = "the edit blocks change nothing"
"""Why an answer whose blocks parse and apply but leave every file as it was gives no patch."""


class EditFormatError(ValueError):
    """An answer that does not parse as edit blocks; the message says where and why."""


class EditApplyError(ValueError):
    """A block that does not apply to the files; the message names the block and the reason."""


@dataclass(frozen=True)
class EditBlock:
    """One edit: replace ``search`` (whole lines, '' to create the file) with ``replace`` in ``path``."""

    path: str
    search: str
    replace: str


def _section(lines: list[str], start: int, end_marker: str, what: str, block: int) -> tuple[str, int]:
    """Text from ``lines[start]`` up to the line equal to ``end_marker``; returns it and the marker index."""
    for j in range(start, len(lines)):
        if lines[j] == end_marker:
            return "".join(line + "\n" for line in lines[start:j]), j
        if lines[j] in (SEARCH, DIVIDER, REPLACE):
            raise EditFormatError(f"block {block}: {what}: found {lines[j]!r} at line {j + 1}")
    raise EditFormatError(f"block {block}: {what}: the answer ends first (unterminated block)")


def parse_edit_blocks(text: str) -> list[EditBlock]:
    """Parse an answer into edit blocks.

    Raises:
        EditFormatError: empty answer, stray text, empty or unsafe path, missing divider,
            unterminated block; the message names the line or block.
    """
    lines = text.splitlines()
    blocks: list[EditBlock] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        n = len(blocks) + 1
        if line == SEARCH:
            raise EditFormatError(
                f"block {n}: empty path (line {i + 1} is {SEARCH!r} with no path before it)"
            )
        if line in (DIVIDER, REPLACE):
            raise EditFormatError(f"line {i + 1}: {line!r} outside a block")
        if i + 1 >= len(lines) or lines[i + 1] != SEARCH:
            raise EditFormatError(f"line {i + 1}: expected a file path followed by {SEARCH!r}, got {line!r}")
        path = line.strip()
        try:
            check_path(path)
        except PatchError as exc:
            raise EditFormatError(f"block {n}: {exc}") from None
        search, div = _section(lines, i + 2, DIVIDER, f"missing {DIVIDER!r} divider", n)
        replace, end = _section(lines, div + 1, REPLACE, f"missing {REPLACE!r}", n)
        blocks.append(EditBlock(path, search, replace))
        i = end + 1
    if not blocks:
        raise EditFormatError("no edit blocks found")
    return blocks


def _line_matches(content: str, search: str) -> list[int]:
    """Offsets where ``search`` (whole lines) starts at a line boundary of ``content``."""
    hits, start = [], 0
    while (pos := content.find(search, start)) != -1:
        if pos == 0 or content[pos - 1] == "\n":
            hits.append(pos)
        start = pos + 1
    return hits


def _apply_block(files: dict[str, str], n: int, block: EditBlock) -> None:
    where = f"block {n} ({block.path})"
    current = files.get(block.path)
    if not block.search:
        if current is not None:
            raise EditApplyError(f"{where}: SEARCH is empty (creates a file) but the file exists")
        files[block.path] = block.replace
        return
    if current is None:
        raise EditApplyError(f"{where}: the file does not exist")
    missing_newline = not current.endswith("\n")
    content = current + "\n" if missing_newline else current
    hits = _line_matches(content, block.search)
    if not hits:
        raise EditApplyError(f"{where}: SEARCH text not found in the file")
    if len(hits) > 1:
        raise EditApplyError(f"{where}: SEARCH text matches {len(hits)} places; add lines to make it unique")
    pos = hits[0]
    content = content[:pos] + block.replace + content[pos + len(block.search) :]
    files[block.path] = content[:-1] if missing_newline and content.endswith("\n") else content


def apply_edit_blocks(files: Mapping[str, str], blocks: Sequence[EditBlock]) -> dict[str, str]:
    """Apply blocks in order to a snapshot (path -> text); returns the new snapshot.

    Raises:
        EditApplyError: a block's file is missing, or its SEARCH matches zero or several places.
    """
    result = dict(files)
    for n, block in enumerate(blocks, start=1):
        _apply_block(result, n, block)
    return result


def edit_blocks_to_diff(files: Mapping[str, str], blocks: Sequence[EditBlock]) -> str:
    """The git-style unified diff that the blocks make to ``files`` (paths sorted)."""
    new_files = apply_edit_blocks(files, blocks)
    paths = sorted({b.path for b in blocks})
    return "".join(file_diff(p, files.get(p), new_files.get(p)) for p in paths)
