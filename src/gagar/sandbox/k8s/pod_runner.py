"""In-pod runner of the Kubernetes sandbox: standard library only, run by the image's python3.

Usage: ``python3 pod_runner.py INPUT_DIR WORKSPACE_DIR [RESULT_FILE [TMP_DIR]]``. INPUT_DIR is
the read-only ConfigMap mount holding ``spec.json``, one ``model-<i>.patch`` per evaluation
of the pod (all of one task), ``test.patch``, copies of :mod:`gagar.sandbox.patch`,
:mod:`gagar.sandbox.pristine`, :mod:`gagar.sandbox.judge_plugin`,
:mod:`gagar.sandbox.judge_monitor` and :mod:`gagar.sandbox.forkserver_worker`
(``gagar_patch.py``, ``gagar_pristine.py``, ``gagar_judge_plugin.py``,
``gagar_judge_monitor.py``, ``gagar_forkserver.py``), the judge's empty ``pytest.ini`` and,
for bundled tasks, ``snapshot.json``.

The runner (the container's PID 1, not dumpable) judges the pod's evaluations one after
another, each in its own isolated child (:func:`run_one`): the child enters fresh user,
mount, PID, IPC, network and UTS namespaces with the local forkserver's own code (where the
pod's seccomp profile allows it; else a session of its own), lays the repository out under
its own folder of WORKSPACE_DIR (from the snapshot, or copied from the image's repository
directory), applies the model patch with the local backend's pristine judge (every test
file, conftest.py and runner setting it touched reset to the task's version), then the
task's test patch, compiles the pristine test files (the trusted reference, before any test
runs), runs the test command with pytest pinned, the runtime monitor watching the patched
files and the judge's plugin writing its report to a pipe only the child reads
(:func:`gagar_pristine.pytest_env`), and sends its summary to the runner over a pipe. Past
the limits' ``wall_time_s`` the runner kills the child (that evaluation is a ``timeout``); after
every evaluation it kills whatever is left, empties the workspace, /tmp and /dev/shm
(:func:`sweep`), so the next evaluation starts as if alone in the pod.

The runner then prints one JSON account of the group between lines holding the pod's
nonce: per evaluation what was reset, the library files the patch changed and the plugin's
report, and the pristine reference once for the group. The same account, zlib-compressed
and base64-encoded with its logs shortened until it fits, goes to RESULT_FILE, the
container's termination message (:func:`encode_result`, at most :data:`RESULT_MAX_BYTES`),
which the host reads from the pod's status without streaming logs; an account too large
even without its logs says so there, and the host reads the log instead. The host judges
each evaluation with the local backend's code (:func:`gagar.sandbox.verdict.judge`). The
tests' own output goes to a file, never to stdout. This file is shipped to the pod
verbatim, so it must not import gagar and must keep to Python 3.8.
"""

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

BEGIN = "<<<GAGAR-RESULT {nonce}>>>"
END = "<<<GAGAR-END {nonce}>>>"
RESULT_TAG = "GAGAR1"
RESULT_MAX_BYTES = 4096
"""What the kubelet keeps of a termination message (it truncates longer ones)."""
OVERFLOW = "-"
"""Payload of a termination message whose summary did not fit: the host reads the pod log."""


def _packed(group):
    return base64.b64encode(zlib.compress(json.dumps(group).encode("utf-8"), 9)).decode("ascii")


def _with_logs(group, keep):
    """``group`` with each result's log cut to its last ``keep`` characters."""
    results = [dict(s, log=(s.get("log") or "")[-keep:] if keep else "") for s in group["results"]]
    return dict(group, results=results)


