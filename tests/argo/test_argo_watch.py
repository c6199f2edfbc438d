"""Following a workflow through the Argo server API: a real HTTP server on loopback, and a live one."""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gagar.cli import runs
from gagar.pipeline.argo_watch import (
    ArgoApiError,
    ArgoServer,
    format_summary,
    server_url,
    summarise,
    watch,
)

RECORDED = json.loads((Path(__file__).parent / "data" / "workflow-failed-sandbox.json").read_text())
NAME = RECORDED["metadata"]["name"]
TOKEN = "secret-token"
CLI = typer.Typer()
CLI.add_typer(runs.app, name="runs")  # as the gagar command mounts it


def running_version(workflow: dict[str, Any]) -> dict[str, Any]:
    """The same workflow while the sandbox's second attempt still runs."""
    running = copy.deepcopy(workflow)
    status = running["status"]
    status["phase"], status["progress"] = "Running", "2/4"
    del status["finishedAt"], status["message"]
    attempt = next(n for n in status["nodes"].values() if n["displayName"] == "sandbox-0(1)")
    attempt["phase"] = "Running"
    del attempt["finishedAt"], attempt["message"]
    return running


class FakeArgo:
    """An HTTP server answering the Argo API's workflow routes from a queue of recorded bodies."""

    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        self.bodies = bodies
        self.requests: list[tuple[str, str | None]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append((self.path, self.headers.get("Authorization")))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._send(401, {"code": 16, "message": "token not valid"})
                if self.path == "/api/v1/workflows/argo":
                    return self._send(200, {"items": [{"metadata": owner.bodies[-1]["metadata"]}]})
                if self.path == f"/api/v1/workflows/argo/{NAME}":
                    body = owner.bodies.pop(0) if len(owner.bodies) > 1 else owner.bodies[0]
                    return self._send(200, body)
                return self._send(404, {"code": 5, "message": "workflows.argoproj.io not found"})

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def argo() -> Iterator[FakeArgo]:
    server = FakeArgo([running_version(RECORDED), RECORDED])
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def test_summary_of_a_failed_run_lists_steps_and_failed_sandbox_pods() -> None:
    summary = summarise(RECORDED)
    assert (summary.name, summary.namespace, summary.phase, summary.done) == (NAME, "argo", "Failed", True)
    assert summary.duration_s == 1300.0
    assert [row.task for row in summary.steps] == ["prepare-0", "rollout-0", "sandbox-0(0)", "sandbox-0(1)"]
    assert [row.duration_s for row in summary.steps] == [30.0, 900.0, 30.0, 300.0]
    failed = summary.failed_sandbox_pods
    assert [(row.pod, row.phase, row.message) for row in failed] == [
        (f"{NAME}-sandbox-1602258712", "Error", "pod deleted"),
        (f"{NAME}-sandbox-1585481093", "Failed", "OOMKilled (exit code 137)"),
    ]
    text = format_summary(summary)
    assert text.splitlines()[0] == f"argo/{NAME}: Failed 2/4 (1300s) - child '{NAME}-2830446436' failed"
    assert "failed sandbox pods (2)" in text
    assert f"{NAME}-sandbox-1585481093: Failed OOMKilled (exit code 137)" in text


def test_running_steps_are_timed_to_now_and_unstarted_ones_have_no_duration() -> None:
    workflow = running_version(RECORDED)
    workflow["status"]["nodes"]["pending"] = {"id": "pending", "type": "Pod", "displayName": "grade-0"}
    summary = summarise(workflow, now=datetime(2026, 11, 30, 2, 17, 40, tzinfo=UTC))
    assert not summary.done
    rows = {row.task: row for row in summary.steps}
    assert rows["sandbox-0(1)"].duration_s == 60.0
    assert rows["grade-0"].duration_s is None
    assert rows["grade-0"].phase == "Pending"
    assert [row.task for row in summary.steps][-1] == "grade-0"  # not started: listed last
    with pytest.raises(ValueError, match=r"no metadata\.name"):
        summarise({"kind": "Status"})


def test_watch_polls_until_the_workflow_finishes(argo: FakeArgo) -> None:
    client = ArgoServer(argo.url, TOKEN)
    pauses: list[float] = []
    summaries = list(watch(client, "argo", NAME, interval_s=7.0, sleep=pauses.append))
    assert [s.phase for s in summaries] == ["Running", "Failed"]
    assert pauses == [7.0]
    assert argo.requests[0] == (f"/api/v1/workflows/argo/{NAME}", f"Bearer {TOKEN}")
    assert client.workflow_names("argo") == [NAME]


def test_api_errors_name_the_status_and_the_servers_message(argo: FakeArgo) -> None:
    with pytest.raises(ArgoApiError, match=r"HTTP 401.*token not valid"):
        ArgoServer(argo.url, "wrong").workflow("argo", NAME)
    with pytest.raises(ArgoApiError, match=r"HTTP 404.*not found"):
        ArgoServer(argo.url, f"Bearer {TOKEN}").workflow("argo", "missing")
    with pytest.raises(ArgoApiError, match=r"Connection refused|timed out"):
        ArgoServer("http://127.0.0.1:9", TOKEN, timeout_s=2).workflow("argo", NAME)


def test_server_url_follows_the_argo_cli_conventions() -> None:
    assert server_url("argo-server.argo:2746") == "https://argo-server.argo:2746"
    assert server_url("localhost:2746", secure=False) == "http://localhost:2746"
    assert server_url("http://127.0.0.1:2746/") == "http://127.0.0.1:2746"
    with pytest.raises(ValueError, match="ARGO_SERVER"):
        server_url("")


def test_cli_watch_prints_changes_and_exits_1_on_failure(argo: FakeArgo) -> None:
    env = {"ARGO_SERVER": argo.url, "ARGO_TOKEN": TOKEN, "ARGO_NAMESPACE": "argo"}
    result = CliRunner().invoke(CLI, ["runs", "watch", NAME, "--interval-s", "0.1"], env=env)
    assert result.exit_code == 1, result.output
    assert result.output.count(f"argo/{NAME}:") == 2
    assert "failed sandbox pods (2)" in result.output
    once = CliRunner().invoke(CLI, ["runs", "watch", NAME, "--once"], env=env)
    assert once.exit_code == 1  # the queue now holds only the failed state
    missing = CliRunner().invoke(CLI, ["runs", "watch", "missing", "--once"], env=env)
    assert missing.exit_code == 2
    assert "HTTP 404" in missing.output


@pytest.mark.skipif(not os.environ.get("ARGO_SERVER"), reason="needs a live Argo server (ARGO_SERVER)")
def test_live_argo_server_summaries() -> None:
    """Against the Argo server of ARGO_SERVER (ARGO_TOKEN, ARGO_NAMESPACE, ARGO_SECURE,
    ARGO_INSECURE_SKIP_VERIFY as the argo CLI reads them): every workflow there summarises."""
    secure = os.environ.get("ARGO_SECURE", "true").lower() != "false"
    client = ArgoServer(
        server_url(os.environ["ARGO_SERVER"], secure),
        os.environ.get("ARGO_TOKEN"),
        verify_tls=os.environ.get("ARGO_INSECURE_SKIP_VERIFY", "false").lower() != "true",
    )
    namespace = os.environ.get("ARGO_NAMESPACE", "argo")
    for name in client.workflow_names(namespace)[:5]:
        summary = summarise(client.workflow(namespace, name))
        assert summary.name == name
        assert summary.phase in {"Pending", "Running", "Succeeded", "Failed", "Error"}
        assert format_summary(summary).startswith(f"{namespace}/{name}: ")
