"""Server process handling that a GPU node depends on: whole process groups, loopback proxies."""

import subprocess
import sys
import time

from eaglenest.engine.server import (
    ServerSpec,
    group_members,
    loopback_without_proxy,
    pid_alive,
    server_env,
    stop_pid,
)

# A leader that dies at once on SIGTERM and a child that needs 2 s to exit, as vLLM's engine
# process does while it releases the accelerators' memory.
LEADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
def slow_exit(*_):
    time.sleep(2)
    sys.exit(0)
signal.signal(signal.SIGTERM, slow_exit)
print("ready", flush=True)
time.sleep(120)
'''], stdout=sys.stdout)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_stopping_a_server_waits_for_its_whole_process_group():
    proc = subprocess.Popen(
        [sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    lines = {proc.stdout.readline().strip() for _ in range(2)}
    child = int(next(x for x in lines if x.isdigit()))
    assert set(group_members(proc.pid)) == {proc.pid, child}
    t0 = time.monotonic()
    stop_pid(proc.pid, grace_s=20)
    assert time.monotonic() - t0 >= 1.5  # it waited for the slow child, not only the leader
    assert not pid_alive(child) and group_members(proc.pid) == []


def test_loopback_bypasses_the_cluster_proxy(monkeypatch):
    monkeypatch.setenv("no_proxy", "corp.example")
    monkeypatch.delenv("NO_PROXY", raising=False)
    env = loopback_without_proxy()
    assert env["no_proxy"] == "corp.example,127.0.0.1,localhost,::1"
    assert env["NO_PROXY"] == "127.0.0.1,localhost,::1"
    monkeypatch.setenv("NO_PROXY", "localhost")
    assert loopback_without_proxy()["NO_PROXY"] == "localhost,127.0.0.1,::1"


def test_the_extraction_server_starts_without_expandable_segments(tmp_path):
    """vLLM 0.32 refuses a KV connector under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
    which clusters set for training: the connector's server leaves that option out, keeps the
    rest; other servers keep the job's value as it is."""
    job = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512", "PATH": "/usr/bin"}
    extraction = ServerSpec("m", ("--kv-transfer-config", "{}"))
    assert server_env(extraction, tmp_path, "k", job)["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
    only = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert "PYTORCH_CUDA_ALLOC_CONF" not in server_env(extraction, tmp_path, "k", only)
    # Set in vllm.env, it goes the same way: vLLM would refuse it there too.
    spec_env = ServerSpec(
        "m", ("--kv-transfer-config", "{}"), (("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)
    )
    assert "PYTORCH_CUDA_ALLOC_CONF" not in server_env(spec_env, tmp_path, "k", {})
    assert (
        server_env(ServerSpec("m", ("--dtype", "float32")), tmp_path, "k", job)["PYTORCH_CUDA_ALLOC_CONF"]
        == (job["PYTORCH_CUDA_ALLOC_CONF"])
    )
    assert server_env(extraction, tmp_path, "k", job)["VLLM_API_KEY"] == "k"