def encode_result(group, nonce, limit=RESULT_MAX_BYTES):
    """The termination message ``GAGAR1 <nonce> <payload>``, at most ``limit`` bytes.

    ``group`` is ``{"results": [summary, ...], "reference": ...}``: every evaluation of the pod.
    The payload is it as base64 of zlib-compressed JSON, keeping the longest tail of each log
    that fits (the same length for all, found by bisection, as compression makes the size
    non-linear); when even empty logs do not fit, the payload is :data:`OVERFLOW`.
    """
    head = RESULT_TAG + " " + nonce + " "
    room = limit - len(head)
    longest = max([len(s.get("log") or "") for s in group["results"]] or [0])
    best = _packed(group)
    if len(best) <= room:
        return head + best
    lo, hi, best = 0, longest - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        text = _packed(_with_logs(group, mid))
        if len(text) <= room:
            best, lo = text, mid + 1
        else:
            hi = mid - 1
    return head + (best if best is not None else OVERFLOW)


def _safe_join(root, rel):
    """root/rel, refusing absolute paths and paths that leave root."""
    if os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
        raise ValueError("refused snapshot path " + repr(rel))
    return os.path.join(root, rel)


def prepare_repo(spec, input_dir, repo):
    """Lay out the repository under ``repo``: bundled snapshot or a copy of the image's directory."""
    if spec["repo_source"] == "snapshot":
        with open(os.path.join(input_dir, "snapshot.json"), encoding="utf-8") as fh:
            files = json.load(fh)
        os.makedirs(repo, exist_ok=True)
        for rel, text in sorted(files.items()):
            path = _safe_join(repo, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
    else:
        shutil.copytree(spec["image_repo_dir"], repo, symlinks=True, dirs_exist_ok=True)


def _apply_python(repo, patch_file, max_bytes):
    """Apply with gagar's own applier (shipped as gagar_patch.py): the local backend's exact rules."""
    import gagar_patch

    with open(patch_file, encoding="utf-8") as fh:
        text = fh.read()
    try:
        touched = gagar_patch.apply_patch(Path(repo), text, max_bytes)
    except gagar_patch.PatchError as exc:
        return False, "gagar patch: " + str(exc)
    return True, "gagar patch: applied to " + ", ".join(touched)


def apply_test_patch(repo, patch_file, max_bytes):
    """Apply the task's test patch (``git apply``, else ``patch``, else gagar's): (ok, output)."""
    if os.path.getsize(patch_file) == 0:
        return True, "empty patch"
    attempts = []
    if shutil.which("git"):
        attempts.append(["git", "apply", "--verbose", "--whitespace=nowarn", patch_file])
    if shutil.which("patch"):
        attempts.append(["patch", "--batch", "--forward", "--fuzz=0", "-p1", "-i", patch_file])
    outputs = []
    for cmd in attempts:
        proc = subprocess.run(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        outputs.append("$ " + " ".join(cmd[:2]) + "\n" + proc.stdout.decode("utf-8", "replace"))
        if proc.returncode == 0:
            return True, outputs[-1]
    ok, output = _apply_python(repo, patch_file, max_bytes)
    return ok, "\n".join([*outputs, output])


def apply_model_patch(spec, repo, patch_file):
    """Apply the model patch pristinely; return (ok, output, judged) with judged the summary's part."""
    import gagar_patch
    import gagar_pristine

    with open(patch_file, encoding="utf-8") as fh:
        text = fh.read()
    if not text.strip():
        return True, "empty patch", {"resets": [], "sources": [], "own_packages": []}, None
    try:
        done = gagar_pristine.apply_pristine(
            Path(repo),
            text,
            int(spec["max_patch_bytes"]),
            spec["judged"],
            spec["shadowed"],
            spec["test_dirs"],
        )
    except gagar_patch.PatchError as exc:
        return False, "gagar patch: " + str(exc), None, None
    judged = {
        "resets": [list(r) for r in done.resets],
        "sources": [list(c) for c in done.sources],
        "own_packages": done.own_packages,
    }
    return True, "gagar patch: applied", judged, done


def _copy_bounded(pipe, log, limit, stop):
    """Copy the tests' output to ``log`` until ``limit`` bytes; past it call ``stop`` once.
    Returns the bytes read (the whole output, what was copied or not)."""
    total = 0
    while True:
        chunk = os.read(pipe, 1 << 16)
        if not chunk:
            return total
        if total <= limit:
            log.write(chunk[: max(0, limit - total)])
        total += len(chunk)
        if total > limit and total - len(chunk) <= limit:
            stop()


def run_tests(spec, input_dir, repo, log_path, done):
    """Run the test command pinned, in its own process group; return (exit code, the plugin's report,
    output bytes). Output past the limits' ``max_output_bytes`` stops the run, as in the local
    sandbox (a flood must not fill the pod's disk under its neighbours).

    ``done`` is what :func:`gagar_pristine.apply_pristine` did (None: an empty patch)."""
    import threading

    import gagar_pristine

    max_report = int(spec["max_report_bytes"])
    channels = gagar_pristine.open_channels(max_report)
    try:
        env = dict(os.environ)
        config = gagar_pristine.config_file(Path(repo))
        watch = gagar_pristine.watch_spec(repo, input_dir, done, spec["judged"], spec["test_dirs"])
        env.update(gagar_pristine.pytest_env(repo, input_dir, config, channels.fds, watch))
        if os.environ.get("PYTHONPATH"):  # the image's own, after the judge's folder
            env["PYTHONPATH"] += os.pathsep + os.environ["PYTHONPATH"]
        read_end, write_end = os.pipe()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", spec["test_cmd"]],
                cwd=repo,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=channels.fds,
            )
            os.close(write_end)

            def stop():
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)

            copied = []
            limit = int(spec["limits"]["max_output_bytes"])
            copier = threading.Thread(
                target=lambda: copied.append(_copy_bounded(read_end, log, limit, stop)), daemon=True
            )
            copier.start()
            code = proc.wait()
            stop()  # whatever the tests left running (it holds the pipe open)
            copier.join(timeout=10)
        os.close(read_end)
        report = gagar_pristine.read_report(channels.report.collect(), channels.nonce, max_report)
    finally:
        channels.close()
    return code, report, copied[0] if copied else 0


