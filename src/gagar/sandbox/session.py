"""A persistent sandboxed session per agent trajectory: a shell and a file editor over a working tree.

:class:`LocalSession` keeps one ``bash`` running for the life of a conversation inside the judge's
isolation (:func:`gagar.sandbox.isolation.session_argv`: the same prlimit, setpriv to a leased
non-root uid and bubblewrap namespaces as a test run, no network, nothing of the host writable but
the working tree and the session's private ``/tmp``), with the task's repository as the working tree
at ``/sandbox/repo``. The task's ``test_patch`` never enters it: the tree is the repository at its
base commit, so the hidden tests exist only in the judge's workspace, which the session cannot see.

- :meth:`LocalSession.run` sends one command to the shell (its stdin is ``/dev/null``) and reads its
  output until an end marker that carries a random nonce; a call past its timeout, or whose output
  passes ``limits.max_output_bytes``, kills every process of the session's uid and starts a new
  shell (the files stay). A shell that exits (``exit``, a killed init) is restarted the same way.
- :meth:`LocalSession.edit` runs the editor (:mod:`gagar.sandbox.session_editor`) through that shell,
  so it reads and writes only what the shell can.
- :meth:`LocalSession.patch` stops every process of the session and diffs the working tree against
  the repository as it started (read from the host without following links).

A session's processes die with the process that started them, ``kill -9`` included: bubblewrap's
``--die-with-parent`` kills the sandbox when its parent (the rollout) dies, and the kernel drops the
uid lease with it. The workspace folder is named after its creator's pid and removed by
:func:`gagar.sandbox.workspace.sweep_orphans` once that pid is gone.

On Kubernetes a session is a pod of its own (:mod:`gagar.sandbox.k8s.session`); both kinds share the
commands, markers, timeouts and restarts of :class:`gagar.sandbox.shell_session.ShellSession`, and
:func:`open_session` picks one for the sandbox backend.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import shutil
import subprocess
from pathlib import Path

from gagar.sandbox.isolation import sandbox_env, session_argv
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import InfraError, LocalBackend, LocalSandboxSettings, clear_uid, tool_path
from gagar.sandbox.process import become_subreaper, wait_reaped
from gagar.sandbox.session_pod import SKIPPED_DIRS, read_tree
from gagar.sandbox.shell_session import EDITOR, SessionError, ShellSession, editor_command
from gagar.sandbox.uids import lease_uid
from gagar.sandbox.workspace import hand_over, materialize, workspace
from gagar.schema.task import Task

__all__ = [
    "EDITOR",
    "SKIPPED_DIRS",
    "LocalSession",
    "SessionError",
    "ShellSession",
    "editor_command",
    "open_session",
    "read_tree",
]

_READ_CHUNK = 1 << 16
_prefer = itertools.count()


class LocalSession(ShellSession):
    """A session in the local sandbox (module docstring). Close it (or use it as a context manager)
    on every exit path; a killed rollout's sandbox dies with it regardless."""

    def __init__(
        self,
        task: Task,
        limits: SandboxLimits,
        settings: LocalSandboxSettings,
        work_root: Path | None,
        max_chars: int,
    ) -> None:
        super().__init__(limits, max_chars)
        become_subreaper()  # so that closing reaps the sandbox's orphaned init at once
        self.settings = settings
        self.python = task.environment.python or settings.python
        self._stack = contextlib.ExitStack()
        self._shell: subprocess.Popen[bytes] | None = None
        try:
            ws = self._stack.enter_context(workspace(work_root))
            materialize(task, ws.repo, settings.repos_dir)
            self.repo = ws.repo
            self.original = read_tree(ws.repo, limits.max_patch_bytes)
            self.state, self.tools_dir = ws.root / "state", ws.root / "tools"
            self.state.mkdir()
            self.tools_dir.mkdir(mode=0o755)
            shutil.copyfile(EDITOR, self.tools_dir / EDITOR.name)
            (self.tools_dir / EDITOR.name).chmod(0o644)
            s = settings
            self.tools = (tool_path(s.prlimit), tool_path(s.setpriv), tool_path(s.bwrap))
            self.uid = self._stack.enter_context(
                lease_uid(s.uid_lock_dir, s.base_uid, s.uid_count, prefer=next(_prefer))
            )
            self._stack.callback(clear_uid, self.uid)
            clear_uid(self.uid)  # a holder that died mid-session may have left processes behind
            hand_over(ws, self.uid)
            os.chown(self.state, self.uid, self.uid)
            self._start()
        except BaseException:
            self.close()
            raise

    def _launch(self) -> None:
        argv = session_argv(
            tools=self.tools, uid=self.uid, limits=self.limits, repo=self.repo, state=self.state,
            tools_dir=self.tools_dir, python=self.python,
        )  # fmt: skip
        self._shell = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=sandbox_env(self.python),
            cwd=self.repo,
            start_new_session=True,
        )

    def _kill(self) -> None:
        shell, self._shell = self._shell, None
        if shell is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(shell.pid, 9)
        clear_uid(self.uid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            shell.wait(timeout=5)
        wait_reaped(self.uid)
        for pipe in (shell.stdin, shell.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]

    def _write(self, data: bytes) -> bool:
        shell = self._shell
        if shell is None or shell.stdin is None:
            return False
        try:
            shell.stdin.write(data)
            shell.stdin.flush()
        except OSError:
            return False
        return True

    def _read(self, timeout_s: float) -> bytes | None:
        assert self._shell is not None
        assert self._shell.stdout is not None
        fd = self._shell.stdout.fileno()
        readable, _, _ = select.select([fd], [], [], timeout_s)
        return os.read(fd, _READ_CHUNK) if readable else None

    def _tree(self) -> dict[str, str]:
        return read_tree(self.repo, self.limits.max_patch_bytes)

    def close(self) -> None:
        """Stop the session and remove its working tree (idempotent)."""
        with contextlib.suppress(InfraError):
            self.stop()
        self._stack.close()


def open_session(sandbox: object, task: Task, max_chars: int) -> ShellSession:
    """A session for ``task`` in the sandbox backend ``sandbox`` runs (its limits and settings): a
    local one, or a pod of its own for the Kubernetes backend (:mod:`gagar.sandbox.k8s.session`).

    Raises:
        ValueError: a backend with no session support.
        SessionError: the sandbox did not start (a Kubernetes session reports it at its first command).
    """
    if isinstance(sandbox, LocalBackend):
        return LocalSession(task, sandbox.limits, sandbox.settings, sandbox.work_root, max_chars)
    from gagar.sandbox.k8s.backend import KubernetesBackend

    if isinstance(sandbox, KubernetesBackend):
        from gagar.sandbox.k8s.session import KubernetesSession

        return KubernetesSession(sandbox, task, max_chars)
    name = type(sandbox).__name__
    raise ValueError(f"the tool-call agent's sessions need the local or Kubernetes sandbox, not {name}")
