"""Snakemake's log text as job records: the one parser for `eaglenest plan` (the output of
`snakemake -n`), `benchmarks/bench_timeline.py` (`.snakemake/log/*.snakemake.log`) and the
pipeline tests (a run's stdout and stderr).

Snakemake (9.x) writes each job it starts as a block, a timestamp line first:

    [Sun Nov 29 10:52:35 2026]
    localrule tokenize:
        input: a, b
        output: c
        jobid: 5
        reason: Missing output files: c
        wildcards: k=1
        resources: tmpdir=/tmp, gpu=8

and each end as ``[stamp]`` then ``Finished jobid: 5 (Rule: tokenize)``, or as ``[stamp]``,
``Error in rule tokenize:`` and a block whose ``jobid:`` line names the job that failed. A block
ends at the first line that is not ``    key: value``. Timestamps have whole seconds and no
time zone (local time); a dry run's blocks may have none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

GPU_RESOURCES = ("gpu", "gpus", "nvidia_gpu")

_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_HEADER = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")
_FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\S+)\)")
_ERROR = re.compile(r"^Error in rule (\S+):")


@dataclass
class JobRecord:
    rule: str
    jobid: int | None = None
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    wildcards: str = ""
    reason: str = ""
    resources: dict[str, str] = field(default_factory=dict)
    start: datetime | None = None  # the timestamp before the job's block
    end: datetime | None = None  # when it finished or failed; None while running (or dry run)
    status: str = "running"  # running | finished | failed

    @property
    def gpu(self) -> bool:
        """Whether the job asks for a GPU resource (`gpu`, `gpus` or `nvidia_gpu` above 0)."""
        return requests_gpu(self.resources)


def requests_gpu(resources: dict[str, str]) -> bool:
    """True when any GPU resource is above 0, or is not a number (a GPU model, say)."""
    for key in GPU_RESOURCES:
        try:
            if float(resources.get(key, 0)) > 0:
                return True
        except ValueError:
            return True
    return False


def parse_stamp(text: str) -> datetime:
    """A log timestamp's text (without the brackets), e.g. ``Sun Nov 29 10:52:35 2026``."""
    return datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y")


def split_files(value: str) -> list[str]:
    """An ``input:``/``output:`` value (comma-separated paths) as a list."""
    return [f for f in (s.strip() for s in value.split(", ")) if f]


def parse_jobs(text: str) -> list[JobRecord]:
    """Every job block in `text`, in printed order (the target rule `all` included)."""
    jobs: list[JobRecord] = []
    by_jobid: dict[int, JobRecord] = {}
    stamp: datetime | None = None
    block: JobRecord | None = None  # the job whose fields are being read
    failing = False  # reading an `Error in rule` block
    for line in text.splitlines():
        m = _STAMP.match(line)
        if m:
            stamp, block, failing = parse_stamp(m.group(1)), None, False
            continue
        m = _HEADER.match(line)
        if m:
            block, failing = JobRecord(rule=m.group(1), start=stamp), False
            jobs.append(block)
            continue
        block_line = line.startswith("    ") and ": " in line
        if not block_line:
            block, failing = None, False
            m = _FINISHED.match(line)
            job = by_jobid.get(int(m.group(1))) if m else None
            if job is not None and stamp is not None:
                job.end, job.status = stamp, "finished"
            failing = _ERROR.match(line) is not None and stamp is not None
            continue
        key, _, value = line.strip().partition(": ")
        if failing:
            job = by_jobid.get(int(value)) if key == "jobid" else None
            if job is not None and job.status == "running":
                job.end, job.status = stamp, "failed"
            continue
        if block is not None:
            _read_field(block, key, value, by_jobid)
    return jobs


def _read_field(block: JobRecord, key: str, value: str, by_jobid: dict[int, JobRecord]) -> None:
    """One ``key: value`` line of a job block."""
    if key == "input":
        block.inputs = split_files(value)
    elif key == "output":
        block.outputs = split_files(value)
    elif key == "jobid":
        block.jobid = int(value)
        by_jobid[block.jobid] = block
    elif key == "wildcards":
        block.wildcards = value
    elif key == "reason":
        block.reason = value
    elif key == "resources":
        for item in value.split(", "):
            k, _, v = item.partition("=")
            block.resources[k.strip()] = v.strip()


__all__ = ["GPU_RESOURCES", "JobRecord", "parse_jobs", "parse_stamp", "requests_gpu", "split_files"]
