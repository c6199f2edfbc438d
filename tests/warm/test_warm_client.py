"""The policy-server client, adapter swaps and stale-version refusal against the project's own server.

:mod:`gagar.policy.server` serves vLLM's runtime LoRA routes with real peft adapters, so everything here
runs without the vLLM environment; tests/warm/test_warm_vllm.py repeats the essentials against vLLM.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from warm_support import write_adapter

from gagar.policy.generation import HFBackend, sequence_logprobs
from gagar.policy.model import load_policy
from gagar.policy.openai_backend import OpenAIBackend, StaleAdapterError
from gagar.policy.server import peft_adapter_loader, running_server
from gagar.policy.vllm_server import (
    PolicyServerClient,
    PolicyServerError,
    server_command,
    server_env,
    start_policy_server,
    swap_adapter,
)
from gagar.schema.trajectory import SamplingParams

PARAMS = SamplingParams(max_new_tokens=10, seed=4, temperature=0.8)


@pytest.fixture(scope="module")
def adapters(base_policy: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {f"policy-step-{n}": write_adapter(base_policy, root / f"policy-step-{n}", seed=n) for n in (1, 2)}


@pytest.fixture
def server(base_policy: Path) -> Iterator[tuple[str, HFBackend]]:
    model, tokenizer = load_policy(base_policy)
    base = HFBackend(model, tokenizer)
    loader = peft_adapter_loader(model, tokenizer)
    with running_server(base, tokenizer, "policy", adapter_loader=loader) as url:
        yield url, base


def test_adapter_versions_load_swap_and_go_stale(server, adapters, base_policy) -> None:
    url, base = server
    client = PolicyServerClient(url)
    assert client.health()
    assert client.served_models() == ["policy"]
    prompt = [base.tokenizer.encode("def area(r):\n")]

    assert client.load_adapter("policy-step-1", adapters["policy-step-1"]) > 0
    assert client.served_models() == ["policy", "policy-step-1"]
    step1 = OpenAIBackend(url, "policy-step-1", base.stop_token_ids)
    (samples,) = step1.generate(prompt, PARAMS, n=2)
    assert {s.policy_version for s in samples} == {"policy-step-1"}

    # the adapter really is applied: its samples' log-probs are peft's, not the base model's
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(load_policy(base_policy)[0], adapters["policy-step-1"]).eval()
    for sample in samples:
        ids = sample.token_ids
        ref = sequence_logprobs(adapted, prompt[0], ids, PARAMS.temperature)
        torch.testing.assert_close(torch.tensor(sample.logprobs), ref, atol=1e-4, rtol=0)
        base_lp = sequence_logprobs(base.model, prompt[0], ids, PARAMS.temperature)
        assert (ref - base_lp).abs().max() > 1e-2

    seconds = swap_adapter(client, "policy-step-2", adapters["policy-step-2"], "policy-step-1")
    assert seconds > 0
    assert client.served_models() == ["policy", "policy-step-2"]
    with pytest.raises(StaleAdapterError, match=r"does not serve policy version 'policy-step-1'"):
        step1.generate(prompt, PARAMS)
    with pytest.raises(StaleAdapterError, match=r"policy-step-1"):
        client.require("policy-step-1")
    client.require("policy-step-2")
    # a resumed run swaps to the version already served: kept, not loaded twice
    swap_adapter(client, "policy-step-2", adapters["policy-step-2"], "policy-step-2")
    assert client.served_models() == ["policy", "policy-step-2"]


def test_server_refusals_name_the_answer(server, adapters, tmp_path) -> None:
    url, _ = server
    client = PolicyServerClient(url)
    client.load_adapter("policy-step-1", adapters["policy-step-1"])
    with pytest.raises(PolicyServerError, match=r"HTTP 400.*already been loaded"):
        client.load_adapter("policy-step-1", adapters["policy-step-1"])
    with pytest.raises(PolicyServerError, match=r"HTTP 404.*'policy-step-9' cannot be found"):
        client.unload_adapter("policy-step-9")
    with pytest.raises(PolicyServerError, match=r"HTTP 400.*cannot load LoRA adapter 'broken'"):
        client.load_adapter("broken", tmp_path / "no-such-adapter")
    with pytest.raises(PolicyServerError, match=r"HTTP 404.*'policy' cannot be found"):
        client.unload_adapter("policy")  # the base model is not an adapter


def test_a_server_without_runtime_lora_refuses_loads(base_policy, adapters) -> None:
    model, tokenizer = load_policy(base_policy)
    with (
        running_server(HFBackend(model, tokenizer), tokenizer, "policy") as url,
        pytest.raises(PolicyServerError, match=r"HTTP 404.*not enabled"),
    ):
        swap_adapter(PolicyServerClient(url), "policy-step-1", adapters["policy-step-1"], None)


def test_a_reply_from_another_model_is_refused() -> None:
    """A server that lists the version but answers from other weights (a proxy gone wrong)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send({"object": "list", "data": [{"id": "policy-step-3"}]})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            choice = {"index": 0, "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-1.0]}}
            self._send({"model": "policy-step-2", "choices": [choice]})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        backend = OpenAIBackend(f"http://127.0.0.1:{httpd.server_address[1]}/v1", "policy-step-3", [0])
        stale = r"asked for policy version 'policy-step-3'.*'policy-step-2'"
        with pytest.raises(StaleAdapterError, match=stale):
            backend.generate([[1, 2]], PARAMS)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_health_is_false_when_nothing_listens() -> None:
    from fixtures.services import free_port

    assert not PolicyServerClient(f"http://127.0.0.1:{free_port()}/v1", timeout_s=2).health()


def test_server_command_and_env_follow_the_recipe(tmp_path) -> None:
    command = server_command("/venv/bin/python", "/models/base", 8123, max_lora_rank=32, dtype="float32")
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(itertools.pairwise(command))
    assert flags["--host"] == "127.0.0.1"
    assert flags["--port"] == "8123"
    assert flags["--max-lora-rank"] == "32"
    assert flags["--dtype"] == "float32"
    assert flags["--logprobs-mode"] == "processed_logprobs"
    assert "--enable-lora" in command
    assert "--enable-lora" not in server_command("p", "m", 1, enable_lora=False)
    env = server_env(tmp_path)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path))
    assert "VLLM_CPU_KVCACHE_SPACE" in env
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in server_env(tmp_path, enable_lora=False)


def test_start_reports_a_server_that_dies_with_its_log(base_policy, tmp_path) -> None:
    """The project's own interpreter has no vLLM: the process exits and the error carries its log."""
    with pytest.raises(PolicyServerError, match=r"(?s)exited with 1 before it was healthy.*No module named"):
        start_policy_server(base_policy, python=sys.executable, cache_dir=tmp_path, startup_timeout_s=60)
    with pytest.raises(PolicyServerError, match=r"no vLLM environment"):
        start_policy_server(base_policy, python=tmp_path / "missing" / "python", cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no config.json"):
        start_policy_server(tmp_path, python=sys.executable, cache_dir=tmp_path)


def test_serve_policy_command_reports_a_missing_vllm_environment(base_policy, tmp_path) -> None:
    from typer.testing import CliRunner

    from gagar.cli.serve import app

    missing = tmp_path / "no-env" / "python"
    result = CliRunner().invoke(app, ["policy", "--model", str(base_policy), "--python", str(missing)])
    assert result.exit_code == 1
    assert "no vLLM environment" in result.output
    assert "make vllm-env" in result.output