def _tail(path, limit):
    if not os.path.exists(path):
        return ""
    with open(path, "rb") as fh:
        data = fh.read()
    return data[-limit:].decode("utf-8", "replace")


def evaluate(spec, input_dir, workspace, patch_name):
    """Do one evaluation in ``workspace``; return its summary dict (stage says how far it got)."""
    limit = int(spec.get("max_log_chars", 20000))
    repo = os.path.join(workspace, "repo")
    summary = {"stage": "setup", "exit_code": None, "report": None, "judged": None, "log": ""}
    try:
        prepare_repo(spec, input_dir, repo)
    except (OSError, ValueError) as exc:
        summary["log"] = f"could not lay out the repository: {exc}"
        return summary
    sys.path.insert(0, input_dir)  # gagar_patch.py, gagar_pristine.py
    summary["stage"] = "model_patch"
    ok, output, summary["judged"], done = apply_model_patch(spec, repo, os.path.join(input_dir, patch_name))
    summary["log"] = output[-limit:]
    if not ok:
        return summary
    summary["stage"] = "test_patch"
    ok, output = apply_test_patch(repo, os.path.join(input_dir, "test.patch"), int(spec["max_patch_bytes"]))
    summary["log"] = output[-limit:]
    if not ok:
        return summary
    summary["stage"] = "tests"
    import gagar_pristine

    files = {t.split("::", 1)[0] for t in spec.get("tests", [])}
    summary["reference"] = gagar_pristine.reference(Path(repo), files)._asdict()
    log_path = os.path.join(workspace, "test-output.log")
    summary["exit_code"], report, output_bytes = run_tests(spec, input_dir, repo, log_path, done)
    summary["report"] = report._asdict()
    summary["output_bytes"] = output_bytes
    summary["output_exceeded"] = output_bytes > int(spec["limits"]["max_output_bytes"])
    summary["log"] = _tail(log_path, limit)
    summary["stage"] = "done"
    return summary


# -- one isolated child per evaluation ------------------------------------------------------------

_PR_SET_DUMPABLE = 4


