"""Per-step cost of keeping the vLLM policy server warm (LoRA swap) against restarting it with merged weights.

One run, one base policy, K simulated update steps. Each step changes the LoRA adapter's weights (as an
optimizer step would), then pays, on two real vLLM CPU servers side by side:

- warm: publish the adapter (``save_pretrained`` to a temporary directory, renamed to
  ``adapters/policy-step-N``) + load it into the running server and unload the previous version
  (:func:`gagar.policy.vllm_server.swap_adapter`) + the first request served under ``policy-step-N``;
- restart: merge the adapter into the base (``merge_and_unload`` + ``save_pretrained``) + stop the engine +
  start it on the merged weights and wait for ``/health`` + the first request.

After the last step it measures the log-prob agreement of the loaded adapter: responses sampled through
the server under the adapter's name, recomputed by transformers + peft in fp32 at the same temperature
(``max |Δ log p|`` and the implied ``max |ratio − 1|`` of the first PPO update). Needs the vLLM environment
(``make vllm-env``); writes JSON and a bar chart.

    .venv/bin/python benchmarks/warm_inference.py [--steps 3] [--out .work/bench/warm_inference]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gagar.policy.generation import sequence_logprobs
from gagar.policy.model import ModelSize, build_model, save_policy
from gagar.policy.openai_backend import OpenAIBackend
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.vllm_server import PolicyServer, start_policy_server, swap_adapter
from gagar.schema.trajectory import SamplingParams

_CODE = (
    "def area(r):\n    return 3.14159 * r * r\n\n\n"
    "class Box:\n    def __init__(self, w):\n        self.w = w\n"
)
FIRST_REQUEST = SamplingParams(max_new_tokens=16, seed=0)


def build_base(path: Path) -> tuple[torch.nn.Module, Any]:
    """The default-size tiny Qwen2 policy (hidden 128, 4 layers) saved to ``path``; (model, tokenizer)."""
    tokenizer = train_tokenizer([_CODE * 40, "Fix the issue. Answer with SEARCH/REPLACE blocks."], 4096)
    model = build_model(tokenizer, ModelSize(num_layers=4), seed=0).eval()
    save_policy(model, tokenizer, path)
    return model, tokenizer


def update_adapter(peft_model: torch.nn.Module, step: int) -> None:
    """Stand-in for an optimizer step: move every LoRA matrix (B starts at zero, so the adapter matters)."""
    generator = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.add_(0.3 * torch.randn(param.shape, generator=generator))


def publish(peft_model: Any, adapters: Path, name: str) -> Path:
    """``save_pretrained`` to a temporary directory, then rename: readers never see half an adapter."""
    final, partial = adapters / name, adapters / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    peft_model.save_pretrained(partial)
    partial.rename(final)
    return final


def first_request(server: PolicyServer, model: str, prompt: list[int]) -> None:
    """One completion under ``model`` (the request that proves the new weights are being served)."""
    OpenAIBackend(server.base_url, model).generate([prompt], FIRST_REQUEST)


def warm_step(server: PolicyServer, peft_model: Any, adapters: Path, step: int, prompt: list[int]) -> dict:
    """Publish + swap + first request; seconds of each part."""
    name, previous = f"policy-step-{step}", (f"policy-step-{step - 1}" if step > 1 else None)
    t0 = time.perf_counter()
    path = publish(peft_model, adapters, name)
    t1 = time.perf_counter()
    swap_adapter(server.client, name, path, previous)
    t2 = time.perf_counter()
    first_request(server, name, prompt)
    t3 = time.perf_counter()
    return {"publish_s": t1 - t0, "swap_s": t2 - t1, "first_request_s": t3 - t2, "total_s": t3 - t0}


def restart_step(
    server: PolicyServer, peft_model: Any, tokenizer: Any, merged_root: Path, step: int, prompt: list[int],
    engine: dict[str, Any],
) -> tuple[PolicyServer, dict]:  # fmt: skip
    """Merge + save + stop the engine + start it on the merged weights + first request; the new server."""
    t0 = time.perf_counter()
    merged = copy.deepcopy(peft_model).merge_and_unload()
    out = merged_root / f"step-{step}"
    save_policy(merged, tokenizer, out)
    t1 = time.perf_counter()
    server.stop()
    t2 = time.perf_counter()
    server = start_policy_server(out, enable_lora=False, **engine)
    t3 = time.perf_counter()
    first_request(server, "policy", prompt)
    t4 = time.perf_counter()
    shutil.rmtree(merged_root / f"step-{step - 1}", ignore_errors=True)
    parts = {"merge_save_s": t1 - t0, "stop_s": t2 - t1, "start_s": t3 - t2, "first_request_s": t4 - t3}
    return server, parts | {"total_s": t4 - t0}


def logprob_agreement(
    server: PolicyServer, peft_model: Any, name: str, prompts: list[list[int]], temperature: float
) -> dict:
    """Server log-probs under adapter ``name`` against transformers + peft recomputation (fp32)."""
    params = SamplingParams(max_new_tokens=32, temperature=temperature, seed=1)
    rows = OpenAIBackend(server.base_url, name).generate(prompts, params, n=4)
    diffs = []
    for prompt, samples in zip(prompts, rows, strict=True):
        for sample in samples:
            ref = sequence_logprobs(peft_model, prompt, sample.token_ids, temperature)
            diffs.append((torch.tensor(sample.logprobs) - ref).abs())
    diff = torch.cat(diffs)
    return {
        "temperature": temperature,
        "tokens": int(diff.numel()),
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "max_abs_ratio_minus_1": math.expm1(float(diff.max())),
    }


def plot(result: dict, path: Path) -> None:
    """Bars: per-step seconds of the warm swap and of the restart, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = range(1, len(result["warm"]) + 1)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.38
    ax.bar([s - width / 2 for s in steps], [w["total_s"] for w in result["warm"]], width, label="warm swap")
    ax.bar([s + width / 2 for s in steps], [r["total_s"] for r in result["restart"]], width, label="restart")
    ax.set_yscale("log")
    ax.set_xticks(list(steps))
    ax.set_xlabel("update step")
    ax.set_ylabel("seconds until the new weights serve")
    ax.set_title(f"warm LoRA swap vs engine restart: {result['speedup']:.0f}x cheaper (median)")
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="simulated update steps (K)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument("--enforce-eager", action="store_true", help="both engines skip graph compilation")
    parser.add_argument("--out", type=Path, default=Path(".work/bench/warm_inference"), help="output folder")
    args = parser.parse_args()
    from peft import LoraConfig, get_peft_model

    args.out.mkdir(parents=True, exist_ok=True)
    engine = {"dtype": "float32", "enforce_eager": args.enforce_eager, "max_lora_rank": 16}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base, tokenizer = build_base(root / "base")
        lora = LoraConfig(
            r=args.rank, lora_alpha=2 * args.rank, target_modules=["q_proj", "v_proj", "o_proj"]
        )
        peft_model = get_peft_model(copy.deepcopy(base), lora).eval()
        prompts = [tokenizer.encode(f"def f{i}(x):\n    return x * {i}\n") for i in range(4)]
        (root / "adapters").mkdir()
        (root / "merged").mkdir()
        started = time.perf_counter()
        warm = start_policy_server(root / "base", **engine)
        cold = start_policy_server(root / "base", enable_lora=False, **engine)
        print(f"engines up in {time.perf_counter() - started:.1f} s", flush=True)
        result: dict[str, Any] = {"steps": args.steps, "engine": engine, "warm": [], "restart": []}
        try:
            for step in range(1, args.steps + 1):
                update_adapter(peft_model, step)
                result["warm"].append(warm_step(warm, peft_model, root / "adapters", step, prompts[0]))
                cold, parts = restart_step(
                    cold, peft_model, tokenizer, root / "merged", step, prompts[0], engine
                )
                result["restart"].append(parts)
                print(f"step {step}: warm {result['warm'][-1]} restart {parts}", flush=True)
            name = f"policy-step-{args.steps}"
            result["agreement"] = [logprob_agreement(warm, peft_model, name, prompts, t) for t in (1.0, 0.7)]
        finally:
            warm.stop()
            cold.stop()
    warm_s = statistics.median(w["total_s"] for w in result["warm"])
    restart_s = statistics.median(r["total_s"] for r in result["restart"])
    result |= {"warm_median_s": warm_s, "restart_median_s": restart_s, "speedup": restart_s / warm_s}
    (args.out / "warm_inference.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / "warm_inference.png")
    print(
        json.dumps(
            {k: result[k] for k in ("warm_median_s", "restart_median_s", "speedup", "agreement")}, indent=2
        )
    )


if __name__ == "__main__":
    main()
