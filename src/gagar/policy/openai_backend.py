"""Generation through any OpenAI-compatible ``/v1/completions`` endpoint (vLLM, :mod:`gagar.policy.server`).

Prompts go as token ids and the endpoint must return ``logprobs.tokens`` as ``"token_id:N"`` strings
(vLLM's ``return_tokens_as_token_ids: true``), so the ids training sees are exactly the sampled ones.
For the log-prob convention of :mod:`gagar.policy.trajectory` at temperatures other than 1, start
vLLM with ``--logprobs-mode processed_logprobs``; at temperature 1 every mode agrees.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from gagar.policy.generation import Sample
from gagar.policy.trajectory import SamplingParams

__all__ = ["EndpointError", "OpenAIBackend", "parse_token_id"]

_PREFIX = "token_id:"


class EndpointError(RuntimeError):
    """The endpoint failed or answered something that is not a completion with token ids."""


def parse_token_id(token: str) -> int:
    """``"token_id:123"`` -> 123.

    Raises:
        EndpointError: for a token in any other form (the endpoint ignored ``return_tokens_as_token_ids``).
    """
    if not token.startswith(_PREFIX) or not token[len(_PREFIX) :].isdigit():
        raise EndpointError(
            f"token {token!r} is not 'token_id:N': the endpoint must support return_tokens_as_token_ids"
        )
    return int(token[len(_PREFIX) :])


class OpenAIBackend:
    """Samples from an OpenAI-compatible completions endpoint.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name.
        stop_token_ids: the ids that end an answer (the policy tokenizer's EOS), for trimming and bookkeeping.
        api_key: sent as a bearer token when set.
        timeout_s: per-request timeout.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        stop_token_ids: Sequence[int],
        api_key: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/completions"
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.stop_token_ids = tuple(stop_token_ids)

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        """``n`` samples per prompt, one request per prompt (seeded ``params.seed + index`` when set)."""
        return [self._complete(p, params, n, i) for i, p in enumerate(prompts)]

    def _complete(self, prompt: list[int], params: SamplingParams, n: int, index: int) -> list[Sample]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": n,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "stop_token_ids": list(self.stop_token_ids),
            "skip_special_tokens": False,
        }
        if params.seed is not None:
            body["seed"] = params.seed + index
        reply = self._post(body)
        try:
            return [self._sample(c) for c in sorted(reply["choices"], key=lambda c: c["index"])]
        except (KeyError, TypeError) as exc:
            raise EndpointError(
                f"{self.url}: reply lacks {exc} (need choices[].logprobs.tokens/token_logprobs)"
            ) from None

    def _sample(self, choice: dict[str, Any]) -> Sample:
        ids = [parse_token_id(t) for t in choice["logprobs"]["tokens"]]
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        if len(ids) != len(logprobs):
            raise EndpointError(f"{self.url}: {len(ids)} tokens but {len(logprobs)} log-probs")
        reason = "stop" if ids and ids[-1] in self.stop_token_ids else choice.get("finish_reason") or "length"
        return Sample(ids, logprobs, reason)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise EndpointError(
                f"{self.url}: HTTP {exc.code}: {exc.read()[:500].decode(errors='replace')}"
            ) from None
        except urllib.error.URLError as exc:
            raise EndpointError(f"{self.url}: {exc.reason}") from None
