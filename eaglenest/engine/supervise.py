"""Run a command until it exits or a watched process disappears, then stop it.

`python -m eaglenest.engine.supervise WATCH_PID -- CMD...` starts CMD in this process group and polls
WATCH_PID (the workflow's main process). When the workflow ends in any way, even by SIGKILL,
the command (the vLLM server and its engine processes) is stopped too. SIGTERM to this
supervisor stops the command as well, so the lease can stop the server through one PID.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from eaglenest.engine.server import pid_alive


def main(argv: list[str]) -> int:
    watch_pid = int(argv[0])
    cmd = argv[argv.index("--") + 1 :]
    child = subprocess.Popen(cmd)

    def stop(*_):
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while child.poll() is None:
        if not pid_alive(watch_pid):
            stop()
        time.sleep(1.0)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
