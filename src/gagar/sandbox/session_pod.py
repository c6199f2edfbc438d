"""A session's own program in its Kubernetes pod, and the working-tree reader both backends share.

Standard library only: :mod:`gagar.sandbox.k8s.session` ships it in the session's ConfigMap as
``gagar_session.py``, beside the judge pod's runner (``gagar_pod_runner.py``, whose isolation and
limits it reuses) and the forkserver worker (``gagar_forkserver.py``). Modes::

    keep INPUT    the container's PID 1: lay out the working tree at /sandbox/repo, then live while a
                  shell does (exit once none has run for IDLE_S, or none started within START_S);
                  the container, and every process in it, ends with it
    shell INPUT   one persistent shell: fresh user, mount, PID, IPC, network and UTS namespaces where
                  the pod may make them (else a session of its own and a seccomp filter refusing
                  every socket but Unix ones, :func:`deny_network`), the
                  judge's limits, then bash reading the commands the stream's stdin brings; when bash
                  ends, or that stdin does (the client closed the stream or died), everything the
                  shell started is killed
    stop          kill every process of the session but PID 1 and wait until they are reaped
    tree MAX      the working tree's text files (:func:`read_tree`) as JSON on stdout

A rollout killed with ``kill -9`` closes its exec streams with it: each shell's relay reads the end of
its stdin and kills the shell, even in the middle of a command, with everything it started, and PID 1
ends the pod IDLE_S later. The pod's ``activeDeadlineSeconds`` bounds the rest.
"""

import contextlib
import json
import os
import signal
import stat
import sys
import threading
import time

REPO, STATE, TOOLS = "/sandbox/repo", "/sandbox/state", "/sandbox/tools"
READY = "/tmp/gagar-session-ready"
IDLE_S = 10.0
"""How long PID 1 outlives the last shell (a restart after a timeout starts the next one sooner)."""
START_S = 300.0
"""How long PID 1 waits for the first shell."""
SKIPPED_DIRS = frozenset({".git", ".pytest_cache", "__pycache__", ".mypy_cache", ".ruff_cache"})
"""Folders of the working tree never read into the patch (caches a test run leaves behind)."""
SHELL_ENV = {
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "USER": "sandbox",
    "LOGNAME": "sandbox",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
}
"""The environment of every sandboxed command but PATH, local (:func:`gagar.sandbox.isolation.sandbox_env`)
and in a session pod."""


def read_tree(root, max_file_bytes):
    """The text files under ``root`` by relative path: links, special files, files over
    ``max_file_bytes``, undecodable files and :data:`SKIPPED_DIRS` left out; no link is followed."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
        for name in filenames:
            if name.endswith(".pyc"):
                continue
            full = os.path.join(dirpath, name)
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue  # a link (ELOOP) or gone
            with os.fdopen(fd, "rb") as fh:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_size > max_file_bytes:
                    continue
                data = fh.read(max_file_bytes + 1)
            with contextlib.suppress(UnicodeDecodeError):
                files[os.path.relpath(full, root)] = data.decode("utf-8")
    return files


_ARCH = {  # machine: (AUDIT_ARCH_*, socket, io_uring_setup)
    "x86_64": (0xC000003E, 41, 425),
    "aarch64": (0xC00000B7, 198, 425),
}


def deny_network():
    """Refuse every socket but Unix ones (EACCES) to this process and all it starts, with a seccomp
    filter any process may install on itself: the network containment of a pod that may not create
    a network namespace (a RuntimeDefault profile refuses ``unshare``), whether or not the cluster
    enforces NetworkPolicies. io_uring, which could open sockets past the filter, is refused too.
    Returns what it did, for the shell's ``GAGAR_ISOLATION``."""
    import ctypes
    import platform
    import struct

    arch = _ARCH.get(platform.machine())
    if arch is None:
        return "network: NetworkPolicy only (no filter for " + platform.machine() + ")"
    audit_arch, nr_socket, nr_io_uring = arch
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, refuse = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EACCES
    program = [  # (code, jt, jf, k); jumps count from the next instruction
        (ld, 0, 0, 4),  # 0: arch
        (jeq, 0, 7, audit_arch),  # 1: another ABI: refuse
        (ld, 0, 0, 0),  # 2: syscall number
        (jge, 5, 0, 0x40000000),  # 3: x32 numbers: refuse
        (jeq, 1, 0, nr_socket),  # 4: socket: look at its domain
        (jeq, 3, 2, nr_io_uring),  # 5: io_uring_setup: refuse; else allow
        (ld, 0, 0, 16),  # 6: socket's domain (args[0])
        (jeq, 0, 1, 1),  # 7: AF_UNIX: allow; else refuse
        (ret, 0, 0, allow),  # 8
        (ret, 0, 0, refuse),  # 9
    ]
    code = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buffer = ctypes.create_string_buffer(code, len(code))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(program), ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(38, 1, None, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "seccomp filter")
    return "network: sockets refused but Unix ones"


