"""Prefix caching for the local server: a turn prefills only the tokens no earlier request computed.

A grading conversation re-sends its whole history each turn (system prompt, task, tool results, the
model's own earlier answers), and every conversation of a step starts with the same system prompt.
:class:`PrefixCachingBackend` keeps the key/value tensors of recent prompts in a :class:`PrefixStore`,
bounded by a token budget and evicted least recently used (a prompt that extends a stored one replaces
it). For a new prompt it takes the longest stored prefix, prefills only the rest
(one sequence at a time: prefill is compute-bound, padding would only add work), then decodes all
sequences of the call together, their caches left-padded to one width, dropping each from the batch
as it finishes. What vLLM calls automatic prefix caching, for the transformers models the project's
own server (:mod:`gagar.policy.server`) runs.

Samples follow :class:`~gagar.policy.generation.HFBackend`'s conventions: temperature then top-p,
``log softmax(logits / T)`` of each sampled token, the stop token included, ``finish_reason``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedTokenizerBase

from gagar.policy.generation import Sample
from gagar.schema.trajectory import SamplingParams

__all__ = ["CacheStats", "PrefixCachingBackend", "PrefixStore", "common_prefix", "left_padded", "next_tokens"]

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, keys and values of one sequence, each ``(kv_heads, length, head_dim)``."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class CacheStats:
    """What the store saved: prompt tokens asked for, and how many of them came from the cache."""

    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def hit_ratio(self) -> float:
        """Share of prompt tokens not prefilled (0 before any request)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class PrefixStore:
    """Key/value tensors of recent token sequences, at most ``max_tokens`` tokens in all (LRU).

    Args:
        max_tokens: the budget; a sequence longer than it is not stored.
    """

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self._tokens = 0

    @property
    def tokens(self) -> int:
        """Tokens held now."""
        return self._tokens

    def longest(self, prompt: Sequence[int]) -> tuple[int, KV | None]:
        """The longest stored prefix of ``prompt``: its length and its tensors (sliced), or ``(0, None)``."""
        best, best_key = 0, None
        for key in self._entries:
            n = common_prefix(key, prompt)
            if n > best:
                best, best_key = n, key
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        return best, [(k[:, :best], v[:, :best]) for k, v in self._entries[best_key]]

    def put(self, tokens: Sequence[int], kv: KV) -> None:
        """Store ``kv`` (one entry per layer, ``length == len(tokens)``); evicts the oldest to fit.

        A stored sequence that is a prefix of ``tokens`` is dropped: the new one answers for it."""
        key = tuple(tokens)
        if not key or len(key) > self.max_tokens:
            return
        for old in [k for k in self._entries if k == key[: len(k)]]:
            self._drop(old)
        self._entries[key] = kv
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        """Drop every stored sequence."""
        self._entries.clear()
        self._tokens = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self._tokens -= len(key)


