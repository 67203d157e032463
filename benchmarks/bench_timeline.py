"""When did the GPU work, and what kept it waiting? The timeline of a finished run.

Reads what Snakemake keeps in the working directory:

- `.snakemake/log/*.snakemake.log`, one per invocation: when each job started and finished or
  failed (to the second), its rule, wildcards, inputs, outputs and resources (GPU rules are the
  ones that declare a `gpu` resource), and when the invocation began and ended;
- `.snakemake/metadata/<base64 of the output path>`, one JSON record per output of the last job
  that made it: `rule`, `input`, `starttime` (when Snakemake marked the output incomplete, i.e.
  the job started) and `endtime` (the output's mtime), to a fraction of a second.

"The run" is every invocation from the first one that made an output still on disk (in the run
dir) to the last one, so a run resumed after a failure is measured as a whole; the time between
invocations (nothing running) is reported but not counted as wall time. `--source metadata`
uses the metadata records alone (for a run whose logs are gone): one span, no failed jobs.

Prints each job (rule, start, end, GPU or not), the share of the wall time during which a GPU
job was running, and every stretch with no GPU job running, classified as
  READY-BUT-IDLE   a GPU job's inputs were all there but it had not started (a CPU job, or the
                   scheduler, delayed a GPU job) -- what the GPU rules must never do;
  CPU-DEPENDENCY   the next GPU job needs CPU jobs that were still running (CPU work on the
                   GPU path, e.g. tokenize between regeneration and extraction);
  HAND-OVER        between two GPU jobs with no CPU job between them (Snakemake's own
                   turnaround, or the 1 s resolution of the log's timestamps);
  STARTUP / END    Snakemake building the DAG before the first job / finishing after the last;
  FAILED           the invocation was ending on a failed job;
  INTERRUPTED      the invocation was killed (its log has no end).

Usage: python benchmarks/bench_timeline.py [--run-dir results/default] [--workdir .]
                                           [--source auto|log|metadata] [--last-invocation]
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from eaglenest.snakemake_log import parse_jobs

DEFAULT_GPU_RULES = ("regenerate_responses", "extract_hidden_states", "train_draft", "evaluate_acceptance")
TOLERANCE_S = 1.5  # log timestamps have whole seconds
SPLIT_IDLE_S = 10.0  # metadata only: no job for this long = between invocations


@dataclass
class Job:
    rule: str
    start: float
    end: float | None = None
    status: str = "running"  # finished | failed | running
    jobid: int | None = None
    wildcards: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    gpu: bool = False
    invocation: int = 0
    precise: bool = False  # times refined from the metadata records

    @property
    def label(self) -> str:
        return f"{self.rule}[{self.wildcards}]" if self.wildcards else self.rule


@dataclass
class Invocation:
    index: int
    log: str
    start: float
    end: float | None = None
    dry_run: bool = False
    failed: bool = False
    state: str = "ok"  # ok | failed | interrupted (no end written) | running (locks held)
    jobs: list[Job] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Reading


_ELAPSED = re.compile(r"^Elapsed time: (?:(\d+) days?, )?(\d+):(\d\d):(\d\d(?:\.\d+)?)")


def parse_log(path: Path, index: int, gpu_rules) -> Invocation:
    text = path.read_text(errors="replace")
    name = re.match(r"(\d{4}-\d\d-\d\dT\d{6}\.\d+)", path.name)
    start = (
        dt.datetime.strptime(name.group(1), "%Y-%m-%dT%H%M%S.%f").timestamp()
        if name
        else path.stat().st_mtime
    )
    inv = Invocation(index=index, log=path.name, start=start)
    for line in text.splitlines():  # the invocation as a whole; the jobs come from parse_jobs
        if line.startswith("  Command:"):
            cmd = line.split(":", 1)[1].split()
            inv.dry_run = any(
                a in ("-n", "--dry-run", "--dryrun")
                or (a.startswith("-") and not a.startswith("--") and "n" in a[1:] and a[1:].isalpha())
                for a in cmd[1:]
            )
        elif line.startswith(("Error in rule ", "At least one job did not complete successfully")):
            inv.failed = True
        elif line.startswith("Terminating processes on user request"):
            inv.state = "interrupted"
        elif m := _ELAPSED.match(line):
            days, h, mi, s = m.groups()
            inv.end = inv.start + int(days or 0) * 86400 + int(h) * 3600 + int(mi) * 60 + float(s)
    for rec in parse_jobs(text):
        if rec.start is None or not rec.outputs:  # `all` has no outputs
            continue
        inv.jobs.append(
            Job(
                rule=rec.rule,
                start=rec.start.timestamp(),
                jobid=rec.jobid,
                end=rec.end.timestamp() if rec.end is not None else None,
                status=rec.status,
                wildcards=rec.wildcards,
                inputs=rec.inputs,
                outputs=rec.outputs,
                invocation=index,
                gpu=rec.gpu or (rec.rule in gpu_rules and not rec.inputs),
            )
        )
    if inv.failed and inv.state != "interrupted":
        inv.state = "failed"
    if inv.end is None:  # still running, or killed: the last thing it said
        last = max([j.end or j.start for j in inv.jobs] + [inv.start])
        inv.end = max(last, path.stat().st_mtime)
        locks = path.parent.parent / "locks"
        newest = max(path.parent.glob("*.snakemake.log"), key=lambda p: p.name)
        if not inv.failed and newest == path and locks.is_dir() and any(locks.iterdir()):
            inv.end, inv.state = time.time(), "running"  # the last one, still holding locks
        elif inv.state == "ok":
            inv.state = "interrupted"
    for job in inv.jobs:
        if job.status == "running":
            job.end = inv.end  # still running (so far), or killed while shutting down
            if inv.state in ("failed", "interrupted"):
                job.status = inv.state
    return inv


def read_metadata(workdir: Path, run_dir: str) -> dict[str, dict]:
    """Metadata records of the outputs under run_dir, keyed by output path."""
    out = {}
    meta_dir = workdir / ".snakemake" / "metadata"
    if not meta_dir.is_dir():
        return out
    for f in meta_dir.rglob("*"):
        if not f.is_file():
            continue
        try:
            key = base64.urlsafe_b64decode(f.name.replace("@", "/").encode()).decode()
        except Exception:
            key = None
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if key is None or "rule" not in rec:
            continue
        if key.startswith(run_dir.rstrip("/") + "/"):
            out[key] = rec
    return out


def refine_with_metadata(jobs: list[Job], records: dict[str, dict]) -> None:
    """Sub-second start/end from the records, for jobs whose record is from that execution."""
    for job in jobs:
        recs = [records[o] for o in job.outputs if o in records]
        recs = [
            r
            for r in recs
            if r.get("rule") == job.rule
            and r.get("starttime")
            and abs(r["starttime"] - job.start) <= TOLERANCE_S + 1
        ]
        if not recs:
            continue
        job.start = min(r["starttime"] for r in recs)
        meta_end = max(r["endtime"] for r in recs if r.get("endtime"))
        if job.status == "finished" and job.end is not None:
            job.end = max(job.end, meta_end)
        job.precise = True


def jobs_from_metadata(records: dict[str, dict], gpu_rules) -> list[Job]:
    """One job per (rule, job_hash, start) from the records alone."""
    groups: dict[tuple, Job] = {}
    for path, rec in sorted(records.items()):
        start = rec.get("starttime")
        if start is None:
            continue
        key = (rec["rule"], rec.get("job_hash"), round(start))
        job = groups.get(key)
        if job is None:
            job = groups[key] = Job(
                rule=rec["rule"],
                start=start,
                end=rec.get("endtime"),
                status="finished",
                inputs=list(rec.get("input", [])),
                gpu=rec["rule"] in gpu_rules,
                precise=True,
            )
        job.outputs.append(path)
        job.start = min(job.start, start)
        job.end = max(job.end or 0, rec.get("endtime") or 0)
    jobs = sorted(groups.values(), key=lambda j: j.start)
    for j in jobs:
        m = re.search(r"shard_(\d+)", j.outputs[0]) if j.rule == "extract_hidden_states" else None
        j.wildcards = f"k={m.group(1)}" if m else ""
    return jobs


# --------------------------------------------------------------------------------------------
# Analysis


def union_length(intervals) -> float:
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


def idle_gaps(inv: Invocation) -> list[tuple[float, float]]:
    """Stretches of the invocation with no GPU job running."""
    busy = sorted((j.start, j.end) for j in inv.jobs if j.gpu and j.end is not None)
    gaps, t = [], inv.start
    for s, e in busy:
        if s > t:
            gaps.append((t, s))
        t = max(t, e)
    if inv.end > t:
        gaps.append((t, inv.end))
    return gaps


def ready_time(job: Job, inv: Invocation) -> float:
    """When all of a job's inputs existed: the end of the latest producer in this invocation."""
    producer = {o: j for j in inv.jobs for o in j.outputs}
    t = inv.start
    for f in job.inputs:
        p = producer.get(f)
        if p is not None and p is not job:
            t = max(t, p.end if p.end is not None else float("inf"))
    return t


