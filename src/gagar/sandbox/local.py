"""The local sandbox backend: each evaluation in a fresh repository copy under bubblewrap.

For one (task, prediction): create a workspace, write the repository, apply the model
patch, reset every test file, conftest.py and runner setting it touched to the task's
version (:mod:`gagar.sandbox.pristine`), then apply the task's test patch (refused or
non-applying patches end as ``failed`` with the reason); hand the repository to a sandbox
uid, run the test command isolated (see :mod:`gagar.sandbox.isolation`) with pytest pinned,
a deadline and an output cap, read per-test outcomes from the judge plugin's report, judge
the run (:func:`gagar.sandbox.verdict.judge`: hacks, report and exit-status checks) and
remove the workspace. Anything that goes
wrong with the machinery (missing tool, workspace not creatable, sandbox not started)
ends as ``infra_error``. A thread pool runs many at once; each run holds its uid under
an exclusive lease (:mod:`gagar.sandbox.uids`), so that killing the uid's processes
after the run can never hit another evaluation's sandbox, in this process or another.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import sys
import time
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gagar.sandbox.base import Prediction, ProgressCallback
from gagar.sandbox.forkserver import NONCE_FD, REPORT_FD, Worker, WorkerError, WorkerPool, forkable
from gagar.sandbox.hacks import JudgeConfig, reset_flags, source_flags
from gagar.sandbox.isolation import SANDBOX_JUDGE, SANDBOX_REPO, sandbox_argv, sandbox_env, venv_of
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.patch import PatchError, apply_patch
from gagar.sandbox.pool import run_pool
from gagar.sandbox.pristine import (
    MONITOR_MODULE,
    Channels,
    Pristine,
    Reference,
    apply_pristine,
    config_file,
    judged_paths,
    open_channels,
    pytest_env,
    read_report,
    reference,
    watch_spec,
    write_judge_dir,
)
from gagar.sandbox.process import RunOutcome, kill_uid, run_bounded
from gagar.sandbox.uids import UidsBusyError, lease_uid
from gagar.sandbox.verdict import exit_reason, judge
from gagar.sandbox.workspace import (
    Workspace,
    WorkspaceError,
    hand_over,
    materialize,
    sweep_orphans,
    workspace,
)
from gagar.schema.result import HackFlag, Status, TestResult
from gagar.schema.task import Task
from gagar.scratch import scratch_root

__all__ = [
    "DEFAULT_TEST_CMD",
    "MONITOR_SOURCE",
    "PLUGIN_SOURCE",
    "InfraError",
    "LocalBackend",
    "LocalSandboxSettings",
    "clear_uid",
    "tool_path",
]

DEFAULT_TEST_CMD = "python -m pytest -q"
"""Run inside the sandbox; PYTEST_ADDOPTS pins pytest and loads the judge's plugin."""
PLUGIN_SOURCE = resources.files("gagar.sandbox").joinpath("judge_plugin.py").read_text(encoding="utf-8")
MONITOR_SOURCE = resources.files("gagar.sandbox").joinpath("judge_monitor.py").read_text(encoding="utf-8")


def _unchecked_pyc(module: str, source: str) -> tuple[str, bytes]:
    """``module``'s byte code for this interpreter's version, as an unchecked-hash ``.pyc`` (PEP 552):
    valid whatever the file times, so written once, copied into every judge folder."""
    code = compile(source, f"{module}.py", "exec", dont_inherit=True)
    flags = (0b01).to_bytes(4, "little")  # hash-based, not checked against the source
    data = (
        importlib.util.MAGIC_NUMBER
        + flags
        + importlib.util.source_hash(source.encode())
        + marshal.dumps(code)
    )
    return f"{module}.{sys.implementation.cache_tag}.pyc", data


MONITOR_PYC = _unchecked_pyc(MONITOR_MODULE, MONITOR_SOURCE)


class Prepared(NamedTuple):
    """A repository ready to test: the flags found in the model patch, what the monitor watches,
    and the pristine test files compiled on this side."""

    flags: list[HackFlag]
    pristine: Pristine | None
    judged: set[str]
    ref: Reference


