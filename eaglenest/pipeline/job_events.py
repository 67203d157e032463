"""Snakemake's job events as structured records, written by a logger plugin and read back.

Snakemake (9.x) hands every job event to its logger plugins as a record with named fields
(``job_info``: jobid, rule, input, output, wildcards, reason, resources; ``job_started``;
``job_finished``; ``job_error``). The ``eaglenest-jobs`` logger plugin (plugins/, enabled by
both profiles) writes them as JSON lines with their exact times, so nothing here parses
Snakemake's log text:

- a run writes ``<its Snakemake log>.jobs.jsonl`` beside ``.snakemake/log/*.snakemake.log``,
  read by the timeline benchmark and the pipeline tests;
- `eaglenest plan` gives its dry run ``--logger-eaglenest-jobs-path FILE`` and reads the jobs
  from there (a dry run without a path writes nothing, as Snakemake writes no log for it).

One file per Snakemake invocation: an ``invocation`` line first, an ``alive`` line every
HEARTBEAT_S seconds while it runs, an ``end`` line when it shuts down cleanly (a killed one has
none: its last line dates the kill). The reason a job runs stays Snakemake's
sentence: it has no structured form.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent
from snakemake_interface_logger_plugins.settings import LogHandlerSettingsBase

GPU_RESOURCES = ("gpu", "gpus", "nvidia_gpu")
EVENTS_SUFFIX = ".jobs.jsonl"
#: Set in Snakemake's process once the events file is open, so local jobs (run_summary) can
#: read their own invocation's events; absent where jobs run elsewhere (a cluster).
EVENTS_ENV = "EAGLENEST_JOB_EVENTS"
# Snakemake annotates some file names for display: "out.txt (temp)", "x (retrieve from storage)".
_ANNOTATION = re.compile(r" \([^()]*\)$")


@dataclass
class JobEventsSettings(LogHandlerSettingsBase):
    path: str | None = field(
        default=None,
        metadata={
            "type": str,  # the annotation is a string here (postponed annotations)
            "help": "Write the job events here (default: beside Snakemake's own log file; "
            "nothing for a dry run).",
        },
    )


HEARTBEAT_S = 5.0


class JobEventsHandler(LogHandlerBase):
    """Appends one JSON line per job event. The file is opened at the first event, once
    Snakemake has moved into the working directory and set up its own log file. While it is
    open, an `alive` line every HEARTBEAT_S seconds dates a kill (which leaves no `end`) to
    within that."""

    def __post_init__(self) -> None:
        self._file = None
        self._opened_at = time.time()
        self._disabled = False
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # Snakemake's LogHandlerBase asks each plugin what it writes and filters.
    writes_to_stream = False
    writes_to_file = False
    has_filter = True  # every job event, whatever --quiet says
    has_formatter = True
    needs_rulegraph = False

    def _open(self):
        if self._file is None and not self._disabled:
            path = _events_path(self.settings.path if self.settings else None)
            if path is None:
                self._disabled = True
                return None
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the handler)
            os.environ[EVENTS_ENV] = str(path.resolve())
            self._write({"event": "invocation", "time": self._opened_at, "pid": os.getpid(),
                         "dry_run": bool(self.common_settings.dryrun)})  # fmt: skip
            if not self.common_settings.dryrun:
                threading.Thread(target=self._heartbeat, name="eaglenest-jobs-heartbeat", daemon=True).start()
        return self._file

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._write({"event": "alive", "time": time.time()})

    def _write(self, row: dict) -> None:
        with self._lock:
            if self._file is not None:
                self._file.write(json.dumps(row, default=str) + "\n")

    def emit(self, record: logging.LogRecord) -> None:
        row = _event_row(record)
        if row is not None and self._open() is not None:
            self._write(row)

    def close(self) -> None:
        self._stop.set()
        if self._file is not None:
            self._write({"event": "end", "time": time.time()})
            with self._lock:
                self._file.close()
                self._file = None
        super().close()


def _events_path(configured: str | None) -> Path | None:
    if configured:
        return Path(configured)
    # Snakemake's own log file, found by the name it gives its handler (no dry run has one).
    for handler in logging.getLogger("snakemake.logging").handlers:
        if handler.name == "DefaultLogFileHandler" and isinstance(handler, logging.FileHandler):
            return Path(handler.baseFilename).with_suffix(EVENTS_SUFFIX)
    return None


def _files(values) -> list[str]:
    return [_ANNOTATION.sub("", str(v)) for v in values or ()]


def _event_row(record: logging.LogRecord) -> dict | None:
    """The JSON line for a job event; None for every other record."""
    event = getattr(record, "event", None)
    t = record.created
    if event == LogEvent.JOB_INFO:
        resources = record.resources or {}
        return {
            "event": "job_info",
            "time": t,
            "jobid": record.jobid,
            "rule": record.rule_name,
            "input": _files(record.input),
            "output": _files(record.output),
            "log": _files(record.log),
            "wildcards": dict(record.wildcards or {}),
            "reason": record.reason,
            "resources": {k: v for k, v in dict(resources.items()).items() if not k.startswith("_")},
            "threads": record.threads,
        }
    if event == LogEvent.JOB_STARTED:
        return {"event": "job_started", "time": t, "jobids": list(record.jobs)}
    if event == LogEvent.JOB_FINISHED:
        return {"event": "job_finished", "time": t, "jobid": record.job_id}
    if event == LogEvent.JOB_ERROR:
        return {"event": "job_error", "time": t, "jobid": record.jobid, "rule": record.rule_name}
    return None


# ---------------------------------------------------------------------------------------------
# Reading the events back
# ---------------------------------------------------------------------------------------------


@dataclass
class JobRecord:
    rule: str
    jobid: int
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    wildcards: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    resources: dict[str, object] = field(default_factory=dict)
    start: float | None = None  # epoch seconds; None in a dry run
    end: float | None = None  # when it finished or failed; None while running
    status: str = "planned"  # planned (dry run) | running | finished | failed

    @property
    def gpu(self) -> bool:
        """Whether the job asks for a GPU resource (`gpu`, `gpus` or `nvidia_gpu` above 0)."""
        return requests_gpu(self.resources)

    @property
    def label(self) -> str:
        wc = ",".join(f"{k}={v}" for k, v in self.wildcards.items())
        return f"{self.rule}[{wc}]" if wc else self.rule


@dataclass
class Invocation:
    """One Snakemake invocation's jobs, in the order Snakemake announced them."""

    path: Path
    start: float
    end: float | None  # None: killed before it could shut down
    dry_run: bool
    jobs: list[JobRecord]
    last_seen: float  # the time of its last line: a killed invocation ended within HEARTBEAT_S of it

    @property
    def failed(self) -> bool:
        return any(j.status == "failed" for j in self.jobs)