def ancestors(job: Job, inv: Invocation) -> set[int]:
    """ids of the jobs of this invocation that `job` needs, directly or not."""
    producer = {o: j for j in inv.jobs for o in j.outputs}
    seen: set[int] = set()
    stack = [job]
    while stack:
        for f in stack.pop().inputs:
            p = producer.get(f)
            if p is not None and p is not job and id(p) not in seen:
                seen.add(id(p))
                stack.append(p)
    return seen


def classify_gap(inv: Invocation, s: float, e: float, last_gap: bool) -> tuple[str, str]:
    running_cpu = [j for j in inv.jobs if not j.gpu and j.start < e and (j.end or e) > s]
    names = ", ".join(sorted({j.label for j in running_cpu})) or "none"
    later_gpu = [j for j in inv.jobs if j.gpu and j.start >= e - 1e-6]
    for j in later_gpu if e - s > TOLERANCE_S else []:
        r = ready_time(j, inv)
        if r < e - TOLERANCE_S and r < j.start - TOLERANCE_S:
            return (
                "READY-BUT-IDLE",
                f"{j.label} ready at +{r - inv.start:.1f}s, started {j.start - r:.1f}s later; "
                f"CPU jobs running meanwhile: {names}",
            )
    if not any(j.start < e and (j.end or e) > s for j in inv.jobs) and s == inv.start:
        return "STARTUP", "Snakemake start-up and DAG building before the first job"
    if last_gap and not later_gpu:
        if inv.state in ("failed", "interrupted"):
            failed = ", ".join(j.label for j in inv.jobs if j.status == inv.state) or "?"
            return inv.state.upper(), f"invocation ended, {inv.state}: {failed}; CPU running: {names}"
        return "END", f"no GPU job left; CPU running: {names}"
    if later_gpu:
        nxt = min(later_gpu, key=lambda j: j.start)
        need = ancestors(nxt, inv)
        on_path = sorted({j.label for j in running_cpu if id(j) in need})
        beside = sorted({j.label for j in running_cpu if id(j) not in need})
        if not on_path:
            return (
                "HAND-OVER",
                f"{nxt.label} next; no CPU job in between (Snakemake's job "
                f"hand-over, and 1 s log timestamps)",
            )
        detail = f"{nxt.label} waits on CPU jobs: {', '.join(on_path)}"
        if beside:
            detail += f" (also running, not needed: {', '.join(beside)})"
        return "CPU-DEPENDENCY", detail
    return "END", f"CPU running: {names}"


