"""The part of the KFP v2beta1 REST API the chart's upload Job uses, for the cluster tests.

KFP's API server cannot run here (no image of it, no Go module proxy to build one), so the tests
that install the chart with its upload Job serve this instead, on an address the node's pods reach.
It answers what ``kfp.Client`` asks for ``gagar pipeline upload`` and ``gagar schedule`` (healthz,
pipelines by name, upload of a pipeline and of a version, versions by name, experiments, recurring
runs) and checks what KFP checks before it stores anything: the package is a compiled pipeline
spec, a pipeline's versions have distinct names, a recurring run names an uploaded version, and its
parameters are inputs of that version's pipeline. A bearer token is reviewed by the cluster's API
server for the audience ``pipelines.kubeflow.org``, as multi-user KFP reviews it; the accounts it
resolved to are recorded.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

PREFIX = "/apis/v2beta1"
AUDIENCE = "pipelines.kubeflow.org"


@dataclass
class Store:
    pipelines: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> version, with its documents
    experiments: dict[str, dict[str, Any]] = field(default_factory=dict)
    recurring_runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    callers: list[str] = field(default_factory=list)  # the users tokens were reviewed as
    refused: list[str] = field(default_factory=list)  # why requests were answered 4xx


def _display_name_filter(query: dict[str, list[str]]) -> str | None:
    raw = query.get("filter", [""])[0]
    if not raw:
        return None
    for predicate in json.loads(raw).get("predicates", []):
        if predicate.get("key") in ("display_name", "name"):
            return predicate.get("string_value") or predicate.get("stringValue")
    return None


def _documents(package: bytes) -> list[dict[str, Any]]:
    """The YAML documents of a compiled package: its pipeline spec, then its platform spec if any.

    Raises:
        ValueError: the first document is not a pipeline spec.
    """
    documents = [d for d in yaml.safe_load_all(package.decode("utf-8")) if d]
    if not documents or "pipelineInfo" not in documents[0] or "root" not in documents[0]:
        raise ValueError("the package is not a compiled pipeline spec")
    return documents


def _input_names(documents: list[dict[str, Any]]) -> set[str]:
    return set(documents[0]["root"].get("inputDefinitions", {}).get("parameters", {}))


def _public(version: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in version.items() if k != "documents"}


class KfpApi:
    """``with KfpApi(host, port, review=...) as api:`` serves on ``api.url``; ``api.store`` holds what
    was uploaded and scheduled. ``review(token) -> user or None`` reviews bearer tokens."""

    def __init__(self, host: str, port: int = 0, review: Any = None) -> None:
        self.store = Store()
        self._review = review
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> KfpApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                return

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                try:
                    self._authorize()
                    with api._lock:
                        status, body = api._dispatch(method, url.path, query, self)
                except PermissionError as exc:
                    status, body = 401, {"error": str(exc)}
                except (ValueError, KeyError) as exc:
                    status, body = 400, {"error": str(exc)}
                if status >= 400:
                    api.store.refused.append(f"{method} {url.path}: {body.get('error')}")
                self._answer(status, body)

            def _authorize(self) -> None:
                header = self.headers.get("Authorization", "")
                if not header or api._review is None:
                    return
                token = header.removeprefix("Bearer ").strip()
                user = api._review(token)
                if user is None:
                    raise PermissionError(f"the token is not valid for audience {AUDIENCE}")
                api.store.callers.append(user)

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_DELETE(self) -> None:
                self._route("DELETE")

            def body_json(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def upload(self) -> bytes:
                """The ``uploadfile`` part of a multipart/form-data body."""
                length = int(self.headers.get("Content-Length") or 0)
                head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
                message = BytesParser(policy=HTTP).parsebytes(head + self.rfile.read(length))
                for part in message.iter_parts():
                    if part.get_param("name", header="content-disposition") == "uploadfile":
                        return part.get_payload(decode=True)
                raise ValueError("the upload has no uploadfile part")

        return Handler

    def _dispatch(
        self, method: str, path: str, query: dict[str, list[str]], request: Any
    ) -> tuple[int, dict[str, Any]]:
        store = self.store
        parts = path.removeprefix(PREFIX).strip("/").split("/")
        first = query.get
        if (method, parts) == ("GET", ["healthz"]):
            return 200, {"multi_user": False}
        if (method, parts) == ("GET", ["pipelines"]):
            name = _display_name_filter(query)
            found = [p for p in store.pipelines.values() if name is None or p["display_name"] == name]
            return 200, {"pipelines": found, "total_size": len(found)} if found else {}
        if (method, parts) == ("POST", ["pipelines", "upload"]):
            documents = _documents(request.upload())
            name = (first("name") or first("display_name") or [documents[0]["pipelineInfo"]["name"]])[0]
            if any(p["display_name"] == name for p in store.pipelines.values()):
                raise ValueError(f"a pipeline named {name!r} exists")
            pipeline = {"pipeline_id": uuid.uuid4().hex, "display_name": name}
            store.pipelines[pipeline["pipeline_id"]] = pipeline
            self._add_version(pipeline["pipeline_id"], name, documents)
            return 200, pipeline
        if (method, parts) == ("POST", ["pipelines", "upload_version"]):
            documents = _documents(request.upload())
            pipeline_id = (first("pipelineid") or [""])[0]
            if pipeline_id not in store.pipelines:
                raise KeyError(f"no pipeline {pipeline_id!r}")
            name = (first("name") or first("display_name") or [""])[0]
            return 200, _public(self._add_version(pipeline_id, name, documents))
        if method == "GET" and len(parts) == 3 and parts[0] == "pipelines" and parts[2] == "versions":
            name = _display_name_filter(query)
            found = [
                _public(ver)
                for ver in store.versions.values()
                if ver["pipeline_id"] == parts[1] and (name is None or ver["display_name"] == name)
            ]
            return 200, {"pipeline_versions": found, "total_size": len(found)} if found else {}
        if (method, parts) == ("GET", ["experiments"]):
            name = _display_name_filter(query)
            found = [e for e in store.experiments.values() if name is None or e["display_name"] == name]
            return 200, {"experiments": found, "total_size": len(found)} if found else {}
        if (method, parts) == ("POST", ["experiments"]):
            experiment = {**request.body_json(), "experiment_id": uuid.uuid4().hex}
            store.experiments[experiment["experiment_id"]] = experiment
            return 200, experiment
        if (method, parts) == ("GET", ["recurringruns"]):
            name = _display_name_filter(query)
            found = [
                r
                for r in store.recurring_runs.values()
                if (name is None or r["display_name"] == name)
                and r.get("experiment_id") == (first("experiment_id") or [r.get("experiment_id")])[0]
            ]
            return 200, {"recurringRuns": found, "total_size": len(found)} if found else {}
        if (method, parts[:1]) == ("DELETE", ["recurringruns"]) and len(parts) == 2:
            store.recurring_runs.pop(parts[1])
            return 200, {}
        if (method, parts) == ("POST", ["recurringruns"]):
            return 200, self._add_recurring_run(request.body_json())
        return 404, {"error": f"{method} {path} is not served here"}

    def _add_version(self, pipeline_id: str, name: str, documents: list[dict[str, Any]]) -> dict[str, Any]:
        taken = {v["display_name"] for v in self.store.versions.values() if v["pipeline_id"] == pipeline_id}
        if name in taken:
            raise ValueError(f"pipeline {pipeline_id} has a version named {name!r} already")
        version = {
            "pipeline_id": pipeline_id,
            "pipeline_version_id": uuid.uuid4().hex,
            "display_name": name,
            "documents": documents,
        }
        self.store.versions[version["pipeline_version_id"]] = version
        return version

    def _add_recurring_run(self, run: dict[str, Any]) -> dict[str, Any]:
        reference = run.get("pipeline_version_reference") or {}
        version = self.store.versions.get(reference.get("pipeline_version_id", ""))
        if version is None or version["pipeline_id"] != reference.get("pipeline_id"):
            raise ValueError(f"the recurring run names no uploaded pipeline version: {reference}")
        if run.get("experiment_id") not in self.store.experiments:
            raise ValueError(f"no experiment {run.get('experiment_id')!r}")
        given = set((run.get("runtime_config") or {}).get("parameters") or {})
        unknown = given - _input_names(version["documents"])
        if unknown:
            raise ValueError(f"parameters the pipeline does not take: {sorted(unknown)}")
        stored = {**run, "recurring_run_id": uuid.uuid4().hex}
        self.store.recurring_runs[stored["recurring_run_id"]] = stored
        return stored
