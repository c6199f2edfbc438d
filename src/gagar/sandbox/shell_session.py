"""What every agent session is, whatever carries it: :class:`ShellSession` (the commands, their end
markers, timeouts and restarts, the patch) over a transport a backend supplies
(:class:`gagar.sandbox.session.LocalSession`, :class:`gagar.sandbox.k8s.session.KubernetesSession`)."""

from __future__ import annotations

import base64
import json
import secrets
import time
from concurrent.futures import Future
from pathlib import Path

from gagar.sandbox.isolation import SANDBOX_TOOLS
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.process import BoundedOutput
from gagar.tasks.diffs import make_diff

__all__ = ["EDITOR", "SessionError", "ShellSession", "editor_command"]

EDITOR = Path(__file__).with_name("session_editor.py")
"""The editor script bound into every session (run by the sandbox's interpreter)."""


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
