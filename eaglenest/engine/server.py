"""The vLLM server that GPU rules share: started once, reused while its configuration matches.

Why a lease: regeneration, every extraction shard and evaluation each run as their own Snakemake
job. Starting vLLM per job costs minutes on a large target, and Snakemake's `service()` jobs make
every consumer rerun when the server restarts. So each GPU job *acquires* the server: a running
server whose spec (model and flags) matches is reused; otherwise the old one is stopped and a new
one started. The Snakefile's `onsuccess`/`onerror` handlers release it. The lease is a small
JSON file in the run folder, guarded by a file lock, and is only honoured on the same host.

The server is started detached under a supervisor process that stops it when the workflow's main
process (EAGLENEST_WORKFLOW_PID) disappears, so even a `kill -9` of Snakemake leaves no server.
On SLURM every job is its own allocation: there the server is per job (started and stopped
inside it), which `reuse=False` selects and `SLURM_JOB_ID` implies.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.engine.vllm_cpu import PATCH_ENV

log = logging.getLogger(__name__)

WORKFLOW_PID_ENV = "EAGLENEST_WORKFLOW_PID"
SERVED_NAME = "target"


class ServerError(EaglenestError):
    """The vLLM server did not start, died, or timed out; the message carries its log tail."""


@dataclass(frozen=True)
class ServerSpec:
    """What makes two servers interchangeable: the model and every flag and variable."""

    model: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def key(self) -> str:
        blob = json.dumps([self.model, list(self.args), list(self.env)], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Server:
    pid: int
    port: int
    key: str
    log_path: str
    host: str = field(default_factory=socket.gethostname)
    # A random token the server requires on /v1 (VLLM_API_KEY): proves a port answers for this
    # server and not for another run's that took the same port. Never logged.
    api_key: str = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def healthy(self) -> bool:
        return self.alive() and _http_ok(f"{self.base_url}/health") and self.owns_port()

    def owns_port(self) -> bool:
        """Whether the port answers with this server's token (a foreign server says 401)."""
        return _http_status(f"{self.api_url}/models", self.api_key) == 200

    @property
    def client_key(self) -> str:
        """The key OpenAI clients send."""
        return self.api_key or "EMPTY"

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


def log_tail(path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no server log)"
    return "\n".join(text[-lines:])


# vLLM's unix sockets live under VLLM_RPC_BASE_PATH; a socket path may not exceed 107 bytes and
# vLLM appends about 50, and sockets on network file systems can fail.
_SOCKET_ROOM = 50


def socket_dir(run_dir) -> Path:
    """The run's own tmp folder when its path is short enough, else a short one in /tmp named
    after the run (removed by `Lease.release`)."""
    own = Path(run_dir).resolve() / ".eaglenest" / "tmp"
    if len(str(own)) + _SOCKET_ROOM <= 107:
        return own
    base = os.environ.get("SLURM_TMPDIR") or "/tmp"
    return Path(base) / f"eaglenest-{hashlib.sha256(str(own).encode()).hexdigest()[:10]}"


def engine_env(run_dir) -> dict[str, str]:
    """Variables that keep vLLM's sockets, caches and temp files inside the run's own folder."""
    root = Path(run_dir).resolve() / ".eaglenest"
    dirs = {
        "TMPDIR": socket_dir(run_dir),
        "VLLM_RPC_BASE_PATH": socket_dir(run_dir),
        "VLLM_CACHE_ROOT": root / "cache" / "vllm",
        "XDG_CACHE_HOME": root / "cache",
        "TRITON_CACHE_DIR": root / "cache" / "triton",
        "TORCHINDUCTOR_CACHE_DIR": root / "cache" / "inductor",
        # Where transformers copies a target's remote code (Kimi's tokenizer) to import it.
        "HF_MODULES_CACHE": root / "cache" / "hf_modules",
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = {k: str(v) for k, v in dirs.items()}
    env[PATCH_ENV] = "1"  # eaglenest.engine.vllm_cpu: only vLLM's CPU build is affected
    # HF_HOME stays the user's unless unset: production targets live in the user's hub cache.
    env.setdefault("HF_HOME", os.environ.get("HF_HOME", str(root / "cache" / "huggingface")))
    env.update(loopback_without_proxy())
    return env


def loopback_without_proxy() -> dict[str, str]:
    """`no_proxy`/`NO_PROXY` with loopback added: GPU clusters often set `http_proxy`, and a
    request to the run's own server must never go through it."""
    hosts = ["127.0.0.1", "localhost", "::1"]
    out = {}
    for name in ("no_proxy", "NO_PROXY"):
        have = [h for h in os.environ.get(name, "").split(",") if h.strip()]
        out[name] = ",".join([*have, *(h for h in hosts if h not in have)])
    return out


def bypass_proxy_for_loopback() -> None:
    """Apply `loopback_without_proxy` to this process (its HTTP clients read the variables)."""
    os.environ.update(loopback_without_proxy())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); look at its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    return _http_status(url, timeout=timeout) == 200


