"""kill -9 a real `gagar train` while its tool-call sessions are open; count the session processes left.

    python benchmarks/session_kill9.py --config tc-train.yaml [--uids 61000:61256]

The config must name the tool-call agent and a policy that makes calls (sessions open on a
conversation's first call). Prints how many processes the sandbox uids held before the kill and how
many are left after it (results: docs/results/tool-call-agent.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

from gagar.sandbox.process import live_pids_of


def sandbox_pids(uids: range) -> list[int]:
    """Live processes of the sandbox uids."""
    return [pid for uid in uids for pid in live_pids_of(uid)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--uids", default="61000:61256", help="first:end of the sandbox uids")
    parser.add_argument("--wait-for", type=int, default=4, help="kill once this many sandbox processes run")
    args = parser.parse_args()
    first, end = (int(v) for v in args.uids.split(":"))
    uids = range(first, end)
    if sandbox_pids(uids):
        sys.exit("sandbox processes already run: try again when the machine's sandboxes are idle")
    run_dir = tempfile.mkdtemp(prefix="gagar-kill9-")
    command = [
        sys.executable,
        "-m",
        "gagar",
        "train",
        "--config",
        args.config,
        "--run-dir",
        run_dir,
        "--steps",
        "1",
    ]
    train = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start, seen = time.monotonic(), 0
    while time.monotonic() - start < 300 and (seen := len(sandbox_pids(uids))) < args.wait_for:
        time.sleep(0.2)
    print(
        f"sandbox processes of open sessions before kill -9: {seen} (after {time.monotonic() - start:.1f} s)"
    )
    os.kill(train.pid, signal.SIGKILL)
    train.wait()
    killed = time.monotonic()
    while sandbox_pids(uids) and time.monotonic() - killed < 10:
        time.sleep(0.05)
    left = len(sandbox_pids(uids))
    print(f"after kill -9 of gagar train (pid {train.pid}): {left} left, {time.monotonic() - killed:.2f} s")


if __name__ == "__main__":
    main()
