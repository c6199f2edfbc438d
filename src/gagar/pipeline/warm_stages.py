"""Warm stages for kfp.local: each task's stage function runs in a fork of one interpreter that
imported torch, transformers and gagar once.

kfp.local's ``SubprocessRunner`` starts a fresh interpreter for every task, and a stage that trains
or samples then spends about 2 s importing torch and transformers before its first line of work,
which on a CPU step of about 20 s is most of the orchestration overhead. ``run_local`` therefore
starts one :func:`serve` process, preloads :data:`PRELOAD` into it, and names its Unix socket in
:data:`ENV`. The task's process still starts and runs KFP's executor as usual; when the component
body calls a :func:`gagar.pipeline.store_stages` function, :func:`warm` sends the call (its name,
its keyword arguments, the task's environment and working directory, and the task's stdout and
stderr descriptors) to the server, which forks a child that adopts the task's environment, runs the
function and answers with its return value or its exception. The task then writes its outputs as
if it had run the function itself.

Only ``run_local`` without containers sets :data:`ENV`; in containers and on a cluster every task
runs its function in its own process, as before. The calls are pickles, so the socket lies in a
folder only the run's user can enter (``tempfile.TemporaryDirectory``: mode 0700).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["ENV", "PRELOAD", "LazyModule", "WarmStageError", "call", "serve", "warm", "warm_stages"]

ENV = "GAGAR_WARM_STAGES"
"""Names the server's socket; unset: every stage runs in the calling process."""

PRELOAD = (
    "torch",
    "transformers",
    "peft",
    "gagar.pipeline.store_stages",
    "gagar.stages",
    "gagar.policy.model",
    "gagar.policy.rollout",
    "gagar.train.update",
    "gagar.train.lora",
    "gagar.grader.heuristic",
    "gagar.sandbox.runner",
    # every stage rebuilds the run's config and checks the environment's settings: the Kubernetes
    # sandbox settings import the kubernetes client (half a second a task when not preloaded)
    "gagar.pipeline.parameters",
    "gagar.settings_env",
    "gagar.sandbox.k8s.config",
    "gagar.pipeline.store",
    "gagar.pipeline.report",
    "gagar.metrics",
)
"""What the server imports before it serves (a missing optional package is skipped)."""

F = TypeVar("F", bound=Callable[..., Any])
_HEADER = struct.Struct("!Q")


class WarmStageError(RuntimeError):
    """The warm stage server could not run a call (not the stage's own error, which is re-raised)."""


class LazyModule:
    """Module ``name``, imported on first attribute access (never put in ``sys.modules`` unloaded, so
    nothing that scans ``sys.modules``, such as ``inspect``, imports it by accident)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def warm(function: F) -> F:
    """Run ``function`` in the warm stage server when :data:`ENV` names one, else here."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        address = os.environ.get(ENV)
        if not address:
            return function(*args, **kwargs)
        return call(address, function.__module__, function.__name__, args, kwargs)

    return run  # type: ignore[return-value]


def _send(sock: socket.socket, payload: bytes, fds: Sequence[int] = ()) -> None:
    header = _HEADER.pack(len(payload))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(payload)


