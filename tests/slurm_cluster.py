"""A real single-node SLURM on localhost, for tests and for trying `profiles/slurm` by hand.

Everything lives in one state folder: munge key and socket, slurm.conf, gres.conf, the daemons'
state, logs and pid files, and a job timeline. Daemons are stopped by the PIDs in their pid
files, never by name. The node advertises 8 fake GPUs (GRES files are symlinks to /dev/null)
and more CPUs and memory than the machine has, so a CPU job runs beside a GPU job that holds all
8 GPUs on a 2-core machine.

A slurmd prolog/epilog (PrologFlags=Alloc) appends one line per job start and end to
`<state>/timeline.log`: time (ns), job id, and the GPU indices SLURM gave the job. The prolog runs
once the job holds its resources and the epilog before it gives them back, so two jobs whose
prolog..epilog intervals do not overlap never held resources at the same time.

    python tests/slurm_cluster.py start /tmp/slurm-state   # prints `export SLURM_CONF=...`
    python tests/slurm_cluster.py stop /tmp/slurm-state

Needs root (the daemons run as root; packages are installed with apt-get when missing).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from eaglenest.engine.server import free_port, pid_alive

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
BINARIES = ["slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "sinfo", "scancel", "munged"]
CLIENTS = ["srun", "sbatch", "squeue", "scancel", "scontrol", "sinfo", "sacct"]
NUM_GPUS = 8
# Advertised, not real: jobs are not confined (task/none), so a GPU job's 32 CPUs and the CPU
# jobs beside it share the real cores.
NODE_CPUS = 64
NODE_MEMORY_MB = 1_024_000
PARTITIONS = ("cpu", "gpu")  # the names profiles/slurm uses; both hold the one node


class ClusterError(RuntimeError):
    """The installed SLURM did not start (a daemon failed, the node never became idle)."""


class ClusterUnavailable(ClusterError):
    """SLURM cannot be installed here (not root, no apt-get, packages not installable)."""


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def ensure_installed(log=print) -> None:
    """Install Debian's slurm and munge packages when a binary is missing (root only)."""
    if not missing_binaries():
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"not root, and SLURM binaries are missing: {missing_binaries()}")
    if shutil.which("apt-get") is None:
        raise ClusterUnavailable("no apt-get to install SLURM with")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log(f"installing {' '.join(PACKAGES)} with apt-get")
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
    ):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise ClusterUnavailable(
                f"{' '.join(cmd)} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-2000:]}"
            )
    if missing_binaries():
        raise ClusterUnavailable(f"still missing after install: {missing_binaries()}")


def executor_env(folder: Path) -> dict[str, str]:
    """The environment under which `python -m snakemake` finds Snakemake's SLURM executor (and,
    inside each job, its jobstep executor): the running environment's own when installed there
    (envs/setup.sh adds it where `sbatch` is), else envs/requirements-slurm.txt installed into
    `folder` and put on PYTHONPATH, which sbatch passes on to the jobs. The environment itself is
    left as it is: every other Snakemake call of a session keeps its start-up time."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None:
        return {}
    requirements = Path(__file__).resolve().parents[1] / "envs" / "requirements-slurm.txt"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder)]
    r = subprocess.run([*cmd, "-r", str(requirements)], capture_output=True, text=True)
    if r.returncode != 0:
        raise ClusterUnavailable(f"{' '.join(cmd)} -r {requirements} failed:\n{r.stderr[-2000:]}")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop_pid(pid: int, grace_s: float = 15.0) -> None:
    """SIGTERM, wait, then SIGKILL: one process, by its PID."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not pid_alive(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
            if not pid_alive(pid):
                return
            time.sleep(0.1)