def next_tokens(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled tokens and their ``log softmax(logits / T)``: temperature, then top-p (at least one token
    kept), as ``HFBackend`` samples. ``logits``: ``(batch, vocab)``; returns two ``(batch,)`` tensors."""
    scaled = logits.float() / params.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of the tokens ranked above each one
        sorted_p = sorted_p.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    tokens = torch.multinomial(probs, 1)[:, 0]
    return tokens, logp.gather(-1, tokens[:, None])[:, 0]


def left_padded(sequences: Sequence[KV], pad: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the sequences' keys and values stacked into one batch, ``(batch, kv_heads, width,
    head_dim)``, sequence ``b`` shifted right by ``pad[b]`` zero positions (masked out when decoding)."""

    def stacked(layer: int, part: int) -> torch.Tensor:
        rows = [F.pad(kv[layer][part], (0, 0, p, 0)) for kv, p in zip(sequences, pad, strict=True)]
        return torch.stack(rows)

    return [(stacked(i, 0), stacked(i, 1)) for i in range(len(sequences[0]))]


def _layers(cache: DynamicCache) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


class PrefixCachingBackend:
    """A :class:`~gagar.policy.generation.GenerationBackend` over a transformers causal LM that reuses
    the key/value tensors of earlier prompts (see the module docstring).

    Args:
        model: a causal LM in eval mode (its ``forward`` takes ``past_key_values`` and ``position_ids``).
        tokenizer: its tokenizer; ``eos_token_id`` ends an answer.
        cache_tokens: the store's budget in tokens.
        batch_size: most sequences prefilled and then decoded together (None: every sequence of a
            call); bounds the decoding cache, which is padded to the call's longest prompt.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        cache_tokens: int,
        batch_size: int | None = None,
    ) -> None:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id: answers could never end")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model, self.stop_token_ids, self.batch_size = model, (eos,), batch_size
        self.store = PrefixStore(cache_tokens)
        self.stats = CacheStats()

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int = 1
    ) -> list[list[Sample]]:
        """``n`` samples per prompt; with ``params.seed`` set the whole call is reproducible."""
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if params.seed is not None:
            torch.manual_seed(params.seed)
        flat = [list(p) for p in prompts for _ in range(n)]
        rows = self.batch_size or len(flat)
        samples: list[Sample] = []
        with torch.no_grad():
            for start in range(0, len(flat), rows):
                chunk = flat[start : start + rows]
                samples += self._decode(chunk, [self._prefill(p) for p in chunk], params)
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _prefill(self, prompt: list[int]) -> tuple[KV, torch.Tensor]:
        """The prompt's key/values and its last position's logits ``(vocab,)``, computing only the tokens
        past the longest stored prefix (at least the last one, whose logits are needed)."""
        cached, kv = self.store.longest(prompt[:-1])
        self.stats.prompt_tokens += len(prompt)
        self.stats.cached_tokens += cached
        cache = DynamicCache(ddp_cache_data=[(k[None], v[None]) for k, v in kv]) if kv else DynamicCache()
        out = self.model(
            input_ids=torch.tensor([prompt[cached:]]),
            position_ids=torch.arange(cached, len(prompt))[None],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        layers = [(k[0], v[0]) for k, v in _layers(out.cache)]
        self.store.put(prompt, layers)
        return layers, out.logits[0, -1]

    def _decode(self, prompts: list[list[int]], prefilled: list[tuple[KV, torch.Tensor]],
                params: SamplingParams) -> list[Sample]:  # fmt: skip
        """Decodes every sequence together from its prefilled cache; a finished one leaves the batch."""
        width = max(len(p) for p in prompts)
        pad = [width - len(p) for p in prompts]
        cache = DynamicCache(ddp_cache_data=left_padded([kv for kv, _ in prefilled], pad))
        mask = torch.tensor([[0] * w + [1] * len(p) for p, w in zip(prompts, pad, strict=True)])
        logits = torch.stack([lg for _, lg in prefilled])
        positions = torch.tensor([len(p) for p in prompts])
        live = list(range(len(prompts)))  # batch row -> sequence index
        tokens: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] = [[] for _ in prompts]
        reasons = ["length"] * len(prompts)
        stops = set(self.stop_token_ids)
        for step in range(params.max_new_tokens):
            chosen, chosen_logp = next_tokens(logits, params)
            keep = []
            for row, seq in enumerate(live):
                token = int(chosen[row])
                tokens[seq].append(token)
                logps[seq].append(float(chosen_logp[row]))
                if token in stops:
                    reasons[seq] = "stop"
                else:
                    keep.append(row)
            if not keep or step == params.max_new_tokens - 1:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep)
                cache.batch_select_indices(index)
                mask, positions, chosen = mask[index], positions[index], chosen[index]
                live = [live[r] for r in keep]
            mask = torch.cat([mask, torch.ones(len(live), 1, dtype=mask.dtype)], dim=1)
            out = self.model(
                input_ids=chosen[:, None],
                attention_mask=mask,
                position_ids=positions[:, None],
                cache=cache,
                use_cache=True,
            )
            cache, logits, positions = out.cache, out.logits[:, -1], positions + 1
        return [Sample(t, lp, r) for t, lp, r in zip(tokens, logps, reasons, strict=True)]
