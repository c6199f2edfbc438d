"""What a local pipeline run shows a person: one line per finished task, KFP's executor logs in a file.

kfp.local writes every task's start, its executor's input and output JSON and its streamed logs to
the terminal: two steps of the embedded default print about two thousand lines. :func:`logged_to`
sends all of that (this process's and every task process's output) to a log file instead, and
reports each task as it finishes, with its step and duration, from the log's own lines.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

__all__ = ["TaskEvent", "logged_to", "parse_event"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SUFFIX = re.compile(r"(-\d+)+$")
_STARTED = re.compile(r"Executing task '(?P<task>[^']+)'")
_FINISHED = re.compile(r"Task '(?P<task>[^']+)' finished with status (?P<status>[A-Z]+)")


class TaskEvent:
    """A task that started or finished, as the log says."""

    def __init__(self, task: str, status: str | None) -> None:
        self.task, self.status = task, status

    def __repr__(self) -> str:
        return f"TaskEvent({self.task!r}, {self.status!r})"


def parse_event(line: str) -> TaskEvent | None:
    """The task event a kfp.local log line reports (start: status None), or None."""
    plain = _ANSI.sub("", line)
    if found := _FINISHED.search(plain):
        return TaskEvent(found["task"], found["status"])
    if found := _STARTED.search(plain):
        return TaskEvent(found["task"], None)
    return None


class _Reporter:
    """Turns task events into lines: ``step 0  rollout   done in 3.1 s``; a new step at each prepare."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.step = -1
        self.started: dict[str, float] = {}

    def __call__(self, event: TaskEvent) -> None:
        stage = _SUFFIX.sub("", event.task)  # kfp.local names repeats rollout-2, rollout-2-2, …
        if event.status is None:
            self.started[event.task] = time.perf_counter()
            if stage == "prepare":
                self.step += 1
            return
        took = time.perf_counter() - self.started.pop(event.task, time.perf_counter())
        verdict = "done" if event.status == "SUCCESS" else event.status.lower()
        self.write(f"  step {max(self.step, 0)}  {stage:<13} {verdict} in {took:.1f} s")


@contextmanager
def logged_to(path: Path, *, show: TextIO | None = None) -> Iterator[Path]:
    """Within the block, everything written to this process's stdout and stderr (its task processes'
    output included) goes to ``path``; each task's end is reported on ``show`` (the terminal as it
    was) as it happens. The log file is kept; on an error its last lines are in the file, and the
    exception propagates."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = show or os.fdopen(os.dup(1), "w", buffering=1)
    report = _Reporter(lambda line: print(line, file=terminal, flush=True))
    done = threading.Event()
    with open(path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        follower = threading.Thread(target=_follow, args=(path, log.tell(), report, done), daemon=True)
        follower.start()
        try:
            yield path
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            done.set()
            follower.join(timeout=5)
            if show is None:
                terminal.close()


def _follow(path: Path, offset: int, report: Callable[[TaskEvent], None], done: threading.Event) -> None:
    """Read ``path`` from ``offset`` as it grows, reporting each task event, until ``done`` and read out."""
    with open(path, encoding="utf-8", errors="replace") as source:
        source.seek(offset)
        pending = ""
        while True:
            chunk = source.read()
            if chunk:
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    if (event := parse_event(line)) is not None:
                        report(event)
            elif done.is_set():
                return
            else:
                time.sleep(0.1)
