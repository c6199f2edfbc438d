"""The forkserver worker: runs inside one slot's bubblewrap sandbox and forks a fresh, isolated
pytest process per evaluation, with pytest already imported (see :mod:`gagar.sandbox.forkserver`).

Standard library only, run by the sandbox's interpreter as a script. Protocol on the control
socket (file descriptor ``argv[1]``): the worker sends ``ready``; then, per evaluation, the host
sends one JSON line with three descriptors attached (output pipe, the judge's nonce pipe and the
report stream's write end) and the worker answers one JSON line ``{"returncode": N}`` (negative:
killed by that signal) once the evaluation's processes are gone.

Per evaluation, three processes:

- *child*: ``unshare`` new user, mount, PID, IPC, network and UTS namespaces (nested inside the
  slot's own), mapping only the slot uid; it forks *init* and waits for it;
- *init*, PID 1 of the new namespace: a fresh ``/proc``, a fresh ``/tmp`` (size-capped) and
  ``/dev/shm``, the evaluation's repository bound at ``/sandbox/repo`` and its judge folder
  read-only at ``/sandbox/judge``, the slot's workspace folder hidden, loopback up; it forks the
  *shell*, reaps every orphan until the shell ends, then exits, and the kernel kills whatever is
  left in the namespace;
- *shell*, in the place of a classic sandbox's ``/bin/sh -c``: forks the test process and exits
  with its status;
- *test*: every capability dropped, a new session, only the three descriptors, the judge's
  environment, then ``python -m pytest ARGS`` in process.

The worker never runs tested code itself and is not dumpable, so no evaluation can trace or
patch it; it lives in the parent PID namespace, so no evaluation can signal it either. Nothing
one evaluation leaves (processes, files, IPC objects, sockets) exists when the next one starts.
"""

import atexit
import contextlib
import ctypes
import fcntl
import importlib
import json
import os
import runpy
import socket
import struct
import sys

_NEWNS, _NEWUTS, _NEWIPC, _NEWUSER, _NEWPID, _NEWNET = (
    0x20000,
    0x4000000,
    0x8000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    1,
    2,
    4,
    32,
    0x1000,
    0x4000,
    1 << 18,
)
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP = 4, 24
_REPO, _JUDGE, _WORK = b"/sandbox/repo", b"/sandbox/judge", b"/sandbox/work"
NONCE_FD, REPORT_FD = 3, 4
"""Where the test process finds the judge's nonce pipe and report stream (the env's descriptor numbers)."""
_LIBC = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    _check(_LIBC.mount(source, target, fstype, flags, data), f"mount {target!r}")


def _warm():
    """Import pytest and its built-in plugins now, so that each forked evaluation finds them loaded."""
    import pytest  # noqa: F401
    from _pytest.config import default_plugins

    for name in default_plugins:
        with contextlib.suppress(ImportError):
            importlib.import_module(f"_pytest.{name}")


def _loopback_up():
    siocgifflags, siocsifflags, up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, siocgifflags, req))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14s", b"lo", flags | up, b""))


def _drop_capabilities():
    for cap in range(64):
        if _LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability the kernel knows

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    _check(_LIBC.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset")


def _enter_namespaces(uid, gid):
    _check(_LIBC.unshare(_NEWUSER | _NEWNS | _NEWPID | _NEWIPC | _NEWNET | _NEWUTS), "unshare")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _lay_out(job):
    """The evaluation's file system view (in init, the new mount and PID namespaces' first process)."""
    _mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE)
    _mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV)
    tmp_opts = f"size={int(job['tmp_bytes'])},mode=1777".encode()
    _mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, tmp_opts)
    if os.path.isdir("/dev/shm"):
        _mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, tmp_opts)
    _mount(job["repo"].encode(), _REPO, None, _MS_BIND | _MS_REC)
    _mount(job["judge"].encode(), _JUDGE, None, _MS_BIND | _MS_REC)
    _mount(b"none", _JUDGE, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    _mount(b"tmpfs", _WORK, b"tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, b"size=4k")
    _check(_LIBC.sethostname(b"sandbox", 7), "sethostname")
    _loopback_up()


def _run_tests(job, fds):
    """The test process: no capabilities, its descriptors only, then pytest in this interpreter."""
    _drop_capabilities()
    os.setsid()
    null = os.open("/dev/null", os.O_RDONLY)
    out, nonce, report = (fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds)  # above every target
    for target, src in ((0, null), (1, out), (2, out), (NONCE_FD, nonce), (REPORT_FD, report)):
        os.dup2(src, target, inheritable=True)
    os.closerange(REPORT_FD + 1, 1 << 16)
    os.chdir(_REPO)
    os.environ.clear()
    os.environ.update(job["env"])
    sys.dont_write_bytecode = True
    sys.path[:0] = [p for p in job["env"].get("PYTHONPATH", "").split(":") if p]
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.argv = ["pytest", *job["args"]]
    code = 0
    try:
        runpy.run_module("pytest", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    _finalize()
    os._exit(code & 0xFF)


def _finalize():
    """What the interpreter does at exit before it is gone: wait for the non-daemon threads, run the
    atexit callbacks (output written there counts like any other), flush."""
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def _shell(job, fds):
    """What ``/bin/sh -c`` is in a classic sandbox: the test process's parent, which exits with its
    status (128 + N when signal N killed it); killing it ends the evaluation, as it would there."""
    test = os.fork()
    if test == 0:
        _run_tests(job, fds)
    for fd in fds:
        os.close(fd)
    _drop_capabilities()
    _, status = os.waitpid(test, 0)
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _init(job, fds, status_w):
    """PID 1 of the evaluation's namespace: lay it out, run the shell, reap orphans until the shell
    ends, report its status; then the namespace dies with everything left in it."""
    _lay_out(job)
    shell = os.fork()
    if shell == 0:
        os.close(status_w)
        _shell(job, fds)
    for fd in fds:
        os.close(fd)
    _drop_capabilities()
    while True:
        pid, status = os.wait()
        if pid == shell:
            break
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    os.write(status_w, str(code).encode())
    os._exit(0)


def _evaluate(job, fds):
    status_r, status_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(status_r)
            _LIBC.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
            _enter_namespaces(os.getuid(), os.getgid())
            init = os.fork()
            if init == 0:
                try:
                    _init(job, fds, status_w)
                except BaseException as exc:
                    os.write(status_w, f"error {exc}".encode())
                    os._exit(70)
            os.waitpid(init, 0)
            os._exit(0)
        except BaseException as exc:
            os.write(status_w, f"error {exc}".encode())
            os._exit(70)
    os.close(status_w)
    for fd in fds:
        os.close(fd)
    os.waitpid(child, 0)
    chunks = []
    while chunk := os.read(status_r, 4096):
        chunks.append(chunk)
    os.close(status_r)
    text = b"".join(chunks).decode(errors="replace")
    if text.lstrip("-").isdigit():
        return {"returncode": int(text)}
    return {"error": text or "the evaluation's init died before reporting"}


def main():
    control = socket.socket(fileno=int(sys.argv[1]))  # a SOCK_SEQPACKET: one message per job
    _LIBC.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    _warm()
    control.send(b"ready")
    while True:
        data, fds, _, _ = socket.recv_fds(control, 1 << 20, 3)
        if not data:
            return  # the host closed the socket
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"error": f"expected 3 descriptors, got {len(fds)}"}).encode())
            continue
        control.send(json.dumps(_evaluate(json.loads(data), fds)).encode())


if __name__ == "__main__":
    main()