def _set_dumpable(on):
    """Not dumpable: processes of the same uid can neither trace us nor open our /proc files."""
    import gagar_forkserver

    gagar_forkserver._LIBC.prctl(_PR_SET_DUMPABLE, 1 if on else 0, 0, 0, 0)


def _fresh_mounts(tmp_dir):
    """In the evaluation's own mount and PID namespaces: a fresh /proc, /tmp and /dev/shm where the
    kernel allows it (a container's masked /proc refuses a new one); returns what was refused."""
    import gagar_forkserver as fs

    refused = []
    fs._mount(b"none", b"/", None, fs._MS_REC | fs._MS_PRIVATE)
    mounts = [(b"proc", b"/proc", b"proc", None), (b"tmpfs", tmp_dir.encode(), b"tmpfs", b"mode=1777")]
    if os.path.isdir("/dev/shm"):
        mounts.append((b"tmpfs", b"/dev/shm", b"tmpfs", b"mode=1777"))
    for source, target, fstype, data in mounts:
        try:
            fs._mount(source, target, fstype, fs._MS_NOSUID | fs._MS_NODEV, data)
        except OSError:
            refused.append(target.decode())
    return refused


def isolate(tmp_dir):
    """Enter fresh user, mount, PID, IPC, network and UTS namespaces, as the local forkserver's
    evaluations do (:mod:`gagar.sandbox.forkserver_worker`, shipped as ``gagar_forkserver``).

    Returns how the evaluation is isolated, in the process that is to run it: the namespaces'
    PID 1 (the caller only waits for it and exits, and whatever the tests leave dies with the
    namespaces). Where the pod may not create namespaces (a RuntimeDefault seccomp profile refuses unshare),
    the isolation is ``process``: a session of its own, the pod's network policy, and the
    runner's sweep and wipe after the evaluation.
    """
    import gagar_forkserver as fs

    _set_dumpable(True)  # else /proc/self/uid_map is root's and cannot be written
    try:
        fs._enter_namespaces(os.getuid(), os.getgid())
    except OSError as exc:
        _set_dumpable(False)
        return "process (" + str(exc.strerror) + ")"
    init = os.fork()
    if init != 0:
        _set_dumpable(False)
        _, status = os.waitpid(init, 0)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)
    _set_dumpable(False)
    refused = _fresh_mounts(tmp_dir)
    with contextlib.suppress(OSError):
        fs._loopback_up()
    return "namespaces" + (" (kept " + ", ".join(refused) + ")" if refused else "")


def set_limits(limits):
    """The local sandbox's rlimits (:func:`gagar.sandbox.isolation.rlimit_args`) on this process and
    what it starts: CPU seconds (SIGXCPU, then SIGKILL a little later), address space, file size,
    no core dumps. Not RLIMIT_NPROC: it counts every process of the uid on the node, and every
    sandbox pod runs as the same uid (a pod's process count is the kubelet's pids limit)."""
    import resource

    cpu = int(limits["cpu_time_s"])
    for which, soft, hard in (
        (resource.RLIMIT_CPU, cpu, cpu + 5),
        (resource.RLIMIT_AS, int(limits["memory_bytes"]), int(limits["memory_bytes"])),
        (resource.RLIMIT_FSIZE, int(limits["max_file_bytes"]), int(limits["max_file_bytes"])),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        _, current = resource.getrlimit(which)
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        resource.setrlimit(which, (soft, hard))


def _child(spec, input_dir, workspace, tmp_dir, patch_name, out_fd):
    """The isolated child: isolate, limit, evaluate, send the summary to the runner, exit."""
    code = 0
    try:
        os.setsid()
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")  # the pod's OOM killer takes the tests, never the runner holding the group
        isolation = isolate(tmp_dir)
        set_limits(spec["limits"])
        summary = evaluate(spec, input_dir, workspace, patch_name)
        summary["isolation"] = isolation
        data = json.dumps(summary).encode("utf-8")
        while data:
            data = data[os.write(out_fd, data) :]
    except BaseException:  # the runner reports a child without a summary
        code = 70
    os._exit(code)


def _read_until(fd, deadline):
    """Everything written to ``fd`` until its end, and whether ``deadline`` (monotonic) passed first."""
    import select
    import time

    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks), False
            chunks.append(chunk)