class InfraError(RuntimeError):
    """The sandbox machinery failed; the evaluation says nothing about the patch."""


class LocalSandboxSettings(BaseSettings):
    """Where the local backend finds its tools and puts its workspaces (``GAGAR_LOCAL_SANDBOX__<FIELD>``)."""

    model_config = SettingsConfigDict(env_prefix="GAGAR_LOCAL_SANDBOX__", frozen=True, extra="ignore")

    bwrap: str = "bwrap"
    """bubblewrap executable (env GAGAR_LOCAL_SANDBOX__BWRAP)."""
    setpriv: str = "setpriv"
    """util-linux setpriv, drops to the slot uid (env GAGAR_LOCAL_SANDBOX__SETPRIV)."""
    prlimit: str = "prlimit"
    """util-linux prlimit, sets the rlimits (env GAGAR_LOCAL_SANDBOX__PRLIMIT)."""
    python: str = "/usr/bin/python3"
    """Interpreter inside the sandbox unless the task names one (env GAGAR_LOCAL_SANDBOX__PYTHON)."""
    base_uid: int = Field(61000, ge=1000)
    """First sandbox uid; worker slot i prefers base_uid + i (env GAGAR_LOCAL_SANDBOX__BASE_UID)."""
    uid_count: int = Field(256, ge=1)
    """Sandbox uids are base_uid .. base_uid + uid_count - 1, shared by every evaluator on the
    machine through leases (env GAGAR_LOCAL_SANDBOX__UID_COUNT)."""
    uid_lock_dir: Path = Path("/run/lock/gagar-sandbox")
    """Lease files of the sandbox uids, one per uid; every evaluator on the machine must use
    the same folder (env GAGAR_LOCAL_SANDBOX__UID_LOCK_DIR)."""
    work_root: Path | None = None
    """Parent of the workspaces; None means :func:`gagar.scratch.scratch_root` (``/dev/shm`` when it
    is a roomy tmpfs, else the system temp dir) (env GAGAR_LOCAL_SANDBOX__WORK_ROOT)."""
    repos_dir: Path | None = None
    """Local clones <repos_dir>/<owner>/<name> for base_commit tasks (env GAGAR_LOCAL_SANDBOX__REPOS_DIR)."""
    forkserver: bool = True
    """Run ``python -m pytest`` evaluations in a pre-started worker per slot that forks each one into
    namespaces of its own (:mod:`gagar.sandbox.forkserver`); False starts a sandbox per evaluation
    (env GAGAR_LOCAL_SANDBOX__FORKSERVER)."""


def tool_path(name: str) -> str:
    """The path of the sandbox tool ``name`` (bwrap, setpriv, prlimit); InfraError when it is missing."""
    path = shutil.which(name)
    if path is None:
        raise InfraError(f"sandbox tool {name!r} not found (install it: scripts/install-system-deps.sh)")
    return path


def _started(marker: Path) -> bool:
    """Whether the shell inside the sandbox reported that it started (see ``sandbox_argv``)."""
    return marker.is_file() and marker.read_text(errors="replace").strip() == "started"