def fmt_clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 10)}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default="results/default")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path("."),
        help="where .snakemake lives (the workflow's working directory)",
    )
    parser.add_argument("--source", choices=("auto", "log", "metadata"), default="auto")
    parser.add_argument(
        "--last-invocation",
        action="store_true",
        help="only the latest invocation that ran jobs for the run dir",
    )
    parser.add_argument(
        "--logs",
        nargs="+",
        metavar="NAME",
        help="these invocations (log file names, or their first characters, "
        "e.g. 2026-11-29T1049) instead of the automatic choice",
    )
    parser.add_argument(
        "--gpu-rules",
        nargs="+",
        default=list(DEFAULT_GPU_RULES),
        help="GPU rules when the logs do not say (metadata source)",
    )
    return parser.parse_args()


def collect_invocations(args, workdir: Path, run_dir: str, records) -> tuple[list[Invocation], str]:
    """The invocations of the run, from Snakemake's logs or else from its metadata records."""
    invocations: list[Invocation] = []
    if args.source in ("auto", "log"):
        logs = sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))
        if args.logs:
            logs = [p for p in logs if any(p.name.startswith(x) for x in args.logs)]
        for i, path in enumerate(logs):
            inv = parse_log(path, i, set(args.gpu_rules))
            inv.jobs = [j for j in inv.jobs if any(o.startswith(run_dir + "/") for o in j.outputs)]
            if not inv.dry_run and inv.jobs:
                invocations.append(inv)
    if invocations:
        for inv in invocations:
            refine_with_metadata(inv.jobs, records)
        # The run: from the first invocation that made an output still on disk to the last.
        current = [
            k
            for k, inv in enumerate(invocations)
            if any(j.status == "finished" and j.precise for j in inv.jobs)
        ]
        first = current[0] if current else len(invocations) - 1
        if args.last_invocation:
            invocations = invocations[-1:]
        elif not args.logs:
            invocations = invocations[first:]
        source = "snakemake logs + metadata records"
    else:
        if args.source == "log":
            raise SystemExit(f"no snakemake logs with jobs for {run_dir} under {workdir}")
        jobs = jobs_from_metadata(records, set(args.gpu_rules))
        if not jobs:
            raise SystemExit(f"no metadata records for {run_dir} under {workdir}/.snakemake")
        # Without logs, a stretch with no job at all is taken as the time between invocations.
        invocations = []
        for j in jobs:
            if invocations and j.start <= invocations[-1].end + SPLIT_IDLE_S:
                inv = invocations[-1]
                inv.end = max(inv.end, j.end)
            else:
                inv = Invocation(index=len(invocations), log="(metadata)", start=j.start, end=j.end)
                invocations.append(inv)
            j.invocation = inv.index
            inv.jobs.append(j)
        source = (
            f"metadata records only (spans split where no job ran for {SPLIT_IDLE_S:.0f}s; "
            "failed attempts are not recorded, and records may come from different runs)"
        )

    return invocations, source