def _others():
    """Pids of the container's processes but PID 1 and this one (zombies included)."""
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]


def _is_shell(pid):
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
        argv = fh.read().split(b"\0")
        return len(argv) > 2 and argv[1].endswith(b"gagar_session.py") and argv[2] == b"shell"
    return False


def _spec(input_dir):
    with open(os.path.join(input_dir, "spec.json"), encoding="utf-8") as fh:
        return json.load(fh)


def keep(input_dir):
    """PID 1 (module docstring)."""
    sys.path.insert(0, input_dir)
    import gagar_pod_runner

    gagar_pod_runner.prepare_repo(_spec(input_dir), input_dir, REPO)
    with open(READY, "w", encoding="ascii") as fh:
        fh.write("ready\n")
    started = last_shell = time.monotonic()
    seen = False
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:  # orphans of killed shells
                pass
        now = time.monotonic()
        if any(_is_shell(pid) for pid in _others()):
            seen, last_shell = True, now
        elif (seen and now - last_shell > IDLE_S) or (not seen and now - started > START_S):
            return 0
        time.sleep(0.2)


def shell(input_dir):
    """One shell (module docstring); returns bash's exit status."""
    sys.path.insert(0, input_dir)
    import gagar_pod_runner

    spec = _spec(input_dir)
    deadline = time.monotonic() + START_S
    while not os.path.exists(READY):
        if time.monotonic() > deadline:
            sys.stdout.write("the working tree was never laid out\n")
            return 70
        time.sleep(0.05)
    isolation = gagar_pod_runner.isolate("/tmp")
    gagar_pod_runner.set_limits(spec["limits"])
    import resource

    # the pod's uid is this session's own (or the namespaces' own), so RLIMIT_NPROC counts only the
    # session's processes: a fork bomb stops there
    nproc = int(spec["limits"]["max_processes"])
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    if not isolation.startswith("namespaces"):  # no network namespace of its own
        isolation += "; " + deny_network()
    commands, feed = os.pipe()
    bash = os.fork()
    if bash == 0:
        os.close(feed)
        os.dup2(commands, 0)
        os.close(commands)
        os.dup2(1, 2)
        os.chdir(REPO)
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")  # the image's, its environment first
        env = {**SHELL_ENV, "PATH": path, "GAGAR_ISOLATION": isolation}
        os.execve("/bin/bash", ["bash", "--noprofile", "--norc"], env)
    os.close(commands)
    threading.Thread(target=_relay, args=(feed, bash), daemon=True).start()
    status = 0
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # PID 1 of its namespaces: reaps every orphan too
        except ChildProcessError:
            break
        if pid == bash:
            break
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)  # what the shell left (in its namespaces, or of this uid)
    return os.waitstatus_to_exitcode(status) if status else 0


def _relay(feed, bash):
    """Pass the exec stream's stdin to bash; at its end (the client closed the stream, or died) kill
    bash, whatever it is running: bash itself reads its stdin only between commands."""
    with contextlib.suppress(OSError):
        while data := os.read(0, 1 << 16):
            os.write(feed, data)
    with contextlib.suppress(OSError):
        os.kill(bash, signal.SIGKILL)


def stop():
    """Kill every process but PID 1 and this one until none is left (a fork bomb forks while it is
    being killed), and wait until PID 1 reaped them; 10 s at most. Prints how many remain."""
    deadline = time.monotonic() + 10
    while (others := _others()) and time.monotonic() < deadline:
        if any(_state(pid) not in ("Z", "X", "") for pid in others):
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)
        time.sleep(0.02)
    left = len(_others())
    sys.stdout.write(f"{left}\n")
    return 0 if left == 0 else 1


def _state(pid):
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", "rb") as fh:
        return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    return ""


def main(argv):
    mode = argv[1]
    if mode == "keep":
        return keep(argv[2])
    if mode == "shell":
        return shell(argv[2])
    if mode == "stop":
        return stop()
    if mode == "tree":
        json.dump(read_tree(REPO, int(argv[2])), sys.stdout)
        return 0
    sys.stderr.write(f"unknown mode {mode!r}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
