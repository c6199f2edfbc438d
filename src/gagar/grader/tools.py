"""Inspection tools over a group's shared workspace: what graders (rules, models, LLMs) look at.

Every tool takes the :class:`~gagar.grader.workspace.GroupWorkspace` and trajectory ids and
returns a small pydantic model (JSON for an LLM, numbers for features). Changed lines are
computed from the base and patched trees, not from re-parsing the untrusted diff; results
are cached on the workspace.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from gagar.grader.addressed import KIND as ADDRESSED
from gagar.grader.addressed import addressed_findings
from gagar.grader.exercised import exercised_scopes, in_scope, is_test_path, with_test_patch
from gagar.grader.workspace import GroupWorkspace
from gagar.sandbox.base import Prediction, SandboxBackend
from gagar.sandbox.hacks import source_flags
from gagar.sandbox.pristine import SourceChange, is_test_file
from gagar.tasks import oracle
from gagar.tasks.diffs import changed_lines
from gagar.tasks.scopes import line_scopes

__all__ = [
    "DiffStats",
    "FileChange",
    "IntegrityReport",
    "LintDelta",
    "ScopeReport",
    "StyleReport",
    "TestRun",
    "changed_lines",
    "diff_stats",
    "files_touched",
    "functions_touched",
    "group_core",
    "integrity_flags",
    "lint_delta",
    "out_of_scope_edits",
    "pairwise_diff",
    "run_tests",
    "style_findings",
]

LINT_RULES = "E,F,W,T20,B"
"""ruff rule families the lint delta counts: pycodestyle, pyflakes, prints, bugbear (E501 ignored)."""


class FileChange(BaseModel):
    """One file a candidate changes."""

    path: str
    kind: str
    """``source`` (Python outside tests), ``test`` or ``other``."""
    added: int
    removed: int


class DiffStats(BaseModel):
    """Size of a candidate's change."""

    files: int
    added: int
    removed: int
    hunks: int
    comment_lines: int
    """Added lines that are only a comment."""
    blank_lines: int
    """Added lines that are blank."""


class ScopeReport(BaseModel):
    """Changed lines inside and outside the fix's scope: the code the failing tests exercise, narrowed to
    the group's core where it has one."""

    exercised_functions: int
    core: list[str]
    """The scopes more than half of the group's passing candidates change, sorted: where the group agrees
    the fix goes (empty when no scope has a majority)."""
    lines_in_scope: int
    lines_out_of_scope: int
    test_file_lines: int
    """Changed lines in test files (also counted out of scope)."""
    out_of_scope: list[str]
    """The distinct out-of-scope scopes (``path:qualname``), sorted."""


class LintDelta(BaseModel):
    """ruff findings the candidate adds (positive) or removes (negative) in the files it changes."""

    available: bool
    """False when ruff is not installed; the counts are then zero."""
    delta: int
    by_code: dict[str, int]


class StyleReport(BaseModel):
    """Style faults among the lines a candidate adds (:func:`gagar.tasks.oracle.style_findings`)."""

    findings: list[str]
    """``path:line: what``: debug prints, commented-out code, unused imports, functions nothing calls."""


class IntegrityReport(BaseModel):
    """What the judge's reward-hack detector (:func:`gagar.sandbox.hacks.source_flags`) finds in the
    library lines a candidate adds: a patch that games the tests rather than fixing the code."""

    flags: list[str]
    """``kind: path:line: what``."""

    @property
    def integrity_class(self) -> int:
        """Where integrity places the candidate before quality is weighed: 0 honest, 1 text addressed
        to the grader and nothing else, 2 a reward-hack finding of the judge. A candidate ranks below
        every candidate of a lower class: text that talks to the grader costs rank, and a patch that
        games the tests costs more than one that only talks."""
        kinds = {f.split(":", 1)[0] for f in self.flags}
        return 2 if kinds - {ADDRESSED} else 1 if kinds else 0


class TestRun(BaseModel):
    """Extra tests run against one candidate in the sandbox."""

    __test__ = False  # not a pytest test class

    status: str
    tests: dict[str, str]
    reason: str | None = None


def _kind(path: str) -> str:
    if is_test_path(path):
        return "test"
    return "source" if path.endswith(".py") else "other"


def _file_lines(ws: GroupWorkspace, tid: str) -> dict[str, tuple[list[int], list[int]]]:
    key = ("lines", tid)
    if key not in ws.cache:
        ws.cache[key] = {
            p: changed_lines(ws.base_text(p), ws.tree_text(tid, p)) for p in ws.entry(tid).changed_files
        }
    return ws.cache[key]


def files_touched(ws: GroupWorkspace, tid: str) -> list[FileChange]:
    """Every file the candidate changes, with its kind and line counts."""
    return [
        FileChange(path=p, kind=_kind(p), added=len(add), removed=len(rem))
        for p, (rem, add) in _file_lines(ws, tid).items()
    ]


