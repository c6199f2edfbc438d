"""A minimal client for an OpenAI-compatible server (vLLM, or :mod:`gagar.policy.server`): one call
turns a conversation into the model's next message, over ``/chat/completions`` or ``/completions``.

Failures become :class:`~gagar.grader.base.GraderFailure` with reason ``timeout``, ``http_error``
or ``bad_response``, so the grader falls back instead of stopping the run.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gagar.grader.base import GraderFailure

__all__ = [
    "GRADER_GREEDY_TEMPERATURE",
    "MAX_TOKENS",
    "ChatClient",
    "ChatModel",
    "TokenUsage",
    "render_prompt",
]

MAX_TOKENS = 512
"""Most tokens of one grader turn (the llm grader's ``max_tokens``, its one default)."""

GRADER_GREEDY_TEMPERATURE = 0.0
"""The grader's own decoding: greedy (temperature 0 in the OpenAI API), so a group's ranking does not
depend on sampling noise. Not the policy's sampling temperature (:data:`gagar.schema.trajectory.Temperature`),
which samples the rollout at its default 1.0."""

_ROLE_TAGS = {"system": "SYSTEM", "user": "USER", "assistant": "ASSISTANT", "tool": "TOOL"}


def render_prompt(messages: list[dict[str, str]]) -> str:
    """A conversation as one completion prompt: ``ROLE: text`` blocks, ending with ``ASSISTANT:``."""
    blocks = [f"{_ROLE_TAGS[m['role']]}: {m['content']}" for m in messages]
    return "\n\n".join([*blocks, "ASSISTANT:"])


@dataclass
class TokenUsage:
    """Tokens the server reports (OpenAI ``usage``) over a client's requests; thread-safe."""

    requests: int = 0
    prompt_tokens_reported: int = 0
    """Prompt tokens."""
    answer_tokens_reported: int = 0
    """Tokens decoded (``completion_tokens``)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, usage: Any) -> None:
        """Count one request's ``usage`` object (a server that sends none adds nothing)."""
        if not isinstance(usage, dict):
            return
        with self._lock:
            self.requests += 1
            self.prompt_tokens_reported += int(usage.get("prompt_tokens") or 0)
            self.answer_tokens_reported += int(usage.get("completion_tokens") or 0)


class ChatModel(Protocol):
    """What the LLM grader talks to: the model's next message in a conversation. Called from several
    threads at once when gradings run concurrently."""

    def next_message(self, messages: list[dict[str, str]], timeout: float) -> str: ...


@dataclass(frozen=True)
class ChatClient:
    """Talks to ``endpoint`` (the ``/v1`` base URL) as model ``model``; thread-safe (a connection a call)."""

    endpoint: str
    model: str
    api: Literal["chat", "completions"] = "chat"
    max_tokens: int = MAX_TOKENS
    temperature: float = GRADER_GREEDY_TEMPERATURE
    """The grader decodes greedily; a test may sample instead."""
    usage: TokenUsage = field(default_factory=TokenUsage, compare=False)
    """What the server reported for this client's requests so far."""

    def _post(self, route: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        request = urllib.request.Request(
            self.endpoint.rstrip("/") + route,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise GraderFailure("http_error", f"{route}: HTTP {exc.code}: {detail}") from None
        except TimeoutError:
            raise GraderFailure("timeout", f"{route}: no answer within {timeout:.1f} s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError | socket.timeout):
                raise GraderFailure("timeout", f"{route}: no answer within {timeout:.1f} s") from None
            raise GraderFailure("http_error", f"{route}: {exc.reason}") from None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise GraderFailure("bad_response", f"{route}: the server's reply is not JSON") from None

    def next_message(self, messages: list[dict[str, str]], timeout: float) -> str:
        """The model's reply to ``messages`` (roles system/user/assistant)."""
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens}
        body["temperature"] = self.temperature
        if self.api == "chat":
            reply = self._post("/chat/completions", {**body, "messages": messages}, timeout)
        else:
            body.update(prompt=render_prompt(messages), stop=["\nUSER:", "\nTOOL:"])
            reply = self._post("/completions", body, timeout)
        self.usage.add(reply.get("usage") if isinstance(reply, dict) else None)
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] if self.api == "chat" else choice["text"]
        except (KeyError, IndexError, TypeError):
            raise GraderFailure("bad_response", f"no {self.api} choice: {str(reply)[:200]}") from None
        if not isinstance(text, str):
            raise GraderFailure("bad_response", "the reply's content is not text")
        return text
