"""Validate and apply untrusted unified diffs to a repository copy, refusing anything unsafe.

A model's patch is applied on the host (as the evaluating user) before the tests run
in the sandbox, so this module is part of the trust boundary. It parses the diff
itself rather than handing it to ``git apply``, and refuses, with a reason:

- paths that are absolute, contain ``..``, ``.`` or empty components, backslashes or NUL,
  or that touch ``.git`` (any case);
- symlinks: a patch creating one (mode 120000), or a target path that passes through
  a symlink already in the repository;
- binary patches (``GIT binary patch``, ``Binary files ... differ``, NUL bytes);
- patches larger than the configured limit;
- renames and copies (git extended headers), which model patches do not need;
- hunks whose context does not match the file exactly (no fuzz; an offset is allowed).

Nothing is written unless every file of the patch applies. Writes use ``O_NOFOLLOW``.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FilePatch",
    "Hunk",
    "PatchError",
    "apply_patch",
    "apply_patch_to_files",
    "check_path",
    "diff_lines",
    "file_diff",
    "parse_patch",
    "read_file",
    "write_file",
]

NO_NEWLINE = "\\ No newline at end of file"
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_ALLOWED_MODES = {"100644", "100755"}
_REFUSED_HEADERS = ("rename from", "rename to", "copy from", "copy to")


class PatchError(ValueError):
    """A patch that is refused or does not apply; the message is the recorded reason."""


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` hunk; ``lines`` holds (tag, text), tag in ``' -+'``, text with its newline if any."""

    old_start: int
    old_len: int
    lines: tuple[tuple[str, str], ...]

    @property
    def old_lines(self) -> list[str]:
        """The lines the hunk expects to find (context and removals)."""
        return [text for tag, text in self.lines if tag in " -"]

    @property
    def new_lines(self) -> list[str]:
        """The lines the hunk leaves in their place (context and additions)."""
        return [text for tag, text in self.lines if tag in " +"]


@dataclass(frozen=True)
class FilePatch:
    """The changes to one file: ``old_path`` None means created, ``new_path`` None means deleted."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        """The repository path this patch touches."""
        return self.new_path or self.old_path or ""


def check_path(path: str) -> str:
    """Return ``path`` if it is a safe relative repository path, else raise PatchError saying why."""
    if not path:
        raise PatchError("empty path")
    if "\\" in path or any(ord(c) < 32 for c in path):
        raise PatchError(f"path {path!r} contains a control character or a backslash")
    if path.startswith("/"):
        raise PatchError(f"absolute path {path!r} is outside the repository")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise PatchError(f"path {path!r} has an empty, '.' or '..' component (escapes or is ambiguous)")
    if any(p.lower() == ".git" for p in parts):
        raise PatchError(f"path {path!r} touches .git")
    return path


def _header_path(raw: str, prefix: str) -> str | None:
    """The path on a ``---``/``+++`` line without its a/ or b/ prefix; None for /dev/null."""
    name = raw.split("\t", 1)[0].rstrip("\r\n")
    if name == "/dev/null":
        return None
    if name.startswith('"'):
        raise PatchError(f"quoted path {name} is not supported")
    if name.startswith(prefix):
        name = name[len(prefix) :]
    return check_path(name)


def _parse_hunk(lines: list[str], i: int, header: re.Match[str]) -> tuple[Hunk, int]:
    """Parse the hunk body after the header at ``lines[i - 1]``; return it and the next index."""
    old_len = int(header.group(2) or 1)
    new_len = int(header.group(4) or 1)
    body: list[tuple[str, str]] = []
    old_seen = new_seen = 0
    while old_seen < old_len or new_seen < new_len:
        if i >= len(lines):
            raise PatchError(f"hunk {header.group(0)} ends early: expected {old_len} old/{new_len} new lines")
        line = lines[i]
        tag, text = (line[0], line[1:]) if line not in ("\n", "") else (" ", line)
        if tag not in " -+":
            raise PatchError(f"hunk {header.group(0)}: unexpected line {line.rstrip()!r}")
        body.append((tag, text if text.endswith("\n") else text + "\n"))
        old_seen += tag in " -"
        new_seen += tag in " +"
        i += 1
        if i < len(lines) and lines[i].startswith(NO_NEWLINE):
            body[-1] = (tag, body[-1][1][:-1])
            i += 1
    return Hunk(int(header.group(1)), old_len, tuple(body)), i


def _check_extended_header(line: str) -> None:
    if line.startswith(_REFUSED_HEADERS):
        raise PatchError(f"renames and copies are not supported ({line.strip()})")
    if line.startswith(("GIT binary patch", "Binary files ")):
        raise PatchError("binary patches are refused")
    for key in ("new file mode ", "deleted file mode ", "new mode ", "old mode "):
        if line.startswith(key):
            mode = line[len(key) :].strip()
            if mode == "120000":
                raise PatchError("patch creates or changes a symlink")
            if mode not in _ALLOWED_MODES:
                raise PatchError(f"unsupported file mode {mode}")


def diff_lines(text: str) -> list[str]:
    """``text`` cut into lines as ``git apply`` cuts them: only LF ends a line (with its ends kept).
    ``str.splitlines`` also cuts at form feeds, vertical tabs and U+2028, which Python source and
    git keep inside a line."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    return [*out, lines[-1]] if lines[-1] else out


