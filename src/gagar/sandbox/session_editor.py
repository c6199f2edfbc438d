"""The file editor of an agent's session, run inside the session's sandbox (stand-alone: no gagar imports).

:mod:`gagar.sandbox.session` copies this file into the folder bound read-only at ``/sandbox/tools``
and runs it with the sandbox's interpreter, one call per edit, the request as JSON on stdin::

    {"command": "view", "path": "pkg/mod.py", "view_range": [10, 20]}
    {"command": "create", "path": "pkg/new.py", "file_text": "..."}
    {"command": "str_replace", "path": "pkg/mod.py", "old_str": "...", "new_str": "..."}
    {"command": "insert", "path": "pkg/mod.py", "insert_line": 3, "new_str": "..."}
    {"command": "undo_edit", "path": "pkg/mod.py"}

It prints what the agent reads and exits 0, or prints ``error: <why>`` and exits 1. Paths are relative
to the working tree (``/sandbox/repo``) or absolute inside it; the undo history lives in
``/sandbox/state``, outside the tree, so it never enters the patch. Running inside the sandbox, it can
read and write only what the session's shell can.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import sys
from collections.abc import Iterator

ROOT = "/sandbox/repo"
STATE = "/sandbox/state"
SNIPPET_LINES = 4
"""Lines shown either side of an edit in its answer (so the next edit can quote the file as it is now)."""
MAX_LISTED = 200
SIMILAR_RATIO = 0.6
"""Least ``difflib`` similarity of the file's lines to a misquoted ``old_str`` for them to be shown in the
refusal (the threshold of Aider's "did you mean" for its SEARCH blocks)."""
SIMILAR_BUDGET = 64_000
"""Most lines in the file times the square of the lines in ``old_str`` for which they are looked for (the
search's cost grows so: about a second at the bound here, 8 lines in a file of 1,000; beyond it the
refusal only says to view the lines)."""


class EditError(ValueError):
    """A request the editor refuses; the message is what the agent reads."""


def numbered(text: str, first: int = 1) -> str:
    """``text`` with right-aligned line numbers starting at ``first`` (as ``cat -n``)."""
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(text.split("\n"), first))


def file_lines(text: str) -> list[str]:
    """The lines of ``text``, without the empty one after a final newline."""
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def view_lines(text: str, view_range: list[int] | None) -> str:
    """The numbered lines of ``text`` in ``view_range`` ``[first, last]`` (1-based; ``last`` -1: the end)."""
    lines = file_lines(text)
    if view_range is None:
        return numbered("\n".join(lines))
    if len(view_range) != 2 or not all(isinstance(v, int) for v in view_range):
        raise EditError("view_range must be two integers [first, last]")
    first, last = view_range
    last = len(lines) if last == -1 else last
    if not 1 <= first <= max(len(lines), 1) or last < first:
        raise EditError(f"view_range {view_range} is outside the file's lines 1..{len(lines)}")
    return numbered("\n".join(lines[first - 1 : last]), first)


def closest_lines(text: str, old: str) -> tuple[int, str] | None:
    """The first line number and the lines of ``text`` most like ``old`` (as many lines as it spans), or
    None when no run of lines reaches :data:`SIMILAR_RATIO` or the search is beyond :data:`SIMILAR_BUDGET`."""
    lines = file_lines(text)
    wanted = old.strip("\n")
    span = min(wanted.count("\n") + 1, max(len(lines), 1))
    if span * span * len(lines) > SIMILAR_BUDGET:
        return None
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(wanted)  # seq2 is the one SequenceMatcher indexes, so index it once
    best, best_ratio = None, SIMILAR_RATIO
    for first in range(max(len(lines) - span + 1, 1)):
        window = "\n".join(lines[first : first + span])
        matcher.set_seq1(window)
        if matcher.real_quick_ratio() < best_ratio or matcher.quick_ratio() < best_ratio:
            continue
        if (ratio := matcher.ratio()) > best_ratio or (best is None and ratio == best_ratio):
            best, best_ratio = (first + 1, window), ratio
    return best


def not_found(text: str, old: str) -> str:
    """The refusal of an ``old_str`` absent from ``text``: it shows the most similar lines, numbered, so
    the next call can quote them from right above it."""
    close = closest_lines(text, old)
    if close is None:
        return "old_str was not found verbatim in the file; view the lines and quote them exactly"
    first, lines = close
    return (
        "old_str was not found verbatim in the file; the most similar lines are below: quote them "
        f"exactly, without the line numbers\n{numbered(lines, first)}"
    )


def replace_unique(text: str, old: str, new: str) -> tuple[str, int]:
    """``text`` with the one occurrence of ``old`` replaced by ``new``, and the line it started on."""
    if not old:
        raise EditError("old_str is empty")
    if old == new:  # answered as an edit, a no-op reads like a fix to the model
        raise EditError("old_str and new_str are the same: the edit would change nothing")
    count = text.count(old)
    if count == 0:
        raise EditError(not_found(text, old))
    if count > 1:
        starts, at = [], -1
        while (at := text.find(old, at + 1)) != -1:
            starts.append(text.count("\n", 0, at) + 1)
        raise EditError(
            f"old_str occurs {count} times (lines {starts}); include more context to make it unique"
        )
    at = text.index(old)
    return text[:at] + new + text[at + len(old) :], text.count("\n", 0, at) + 1