class LocalBackend:
    """SandboxBackend running tests on this machine under bubblewrap, ``workers`` at a time.

    ``isolate=False`` runs the very same commands without prlimit, setpriv or bwrap: only
    for measuring the sandbox's overhead on trusted code (benchmarks/sandbox.py).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        settings: LocalSandboxSettings | None = None,
        workers: int | None = None,
        *,
        isolate: bool = True,
        judge: JudgeConfig | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.settings = settings or LocalSandboxSettings()
        self.judge = judge or JudgeConfig()
        self.workers = workers or os.cpu_count() or 1
        self.isolate = isolate
        self.work_root = self.settings.work_root or scratch_root()
        """Where this backend's workspaces and worker folders go."""
        sweep_orphans(self.work_root)

    def evaluate(
        self, jobs: Iterable[tuple[Task, Prediction]], on_result: ProgressCallback | None = None
    ) -> list[TestResult]:
        """One TestResult per job, in order, each started as soon as it arrives and a slot is free;
        never raises for a bad patch or a broken sandbox."""
        if not (self.isolate and self.settings.forkserver):
            return run_pool(jobs, self.evaluate_one, self.workers, on_result)
        pool = WorkerPool(self._start_worker)
        try:
            return run_pool(
                jobs,
                lambda task, pred, slot: self.evaluate_one(task, pred, slot, pool),
                self.workers,
                on_result,
            )
        finally:
            pool.close()

    def _start_worker(self, slot: int) -> Worker:
        s = self.settings
        try:
            tools = (tool_path(s.prlimit), tool_path(s.setpriv), tool_path(s.bwrap))
        except InfraError as exc:
            raise WorkerError(str(exc)) from exc
        return Worker(
            tools=tools,
            limits=self.limits,
            python=s.python,
            uid_lease=(s.uid_lock_dir, s.base_uid, s.uid_count, slot),
            work_root=self.work_root,
        )

    def evaluate_one(
        self, task: Task, pred: Prediction, slot: int = 0, workers: WorkerPool | None = None
    ) -> TestResult:
        """Evaluate one prediction as worker slot ``slot`` (in the slot's forkserver worker when
        ``workers`` has one and the task's command allows it); any machinery failure is an infra_error."""
        start = time.monotonic()
        base = {"trajectory_id": pred.key, "instance_id": pred.instance_id}
        args = forkable(task.test_cmd or DEFAULT_TEST_CMD) if task.environment.python is None else None
        worker = workers.for_slot(slot) if workers is not None and args is not None else None
        try:
            with workspace(worker.work if worker is not None else self.work_root) as ws:
                prepared = self._prepare(task, pred, ws)
                if isinstance(prepared, str):
                    return TestResult(**base, status=Status.FAILED, reason=prepared, duration_s=_since(start))
                channels = open_channels(self.limits.max_report_bytes)
                try:
                    if worker is not None and args is not None:
                        run = self._run_in_worker(worker, ws, args, channels, prepared)
                    else:
                        run = self._run(task, ws, slot, channels, prepared)
                    data = channels.report.collect()
                    report = read_report(data, channels.nonce, self.limits.max_report_bytes)
                finally:
                    channels.close()
        except WorkerError as exc:
            if workers is not None:
                workers.discard(slot)
            reason = f"{type(exc).__name__}: {exc}"
            return TestResult(**base, status=Status.INFRA_ERROR, reason=reason, duration_s=_since(start))
        except (InfraError, WorkspaceError, UidsBusyError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            return TestResult(**base, status=Status.INFRA_ERROR, reason=reason, duration_s=_since(start))
        j = judge(run, report, task, prepared.flags, self.judge, prepared.ref)
        return TestResult(
            **base, status=j.status, resolved=j.resolved, tests=j.tests, reason=j.reason, hacks=j.hacks,
            duration_s=_since(start), log=run.log,
        )  # fmt: skip

    def _prepare(self, task: Task, pred: Prediction, ws: Workspace) -> Prepared | str:
        """Write the repository, apply the model patch pristinely, then the test patch, and compile the
        pristine test files.

        Returns what the run needs, or the reason the patch was refused.
        """
        materialize(task, ws.repo, self.settings.repos_dir)
        write_judge_dir(ws.judge, PLUGIN_SOURCE, MONITOR_SOURCE, MONITOR_PYC)
        flags: list[HackFlag] = []
        done: Pristine | None = None
        expected = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
        judged = judged_paths(expected, task.test_patch)
        if pred.model_patch.strip():
            cfg = self.judge
            try:
                done = apply_pristine(
                    ws.repo,
                    pred.model_patch,
                    self.limits.max_patch_bytes,
                    judged,
                    cfg.shadowed,
                    cfg.test_dirs,
                )
            except PatchError as exc:
                return f"model patch refused or did not apply: {exc}"
            flags = reset_flags(done.resets) + source_flags(done.sources, done.own_packages, cfg.checks)
        if task.test_patch.strip():
            try:
                # the test patch comes with the task, not the model: no size limit, same safety checks
                apply_patch(ws.repo, task.test_patch, max_bytes=len(task.test_patch.encode()) + 1)
            except PatchError as exc:
                return f"test patch did not apply after the model patch: {exc}"
        ref = reference(ws.repo, {t.split("::", 1)[0] for t in expected})
        return Prepared(flags, done, judged, ref)

    def _env(
        self, repo: str, judge_dir: str, ws: Workspace, fds: tuple[int, int], prep: Prepared
    ) -> dict[str, str]:
        """The judge's pinning and the monitor's watch list for a repository seen at ``repo``."""
        watch = watch_spec(repo, judge_dir, prep.pristine, prep.judged, self.judge.test_dirs)
        return pytest_env(repo, judge_dir, config_file(ws.repo), fds, watch)

    def _run(self, task: Task, ws: Workspace, slot: int, channels: Channels, prep: Prepared) -> RunOutcome:
        command = task.test_cmd or DEFAULT_TEST_CMD
        python = task.environment.python or self.settings.python
        if not os.access(python, os.X_OK):
            raise InfraError(f"interpreter {python} not found or not executable")
        if not self.isolate:
            env = {**sandbox_env(python), **self._env(str(ws.repo), str(ws.judge), ws, channels.fds, prep)}
            return self._run_unisolated(command, python, ws, env, channels.fds)
        env = {**sandbox_env(python), **self._env(SANDBOX_REPO, SANDBOX_JUDGE, ws, channels.fds, prep)}
        tools = (
            tool_path(self.settings.prlimit),
            tool_path(self.settings.setpriv),
            tool_path(self.settings.bwrap),
        )
        s = self.settings
        with lease_uid(s.uid_lock_dir, s.base_uid, s.uid_count, prefer=slot) as uid:
            clear_uid(uid)  # a holder that died mid-run may have left processes behind
            hand_over(ws, uid)
            marker = ws.root / "started"
            with open(marker, "wb") as status:
                argv = sandbox_argv(
                    tools=tools, uid=uid, limits=self.limits, repo=ws.repo, judge=ws.judge, python=python,
                    started_fd=status.fileno(), command=command,
                )  # fmt: skip
                run = self._bounded(argv, env, ws.repo, (status.fileno(), *channels.fds))
            clear_uid(uid)  # before the lease goes: the next holder starts with an idle uid
        if not _started(marker):
            how, output = exit_reason(run.returncode), run.log.strip()[-500:] or "no output"
            raise InfraError(f"bubblewrap did not start the sandbox ({how}): {output}")
        return run

    def _run_in_worker(
        self, worker: Worker, ws: Workspace, args: list[str], channels: Channels, prep: Prepared
    ) -> RunOutcome:
        env = {
            **sandbox_env(worker.python),
            **self._env(SANDBOX_REPO, SANDBOX_JUDGE, ws, (NONCE_FD, REPORT_FD), prep),
        }
        hand_over(ws, worker.uid)
        return worker.run(ws.root, env, args, channels.fds)

    def _run_unisolated(
        self, command: str, python: str, ws: Workspace, env: dict[str, str], fds: tuple[int, ...]
    ) -> RunOutcome:
        if venv_of(python) is None:  # a venv's bin is already first on PATH (sandbox_env)
            bin_dir = ws.root / "bin"
            bin_dir.mkdir()
            (bin_dir / "python").symlink_to(python)
            env = {**env, "PATH": f"{bin_dir}:{env['PATH']}"}
        return self._bounded(["/bin/sh", "-c", command], env, ws.repo, fds)

    def _bounded(self, argv: list[str], env: dict[str, str], cwd: Path, fds: tuple[int, ...]) -> RunOutcome:
        lim = self.limits
        return run_bounded(
            argv, env=env, cwd=str(cwd), wall_time_s=lim.wall_time_s, max_output_bytes=lim.max_output_bytes,
            log_chars=lim.log_chars, pass_fds=fds,
        )  # fmt: skip


def clear_uid(uid: int) -> None:
    """Kill every process of the leased ``uid``: by the lease, none belongs to another evaluation."""
    if (left := kill_uid(uid)) > 0:
        raise InfraError(f"{left} process(es) of sandbox uid {uid} survived SIGKILL")


def _since(start: float) -> float:
    return time.monotonic() - start