def parse_patch(text: str, max_bytes: int) -> list[FilePatch]:
    """Parse a unified diff into per-file patches, refusing unsafe or oversized ones.

    Raises:
        PatchError: the patch is refused or malformed; the message says why.
    """
    size = len(text.encode("utf-8", errors="replace"))
    if size > max_bytes:
        raise PatchError(f"patch is {size} bytes, over the {max_bytes}-byte limit")
    if "\0" in text:
        raise PatchError("binary patches are refused (NUL byte)")
    lines = diff_lines(text)
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            i += 1
            while i < len(lines) and not lines[i].startswith(("--- ", "diff --git ")):
                _check_extended_header(lines[i])
                i += 1
            continue
        _check_extended_header(line)
        if not line.startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"'---' header without '+++' line: {line.rstrip()!r}")
        old_path, new_path = _header_path(line[4:], "a/"), _header_path(lines[i + 1][4:], "b/")
        if old_path is None and new_path is None:
            raise PatchError("a file patch from /dev/null to /dev/null")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and (match := _HUNK_RE.match(lines[i])):
            hunk, i = _parse_hunk(lines, i + 1, match)
            hunks.append(hunk)
        if not hunks:
            raise PatchError(f"file patch for {new_path or old_path} has no hunks")
        patches.append(FilePatch(old_path, new_path, tuple(hunks)))
    if not patches:
        raise PatchError("no file patches found (empty or not a unified diff)")
    seen = [p.path for p in patches]
    if len(set(seen)) != len(seen):
        raise PatchError("the patch touches the same file twice")
    return patches


def _find(file_lines: list[str], old: list[str], expected: int, lowest: int) -> int | None:
    """Start index of ``old`` in ``file_lines`` at or after ``lowest``, nearest to ``expected``."""
    last = len(file_lines) - len(old)
    candidates = sorted(range(lowest, last + 1), key=lambda pos: abs(pos - expected))
    return next((pos for pos in candidates if file_lines[pos : pos + len(old)] == old), None)


def _apply_file(fp: FilePatch, old_text: str | None) -> str | None:
    """New text of one file (None when deleted); raises PatchError when a hunk does not match."""
    if fp.old_path is None and old_text is not None:
        raise PatchError(f"{fp.path}: patch creates the file but it already exists")
    if fp.old_path is not None and old_text is None:
        raise PatchError(f"{fp.path}: patch modifies a file that does not exist")
    file_lines = diff_lines(old_text or "")
    out: list[str] = []
    cursor = 0
    for n, hunk in enumerate(fp.hunks, start=1):
        expected = hunk.old_start if hunk.old_len == 0 else hunk.old_start - 1
        pos = _find(file_lines, hunk.old_lines, max(expected, cursor), cursor)
        if pos is None:
            raise PatchError(f"{fp.path}: hunk {n} (@@ -{hunk.old_start},{hunk.old_len}) does not apply")
        out += file_lines[cursor:pos] + hunk.new_lines
        cursor = pos + len(hunk.old_lines)
    new_text = "".join(out + file_lines[cursor:])
    if fp.new_path is None:
        if new_text:
            raise PatchError(f"{fp.path}: deletion leaves content behind")
        return None
    return new_text


