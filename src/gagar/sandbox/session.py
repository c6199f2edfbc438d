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
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import secrets
import select
import shutil
import subprocess
import time
from concurrent.futures import Future
from pathlib import Path

from gagar.sandbox.isolation import SANDBOX_TOOLS, sandbox_env, session_argv
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import InfraError, LocalBackend, LocalSandboxSettings, clear_uid, tool_path
from gagar.sandbox.process import BoundedOutput, wait_reaped
from gagar.sandbox.session_pod import SKIPPED_DIRS, read_tree
from gagar.sandbox.uids import lease_uid
from gagar.sandbox.workspace import hand_over, materialize, workspace
from gagar.schema.task import Task
from gagar.tasks.diffs import make_diff

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

EDITOR = Path(__file__).with_name("session_editor.py")
"""The editor script bound into every session (run by the sandbox's interpreter)."""
_READ_CHUNK = 1 << 16
_prefer = itertools.count()


class SessionError(RuntimeError):
    """The session's sandbox could not start: an infrastructure failure, not the policy's."""


def editor_command(request: dict[str, object]) -> str:
    """The shell command that runs the session's editor on ``request`` (JSON, passed base64-encoded)."""
    payload = base64.b64encode(json.dumps(request).encode()).decode()
    return f"printf %s {payload} | base64 -d | python3 {SANDBOX_TOOLS}/{EDITOR.name}"


class ShellSession:
    """One trajectory's persistent shell and editor, whatever carries them (module docstring).

    A backend supplies the transport: :meth:`_launch` starts a shell reading commands from its stdin,
    :meth:`_write` and :meth:`_read` talk to it, :meth:`_kill` ends every process of the session (the
    files stay) and :meth:`_tree` reads the working tree. ``original`` is the tree as it started.
    """

    limits: SandboxLimits
    max_chars: int
    original: dict[str, str]

    def __init__(self, limits: SandboxLimits, max_chars: int) -> None:
        self.limits, self.max_chars = limits, max_chars
        self._nonce = secrets.token_hex(8)
        self._pending: tuple[float, float, bool] | Future[tuple[float, float, bool]] | None = None
        self._alive = False
        self.restarts = 0
        """Shells started after the first (a timeout, an exit, an output flood)."""

    # -- the transport -----------------------------------------------------------------------------

    def _launch(self) -> None:
        raise NotImplementedError

    def _kill(self) -> None:
        raise NotImplementedError

    def _write(self, data: bytes) -> bool:
        """Write to the shell's stdin; False when it is gone."""
        raise NotImplementedError

    def _read(self, timeout_s: float) -> bytes | None:
        """The next output, b"" once the shell ended, None when nothing came within ``timeout_s``."""
        raise NotImplementedError

    def _tree(self) -> dict[str, str]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- commands ----------------------------------------------------------------------------------

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        self._launch()
        self._alive = True
        ready, _, exited = self._exchange("echo ready", 60.0)
        if exited or ready.strip() != "ready":
            self.stop()
            raise SessionError(f"the session's sandbox did not start: {ready.strip()[-300:] or 'no output'}")

    def stop(self) -> None:
        """Kill every process of the session (the shell, whatever it started); the files stay."""
        if self._alive:
            self._alive = False
            self._kill()

    def _send(self, command: str) -> bool:
        """Write ``command`` to the shell, followed by the end marker; False when the shell is gone."""
        encoded = base64.b64encode(command.encode()).decode()
        line = (
            f"eval \"$(printf %s {encoded} | base64 -d)\" </dev/null 2>&1; printf '\\n%s\\n' {self._marker}\n"
        )
        return self._write(line.encode())

    @property
    def _marker(self) -> str:
        return f"__gagar_done_{self._nonce}__"

    def _receive(self, deadline: float) -> tuple[str, bool, bool]:
        """The output up to the end marker (head and tail): the text, whether it ran past
        ``deadline`` or flooded, whether the shell ended."""
        marker = self._marker.encode()
        out, window = BoundedOutput(2 * self.max_chars), b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or out.total > self.limits.max_output_bytes:
                return out.text(), True, False
            chunk = self._read(left)
            if chunk is None:
                continue
            if not chunk:
                return out.text(), False, True
            out.add(chunk)
            window = (window + chunk)[-(len(marker) + 4) :]
            if window.rstrip(b"\n").endswith(marker):
                text = out.text()
                return text[: text.rfind(self._marker)].removesuffix("\n"), False, False

    def _exchange(self, command: str, timeout_s: float) -> tuple[str, bool, bool]:
        deadline = time.monotonic() + timeout_s
        return self._receive(deadline) if self._send(command) else ("", False, True)

    def _dispatch(self, command: str, timeout_s: float) -> tuple[float, float, bool]:
        """Start a shell if none runs, send ``command``: its deadline, timeout and whether it was sent."""
        if not self._alive:
            self.restarts += 1
            self._start()
        return time.monotonic() + timeout_s, timeout_s, self._send(command)

    def begin(self, command: str, timeout_s: float) -> None:
        """Send ``command`` to the shell and return at once; :meth:`finish` reads its answer (so that
        the calls of many sessions run at the same time)."""
        self._pending = self._dispatch(command, timeout_s)

    def finish(self) -> str:
        """The output of the command :meth:`begin` sent (stdout and stderr), with a note when it timed
        out, flooded or ended the shell (a new shell is then started: files stay, shell state and
        processes go)."""
        if self._pending is None:
            raise RuntimeError("finish() without begin()")
        pending, self._pending = self._pending, None
        deadline, timeout_s, sent = pending.result() if isinstance(pending, Future) else pending
        output, stopped, exited = self._receive(deadline) if sent else ("", False, True)
        note = ""
        if stopped:
            flooded = "its output passed the limit" if len(output) >= 2 * self.max_chars else ""
            why = flooded or f"it timed out after {timeout_s:g} s"
            note = f"[the command was killed: {why}; a new shell was started, the files are kept]"
        elif exited:
            note = "[the shell exited; a new shell was started, the files are kept]"
        if note:
            self.stop()
            self.restarts += 1
            self._start()
        return f"{output}\n{note}".strip() if note else output

    def run(self, command: str, timeout_s: float) -> str:
        """:meth:`begin` then :meth:`finish`: the output of ``command``."""
        self.begin(command, timeout_s)
        return self.finish()

    def edit(self, request: dict[str, object], timeout_s: float) -> str:
        """The editor's answer to ``request`` (:mod:`gagar.sandbox.session_editor`), run in the session."""
        return self.run(editor_command(request), timeout_s)

    def patch(self) -> str:
        """Stop the session and diff its working tree against the repository it started from."""
        self.stop()
        return make_diff(self.original, self._tree())


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
