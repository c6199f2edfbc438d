"""KubernetesSession: an agent trajectory's persistent shell in a pod of its own, through the API.

The Kubernetes counterpart of :class:`gagar.sandbox.session.LocalSession`, with the same commands
(:class:`~gagar.sandbox.session.ShellSession`). A session creates, on a thread of its own so that a
turn's sessions start together, three objects labelled like the judge's (the backend's TTL sweep
removes whatever a crash leaves): a deny-all NetworkPolicy for its pod; a ConfigMap holding the
session program (:mod:`gagar.sandbox.session_pod`), the judge pod's runner and forkserver worker
(whose isolation and limits it reuses), the editor, its limits and the task's snapshot, never the
hidden tests; and a pod as hardened as a judge pod (non-root, no capabilities, read-only root, no
service account token), whose only writable places are the working tree (``/sandbox/repo``), the
editor's history (``/sandbox/state``) and ``/tmp``, each a size-limited emptyDir.

The shell runs in an exec stream (``connect_get_namespaced_pod_exec`` with stdin, as ``kubectl exec
-i``); each command goes through it as in the local session, ended by a nonce marker. A command past
its timeout, a flood or an exited shell kills every process of the pod but its PID 1 (another exec)
and starts a new shell; the files stay. The patch is the diff of the tree as it started and as it is
when the conversation submits, both read through an exec. Every request (creates, status reads,
exec streams, deletes) passes the backend's token bucket and retry policy. :meth:`close` deletes the
three objects on every exit path; a rollout killed with ``kill -9`` drops its exec streams, the
shells end, and the pod ends itself shortly after (:data:`gagar.sandbox.session_pod.IDLE_S`), within
``session_deadline_s`` whatever a command left behind.
"""

from __future__ import annotations

import functools
import json
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from websocket import ABNF

from gagar.sandbox.k8s.backend import KubernetesBackend
from gagar.sandbox.k8s.config import KubernetesSandboxConfig
from gagar.sandbox.k8s.objects import (
    _RUNNER_SOURCE,
    _SHIPPED_SOURCES,
    CONFIGMAP_MAX_BYTES,
    TMP_DIR,
    container_resources,
    container_security,
    image_for,
    pod_spec,
    run_labels,
)
from gagar.sandbox.session_pod import REPO, STATE, TOOLS
from gagar.sandbox.shell_session import EDITOR, SessionError, ShellSession
from gagar.schema.task import Task

__all__ = ["KubernetesSession", "build_session_objects"]

INPUT = "/gagar/input"
PROGRAM = f"{INPUT}/gagar_session.py"
_SESSION_SOURCE = resources.files("gagar.sandbox").joinpath("session_pod.py").read_text(encoding="utf-8")
_EDITOR_SOURCE = EDITOR.read_text(encoding="utf-8")
_POLL_S = 0.5
_FAILED_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
SESSION_UIDS = 1_000_000
"""Session pods run as ``run_as_user + 1 + (id mod SESSION_UIDS)``: a uid of their own, so that the
shell's RLIMIT_NPROC counts that session's processes only (judge pods share ``run_as_user``)."""
_STREAM_LOCK = threading.Lock()  # kubernetes.stream swaps its client's request method while it opens


def _pump(ws: Any, timeout_s: float) -> None:
    """Read what the exec stream has: one frame when one arrives within ``timeout_s``, and every
    frame already received. ``WSClient.update`` reads one frame a call and polls the raw socket, which
    does not see frames already decrypted into the TLS buffer: those wait for the next packet."""

    def buffered() -> bool:
        sock = ws.sock
        pending = getattr(sock.sock, "pending", None)
        return bool(sock.frame_buffer.recv_buffer) or (pending is not None and pending() > 0)

    if not buffered():
        ws.update(timeout=timeout_s)
    while ws.is_open() and buffered():
        op_code, frame = ws.sock.recv_data_frame(True)
        if op_code == ABNF.OPCODE_CLOSE:
            ws._connected = False  # as WSClient.update does
        elif op_code in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) and len(frame.data) > 1:
            channel, data = frame.data[0], frame.data[1:]
            ws._channels[channel] = ws._channels.get(channel, b"") + data


@functools.cache
def _exec_api(configuration: client.Configuration) -> client.CoreV1Api:
    """A client for exec streams only: opening one swaps the client's transport for a moment."""
    return client.CoreV1Api(client.ApiClient(configuration))


