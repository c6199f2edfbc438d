"""A minimal OpenAI-compatible completions server for a local policy (``http.server``, loopback).

Serves ``POST /v1/completions`` (prompt as text or token ids, ``n``, ``temperature``, ``top_p``,
``max_tokens``, ``seed``, ``logprobs``, ``return_tokens_as_token_ids``) and ``GET /v1/models`` from
any :class:`~gagar.policy.generation.GenerationBackend`, one request at a time. It is what tests and the
one-machine pipeline use in place of a vLLM server; it is not meant to face a network.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import ValidationError
from transformers import PreTrainedTokenizerBase

from gagar.policy.generation import GenerationBackend, Sample
from gagar.policy.trajectory import SamplingParams

__all__ = ["CompletionServer", "running_server"]


class RequestError(ValueError):
    """A request the server refuses (HTTP 400)."""


def _prompts(value: Any, tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """The ``prompt`` field as token id lists: str, [int], [str] or [[int]]."""
    if isinstance(value, str):
        return [tokenizer.encode(value)]
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        return [list(value)]
    if isinstance(value, list) and value:
        return [p for item in value for p in _prompts(item, tokenizer)]
    raise RequestError("'prompt' must be a string, a list of token ids, or a non-empty list of either")


class CompletionServer:
    """Turns completion requests into backend calls and backend samples into OpenAI replies."""

    def __init__(
        self, backend: GenerationBackend, tokenizer: PreTrainedTokenizerBase, model_name: str
    ) -> None:
        self.backend, self.tokenizer, self.model_name = backend, tokenizer, model_name
        self._lock = threading.Lock()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The reply to one ``/v1/completions`` request body."""
        if body.get("model", self.model_name) != self.model_name:
            raise RequestError(f"unknown model {body.get('model')!r}; this server serves {self.model_name!r}")
        prompts = _prompts(body.get("prompt"), self.tokenizer)
        try:
            params = SamplingParams(
                temperature=body.get("temperature", 1.0),
                top_p=body.get("top_p", 1.0),
                max_new_tokens=body.get("max_tokens", 16),
                seed=body.get("seed"),
            )
        except ValidationError as exc:
            raise RequestError(str(exc)) from None
        n = body.get("n", 1)
        if not isinstance(n, int) or n < 1:
            raise RequestError("'n' must be a positive integer")
        with self._lock:
            samples = self.backend.generate(prompts, params, n)
        as_ids = bool(body.get("return_tokens_as_token_ids", False))
        want_logprobs = body.get("logprobs") is not None
        choices = [
            self._choice(i * n + k, s, as_ids, want_logprobs)
            for i, row in enumerate(samples)
            for k, s in enumerate(row)
        ]
        completion_tokens = sum(len(s.token_ids) for row in samples for s in row)
        prompt_tokens = sum(len(p) for p in prompts)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _choice(self, index: int, sample: Sample, as_ids: bool, want_logprobs: bool) -> dict[str, Any]:
        pieces = [self.tokenizer.decode([t]) for t in sample.token_ids]
        choice: dict[str, Any] = {
            "index": index,
            "text": self.tokenizer.decode(sample.token_ids, skip_special_tokens=True),
            "finish_reason": sample.finish_reason,
            "logprobs": None,
        }
        if want_logprobs:
            tokens = [f"token_id:{t}" for t in sample.token_ids] if as_ids else pieces
            offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": sample.logprobs,
                "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, sample.logprobs, strict=True)],
                "text_offset": offsets,
            }
        return choice


def _handler(server: CompletionServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: tests and rollouts call it often
            pass

        def _reply(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._reply(200, {"object": "list", "data": [{"id": server.model_name, "object": "model"}]})
            else:
                self._reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/completions":
                self._reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if not isinstance(body, dict):
                    raise RequestError("the request body must be a JSON object")
                self._reply(200, server.complete(body))
            except (RequestError, json.JSONDecodeError) as exc:
                self._reply(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})

    return Handler


@contextmanager
def running_server(
    backend: GenerationBackend, tokenizer: PreTrainedTokenizerBase, model_name: str, port: int = 0
) -> Iterator[str]:
    """Serve on ``127.0.0.1:port`` (0: any free port) in a thread; yields the ``/v1`` URL; stops on exit."""
    httpd = ThreadingHTTPServer(
        ("127.0.0.1", port), _handler(CompletionServer(backend, tokenizer, model_name))
    )
    thread = threading.Thread(target=httpd.serve_forever, name="gagar-completions", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
