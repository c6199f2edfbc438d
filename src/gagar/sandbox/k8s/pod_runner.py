"""In-pod runner of the Kubernetes sandbox: standard library only, run by the image's python3.

Usage: ``python3 pod_runner.py INPUT_DIR WORKSPACE_DIR``. INPUT_DIR is the read-only
ConfigMap mount holding ``spec.json``, ``model.patch``, ``test.patch``, ``gagar_patch.py``
(a copy of :mod:`gagar.sandbox.patch`, standard library only) and, for bundled tasks,
``snapshot.json``. The runner lays the repository out under WORKSPACE_DIR/repo
(from the snapshot, or copied from the image's repository directory), applies the model
patch and then the task's test patch, runs the test command with pytest's junit XML
enabled through ``PYTEST_ADDOPTS``, and prints one JSON summary between lines holding the
evaluation's nonce. The tests' own output goes to a file, never to stdout. This file is
shipped to the pod verbatim, so it must not import gagar and must keep to Python 3.8.
The pod, not this script, is the isolation boundary.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

BEGIN = "<<<GAGAR-RESULT {nonce}>>>"
END = "<<<GAGAR-END {nonce}>>>"


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


def apply_patch(repo, patch_file, python_first, max_bytes):
    """Apply a unified diff; return (ok, output).

    The model patch goes through gagar's applier only (``python_first``), as on the local
    backend; the task's test patch tries ``git apply``, then ``patch``, then gagar's applier.
    """
    if os.path.getsize(patch_file) == 0:
        return True, "empty patch"
    if python_first:
        return _apply_python(repo, patch_file, max_bytes)
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


def run_tests(spec, repo, junit_path, log_path):
    """Run the test command in its own process group; return its exit code."""
    env = dict(os.environ)
    addopts = f"--junitxml={junit_path} -o junit_family=xunit1"
    env["PYTEST_ADDOPTS"] = (env.get("PYTEST_ADDOPTS", "") + " " + addopts).strip()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", spec["test_cmd"]],
            cwd=repo,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        code = proc.wait()
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever the tests left running
    return code


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
    summary = {"stage": "setup", "exit_code": None, "junit": None, "log": ""}
    try:
        prepare_repo(spec, input_dir, repo)
    except (OSError, ValueError) as exc:
        summary["log"] = f"could not lay out the repository: {exc}"
        return spec, summary
    sys.path.insert(0, input_dir)  # gagar_patch.py
    for stage, name in (("model_patch", "model.patch"), ("test_patch", "test.patch")):
        summary["stage"] = stage
        path = os.path.join(input_dir, name)
        ok, output = apply_patch(repo, path, stage == "model_patch", int(spec["max_patch_bytes"]))
        summary["log"] = output[-limit:]
        if not ok:
            return spec, summary
    summary["stage"] = "tests"
    junit_path = os.path.join(workspace, "junit.xml")
    log_path = os.path.join(workspace, "test-output.log")
    summary["exit_code"] = run_tests(spec, repo, junit_path, log_path)
    summary["log"] = _tail(log_path, limit)
    if os.path.exists(junit_path):
        with open(junit_path, encoding="utf-8", errors="replace") as fh:
            summary["junit"] = fh.read()
    summary["stage"] = "done"
    return spec, summary


def main(argv):
    input_dir, workspace = argv[1], argv[2]
    spec, summary = evaluate(input_dir, workspace)
    sys.stdout.write("\n" + BEGIN.format(nonce=spec["nonce"]) + "\n")
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.write(END.format(nonce=spec["nonce"]) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