def _wipe(path):
    """Remove everything under ``path`` (the tested code may have made its folders read-only)."""

    def writable(func, target, _):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)

    for name in os.listdir(path) if os.path.isdir(path) else []:
        entry = os.path.join(path, name)
        if os.path.isdir(entry) and not os.path.islink(entry):
            shutil.rmtree(entry, onerror=writable)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry)


def sweep(tmp_dir):
    """After an evaluation: no process, file or shared-memory object of it is left for the next.

    As the container's PID 1 (in a pod) the runner kills every other process (signals to it
    from the tests are ignored by the kernel) and reaps them, then empties /tmp and /dev/shm;
    elsewhere only its own /tmp folder is emptied (the namespaces ended the processes)."""
    if os.getpid() == 1:
        while True:  # kill(-1) is atomic against fork; reaping until none is left catches the rest
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
        _wipe("/dev/shm")
    _wipe(tmp_dir)


def run_one(spec, input_dir, root, position, tmp_dir):
    """Evaluation ``position`` in an isolated child under the per-evaluation deadline; its summary.

    Its workspace is a folder of ``root``; afterwards everything under ``root`` is removed, so
    nothing it wrote (there, or ahead of a later evaluation) is seen by the next one."""
    import time

    started = time.monotonic()
    _wipe(root)
    workspace = os.path.join(root, f"e{position}")
    patch_name = spec["patches"][position]
    os.makedirs(workspace)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(spec, input_dir, workspace, tmp_dir, patch_name, write_fd)
    os.close(write_fd)
    data, expired = _read_until(read_fd, started + float(spec["limits"]["wall_time_s"]))
    os.close(read_fd)
    if expired:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(OSError):
                kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sweep(tmp_dir)
    _wipe(root)
    summary = None
    if not expired:
        with contextlib.suppress(ValueError):
            summary = json.loads(data.decode("utf-8"))
    if not isinstance(summary, dict):
        why = "timeout" if expired else "lost"
        summary = {"stage": why, "exit_code": None, "report": None, "judged": None, "log": ""}
    summary["duration_s"] = round(time.monotonic() - started, 3)
    return summary


def run_group(spec, input_dir, workspace, tmp_dir):
    """Every evaluation of the pod in turn: ``{"results": [summary, ...], "reference": ...}``.

    The pristine reference is the same for every evaluation of one task (its test files are
    reset before it is compiled), so it travels once; a summary keeps its own only if it differs.
    """
    sys.path.insert(0, input_dir)  # gagar_forkserver.py
    _set_dumpable(False)
    results = [run_one(spec, input_dir, workspace, i, tmp_dir) for i in range(len(spec["patches"]))]
    group = {"results": results}
    references = [s["reference"] for s in results if "reference" in s]
    if references:
        group["reference"] = references[0]
        for s in results:
            if s.get("reference") == group["reference"]:
                del s["reference"]
    return group


def main(argv):
    input_dir, workspace = argv[1], argv[2]
    tmp_dir = argv[4] if len(argv) > 4 else "/tmp"
    with open(os.path.join(input_dir, "spec.json"), encoding="utf-8") as fh:
        spec = json.load(fh)
    group = run_group(spec, input_dir, workspace, tmp_dir)
    sys.stdout.write("\n" + BEGIN.format(nonce=spec["nonce"]) + "\n")
    sys.stdout.write(json.dumps(group) + "\n")
    sys.stdout.write(END.format(nonce=spec["nonce"]) + "\n")
    sys.stdout.flush()
    if len(argv) > 3:  # the container's terminationMessagePath; unwritable, the host reads the log
        with contextlib.suppress(OSError), open(argv[3], "w", encoding="ascii") as fh:
            fh.write(encode_result(group, spec["nonce"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