def report(invocations: list[Invocation], source: str, workdir: Path, run_dir: str) -> None:
    t0 = invocations[0].start
    done = Path(workdir / run_dir / "eval" / "acceptance.json").exists()
    last = invocations[-1]
    if last.state != "ok":
        state = f"NO: the last invocation {'is' if last.state == 'running' else 'was'} {last.state}"
    else:
        state = "yes" + ("" if done else " (eval/acceptance.json since removed)")
    print(f"run {run_dir}: {len(invocations)} invocation(s), source: {source}; finished: {state}")
    print(f"{'inv':>3} {'job':<34} {'start':>8} {'end':>8} {'secs':>7}  {'GPU':<3}  {'clock':<10} status")
    for inv in invocations:
        for j in sorted(inv.jobs, key=lambda j: j.start):
            end = j.end if j.end is not None else inv.end
            print(
                f"{inv.index:>3} {j.label:<34} {j.start - t0:>+8.1f} {end - t0:>+8.1f} "
                f"{end - j.start:>7.1f}  {'GPU' if j.gpu else '-':<3}  {fmt_clock(j.start):<10} "
                f"{j.status}{'' if j.precise else ' (log, 1 s)'}"
            )

    wall = sum(inv.end - inv.start for inv in invocations)
    gpu_busy = sum(
        union_length([(max(j.start, inv.start), min(j.end or inv.end, inv.end)) for j in inv.jobs if j.gpu])
        for inv in invocations
    )
    between = sum(max(0.0, b.start - a.end) for a, b in itertools.pairwise(invocations))
    print()
    for inv in invocations:
        print(
            f"invocation {inv.index} ({inv.log}): +{inv.start - t0:.1f}s .. +{inv.end - t0:.1f}s, "
            f"{inv.end - inv.start:.1f}s, {inv.state}"
        )
    print(
        f"wall time {wall:.1f}s in invocations (+{between:.1f}s between them, not counted); "
        f"a GPU job was running {gpu_busy:.1f}s = {gpu_busy / wall:.1%} of it"
    )

    print("\nstretches with no GPU job running:")
    print(f"{'start':>8} {'end':>8} {'secs':>6}  {'kind':<15} detail")
    totals: dict[str, float] = {}
    for inv in invocations:
        gaps = idle_gaps(inv)
        for k, (s, e) in enumerate(gaps):
            if e - s < 0.05:
                continue
            kind, detail = classify_gap(inv, s, e, k == len(gaps) - 1)
            totals[kind] = totals.get(kind, 0.0) + (e - s)
            print(f"{s - t0:>+8.1f} {e - t0:>+8.1f} {e - s:>6.1f}  {kind:<15} {detail}")
    print(
        "GPU idle by kind: "
        + ", ".join(
            f"{k} {v:.1f}s ({v / wall:.1%})" for k, v in sorted(totals.items(), key=lambda kv: -kv[1])
        )
    )
    delayed = totals.get("READY-BUT-IDLE", 0.0)
    print(
        f"GPU jobs delayed by CPU jobs although their inputs were ready: {delayed:.1f}s "
        f"({'none' if delayed == 0 else 'SEE READY-BUT-IDLE above'})"
    )


def main() -> None:
    args = parse_args()
    workdir, run_dir = args.workdir, args.run_dir.rstrip("/")
    invocations, source = collect_invocations(args, workdir, run_dir, read_metadata(workdir, run_dir))
    report(invocations, source, workdir, run_dir)


if __name__ == "__main__":
    main()
