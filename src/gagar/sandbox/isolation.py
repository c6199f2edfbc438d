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

__all__ = ["SANDBOX_JUDGE", "SANDBOX_REPO", "rlimit_args", "sandbox_argv", "sandbox_env"]

SANDBOX_REPO = "/sandbox/repo"
SANDBOX_JUDGE = "/sandbox/judge"
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


def _interpreter_args(python: str) -> list[str]:
    """Bind the interpreter's prefix when it lives outside /usr, and expose it as /sandbox/bin/python."""
    real = Path(python).resolve()
    args: list[str] = []
    if not str(real).startswith("/usr/"):
        prefix = str(real.parent.parent)
        args += ["--ro-bind", prefix, prefix]
    for name in ("python", "python3"):
        args += ["--symlink", str(real), f"/sandbox/bin/{name}"]
    return args


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


def sandbox_env() -> dict[str, str]:
    """The environment of the test command, less the judge's pytest pinning
    (:func:`gagar.sandbox.pristine.pytest_env`): nothing is inherited from the host."""
    return {
        "PATH": "/sandbox/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
    }
