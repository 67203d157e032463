"""Server process handling that a GPU node depends on: whole process groups, loopback proxies."""

import subprocess
import sys
import time

from eaglenest.server import group_members, loopback_without_proxy, pid_alive, stop_pid

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
