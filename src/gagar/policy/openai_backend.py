"""Generation through any OpenAI-compatible ``/v1/completions`` endpoint (vLLM, :mod:`gagar.policy.server`).

Prompts go as token ids and the endpoint must return ``logprobs.tokens`` as ``"token_id:N"`` strings
(vLLM's ``return_tokens_as_token_ids: true``), so the ids training sees are exactly the sampled ones.
For the log-prob convention of :mod:`gagar.schema.trajectory` at temperatures other than 1, start
vLLM with ``--logprobs-mode processed_logprobs`` (:func:`gagar.policy.vllm_server.start_policy_server`
does); at temperature 1 every mode agrees.

``model`` is the policy version: the base model's served name or a LoRA adapter's (``policy-step-N``,
docs/warm-inference.md). Before sampling the backend checks that the server serves that name, and every
reply must name it back; otherwise it raises :class:`StaleAdapterError` instead of sampling from
other weights. Each returned :class:`VersionedSample` records the version that produced it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gagar.policy.generation import Sample
from gagar.schema.trajectory import SamplingParams

__all__ = [
    "EndpointError",
    "OpenAIBackend",
    "StaleAdapterError",
    "VersionedSample",
    "http_call",
    "parse_token_id",
    "served_model_names",
]

_PREFIX = "token_id:"


class EndpointError(RuntimeError):
    """The endpoint failed or answered something that is not a completion with token ids."""


class StaleAdapterError(EndpointError):
    """The server does not serve the requested policy version, or answered under another name."""


@dataclass(frozen=True)
class VersionedSample(Sample):
    """A :class:`Sample` with the policy version (served model name) the server sampled it from."""

    policy_version: str


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


def http_call(
    url: str,
    body: dict[str, Any] | None = None,
    *,
    timeout_s: float,
    api_key: str | None = None,
    error: type[EndpointError] = EndpointError,
) -> str:
    """GET ``url`` (no body) or POST ``body`` as JSON; the reply's text.

    Raises:
        EndpointError: (or ``error``) naming the URL and the server's answer, for a non-2xx status or
            when the server cannot be reached.
    """
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers=headers, method="GET" if data is None else "POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.read().decode()
    except urllib.error.HTTPError as exc:
        raise error(f"{url}: HTTP {exc.code}: {exc.read()[:500].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise error(f"{url}: {getattr(exc, 'reason', exc)}") from None


def served_model_names(models_reply: str, url: str) -> list[str]:
    """The ``id``s of a ``GET /v1/models`` reply (base model and loaded adapters).

    Raises:
        EndpointError: when the reply is not an OpenAI model list.
    """
    try:
        return [m["id"] for m in json.loads(models_reply)["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise EndpointError(f"{url}: not an OpenAI model list ({exc}): {models_reply[:200]!r}") from None


class OpenAIBackend:
    """Samples from an OpenAI-compatible completions endpoint under one policy version.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: the policy version: the served base model name or a loaded LoRA adapter's name.
        stop_token_ids: the ids that end an answer (the policy tokenizer's EOS), for trimming and
            bookkeeping; empty leaves stopping to the server's own end-of-sequence handling.
        api_key: sent as a bearer token when set.
        timeout_s: per-request timeout.
        check_served: ask ``GET /v1/models`` before each :meth:`generate` whether ``model`` is served.
        max_in_flight: most requests of one :meth:`generate` sent at once (the server batches them).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        stop_token_ids: Sequence[int] = (),
        api_key: str | None = None,
        timeout_s: float = 600.0,
        check_served: bool = True,
        max_in_flight: int = 64,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/completions"
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.stop_token_ids = tuple(stop_token_ids)
        self.check_served = check_served
        self.max_in_flight = max_in_flight

    @property
    def policy_version(self) -> str:
        """The version every sample of this backend comes from (the ``model`` it requests)."""
        return self.model

    def require_served(self) -> None:
        """Raises :class:`StaleAdapterError` when the server does not list ``self.model``."""
        url = self.base_url + "/models"
        served = served_model_names(http_call(url, timeout_s=self.timeout_s, api_key=self.api_key), url)
        if self.model not in served:
            raise StaleAdapterError(
                f"{self.base_url} does not serve policy version {self.model!r} (it serves {served}); "
                "load the adapter first rather than sampling from other weights"
            )

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[VersionedSample]]:
        """``n`` samples per prompt, one request per prompt, up to ``max_in_flight`` of them at once
        (seeded ``params.seed + index`` when set), in prompt order.

        Raises:
            StaleAdapterError: the version is not served, or a reply names another model.
            EndpointError: the server failed or answered without token ids and log-probs.
        """
        if self.check_served:
            self.require_served()
        if len(prompts) <= 1 or self.max_in_flight <= 1:
            return [self._complete(p, params, n, i) for i, p in enumerate(prompts)]
        with ThreadPoolExecutor(min(self.max_in_flight, len(prompts))) as pool:
            return list(pool.map(lambda ip: self._complete(ip[1], params, n, ip[0]), enumerate(prompts)))

    def _complete(
        self, prompt: list[int], params: SamplingParams, n: int, index: int
    ) -> list[VersionedSample]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": n,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if self.stop_token_ids:
            body["stop_token_ids"] = list(self.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed + index
        text = http_call(self.url, body, timeout_s=self.timeout_s, api_key=self.api_key)
        try:
            reply = json.loads(text)
            if reply.get("model") != self.model:
                raise StaleAdapterError(
                    f"{self.url}: asked for policy version {self.model!r}, "
                    f"the reply came from {reply.get('model')!r}"
                )
            return [self._sample(c) for c in sorted(reply["choices"], key=lambda c: c["index"])]
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise EndpointError(
                f"{self.url}: reply lacks {exc} (need choices[].logprobs.tokens/token_logprobs)"
            ) from None

    def _sample(self, choice: dict[str, Any]) -> VersionedSample:
        ids = [parse_token_id(t) for t in choice["logprobs"]["tokens"]]
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        if len(ids) != len(logprobs):
            raise EndpointError(f"{self.url}: {len(ids)} tokens but {len(logprobs)} log-probs")
        reason = "stop" if ids and ids[-1] in self.stop_token_ids else choice.get("finish_reason") or "length"
        return VersionedSample(ids, logprobs, reason, self.model)
