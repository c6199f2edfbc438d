"""The command line that runs a test command isolated: prlimit, then setpriv, then bubblewrap.

``prlimit`` sets the rlimits (CPU, address space, processes, file size, no core dumps)
and execs ``setpriv``, which drops to the slot's non-root uid with no supplementary
groups so that RLIMIT_NPROC is enforced (it is not for root); ``setpriv`` execs
``bwrap``, which, unprivileged, creates new user, mount, PID, network, IPC, UTS and
cgroup namespaces: no network but a private loopback, a read-only ``/usr``, a private
``/tmp`` of bounded size, only the repository copy (``/sandbox/repo``) writable, and the
judge's plugin folder (``/sandbox/judge``) bound read-only. Each worker slot has its own uid, so one
evaluation's fork bomb cannot starve another's process budget.

The interpreter (``/sandbox/bin/python``) must be readable by that uid: the default is
Debian's ``/usr/bin/python3`` with ``python3-pytest`` from apt (scripts/install-system-deps.sh),
which keeps the host's virtualenv (under /root, unreadable to the uid anyway) out of the
sandbox. An interpreter outside ``/usr`` is bound read-only with its installation prefix.
"""

from __future__ import annotations

import os
from pathlib import Path

from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.session_pod import SHELL_ENV

__all__ = [
    "SANDBOX_JUDGE",
    "SANDBOX_REPO",
    "SANDBOX_STATE",
    "SANDBOX_TOOLS",
    "SANDBOX_WORK",
    "rlimit_args",
    "sandbox_argv",
    "sandbox_env",
    "session_argv",
    "venv_of",
    "worker_argv",
]

SANDBOX_REPO = "/sandbox/repo"
SANDBOX_JUDGE = "/sandbox/judge"
SANDBOX_WORK = "/sandbox/work"
SANDBOX_STATE = "/sandbox/state"
SANDBOX_TOOLS = "/sandbox/tools"
_CPU_GRACE_S = 5
_ROOT_DIRS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32")


def rlimit_args(prlimit: str, limits: SandboxLimits) -> list[str]:
    """``prlimit`` options: soft CPU limit sends SIGXCPU, the hard one a few seconds later SIGKILL."""
    return [
        prlimit,
        f"--cpu={limits.cpu_time_s}:{limits.cpu_time_s + _CPU_GRACE_S}",
        f"--as={limits.memory_bytes}",
        f"--nproc={limits.max_processes}",
        f"--fsize={limits.max_file_bytes}",
        "--core=0",
        "--",
    ]


def _root_dir_args() -> list[str]:
    """/bin, /lib, ...: symlinks into /usr on merged-/usr systems, read-only binds otherwise."""
    args: list[str] = []
    for path in _ROOT_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def venv_of(python: str) -> Path | None:
    """The virtual environment ``python`` belongs to (its ``pyvenv.cfg`` beside ``bin/``), or None."""
    root = Path(python).absolute().parent.parent
    return root if (root / "pyvenv.cfg").is_file() else None


def _venv_home(venv: Path) -> Path | None:
    """The base interpreter's folder a venv names (``home = ...`` in its pyvenv.cfg)."""
    for line in (venv / "pyvenv.cfg").read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home" and value.strip():
            return Path(value.strip())
    return None


def _interpreter_args(python: str) -> list[str]:
    """Bind the interpreter's prefix when it lives outside /usr, and expose it as /sandbox/bin/python.

    A venv's interpreter is bound with its venv (and its base interpreter's prefix), and the
    venv's ``bin`` goes first on PATH (:func:`sandbox_env`): Python finds ``pyvenv.cfg`` only
    beside the path it was started by, so a link from /sandbox/bin would run the bare base.
    """
    real = Path(python).resolve()
    prefixes = [real.parent.parent]
    if (venv := venv_of(python)) is not None:
        prefixes.append(venv)
        if (home := _venv_home(venv)) is not None:
            prefixes.append(home.parent)
    args: list[str] = []
    for prefix in dict.fromkeys(prefixes):
        if not str(prefix).startswith("/usr/") and str(prefix) != "/usr":
            args += ["--ro-bind", str(prefix), str(prefix)]
    for name in ("python", "python3"):
        args += ["--symlink", str(real), f"/sandbox/bin/{name}"]
    return args