def build_session_objects(
    config: KubernetesSandboxConfig, task: Task, session_id: str
) -> tuple[client.V1NetworkPolicy, client.V1ConfigMap, client.V1Pod]:
    """The NetworkPolicy, ConfigMap and Pod of one session (module docstring).

    Raises:
        SessionError: the task's inputs do not fit one ConfigMap, or no image is named.
    """
    name = f"gagar-ses-{session_id}"
    uid = config.run_as_user + 1 + int(session_id, 16) % SESSION_UIDS
    labels = run_labels(config, session_id)
    meta = client.V1ObjectMeta(name=name, namespace=config.namespace, labels=labels)
    spec = {
        "limits": config.limits.model_dump(
            include={"cpu_time_s", "memory_bytes", "max_file_bytes", "max_processes"}
        ),
        "repo_source": "snapshot" if task.snapshot is not None else "image",
        "image_repo_dir": config.image_repo_dir,
    }
    data = {
        "gagar_session.py": _SESSION_SOURCE,
        "gagar_pod_runner.py": _RUNNER_SOURCE,
        "gagar_forkserver.py": _SHIPPED_SOURCES["gagar_forkserver.py"],
        EDITOR.name: _EDITOR_SOURCE,
        "spec.json": json.dumps(spec),
    }
    if task.snapshot is not None:
        data["snapshot.json"] = json.dumps(task.snapshot)
    size = sum(len(k) + len(v.encode("utf-8")) for k, v in data.items())
    if size > CONFIGMAP_MAX_BYTES:
        raise SessionError(
            f"task {task.instance_id!r}: the session's inputs take {size} bytes, over the ConfigMap "
            f"limit of {CONFIGMAP_MAX_BYTES}"
        )
    try:
        image = image_for(config, task)
    except ValueError as exc:
        raise SessionError(str(exc)) from exc
    policy = client.V1NetworkPolicy(
        api_version="networking.k8s.io/v1",
        kind="NetworkPolicy",
        metadata=meta,
        spec=client.V1NetworkPolicySpec(
            pod_selector=client.V1LabelSelector(match_labels=labels), policy_types=["Ingress", "Egress"]
        ),
    )
    configmap = client.V1ConfigMap(api_version="v1", kind="ConfigMap", metadata=meta, data=data)
    res = config.resources

    def empty(volume: str, size_limit: str) -> client.V1Volume:
        return client.V1Volume(name=volume, empty_dir=client.V1EmptyDirVolumeSource(size_limit=size_limit))

    container = client.V1Container(
        name="session",
        image=image,
        image_pull_policy="IfNotPresent",
        command=[config.runner_python, PROGRAM, "keep", INPUT],
        working_dir=REPO,
        env=[client.V1EnvVar(name="HOME", value="/tmp"), client.V1EnvVar(name="TMPDIR", value="/tmp")],
        resources=container_resources(config),
        security_context=container_security(config, uid),
        volume_mounts=[
            client.V1VolumeMount(name="input", mount_path=INPUT, read_only=True),
            client.V1VolumeMount(name="tools", mount_path=TOOLS, read_only=True),
            client.V1VolumeMount(name="repo", mount_path=REPO),
            client.V1VolumeMount(name="state", mount_path=STATE),
            client.V1VolumeMount(name="tmp", mount_path=TMP_DIR),
        ],
    )
    volumes = [
        client.V1Volume(
            name="input", config_map=client.V1ConfigMapVolumeSource(name=name, default_mode=0o444)
        ),
        client.V1Volume(
            name="tools",
            config_map=client.V1ConfigMapVolumeSource(
                name=name, default_mode=0o444, items=[client.V1KeyToPath(key=EDITOR.name, path=EDITOR.name)]
            ),
        ),
        empty("repo", res.workspace_size),
        empty("state", res.tmp_size),
        empty("tmp", res.tmp_size),
    ]
    pod = client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=meta,
        spec=pod_spec(config, container, volumes, config.session_deadline_s, uid),
    )
    return policy, configmap, pod