def _receive_exact(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"the connection closed with {left} of {size} bytes unread")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def call(address: str, module: str, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Run ``module.name(*args, **kwargs)`` in a fork of the server at ``address``, with this process's
    environment, working directory, stdout and stderr; return its value or raise its exception.

    Raises:
        WarmStageError: the server is unreachable, or its child died without an answer.
    """
    request = pickle.dumps(
        {
            "module": module,
            "name": name,
            "args": tuple(args),
            "kwargs": kwargs,
            "env": {k: v for k, v in os.environ.items() if k != ENV},
            "cwd": os.getcwd(),
            "logging": _logging_of_this_process(),
        }
    )
    sys.stdout.flush()
    sys.stderr.flush()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(address)
        except OSError as error:
            raise WarmStageError(f"the warm stage server at {address} is unreachable: {error}") from error
        _send(sock, request, (sys.stdout.fileno(), sys.stderr.fileno()))
        try:
            [size] = _HEADER.unpack(_receive_exact(sock, _HEADER.size))
            ok, value, trace = pickle.loads(_receive_exact(sock, size))
        except EOFError as error:
            message = f"{module}.{name} died in the warm stage server without an answer"
            raise WarmStageError(message) from error
    if ok:
        return value
    value.add_note(f"raised in the warm stage server's fork:\n{trace}")
    raise value


def _logging_of_this_process() -> dict[str, Any]:
    """The root logger's level and its stream handlers (KFP's executor logs INFO to stdout)."""
    root = logging.getLogger()
    handlers = []
    for handler in root.handlers:
        stream = getattr(handler, "stream", None)
        name = {sys.stdout: "stdout", sys.stderr: "stderr"}.get(stream) if stream is not None else None
        if name is not None:
            formatter = handler.formatter
            handlers.append(
                (
                    name,
                    handler.level,
                    formatter._fmt if formatter else None,
                    formatter.datefmt if formatter else None,
                )
            )
    return {"level": root.level, "handlers": handlers}


def _adopt_logging(setup: dict[str, Any]) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for name, level, fmt, datefmt in setup["handlers"]:
        handler = logging.StreamHandler(getattr(sys, name))
        handler.setLevel(level)
        handler.setFormatter(logging.Formatter(fmt, datefmt))
        root.addHandler(handler)
    root.setLevel(setup["level"])


def _answer(conn: socket.socket, ok: bool, value: Any, trace: str = "") -> None:
    try:
        payload = pickle.dumps((ok, value, trace))
    except Exception:  # an unpicklable result or exception still reaches the caller, as text
        payload = pickle.dumps((False, WarmStageError(f"{type(value).__name__}: {value}"), trace))
    _send(conn, payload)


def _run_child(conn: socket.socket) -> None:
    """In the fork: adopt the caller's output, environment and directory, run the call, answer."""
    header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 2)
    header += _receive_exact(conn, _HEADER.size - len(header))
    request = pickle.loads(_receive_exact(conn, _HEADER.unpack(header)[0]))
    for fd, target in zip(fds, (1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    _adopt_logging(request["logging"])
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))  # torch read the server's value at import
    try:
        function = getattr(importlib.import_module(request["module"]), request["name"])
        function = getattr(function, "__wrapped__", function)
        value = function(*request["args"], **request["kwargs"])
    except BaseException as error:  # every failure goes back to the caller
        _answer(conn, False, error, traceback.format_exc())
    else:
        _answer(conn, True, value)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(address: str, preload: Sequence[str] = PRELOAD) -> None:
    """Import ``preload``, listen on the Unix socket ``address``, print ``ready`` and fork a child for
    each call until terminated. The server itself stays single-threaded, so its forks are safe."""
    for module in preload:
        with suppress(ImportError):
            importlib.import_module(module)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(address)
        server.listen(64)
        server.settimeout(1.0)
        print("ready", flush=True)
        while True:
            _reap()
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            pid = os.fork()
            if pid == 0:
                server.close()
                code = 0
                try:
                    _run_child(conn)
                except BaseException:  # the fork never returns into the accept loop
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
            conn.close()


@contextmanager
def warm_stages(ready_timeout_s: float = 300.0) -> Iterator[str]:
    """Start a warm stage server for the duration of the block, with :data:`ENV` naming it in this
    process's environment (which kfp.local's subprocess tasks inherit); yields its socket path.

    Raises:
        WarmStageError: the server exited or did not get ready within ``ready_timeout_s``.
    """
    with tempfile.TemporaryDirectory(prefix="gagar-warm-") as folder:
        address = str(Path(folder) / "stages.sock")
        server = subprocess.Popen(
            [sys.executable, "-m", "gagar.pipeline.warm_stages", address],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: stopping it stops its running forks
        )
        try:
            _wait_ready(server, ready_timeout_s)
            previous = os.environ.get(ENV)
            os.environ[ENV] = address
            try:
                yield address
            finally:
                if previous is None:
                    os.environ.pop(ENV, None)
                else:
                    os.environ[ENV] = previous
        finally:
            with suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            server.wait()
            if server.stdout is not None:
                server.stdout.close()


def _wait_ready(server: subprocess.Popen[str], timeout_s: float) -> None:
    import selectors

    assert server.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(server.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise WarmStageError(f"the warm stage server was not ready within {timeout_s:.0f} s")
    line = server.stdout.readline()
    if line.strip() != "ready":
        code = server.wait()
        raise WarmStageError(f"the warm stage server exited (code {code}) before it was ready")


if __name__ == "__main__":
    serve(sys.argv[1])
