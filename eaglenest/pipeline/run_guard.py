"""What the workflow's main process does when a run starts (the Snakefile's `onstart`), and how
each stage stops when asked.

- One workflow per run folder: the main process holds an exclusive lock on
  `{run_dir}/.eaglenest/run.lock` while it lives. Snakemake's own lock covers one working
  directory; this one also stops a second workflow from another directory (an absolute
  run_dir) from writing into the same run folder. A killed process releases it by itself.
- SIGTERM (what SLURM sends before a time limit or a preemption, or `kill`): Snakemake alone
  would wait for its running jobs to finish, possibly hours. The main process forwards the
  signal to its jobs; each stage (`stop_on_sigterm`, set by workflow.run_logged) then unwinds
  like an error: temporary outputs are removed, a server it started is stopped, progress files
  and checkpoints stay, and the rerun resumes from them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path

from eaglenest.core.errors import EaglenestError

log = logging.getLogger(__name__)

_HELD: dict[str, object] = {}  # open lock files: the lock lives as long as the file stays open


def claim_run_folder(run_dir) -> Path:
    """Take the run folder for this process, or fail naming the process that holds it."""
    path = Path(run_dir) / ".eaglenest" / "run.lock"
    if str(path) in _HELD:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")  # noqa: SIM115 (held open for the life of the process)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = _describe(f.read())
        f.close()
        raise EaglenestError(
            f"run folder {run_dir} is in use by another workflow ({holder}). Wait for it to end "
            "or stop it, or give this run its own run_dir. The lock goes with that process: "
            "there is nothing to unlock by hand.",
            path,
        ) from None
    f.seek(0)
    f.truncate()
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "cwd": os.getcwd(), "since": time.ctime()}
    f.write(json.dumps(holder) + "\n")
    f.flush()
    _HELD[str(path)] = f
    return path


def _describe(record: str) -> str:
    try:
        h = json.loads(record)
        return f"pid {h['pid']} on {h['host']}, started {h['since']} in {h['cwd']}"
    except (ValueError, KeyError, TypeError):
        return "a process that left no record"


def forward_sigterm_to_jobs() -> None:
    """On SIGTERM, signal every process this one started (the jobs, their stages and the
    servers they hold), then let Snakemake's own handler stop scheduling new jobs."""
    import psutil

    previous = signal.getsignal(signal.SIGTERM)

    def forward(signum, frame):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.send_signal(signal.SIGTERM)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, forward)


class Preempted(SystemExit):
    """A stage stopped by SIGTERM. A SystemExit, so `except Exception` blocks let it through
    while `finally` blocks and context managers clean up."""

    def __init__(self):
        super().__init__(128 + signal.SIGTERM)


def stop_on_sigterm() -> None:
    """Make SIGTERM unwind this stage process (see the module docstring)."""

    def stop(signum, frame):
        log.warning("SIGTERM: stopping; finished work and progress are kept, rerun to resume")
        raise Preempted()

    signal.signal(signal.SIGTERM, stop)


__all__ = ["Preempted", "claim_run_folder", "forward_sigterm_to_jobs", "stop_on_sigterm"]