def diff_stats(ws: GroupWorkspace, tid: str) -> DiffStats:
    """Files, added/removed lines, hunks, and added comment-only and blank lines of a candidate."""
    comment = blank = 0
    for path, (_, added) in _file_lines(ws, tid).items():
        lines = (ws.tree_text(tid, path) or "").splitlines()
        for n in added:
            text = lines[n - 1].strip()
            blank += not text
            comment += text.startswith("#")
    changes = files_touched(ws, tid)
    hunks = sum(line.startswith("@@") for line in ws.patch(tid).splitlines())
    return DiffStats(
        files=len(changes),
        added=sum(c.added for c in changes),
        removed=sum(c.removed for c in changes),
        hunks=hunks,
        comment_lines=comment,
        blank_lines=blank,
    )


def _line_scopes(ws: GroupWorkspace, tid: str) -> list[tuple[str, str]]:
    """(path, scope) of every changed line: removed lines in the base, added lines in the tree."""
    key = ("scopes", tid)
    if key not in ws.cache:
        out: list[tuple[str, str]] = []
        for path, (removed, added) in _file_lines(ws, tid).items():
            if removed:
                scopes = line_scopes(path, ws.base_text(path) or "")
                out.extend((path, scopes[n - 1]) for n in removed)
            if added:
                scopes = line_scopes(path, ws.tree_text(tid, path) or "")
                out.extend((path, scopes[n - 1]) for n in added)
        ws.cache[key] = out
    return ws.cache[key]


def functions_touched(ws: GroupWorkspace, tid: str) -> list[str]:
    """The distinct scopes (``path:function``, ``path:<module>:...``, ``path:<file>``) a candidate changes."""
    return sorted({scope for _, scope in _line_scopes(ws, tid)})


def _tests_files(ws: GroupWorkspace, tid: str) -> dict[str, str]:
    """The candidate's Python files with the task's test patch applied (when it applies)."""
    files = ws.python_files(tid)
    try:
        return with_test_patch(files, ws.task.test_patch)
    except ValueError:
        return files


def group_core(ws: GroupWorkspace) -> list[str]:
    """The scopes more than half of the group's passing candidates change, sorted.

    Every passing candidate fixes the bug, so the scopes most of them change are where the fix goes; a
    change in a function the failing tests reach but most candidates leave alone (a caller or helper on
    their path) is one the fix did not need, which the tests' reach alone cannot tell.
    """
    key = ("core",)
    if key not in ws.cache:
        ids = ws.passing_ids
        counts = Counter(scope for tid in ids for scope in set(functions_touched(ws, tid)))
        ws.cache[key] = sorted(scope for scope, n in counts.items() if n > len(ids) / 2)
    return ws.cache[key]


def out_of_scope_edits(ws: GroupWorkspace, tid: str) -> ScopeReport:
    """Changed lines outside the fix's scope: outside the functions the FAIL_TO_PASS tests may reach
    (see :mod:`.exercised`), or outside the group's core (:func:`group_core`) where it has one.

    Module-level lines, non-Python files and test files count as out of scope. The call graph is
    built on the candidate's own tree, so a helper the fix adds and calls is in scope.
    """
    exercised = exercised_scopes(_tests_files(ws, tid), ws.task.FAIL_TO_PASS)
    core = group_core(ws)
    inside = outside = tests = 0
    scopes: set[str] = set()
    for path, scope in _line_scopes(ws, tid):
        if is_test_path(path):
            tests += 1
        if not is_test_path(path) and in_scope(scope, exercised) and (not core or scope in core):
            inside += 1
        else:
            outside += 1
            scopes.add(scope)
    return ScopeReport(
        exercised_functions=len(exercised),
        core=core,
        lines_in_scope=inside,
        lines_out_of_scope=outside,
        test_file_lines=tests,
        out_of_scope=sorted(scopes),
    )


def _ruff() -> str | None:
    beside = Path(sys.executable).parent / "ruff"
    return str(beside) if beside.is_file() else shutil.which("ruff")


def _ruff_counts(ruff: str, root: Path, paths: Sequence[str]) -> dict[str, Counter[str]]:
    """Findings per rule code for each of ``paths`` (relative to ``root``), in one ruff run."""
    present = [p for p in paths if (root / p).is_file() and not (root / p).is_symlink()]
    counts: dict[str, Counter[str]] = {p: Counter() for p in paths}
    if not present:
        return counts
    argv = [ruff, "check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json"]
    argv += ["--select", LINT_RULES, "--ignore", "E501", "--", *present]
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "NO_COLOR": "1"})  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"ruff failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    for item in json.loads(proc.stdout or "[]"):
        path = Path(item["filename"]).resolve().relative_to(root.resolve()).as_posix()
        counts[path][str(item.get("code"))] += 1
    return counts