def apply_patch_to_files(files: Mapping[str, str], text: str, max_bytes: int = 1 << 22) -> dict[str, str]:
    """Apply a unified diff to an in-memory snapshot (path -> text); returns the new snapshot."""
    result = dict(files)
    for fp in parse_patch(text, max_bytes):
        new_text = _apply_file(fp, result.get(fp.path))
        if new_text is None:
            result.pop(fp.path)
        else:
            result[fp.path] = new_text
    return result


def _safe_target(root: Path, path: str) -> Path:
    """``root / path``, refusing it when any existing component is a symlink or not a directory."""
    current = root
    parts = path.split("/")
    for i, part in enumerate(parts):
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode):
            raise PatchError(f"{path}: goes through the symlink {'/'.join(parts[: i + 1])}")
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise PatchError(f"{path}: {'/'.join(parts[: i + 1])} is not a directory")
        if i == len(parts) - 1 and not stat.S_ISREG(st.st_mode):
            raise PatchError(f"{path}: not a regular file")
    return root.joinpath(*parts)


def _read_text(target: Path, path: str) -> str | None:
    if not target.exists():
        return None
    try:
        return target.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise PatchError(f"{path}: not a UTF-8 text file") from None


def _write_text(root: Path, path: str, text: str) -> None:
    target = _safe_target(root, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _safe_target(root, path)  # the directories just made must not have raced into symlinks
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)


def read_file(root: Path, path: str) -> str | None:
    """The text of ``root/path`` (None when absent), refusing symlinks and non-UTF-8 files."""
    return _read_text(_safe_target(root, check_path(path)), path)


def write_file(root: Path, path: str, text: str | None) -> None:
    """Write ``text`` to ``root/path`` with the patch's safety checks; None deletes the file."""
    check_path(path)
    if text is not None:
        _write_text(root, path, text)
    elif os.path.lexists(_safe_target(root, path)):
        os.unlink(_safe_target(root, path))


def apply_patch(root: Path, text: str, max_bytes: int) -> list[str]:
    """Apply a unified diff to the repository at ``root``; all files or none. Returns the paths touched.

    Raises:
        PatchError: the patch is refused or does not apply; nothing was written.
    """
    new_texts: dict[str, str | None] = {}
    for fp in parse_patch(text, max_bytes):
        target = _safe_target(root, fp.path)
        if fp.old_path is not None and fp.new_path is not None and fp.old_path != fp.new_path:
            raise PatchError(f"{fp.old_path} -> {fp.new_path}: renames are not supported")
        new_texts[fp.path] = _apply_file(fp, _read_text(target, fp.path))
    for path, new_text in new_texts.items():
        if new_text is None:
            os.unlink(_safe_target(root, path))
        else:
            _write_text(root, path, new_text)
    return list(new_texts)


def _mark_no_newline(lines: list[str]) -> list[str]:
    return [line if line.endswith("\n") else f"{line}\n{NO_NEWLINE}\n" for line in lines]


def file_diff(path: str, old: str | None, new: str | None) -> str:
    """A git-style unified diff of one file (``old``/``new`` None: created/deleted); '' if equal."""
    if old == new:
        return ""
    header = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        header.append("new file mode 100644\n")
    if new is None:
        header.append("deleted file mode 100644\n")
    body = difflib.unified_diff(
        diff_lines(old or ""),
        diff_lines(new or ""),
        fromfile="/dev/null" if old is None else f"a/{path}",
        tofile="/dev/null" if new is None else f"b/{path}",
    )
    lines = list(body)
    return "".join(header + lines[:2] + _mark_no_newline(lines[2:]))