def insert_after(text: str, line: int, new: str) -> str:
    """``text`` with ``new`` inserted after line ``line`` (0: at the top)."""
    lines = text.split("\n") if text else []
    if text.endswith("\n"):
        lines = lines[:-1]
    if not 0 <= line <= len(lines):
        raise EditError(f"insert_line {line} is outside 0..{len(lines)}")
    added = new[:-1].split("\n") if new.endswith("\n") else new.split("\n")
    out = lines[:line] + added + lines[line:]
    return "\n".join(out) + ("\n" if text.endswith("\n") or not text else "")


def snippet(text: str, line: int, added: int) -> str:
    """The numbered lines around lines ``line .. line + added - 1`` of ``text``."""
    lines = text.split("\n")
    first = max(line - SNIPPET_LINES, 1)
    last = min(line + added - 1 + SNIPPET_LINES, len(lines))
    return numbered("\n".join(lines[first - 1 : last]), first)


def resolve(path: object) -> str:
    """The absolute path inside the working tree that ``path`` names."""
    if not isinstance(path, str) or not path.strip():
        raise EditError("path must be a non-empty string")
    full = os.path.normpath(path if path.startswith("/") else os.path.join(ROOT, path))
    if full != ROOT and not full.startswith(ROOT + "/"):
        raise EditError(f"{path} is outside the repository ({ROOT})")
    return full


def _history(full: str) -> str:
    return os.path.join(STATE, "undo-" + hashlib.sha256(full.encode()).hexdigest()[:16] + ".json")


def _stack(hist: str) -> list[str | None]:
    if not os.path.exists(hist):
        return []
    with open(hist) as fh:
        return list(json.load(fh))


def _push(full: str, before: str | None) -> None:
    hist = _history(full)
    stack = _stack(hist)
    stack.append(before)
    with open(hist, "w") as fh:
        json.dump(stack, fh)


def _walk(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk`` of ``top`` in name order, leaving out hidden folders and ``__pycache__``."""
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        yield dirpath, dirnames, filenames


def same_name(full: str, root: str = ROOT) -> list[str]:
    """Files of the tree under ``root`` named as ``full`` is (relative paths, at most 5): a small model
    often gets the package directory wrong and the module right, and the refusal then names the way on."""
    name = os.path.basename(full)
    found = []
    for dirpath, _, filenames in _walk(root):
        if name in filenames:
            found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return found[:5]


def _read(full: str) -> str:
    if not os.path.isfile(full):
        others = same_name(full) if not os.path.isdir(full) else []
        hint = f"; files of that name: {', '.join(others)}" if others else ""
        raise EditError(f"{full} does not exist or is not a file{hint}")
    with open(full, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def _write(full: str, text: str) -> None:
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as fh:
        fh.write(text)


def _listing(full: str) -> str:
    names = []
    for dirpath, dirnames, filenames in _walk(full):
        depth = dirpath[len(full) :].count("/")
        if depth >= 2:
            dirnames[:] = []
        names += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in sorted(filenames)]
    shown = names[:MAX_LISTED]
    more = f"\n... and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return "\n".join(shown) + more


def run(request: dict[str, object]) -> str:
    """Carry out one request (module docstring); raises EditError with the reason it is refused."""
    command = request.get("command")
    full = resolve(request.get("path"))
    rel = os.path.relpath(full, ROOT)
    if command == "view":
        if os.path.isdir(full):
            return _listing(full)
        view_range = request.get("view_range")
        return view_lines(_read(full), view_range if isinstance(view_range, list) else None)
    if command == "create":
        text = request.get("file_text")
        if not isinstance(text, str):
            raise EditError("create needs file_text")
        if os.path.exists(full):
            raise EditError(f"{rel} already exists; use str_replace or insert to change it")
        _write(full, text)
        _push(full, None)
        return f"created {rel}"
    if command == "str_replace":
        old, new = request.get("old_str"), request.get("new_str", "")
        if not isinstance(old, str) or not isinstance(new, str):
            raise EditError("str_replace needs old_str and new_str strings")
        before = _read(full)
        after, line = replace_unique(before, old, new)
        _write(full, after)
        _push(full, before)
        shown = snippet(after, line, new.count("\n") + 1)
        return f"edited {rel}; the lines around the change now read:\n{shown}"
    if command == "insert":
        line, new = request.get("insert_line"), request.get("new_str")
        if not isinstance(line, int) or not isinstance(new, str):
            raise EditError("insert needs an integer insert_line and a new_str string")
        before = _read(full)
        after = insert_after(before, line, new)
        _write(full, after)
        _push(full, before)
        shown = snippet(after, line + 1, new.count("\n") + 1)
        return f"inserted into {rel}; the lines around it now read:\n{shown}"
    if command == "undo_edit":
        hist = _history(full)
        stack = _stack(hist)
        if not stack:
            raise EditError(f"no edit of {rel} to undo")
        before = stack.pop()
        with open(hist, "w") as fh:
            json.dump(stack, fh)
        if before is None:
            os.remove(full)
            return f"undid the creation of {rel}"
        _write(full, before)
        return f"undid the last edit of {rel}"
    raise EditError(f"unknown command {command!r}: view, create, str_replace, insert or undo_edit")


def main() -> int:
    try:
        request = json.loads(sys.stdin.read())
        if not isinstance(request, dict):
            raise EditError("the request must be a JSON object")
        print(run(request))
    except EditError as exc:
        print(f"error: {exc}")
        return 1
    except (OSError, ValueError) as exc:
        print(f"error: {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
