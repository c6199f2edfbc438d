"""The warm stage server: a call runs in a fork with the caller's environment, directory and output,
and answers with the value or the exception; a fork that dies is a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gagar.pipeline import warm_stages
from gagar.pipeline.warm_stages import ENV, WarmStageError, call, warm


@pytest.fixture(scope="module")
def server() -> str:
    with warm_stages.warm_stages() as address:
        yield address


def test_a_call_sees_the_callers_environment_and_directory(server: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GAGAR_TEST_ONLY_IN_CALLER", "here")
    monkeypatch.chdir(tmp_path)
    assert call(server, "os", "getenv", ("GAGAR_TEST_ONLY_IN_CALLER",), {}) == "here"
    assert call(server, "os", "getcwd", (), {}) == str(tmp_path)
    assert call(server, "os", "getenv", (ENV,), {}) is None  # a fork never hands its calls on again
    assert call(server, "os.path", "join", ("a", "b"), {}) == "a/b"
    assert call(server, "os", "getpid", (), {}) not in (os.getpid(), None)


def test_a_stage_error_is_raised_in_the_caller_with_the_forks_traceback(server: str) -> None:
    with pytest.raises(json.JSONDecodeError) as raised:
        call(server, "json", "loads", ("{",), {})
    assert any("warm stage server" in note for note in raised.value.__notes__)


def test_a_fork_that_dies_is_named(server: str) -> None:
    with pytest.raises(WarmStageError, match=r"os\._exit died in the warm stage server"):
        call(server, "os", "_exit", (3,), {})
    assert call(server, "os", "getenv", ("HOME",), {}) == os.environ.get("HOME")  # the server lives on


def test_the_forks_output_goes_to_the_callers_stdout_and_stderr(server: str) -> None:
    script = (
        "import sys; from gagar.pipeline.warm_stages import call; "
        f"call({server!r}, 'builtins', 'print', ('to stdout',), {{}}); "
        f"call({server!r}, 'os', 'write', (2, b'to stderr'), {{}})"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "to stdout\n"
    assert done.stderr == "to stderr"


def test_without_a_server_a_warm_function_runs_here(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert warm(os.getpid)() == os.getpid()
    monkeypatch.setenv(ENV, "/nonexistent/stages.sock")
    with pytest.raises(WarmStageError, match="unreachable"):
        warm(os.getpid)()


def test_the_fork_logs_as_the_caller_configured_its_root_logger(server: str) -> None:
    script = (
        "import logging, sys; from gagar.pipeline.warm_stages import call; "
        "logging.basicConfig(stream=sys.stdout, format='[task %(levelname)s]: %(message)s', level=20); "
        f"call({server!r}, 'logging', 'info', ('from the fork',), {{}})"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "[task INFO]: from the fork\n"


def test_only_the_runs_user_can_reach_the_socket(server: str) -> None:
    assert Path(server).parent.stat().st_mode & 0o077 == 0  # a call is a pickle: nobody else may send one