class KubernetesSession(ShellSession):
    """One trajectory's session in a pod of its own (module docstring). Close it on every exit path."""

    def __init__(self, backend: KubernetesBackend, task: Task, max_chars: int) -> None:
        super().__init__(backend.config.limits, max_chars)
        self.backend, self.config, self.task = backend, backend.config, task
        self.session_id = secrets.token_hex(6)
        self.name = f"gagar-ses-{self.session_id}"
        self._ws: Any = None
        self._closing = threading.Event()
        self._created = False
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=self.name)
        self._started = self._worker.submit(self._create_and_start)

    # -- objects -----------------------------------------------------------------------------------

    def _create_and_start(self) -> None:
        policy, configmap, pod = build_session_objects(self.config, self.task, self.session_id)
        b, core = self.backend, self.backend.core
        try:
            self._created = True
            net = b.networking
            b._create(net.create_namespaced_network_policy, net.read_namespaced_network_policy, policy)
            b._create(core.create_namespaced_config_map, core.read_namespaced_config_map, configmap)
            b._create(core.create_namespaced_pod, core.read_namespaced_pod, pod)
        except ApiException as exc:
            why = f"Kubernetes API error {exc.status} ({exc.reason})"
            raise SessionError(f"session {self.name}: {why}") from exc
        self._wait_running()
        self._start()
        self.original = self._tree()

    def _wait_running(self) -> None:
        deadline = time.monotonic() + self.config.start_deadline_s
        ns, why = self.config.namespace, "not running yet"
        while not self._closing.is_set():
            pod = self.backend._call(lambda: self.backend.core.read_namespaced_pod(self.name, ns))
            status = pod.status
            if status.phase == "Running":
                return
            if status.phase in ("Failed", "Succeeded"):
                raise SessionError(f"session pod {self.name} ended before its shell started ({status.phase})")
            for c in status.container_statuses or []:
                waiting = c.state.waiting if c.state is not None else None
                if waiting is not None and waiting.reason:
                    why = f"{waiting.reason}: {waiting.message or ''}".strip(": ")
                    if waiting.reason in _FAILED_WAITING:
                        raise SessionError(f"session pod {self.name} cannot start: {why}")
            if time.monotonic() > deadline:
                raise SessionError(
                    f"session pod {self.name} not running after {self.config.start_deadline_s:g} s ({why})"
                )
            time.sleep(_POLL_S)
        raise SessionError(f"session {self.name} was closed while starting")

    def _delete_objects(self) -> None:
        b, core = self.backend, self.backend.core
        b._delete(core.delete_namespaced_pod, self.name)
        b._delete(core.delete_namespaced_config_map, self.name)
        b._delete(b.networking.delete_namespaced_network_policy, self.name)

    # -- exec streams ------------------------------------------------------------------------------

    def _exec(self, command: list[str], stdin: bool) -> Any:
        self.backend.bucket.acquire()
        api = _exec_api(self.backend.core.api_client.configuration)
        with _STREAM_LOCK:
            return stream(
                api.connect_get_namespaced_pod_exec, self.name, self.config.namespace,
                command=[self.config.runner_python, PROGRAM, *command], container="session",
                stdin=stdin, stdout=True, stderr=True, tty=False, _preload_content=False, binary=True,
            )  # fmt: skip

    def _oneshot(self, command: list[str], timeout_s: float = 120.0) -> bytes:
        """Run ``command`` of the session program to its end: its stdout."""
        ws = self._exec(command, stdin=False)
        out, deadline = bytearray(), time.monotonic() + timeout_s
        try:
            while ws.is_open() and time.monotonic() < deadline:
                _pump(ws, 1.0)
                if ws.peek_stdout():
                    out += ws.read_stdout()
            if ws.peek_stdout():
                out += ws.read_stdout()
        finally:
            ws.close()
        return bytes(out)

    def _launch(self) -> None:
        self._ws = self._exec(["shell", INPUT], stdin=True)

    def _kill(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()
        left = self._oneshot(["stop"]).strip()
        if left != b"0":
            raise SessionError(f"session pod {self.name}: processes survived SIGKILL ({left.decode()!r})")

    def _write(self, data: bytes) -> bool:
        if self._ws is None or not self._ws.is_open():
            return False
        try:
            self._ws.write_stdin(data)
        except Exception:  # a closed socket: the shell is gone
            return False
        return True

    def _read(self, timeout_s: float) -> bytes | None:
        ws = self._ws
        if ws is None:
            return b""
        if ws.is_open():
            _pump(ws, min(timeout_s, 1.0))
        chunk = b""
        for peek, read in ((ws.peek_stdout, ws.read_stdout), (ws.peek_stderr, ws.read_stderr)):
            if peek():
                chunk += read()
        if chunk:
            return chunk
        return None if ws.is_open() else b""

    def _tree(self) -> dict[str, str]:
        raw = self._oneshot(["tree", str(self.limits.max_patch_bytes)])
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise SessionError(f"session pod {self.name}: the working tree could not be read") from exc

    # -- the session -------------------------------------------------------------------------------

    def _dispatch(self, command: str, timeout_s: float) -> tuple[float, float, bool]:
        self._started.result()  # raises the start's SessionError
        return super()._dispatch(command, timeout_s)

    def begin(self, command: str, timeout_s: float) -> None:
        """As :meth:`ShellSession.begin`; while the pod starts, the command waits on the session's
        own thread, so that the sessions of one turn start together."""
        if self._started.done():
            super().begin(command, timeout_s)
        else:
            self._pending = self._worker.submit(self._dispatch, command, timeout_s)

    def patch(self) -> str:
        self._started.result()
        return super().patch()

    def close(self) -> None:
        """Stop the shell and delete the session's objects (idempotent, never raises)."""
        self._closing.set()
        self._worker.shutdown(wait=True, cancel_futures=True)
        ws, self._ws, self._alive = self._ws, None, False
        if ws is not None:
            ws.close()
        if self._created:  # deleting the pod ends every process in it
            self._created = False
            self._delete_objects()