def _http_status(url: str, api_key: str = "", timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET (None: no answer)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError, ValueError):
        return None


class PortTaken(ServerError):
    """Another process answered on the port chosen for a new server."""


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`, from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def stop_pid(pid: int, grace_s: float = 30.0) -> None:
    """SIGTERM the process and its process group (it leads one), then SIGKILL after grace, and
    return only when every process of the group is gone: vLLM's engine and worker processes
    hold the accelerators' memory until they exit, and the next server or the trainer must
    not start before."""
    if not pid_alive(pid) and not group_members(pid):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not pid_alive(pid) and not group_members(pid):
                return
            time.sleep(0.2)


def server_command(spec: ServerSpec, port: int) -> list[str]:
    # `python -m` rather than the `vllm` CLI: the CPU repackaging has no `vllm` distribution
    # metadata, which the CLI needs.
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        spec.model,
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *spec.args,
    ]


PORT_ATTEMPTS = 3


def start(
    spec: ServerSpec,
    run_dir,
    log_path,
    *,
    watch_pid: int | None = None,
    timeout_s: float = 900.0,
    api_key: bool = True,
) -> Server:
    """Start a server detached (own session) and wait until it is healthy. A free port can be
    taken by another run's server before this one binds it: then another port is tried.
    `api_key=False`: a server without the token, for clients that cannot send one (speculators'
    own commands send none or "EMPTY"; benchmarks/bench_vs_speculators.py)."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return _start_once(
                spec, run_dir, log_path, watch_pid=watch_pid, timeout_s=timeout_s, api_key=api_key
            )
        except PortTaken as e:
            if attempt == PORT_ATTEMPTS:
                raise
            log.warning("%s; trying another port", e.problem)
    raise AssertionError("unreachable")


def server_env(spec: ServerSpec, run_dir, api_key: str, inherited=None) -> dict[str, str]:
    """The environment a server starts with: the job's (`inherited`, default os.environ), the
    run's engine folders, the spec's own variables and the API key.

    A server with a KV connector (the extraction server) drops `expandable_segments:True` from
    PYTORCH_CUDA_ALLOC_CONF: vLLM 0.32 refuses to start with both (VllmConfig's KV-transfer
    check), and training clusters often set it for every job."""
    inherited = os.environ if inherited is None else inherited
    env = {**inherited, **engine_env(run_dir), **dict(spec.env), "VLLM_API_KEY": api_key}
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "--kv-transfer-config" in spec.args and "expandable_segments:True" in conf:
        kept = ",".join(o for o in conf.split(",") if o.strip() and o.strip() != "expandable_segments:True")
        if kept:
            env["PYTORCH_CUDA_ALLOC_CONF"] = kept
        else:
            del env["PYTORCH_CUDA_ALLOC_CONF"]
        log.warning(
            "PYTORCH_CUDA_ALLOC_CONF=%s: expandable_segments:True left out for this server "
            "(vLLM refuses it with a KV connector)",
            conf,
        )
    return env


def _start_once(
    spec: ServerSpec, run_dir, log_path, *, watch_pid: int | None, timeout_s: float, api_key: bool
) -> Server:
    bypass_proxy_for_loopback()  # this process's health checks and clients
    port = free_port()
    # An empty VLLM_API_KEY (not an inherited one) is vLLM's "no authentication".
    api_key = secrets.token_hex(16) if api_key else ""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = server_env(spec, run_dir, api_key)
    cmd = server_command(spec, port)
    if watch_pid:
        cmd = [sys.executable, "-m", "eaglenest.engine.supervise", str(watch_pid), "--", *cmd]
    with open(log_path, "ab") as logf:
        logf.write(f"\n$ {' '.join(cmd)}\n".encode())
        logf.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = Server(pid=proc.pid, port=port, key=spec.key(), log_path=str(log_path), api_key=api_key)
    log.info("vLLM server starting: pid %d, port %d, log %s", proc.pid, port, log_path)
    t0 = time.monotonic()
    try:
        wait_healthy(server, timeout_s)
    except BaseException:
        stop_pid(server.pid)
        raise
    log.info("vLLM server healthy after %.1f s", time.monotonic() - t0)
    return server


def wait_healthy(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = server.alive()
        status = _http_status(f"{server.api_url}/models", server.api_key)
        if status in (401, 403):  # a server that is not ours answers there (ours may have died binding)
            raise PortTaken(
                f"port {server.port} is served by another process, not this server", server.log_path
            )
        if not alive:
            raise ServerError(
                f"vLLM server exited during start-up. Last lines of its log:\n{server.log_tail()}",
                server.log_path,
            )
        if status == 200 and _http_ok(f"{server.base_url}/health"):
            return
        time.sleep(1.0)
    raise ServerError(
        f"vLLM server not healthy after {timeout_s:.0f} s. Last lines of its log:\n{server.log_tail()}",
        server.log_path,
    )


class Lease:
    """The run's one shared server, recorded in `<run_dir>/.eaglenest/server/lease.json`."""

    def __init__(self, run_dir):
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / ".eaglenest" / "server"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "lease.json"

    @contextlib.contextmanager
    def _locked(self):
        with open(self.dir / "lease.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def current(self) -> Server | None:
        if not self.path.exists():
            return None
        try:
            server = Server(**json.loads(self.path.read_text()))
        except (ValueError, TypeError):
            return None
        return server if server.host == socket.gethostname() else None

    def _record(self, server: Server | None) -> None:
        if server is None:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(server)))
        os.replace(tmp, self.path)
        with open(self.dir / "starts.log", "a") as f:
            public = {k: v for k, v in asdict(server).items() if k != "api_key"}
            f.write(json.dumps({"time": time.time(), **public}) + "\n")

    def acquire(self, spec: ServerSpec, *, timeout_s: float = 900.0) -> Server:
        """A healthy server for `spec`: the running one if it matches, else a fresh one."""
        with self._locked():
            server = self.current()
            if server and server.key == spec.key() and server.healthy():
                log.info("reusing vLLM server pid %d on port %d", server.pid, server.port)
                return server
            if server:
                log.info("replacing vLLM server pid %d (spec changed or unhealthy)", server.pid)
                stop_pid(server.pid)
                self._record(None)
            watch = os.environ.get(WORKFLOW_PID_ENV)
            server = start(
                spec,
                self.run_dir,
                self.dir / f"server-{spec.key()}.log",
                watch_pid=int(watch) if watch else None,
                timeout_s=timeout_s,
            )
            self._record(server)
            return server

    def release(self) -> None:
        """Stop the leased server by its PID (the workflow's onsuccess/onerror call this)."""
        with self._locked():
            server = self.current()
            if server:
                log.info("stopping vLLM server pid %d", server.pid)
                stop_pid(server.pid)
            self._record(None)
            scratch = socket_dir(self.run_dir)
            if not scratch.is_relative_to(self.run_dir.resolve()):
                shutil.rmtree(scratch, ignore_errors=True)

    def count_starts(self) -> int:
        path = self.dir / "starts.log"
        return len(path.read_text().splitlines()) if path.exists() else 0


def per_job_servers() -> bool:
    """On a cluster every job is its own allocation, so a server cannot outlive its job."""
    return bool(os.environ.get("SLURM_JOB_ID"))


@contextlib.contextmanager
def serving(spec: ServerSpec, run_dir, *, reuse: bool = True, timeout_s: float = 900.0, api_key: bool = True):
    """Yield a healthy server for `spec`; a per-job server is stopped on exit, a leased one kept.
    `api_key=False` (see `start`) needs a per-job server (`reuse=False`)."""
    bypass_proxy_for_loopback()
    if reuse and not api_key:
        raise ValueError("a leased server always has an API key: api_key=False needs reuse=False")
    if reuse and not per_job_servers():
        server = Lease(run_dir).acquire(spec, timeout_s=timeout_s)
        try:
            yield server
        except BaseException:
            # A failing job may have broken the server; the next job must not inherit it.
            if not server.healthy():
                Lease(run_dir).release()
            raise
        return
    lease_dir = Path(run_dir) / ".eaglenest" / "server"
    server = start(
        spec, run_dir, lease_dir / f"server-job-{os.getpid()}.log", timeout_s=timeout_s, api_key=api_key
    )
    try:
        yield server
    finally:
        stop_pid(server.pid)


class StallWatch:
    """Fails a stage whose server hangs: alive, accepting connections, answering nothing.

    Each answered request calls `answered()`; each failed one calls `check()`, which raises
    once no request has been answered for `stall_timeout_s` (vllm.stall_timeout_s). Requests
    carry their own timeouts, so a failure always comes and the stage ends within
    stall_timeout_s plus one request timeout, never waits forever.
    """

    def __init__(self, server: Server, stall_timeout_s: float):
        self.server, self.stall_timeout_s = server, stall_timeout_s
        self.last = time.monotonic()

    def answered(self) -> None:
        self.last = time.monotonic()

    def check(self, error: BaseException) -> None:
        check_alive(self.server)
        silent = time.monotonic() - self.last
        if silent >= self.stall_timeout_s:
            raise ServerError(
                f"vLLM server (pid {self.server.pid}, port {self.server.port}) is alive but has "
                f"answered no request for {silent:.0f} s (vllm.stall_timeout_s: "
                f"{self.stall_timeout_s:g}); it is hung. Last request error: "
                f"{type(error).__name__}: {error}. Finished work is kept: rerun to resume. "
                f"Last lines of its log:\n{self.server.log_tail()}",
                self.server.log_path,
            )


def check_alive(server: Server) -> None:
    """Raise with the log tail if the server died under us (called between requests)."""
    if not server.alive():
        raise ServerError(
            f"vLLM server (pid {server.pid}) died. Last lines of its log:\n{server.log_tail()}",
            server.log_path,
        )
