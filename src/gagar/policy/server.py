"""A minimal OpenAI-compatible completions server for a local policy (``http.server``, loopback).

Serves ``POST /v1/completions`` (prompt as text or token ids, ``n``, ``temperature``, ``top_p``,
``max_tokens``, ``seed``, ``logprobs``, ``return_tokens_as_token_ids``), ``POST /v1/chat/completions``
(``messages`` rendered with the tokenizer's chat template, the same sampling fields), ``GET /v1/models`` and
``GET /health`` from any :class:`~gagar.policy.generation.GenerationBackend`. Concurrent requests with
the same sampling settings are decoded together in one batch (:mod:`gagar.policy.batching`;
``max_batch=1`` serves one request at a time).
Given an adapter loader (:func:`peft_adapter_loader`) it also serves vLLM's runtime LoRA routes
``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (``{"lora_name", "lora_path"}``), each
adapter then sampled under its own model name, with vLLM's status codes. It is what tests and the
one-machine pipeline use in place of a vLLM server; it is not meant to face a network.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from pydantic import ValidationError
from transformers import PreTrainedTokenizerBase

from gagar.policy.batching import RequestBatcher
from gagar.policy.generation import GenerationBackend, HFBackend, Sample
from gagar.schema.trajectory import SamplingParams

__all__ = ["AdapterLoader", "CompletionServer", "peft_adapter_loader", "running_server"]

AdapterLoader = Callable[[str], GenerationBackend]
"""Builds the backend that samples with the LoRA adapter saved in a directory."""


GREEDY_TEMPERATURE = 1e-5
"""What a request's ``temperature: 0`` (greedy) samples at."""


class RequestError(ValueError):
    """A request the server refuses (HTTP 400)."""


class NotFoundError(LookupError):
    """A model, adapter or route the server does not have (HTTP 404)."""


def peft_adapter_loader(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> AdapterLoader:
    """Loads a peft ``save_pretrained`` adapter onto a private copy of ``model`` (the base stays clean)."""

    def load(path: str) -> GenerationBackend:
        from peft import PeftModel

        return HFBackend(PeftModel.from_pretrained(copy.deepcopy(model), path).eval(), tokenizer)

    return load


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
        self,
        backend: GenerationBackend,
        tokenizer: PreTrainedTokenizerBase,
        model_name: str,
        adapter_loader: AdapterLoader | None = None,
        max_batch: int = 32,
    ) -> None:
        self.tokenizer, self.model_name, self.adapter_loader = tokenizer, model_name, adapter_loader
        self.backends: dict[str, GenerationBackend] = {model_name: backend}
        """Served name -> backend: the base model and each loaded adapter."""
        self.batcher = RequestBatcher(max_batch)
        """Decodes concurrent requests together, at most ``max_batch`` sequences a batch."""
        self._lock = threading.Lock()

    def load_adapter(self, body: dict[str, Any]) -> str:
        """``/v1/load_lora_adapter``: serve the adapter at ``lora_path`` as ``lora_name``."""
        if self.adapter_loader is None:
            raise NotFoundError("runtime LoRA loading is not enabled on this server")
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise RequestError("'lora_name' and 'lora_path' must both be non-empty strings")
        if name in self.backends:
            raise RequestError(f"The lora adapter '{name}' has already been loaded.")
        try:
            backend = self.adapter_loader(path)
        except (OSError, ValueError) as exc:
            raise RequestError(f"cannot load LoRA adapter {name!r} from {path}: {exc}") from None
        with self._lock:
            if name in self.backends:  # loaded by a concurrent request meanwhile
                raise RequestError(f"The lora adapter '{name}' has already been loaded.")
            self.backends[name] = backend
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload_adapter(self, body: dict[str, Any]) -> str:
        """``/v1/unload_lora_adapter``: stop serving the adapter ``lora_name``."""
        name = body.get("lora_name")
        if self.adapter_loader is None:
            raise NotFoundError("runtime LoRA loading is not enabled on this server")
        with self._lock:
            if name == self.model_name or name not in self.backends:
                raise NotFoundError(f"The lora adapter '{name}' cannot be found.")
            del self.backends[name]
        return f"Success: LoRA adapter '{name}' removed successfully."

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The reply to one ``/v1/completions`` request body."""
        name = body.get("model", self.model_name)
        if name not in self.backends:
            raise NotFoundError(f"The model `{name}` does not exist (served: {sorted(self.backends)}).")
        prompts = _prompts(body.get("prompt"), self.tokenizer)
        try:
            temperature = body.get("temperature", 1.0)
            params = SamplingParams(
                # 0 means greedy in the OpenAI API and vLLM; sampling this cold picks the argmax token
                temperature=GREEDY_TEMPERATURE if temperature == 0 else temperature,
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
            backend = self.backends.get(name)
            if backend is None:  # unloaded while this request was being parsed
                raise NotFoundError(f"The model `{name}` does not exist.")
        samples = self.batcher.generate(backend, prompts, params, n)
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
            "model": name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The reply to one ``/v1/chat/completions`` request: the messages in the model's chat template,
        completed as text."""
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            raise RequestError("'messages' must be a non-empty list of {role, content} strings")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise RequestError("the served tokenizer has no chat template; use /v1/completions")
        prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        fields = {k: v for k, v in body.items() if k not in ("messages", "logprobs")}
        reply = self.complete({**fields, "prompt": self.tokenizer.encode(prompt, add_special_tokens=False)})
        reply["object"] = "chat.completion"
        reply["choices"] = [
            {
                "index": c["index"],
                "message": {"role": "assistant", "content": c["text"]},
                "finish_reason": c["finish_reason"],
            }
            for c in reply["choices"]
        ]
        return reply

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

        def _text(self, code: int, text: str) -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.rstrip("/")
            if path == "/v1/models":
                data = [{"id": name, "object": "model"} for name in list(server.backends)]
                self._reply(200, {"object": "list", "data": data})
            elif path == "/health":
                self._text(200, "")
            else:
                self._reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            routes = {
                "/v1/completions": server.complete,
                "/v1/chat/completions": server.chat,
                "/v1/load_lora_adapter": server.load_adapter,
                "/v1/unload_lora_adapter": server.unload_adapter,
            }
            route = routes.get(self.path.rstrip("/"))
            if route is None:
                self._reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if not isinstance(body, dict):
                    raise RequestError("the request body must be a JSON object")
                answer = route(body)
                if isinstance(answer, str):
                    self._text(200, answer)
                else:
                    self._reply(200, answer)
            except (RequestError, json.JSONDecodeError) as exc:
                self._reply(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
            except NotFoundError as exc:
                self._reply(404, {"error": {"message": str(exc.args[0]), "type": "not_found"}})

    return Handler


@contextmanager
def running_server(
    backend: GenerationBackend,
    tokenizer: PreTrainedTokenizerBase,
    model_name: str,
    port: int = 0,
    adapter_loader: AdapterLoader | None = None,
    max_batch: int = 32,
) -> Iterator[str]:
    """Serve on ``127.0.0.1:port`` (0: any free port) in a thread; yields the ``/v1`` URL; stops on exit.

    With ``adapter_loader`` the runtime LoRA routes are enabled; ``max_batch`` is the most sequences
    decoded together (1: one request at a time).
    """
    server = CompletionServer(backend, tokenizer, model_name, adapter_loader, max_batch)
    httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(server))
    thread = threading.Thread(target=httpd.serve_forever, name="gagar-completions", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
        server.batcher.close()