def requests_gpu(resources: dict) -> bool:
    """True when any GPU resource is above 0, or is not a number (a GPU model, say)."""
    for key in GPU_RESOURCES:
        try:
            if float(resources.get(key, 0)) > 0:
                return True
        except (TypeError, ValueError):
            return True
    return False


def read_events(path) -> Invocation:
    """The jobs of one events file. A line cut short by a kill is ignored."""
    path = Path(path)
    start, end, dry_run, last_seen = None, None, False, 0.0
    jobs: dict[int, JobRecord] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind, t = row.get("event"), row.get("time")
        last_seen = max(last_seen, t or 0.0)
        if kind == "invocation":
            start, dry_run = t, bool(row.get("dry_run"))
        elif kind == "end":
            end = t
        elif kind == "job_info":
            jobs[row["jobid"]] = JobRecord(
                rule=row["rule"],
                jobid=row["jobid"],
                inputs=row["input"],
                outputs=row["output"],
                wildcards=row["wildcards"],
                reason=row["reason"],
                resources=row["resources"],
                start=None if dry_run else t,
                status="planned" if dry_run else "running",
            )
        else:
            _apply_state(jobs, kind, row, t)
    if start is None:
        raise ValueError(f"{path}: not a job events file (no invocation line)")
    return Invocation(
        path=path, start=start, end=end, dry_run=dry_run, jobs=list(jobs.values()), last_seen=last_seen
    )


def _apply_state(jobs: dict[int, JobRecord], kind: str, row: dict, t: float) -> None:
    if kind == "job_started":
        for i in row["jobids"]:
            if i in jobs and jobs[i].start is None:
                jobs[i].start = t
    elif kind == "job_finished" and row["jobid"] in jobs:
        jobs[row["jobid"]].end, jobs[row["jobid"]].status = t, "finished"
    elif kind == "job_error" and row["jobid"] in jobs and jobs[row["jobid"]].status == "running":
        jobs[row["jobid"]].end, jobs[row["jobid"]].status = t, "failed"


def union_length(intervals) -> float:
    """Seconds covered by at least one of the (start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def gpu_busy_seconds(inv: Invocation, until: float) -> float:
    """Seconds of the invocation, up to `until`, with a GPU job running (one still running
    counts up to `until`)."""
    return union_length(
        [
            (max(j.start, inv.start), min(j.end or until, until))
            for j in inv.jobs
            if j.gpu and j.start is not None
        ]
    )


def event_files(workdir) -> list[Path]:
    """The events files of a working directory's runs, oldest first (named by start time)."""
    return sorted((Path(workdir) / ".snakemake" / "log").glob(f"*{EVENTS_SUFFIX}"))


__all__ = [
    "EVENTS_ENV",
    "GPU_RESOURCES",
    "Invocation",
    "JobEventsHandler",
    "JobEventsSettings",
    "JobRecord",
    "event_files",
    "gpu_busy_seconds",
    "read_events",
    "requests_gpu",
    "union_length",
]