def _dropped(tools: tuple[str, str, str], uid: int, limits: SandboxLimits) -> list[str]:
    """prlimit, then setpriv to ``uid``, then the bwrap executable: the start of every sandbox argv."""
    prlimit, setpriv, bwrap = tools
    return [
        *rlimit_args(prlimit, limits),
        setpriv,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--",
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
        *_root_dir_args(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(limits.tmp_bytes),
        "--tmpfs",
        "/tmp",
    ]


def sandbox_argv(
    *,
    tools: tuple[str, str, str],
    uid: int,
    limits: SandboxLimits,
    repo: Path,
    judge: Path,
    python: str,
    started_fd: int,
    command: str,
) -> list[str]:
    """The full argv: ``tools`` are the paths of (prlimit, setpriv, bwrap); ``command`` runs under /bin/sh.

    Once inside the sandbox, bash (dash cannot name fds above 9) writes ``started`` to
    ``started_fd`` and closes it before running ``command``: no output there means the sandbox
    never started (an infrastructure failure), and the code under test cannot take that back.
    """
    return [
        *_dropped(tools, uid, limits),
        "--bind",
        str(repo),
        SANDBOX_REPO,
        "--ro-bind",
        str(judge),
        SANDBOX_JUDGE,
        *_interpreter_args(python),
        "--chdir",
        SANDBOX_REPO,
        "--",
        "/bin/bash",
        "-c",
        f'echo started >&{started_fd} && exec {started_fd}>&- && exec /bin/sh -c "$1"',
        "sandbox",
        command,
    ]


def session_argv(
    *,
    tools: tuple[str, str, str],
    uid: int,
    limits: SandboxLimits,
    repo: Path,
    state: Path,
    tools_dir: Path,
    python: str,
) -> list[str]:
    """The argv of an agent's persistent shell (:mod:`gagar.sandbox.session`): the judge's sandbox
    (:func:`sandbox_argv`) with the working tree at ``/sandbox/repo``, the session's own state folder
    (the editor's undo history) at ``/sandbox/state``, and the folder holding the editor script
    read-only at ``/sandbox/tools``; no judge folder; the sandbox's root read-only, so that the tree,
    the state folder and the private ``/tmp`` (bounded) are all it can write. The shell reads its
    commands from stdin."""
    return [
        *_dropped(tools, uid, limits),
        "--bind",
        str(repo),
        SANDBOX_REPO,
        "--bind",
        str(state),
        SANDBOX_STATE,
        "--ro-bind",
        str(tools_dir),
        SANDBOX_TOOLS,
        *_interpreter_args(python),
        "--remount-ro",
        "/",
        "--chdir",
        SANDBOX_REPO,
        "--",
        "/bin/bash",
        "--noprofile",
        "--norc",
    ]


def worker_argv(
    *,
    tools: tuple[str, str, str],
    uid: int,
    limits: SandboxLimits,
    work: Path,
    worker: Path,
    python: str,
    control_fd: int,
) -> list[str]:
    """The argv of a slot's forkserver worker (:mod:`gagar.sandbox.forkserver`): the same sandbox as
    :func:`sandbox_argv`, with the slot's workspace folder at ``/sandbox/work`` (each evaluation's
    repository and judge folder are bound in place by the worker's per-evaluation namespaces) and
    ``worker``, the folder holding the worker script, read-only at ``/sandbox/worker``."""
    return [
        *_dropped(tools, uid, limits),
        "--dir",
        SANDBOX_REPO,
        "--dir",
        SANDBOX_JUDGE,
        "--bind",
        str(work),
        SANDBOX_WORK,
        "--ro-bind",
        str(worker),
        "/sandbox/worker",
        *_interpreter_args(python),
        "--chdir",
        "/sandbox",
        "--",
        "/sandbox/bin/python",
        "/sandbox/worker/gagar_forkserver.py",
        str(control_fd),
    ]


def sandbox_env(python: str | None = None) -> dict[str, str]:
    """The environment of the test command, less the judge's pytest pinning
    (:func:`gagar.sandbox.pristine.pytest_env`): nothing is inherited from the host.

    When ``python`` is a venv's interpreter, the venv's ``bin`` comes first on PATH, so that
    ``python -m pytest`` runs in the environment the task was verified in.
    """
    path = "/sandbox/bin:/usr/local/bin:/usr/bin:/bin"
    if python is not None and (venv := venv_of(python)) is not None:
        path = f"{venv / 'bin'}:{path}"
    return {"PATH": path, **SHELL_ENV}