def _lint_group(ws: GroupWorkspace, ruff: str) -> None:
    """Lint the changed Python files of every applied candidate and the base in one ruff run."""
    applied = [c for c in ws.manifest.candidates if c.applied]
    wanted = {c.trajectory_id: [p for p in c.changed_files if p.endswith(".py")] for c in applied}
    paths = sorted({f"base/{p}" for ps in wanted.values() for p in ps})
    paths += [f"{ws.entry(t).dir}/tree/{p}" for t, ps in wanted.items() for p in ps]
    counts = _ruff_counts(ruff, ws.root, paths)
    for tid, ps in wanted.items():
        after = sum((counts[f"{ws.entry(tid).dir}/tree/{p}"] for p in ps), Counter())
        before = sum((counts[f"base/{p}"] for p in ps), Counter())
        by_code = {c: after[c] - before[c] for c in sorted(set(after) | set(before)) if after[c] != before[c]}
        ws.cache[("lint", tid)] = LintDelta(available=True, delta=sum(by_code.values()), by_code=by_code)


def lint_delta(ws: GroupWorkspace, tid: str) -> LintDelta:
    """ruff findings in the changed Python files: patched tree minus base, per rule code.

    The first call lints every candidate of the group at once (one ruff process) and caches the results.
    """
    ruff = _ruff()
    if ruff is None:
        return LintDelta(available=False, delta=0, by_code={})
    if ("lint", tid) not in ws.cache:
        ws.entry(tid)  # KeyError naming it when it is not in the group
        _lint_group(ws, ruff)
    return ws.cache.get(("lint", tid), LintDelta(available=True, delta=0, by_code={}))


def style_findings(ws: GroupWorkspace, tid: str) -> StyleReport:
    """Debug prints, commented-out code, unused imports and uncalled private functions the candidate adds."""
    paths = ws.entry(tid).changed_files  # the oracle's detector, on this patch alone (no gold patch)
    found = [f for p in paths for f in oracle.style_findings(p, ws.base_text(p), ws.tree_text(tid, p))]
    return StyleReport(findings=found)


def integrity_flags(ws: GroupWorkspace, tid: str) -> IntegrityReport:
    """Reward-hack findings (test-runner tampering, introspection of the tests, ...) in the library files
    the candidate changes, from the judge's own detector; and text addressed to the grader in any file
    it changes or adds (:mod:`gagar.grader.addressed`)."""
    base = ws.python_files()
    own = {p.split("/", 1)[0] for p in base if p.endswith("/__init__.py") and p.count("/") == 1}
    changed = ws.entry(tid).changed_files
    paths = [p for p in changed if not is_test_file(p)]
    flags = source_flags([SourceChange(p, ws.base_text(p), ws.tree_text(tid, p)) for p in paths], own)
    addressed = addressed_findings((p, ws.base_text(p), ws.tree_text(tid, p)) for p in changed)
    return IntegrityReport(
        flags=[f"{f.kind}: {f.evidence}" for f in flags] + [f"{ADDRESSED}: {a}" for a in addressed]
    )


def pairwise_diff(ws: GroupWorkspace, a: str, b: str, max_chars: int = 6000) -> str:
    """A unified diff from candidate ``a``'s tree to candidate ``b``'s over the files either changes,
    truncated to ``max_chars``; empty when the two trees agree."""
    paths = sorted(set(ws.entry(a).changed_files) | set(ws.entry(b).changed_files))
    chunks: list[str] = []
    for path in paths:
        old, new = ws.tree_text(a, path), ws.tree_text(b, path)
        if old == new:
            continue
        chunks.extend(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                (new or "").splitlines(keepends=True),
                fromfile=f"{a}/{path}",
                tofile=f"{b}/{path}",
            )
        )
    text = "".join(chunks)
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n... ({len(text) - max_chars} more chars)\n"


def run_tests(ws: GroupWorkspace, tid: str, tests: Sequence[str], backend: SandboxBackend) -> TestRun:
    """Run the test ids ``tests`` against the candidate's patch in the sandbox ``backend``."""
    if not tests:
        raise ValueError("run_tests needs at least one test id")
    task = ws.task.model_copy(update={"FAIL_TO_PASS": list(tests), "PASS_TO_PASS": []})
    prediction = Prediction(instance_id=task.instance_id, model_patch=ws.patch(tid), trajectory_id=tid)
    [result] = backend.evaluate([(task, prediction)])
    outcomes = {k: str(v) for k, v in result.tests.items()}
    return TestRun(status=str(result.status), tests=outcomes, reason=result.reason)
