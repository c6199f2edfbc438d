"""In-pod runner of the Kubernetes sandbox: standard library only, run by the image's python3.

Usage: ``python3 pod_runner.py INPUT_DIR WORKSPACE_DIR [RESULT_FILE]``. INPUT_DIR is the read-only
ConfigMap mount holding ``spec.json``, ``model.patch``, ``test.patch``, copies of
:mod:`gagar.sandbox.patch`, :mod:`gagar.sandbox.pristine`, :mod:`gagar.sandbox.judge_plugin` and
:mod:`gagar.sandbox.judge_monitor` (``gagar_patch.py``, ``gagar_pristine.py``,
``gagar_judge_plugin.py``, ``gagar_judge_monitor.py``), the judge's empty
``pytest.ini`` and, for bundled tasks, ``snapshot.json``. The runner lays the repository out
under WORKSPACE_DIR/repo (from the snapshot, or copied from the image's repository
directory), applies the model patch with the local backend's pristine judge (every test
file, conftest.py and runner setting it touched reset to the task's version), then the
task's test patch, compiles the pristine test files (the trusted reference, before any test
runs), runs the test command with pytest pinned, the runtime monitor watching the patched
files and the judge's plugin writing its report to a pipe only this runner reads
(:func:`gagar_pristine.pytest_env`), and prints one JSON summary between lines holding the
evaluation's nonce: what was reset, the library files the patch changed, the reference and
the plugin's report. The same summary, zlib-compressed and
base64-encoded with its log tail shortened until it fits, goes to RESULT_FILE, the
container's termination message (:func:`encode_result`, at most :data:`RESULT_MAX_BYTES`),
which the host reads from the pod's status without streaming logs; a summary too large
even without its log says so there, and the host reads the log instead. The host judges it
with the local backend's code (:func:`gagar.sandbox.verdict.judge`). The tests' own output
goes to a file, never to stdout. This file is shipped to the pod verbatim, so it must not
import gagar and must keep to Python 3.8. The pod, not this script, is the isolation boundary.
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


def _packed(summary):
    return base64.b64encode(zlib.compress(json.dumps(summary).encode("utf-8"), 9)).decode("ascii")


def encode_result(summary, nonce, limit=RESULT_MAX_BYTES):
    """The termination message ``GAGAR1 <nonce> <payload>``, at most ``limit`` bytes.

    The payload is the summary as base64 of zlib-compressed JSON, keeping the longest tail of
    its log that fits (found by bisection, as compression makes the size non-linear); when
    even an empty log does not fit, the payload is :data:`OVERFLOW`.
    """
    head = RESULT_TAG + " " + nonce + " "
    room = limit - len(head)
    log = summary.get("log") or ""

    def packed(keep):
        return _packed(dict(summary, log=log[len(log) - keep :] if keep else ""))

    best = packed(len(log))
    if len(best) <= room:
        return head + best
    lo, hi, best = 0, len(log) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        text = packed(mid)
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
        os.makedirs(repo)
        for rel, text in sorted(files.items()):
            path = _safe_join(repo, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
    else:
        shutil.copytree(spec["image_repo_dir"], repo, symlinks=True)


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


def run_tests(spec, input_dir, repo, log_path, done):
    """Run the test command pinned, in its own process group; return (exit code, the plugin's report).

    ``done`` is what :func:`gagar_pristine.apply_pristine` did (None: an empty patch)."""
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
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", spec["test_cmd"]],
                cwd=repo,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=channels.fds,
            )
            code = proc.wait()
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the tests left running
        report = gagar_pristine.read_report(channels.report.collect(), channels.nonce, max_report)
    finally:
        channels.close()
    return code, report


def _tail(path, limit):
    if not os.path.exists(path):
        return ""
    with open(path, "rb") as fh:
        data = fh.read()
    return data[-limit:].decode("utf-8", "replace")


def evaluate(input_dir, workspace):
    """Do one evaluation; return the summary dict (stage says how far it got)."""
    with open(os.path.join(input_dir, "spec.json"), encoding="utf-8") as fh:
        spec = json.load(fh)
    limit = int(spec.get("max_log_chars", 20000))
    repo = os.path.join(workspace, "repo")
    summary = {"stage": "setup", "exit_code": None, "report": None, "judged": None, "log": ""}
    try:
        prepare_repo(spec, input_dir, repo)
    except (OSError, ValueError) as exc:
        summary["log"] = f"could not lay out the repository: {exc}"
        return spec, summary
    sys.path.insert(0, input_dir)  # gagar_patch.py, gagar_pristine.py
    summary["stage"] = "model_patch"
    ok, output, summary["judged"], done = apply_model_patch(
        spec, repo, os.path.join(input_dir, "model.patch")
    )
    summary["log"] = output[-limit:]
    if not ok:
        return spec, summary
    summary["stage"] = "test_patch"
    ok, output = apply_test_patch(repo, os.path.join(input_dir, "test.patch"), int(spec["max_patch_bytes"]))
    summary["log"] = output[-limit:]
    if not ok:
        return spec, summary
    summary["stage"] = "tests"
    import gagar_pristine

    files = {t.split("::", 1)[0] for t in spec.get("tests", [])}
    summary["reference"] = gagar_pristine.reference(Path(repo), files)._asdict()
    log_path = os.path.join(workspace, "test-output.log")
    summary["exit_code"], report = run_tests(spec, input_dir, repo, log_path, done)
    summary["report"] = report._asdict()
    summary["log"] = _tail(log_path, limit)
    summary["stage"] = "done"
    return spec, summary


def main(argv):
    input_dir, workspace = argv[1], argv[2]
    spec, summary = evaluate(input_dir, workspace)
    sys.stdout.write("\n" + BEGIN.format(nonce=spec["nonce"]) + "\n")
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.write(END.format(nonce=spec["nonce"]) + "\n")
    sys.stdout.flush()
    if len(argv) > 3:  # the container's terminationMessagePath; unwritable, the host reads the log
        with contextlib.suppress(OSError), open(argv[3], "w", encoding="ascii") as fh:
            fh.write(encode_result(summary, spec["nonce"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