@dataclass
class Cluster:
    state: Path

    def __post_init__(self):
        self.state = Path(self.state).resolve()
        self.conf = self.state / "slurm.conf"
        self.node = socket.gethostname().split(".")[0]

    # -- paths -----------------------------------------------------------------------------
    @property
    def pid_files(self) -> dict[str, Path]:
        # Stop order: slurmd (after its jobs), then slurmctld, then munged.
        return {name: self.state / f"{name}.pid" for name in ("slurmd", "slurmctld", "munged")}

    @property
    def bin_dir(self) -> Path:
        return self.state / "bin"

    @property
    def env(self) -> dict[str, str]:
        """Variables that point SLURM's client commands (and jobs) at this cluster.

        SLURM_CONF alone is not enough: the Snakemake job-step executor removes every SLURM_*
        variable but the job's identity before it calls `srun` inside the job, and that srun
        then looks for /etc/slurm/slurm.conf, which a real cluster has and this one does not
        write. So the client commands are also wrapped (`<state>/bin`, first on PATH) to set it.
        """
        return {
            "SLURM_CONF": str(self.conf),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        }

    @property
    def timeline_path(self) -> Path:
        return self.state / "timeline.log"

    def _run(self, *cmd, check=True, timeout=30) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(cmd),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    # -- configuration ---------------------------------------------------------------------
    def write_config(self) -> None:
        s = self.state
        for d in ("ctld", "spool", "munge", "gpus"):
            (s / d).mkdir(parents=True, exist_ok=True)
        os.chmod(s, 0o700)
        os.chmod(s / "munge", 0o700)
        key = s / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            os.chmod(key, 0o400)
        gpu_files = []
        for i in range(NUM_GPUS):
            link = s / "gpus" / f"nvidia{i}"
            if not link.is_symlink():
                link.symlink_to("/dev/null")
            gpu_files.append(link)
        self.bin_dir.mkdir(exist_ok=True)
        for name in CLIENTS:
            path = os.pathsep.join(
                d
                for d in os.environ.get("PATH", os.defpath).split(os.pathsep)
                if Path(d).resolve() != self.bin_dir
            )
            real = shutil.which(name, path=path)
            if real:
                wrapper = self.bin_dir / name
                wrapper.write_text(f'#!/bin/sh\nSLURM_CONF="{self.conf}" exec {real} "$@"\n')
                os.chmod(wrapper, 0o755)
        for name in ("prolog", "epilog"):
            script = s / f"{name}.sh"
            event = "start" if name == "prolog" else "end"
            script.write_text(
                "#!/bin/sh\n"
                f'echo "{event} $(date +%s%N) $SLURM_JOB_ID gpus=${{SLURM_JOB_GPUS:-}}" '
                f">> {self.timeline_path}\n"
                "exit 0\n"
            )
            os.chmod(script, 0o755)
        ctld_port, d_port = free_port(), free_port()
        node, socket_path = self.node, s / "munge" / "munge.socket"
        partitions = "\n".join(
            f"PartitionName={p} Nodes={node} Default={'YES' if p == PARTITIONS[0] else 'NO'} "
            "MaxTime=INFINITE State=UP"
            for p in PARTITIONS
        )
        self.conf.write_text(f"""\
ClusterName=eaglenest-ci
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
StateSaveLocation={s}/ctld
SlurmdSpoolDir={s}/spool
SlurmctldPidFile={self.pid_files["slurmctld"]}
SlurmdPidFile={self.pid_files["slurmd"]}
SlurmctldLogFile={s}/slurmctld.log
SlurmdLogFile={s}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={s}/jobcomp.log
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=5
InactiveLimit=0
Prolog={s}/prolog.sh
Epilog={s}/epilog.sh
PrologFlags=Alloc
NodeName={node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} Gres=gpu:{NUM_GPUS} State=UNKNOWN
{partitions}
""")
        (s / "gres.conf").write_text(
            "AutoDetect=off\n" + "".join(f"NodeName={node} Name=gpu File={f}\n" for f in gpu_files)
        )

    # -- life cycle ------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> None:
        if os.geteuid() != 0:
            raise ClusterUnavailable("the SLURM daemons need root")
        ensure_installed()
        mode = stat.S_IMODE(os.stat("/dev/null").st_mode)
        if mode != 0o666:
            raise ClusterError(
                f"/dev/null has mode {mode:o}, not 666: munged will not "
                "start (fix with `chmod 666 /dev/null`)"
            )
        self.state.mkdir(parents=True, exist_ok=True)
        self.write_config()
        m = self.state / "munge"
        self._daemon(
            "munged",
            [
                "munged",
                "--force",
                f"--socket={m / 'munge.socket'}",
                f"--key-file={m / 'munge.key'}",
                f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
                f"--pid-file={self.pid_files['munged']}",
            ],
        )
        self._daemon("slurmctld", ["slurmctld", "-f", str(self.conf)])
        self._daemon("slurmd", ["slurmd", "-f", str(self.conf)])
        self.wait_idle(timeout_s)

    def _daemon(self, name: str, cmd: list[str]) -> None:
        pid_file = self.pid_files[name]
        r = subprocess.run(
            cmd,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            pid = _read_pid(pid_file)
            if pid and pid_alive(pid):
                return
            time.sleep(0.1)
        raise ClusterError(
            f"{name} did not start (exit {r.returncode}): "
            f"{(r.stdout + r.stderr)[-1500:]}\n{self.log_tail(name)}"
        )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.state / "munge" / "munged.log" if name == "munged" else self.state / f"{name}.log"
        try:
            return f"--- {path}:\n" + "\n".join(path.read_text().splitlines()[-lines:])
        except OSError:
            return f"--- {path}: (none)"

    def node_state(self) -> str:
        r = self._run("sinfo", "-h", "-n", self.node, "-o", "%T", check=False)
        return r.stdout.strip().split("\n")[0] if r.returncode == 0 else ""

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.node_state()
            if state == "idle":
                return
            time.sleep(0.2)
        raise ClusterError(
            f"node not idle after {timeout_s:.0f} s (state {state!r})\n"
            f"{self.log_tail('slurmctld')}\n{self.log_tail('slurmd')}"
        )

    def cancel_all(self, timeout_s: float = 30.0) -> None:
        """Cancel this cluster's jobs and wait until none is left running."""
        if not self.conf.exists():
            return
        self._run("scancel", "--full", "--user", str(os.getuid()), check=False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = self._run(
                "squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING,CONFIGURING", "-o", "%i", check=False
            )
            if r.returncode != 0 or not r.stdout.strip():
                return
            time.sleep(0.5)

    def stop(self) -> None:
        """Cancel jobs, then stop slurmd, slurmctld and munged by the PIDs in their pid files."""
        with contextlib.suppress(Exception):
            pid = _read_pid(self.pid_files["slurmctld"])
            if pid and pid_alive(pid):
                self.cancel_all()
        for _name, pid_file in self.pid_files.items():
            pid = _read_pid(pid_file)
            if pid:
                _stop_pid(pid)

    # -- what happened ---------------------------------------------------------------------
    def timeline(self) -> dict[str, dict]:
        """Job id -> {start, end (seconds, from the prolog/epilog), gpus (list of indices)}."""
        jobs: dict[str, dict] = {}
        if not self.timeline_path.exists():
            return jobs
        for line in self.timeline_path.read_text().splitlines():
            event, ns, job_id, gpus = line.split(" ", 3)
            job = jobs.setdefault(job_id, {"start": None, "end": None, "gpus": []})
            job[event] = int(ns) / 1e9
            ids = gpus.removeprefix("gpus=")
            if ids:
                job["gpus"] = [int(g) for g in ids.split(",")]
        return jobs

    def show_job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (jobs stay visible for MinJobAge=3600 s)."""
        r = self._run("scontrol", "show", "job", "-o", str(job_id), check=False)
        fields = {}
        for token in r.stdout.split():
            key, _, value = token.partition("=")
            fields.setdefault(key, value)
        return fields


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__.split("\n\n")[-2], file=sys.stderr)
        return 2
    cluster = Cluster(Path(argv[1]))
    if argv[0] == "start":
        try:
            cluster.start()
        except ClusterError as e:
            print(f"cannot start SLURM: {e}", file=sys.stderr)
            cluster.stop()
            return 1
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
