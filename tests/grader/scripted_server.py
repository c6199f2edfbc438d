"""A scripted OpenAI-compatible server for the LLM grader's tests (run as a subprocess).

``python scripted_server.py`` listens on 127.0.0.1 (a free port, printed on stdout as ``PORT n``).
``POST /script`` with ``{"replies": [...]}`` sets the replies the next completion requests get, in
order: a string is the model's text, ``{"sleep": s, "text": t}`` answers after ``s`` seconds,
``{"status": code}`` answers with that HTTP error. ``GET /requests`` returns the request bodies
received since the last script. Both ``/v1/chat/completions`` and ``/v1/completions`` are served.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_lock = threading.Lock()
_state: dict[str, list[Any]] = {"replies": [], "requests": []}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/requests":
            with _lock:
                self._send(200, _state["requests"])
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
        elif self.path == "/health":
            self._send(200, {})
        else:
            self._send(404, {"error": {"message": self.path}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/script":
            with _lock:
                _state["replies"], _state["requests"] = list(body["replies"]), []
            self._send(200, {"ok": True})
            return
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self._send(404, {"error": {"message": self.path}})
            return
        with _lock:
            _state["requests"].append(body)
            reply = _state["replies"].pop(0) if _state["replies"] else {"status": 503}
        if isinstance(reply, dict) and "status" in reply:
            self._send(reply["status"], {"error": {"message": "scripted failure"}})
            return
        if isinstance(reply, dict):
            time.sleep(reply["sleep"])
            reply = reply["text"]
        if self.path == "/v1/chat/completions":
            choice = {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
        else:
            choice = {"index": 0, "text": reply, "finish_reason": "stop"}
        self._send(200, {"id": "scripted", "object": "completion", "model": "scripted", "choices": [choice]})


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
