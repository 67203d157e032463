"""When did the GPU work, and what kept it waiting? The timeline of a finished run.

Reads what the run's Snakemake invocations recorded in the working directory:

- `.snakemake/log/*.jobs.jsonl`, one per invocation (the eaglenest-jobs logger plugin both
  profiles enable; eaglenest/pipeline/job_events.py): when each job started and finished or failed, to
  the millisecond, its rule, wildcards, inputs, outputs and resources (GPU jobs are the ones that
  ask for a `gpu` resource), and when the invocation began and shut down (a killed one has no
  end: its last heartbeat dates the kill to within 5 s);
- `<run dir>/benchmarks/`, Snakemake's `benchmark:` record of each job's last execution: its
  peak resident memory, printed beside the job.

"The run" is every invocation from the first one that made an output still on disk (its
benchmark file is from that execution) to the last one, so a run resumed after a failure is
measured as a whole; the time between invocations (nothing running) is reported but not counted
as wall time.

Prints each job (rule, start, end, GPU or not, peak memory), the share of the wall time during
which a GPU job was running, and every stretch with no GPU job running, classified as
  READY-BUT-IDLE   a GPU job's inputs were all there but it had not started (a CPU job, or the
                   scheduler, delayed a GPU job) -- what the GPU rules must never do;
  CPU-DEPENDENCY   the next GPU job needs CPU jobs that were still running (CPU work on the
                   GPU path, e.g. tokenize between regeneration and extraction);
  HAND-OVER        between two GPU jobs with no CPU job between them (Snakemake's own
                   turnaround);
  STARTUP / END    Snakemake building the DAG before the first job / finishing after the last;
  FAILED           the invocation was ending on a failed job;
  INTERRUPTED      the invocation was killed (no end recorded).

Usage: python benchmarks/bench_timeline.py [--run-dir results/default] [--workdir .]
                                           [--last-invocation] [--events NAME ...]
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

from eaglenest.pipeline.job_events import JobRecord, event_files, read_events, union_length
from eaglenest.report.summary import read_benchmark

TOLERANCE_S = 0.5  # a GPU job starting this soon after its inputs is not "delayed"


@dataclass
class Invocation:
    index: int
    name: str
    start: float
    end: float
    state: str = "ok"  # ok | failed | interrupted (killed: ends at its last heartbeat) | running (locks held)
    jobs: list[JobRecord] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Reading


def read_invocation(path: Path, index: int, run_dir: str, newest: bool) -> Invocation | None:
    """The invocation's jobs that write into the run dir; None for a dry run or no such job."""
    events = read_events(path)
    jobs = [
        j for j in events.jobs if j.start is not None and any(o.startswith(run_dir + "/") for o in j.outputs)
    ]
    if events.dry_run or not jobs:
        return None
    end, state = events.end, "failed" if events.failed else "ok"
    if end is None:  # killed, or still running: the last thing it recorded
        locks = path.parent.parent / "locks"
        if newest and locks.is_dir() and any(locks.iterdir()):
            end, state = time.time(), "running"
        else:
            end, state = events.last_seen, "interrupted"  # to within the heartbeat
    for job in jobs:
        if job.status == "running":
            job.end = end  # still running (so far), or killed with its invocation
            if state == "interrupted":
                job.status = state
    name = path.name.removesuffix(".snakemake.jobs.jsonl")
    return Invocation(index=index, name=name, start=events.start, end=end, state=state, jobs=jobs)


def benchmark_records(workdir: Path, run_dir: str) -> dict[str, dict]:
    """Each job's benchmark record by its label (rule[k=v]), with the file's mtime (when the
    job ended, i.e. which execution the record is from)."""
    out = {}
    root = workdir / run_dir / "benchmarks"
    for f in root.rglob("*.tsv") if root.is_dir() else []:
        rel = f.relative_to(root)
        # extract_hidden_states/shard_3.tsv is the job extract_hidden_states[k=3]
        label = rel.stem if len(rel.parts) == 1 else f"{rel.parts[0]}[k={rel.stem.removeprefix('shard_')}]"
        try:
            out[label] = {**read_benchmark(f), "mtime": f.stat().st_mtime}
        except (OSError, ValueError, KeyError):
            continue
    return out


def from_this_execution(job: JobRecord, bench: dict | None) -> bool:
    """Whether the benchmark file was written when this execution of the job ended."""
    return (
        bench is not None
        and job.end is not None
        and job.status == "finished"
        and abs(bench["mtime"] - job.end) < 5
    )


# --------------------------------------------------------------------------------------------
# Analysis


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


def ready_time(job: JobRecord, inv: Invocation) -> float:
    """When all of a job's inputs existed: the end of the latest producer in this invocation."""
    producer = {o: j for j in inv.jobs for o in j.outputs}
    t = inv.start
    for f in job.inputs:
        p = producer.get(f)
        if p is not None and p is not job:
            t = max(t, p.end if p.end is not None else float("inf"))
    return t


def ancestors(job: JobRecord, inv: Invocation) -> set[int]:
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
                f"{nxt.label} next; no CPU job in between (Snakemake's job hand-over)",
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
    parser.add_argument(
        "--last-invocation",
        action="store_true",
        help="only the latest invocation that ran jobs for the run dir",
    )
    parser.add_argument(
        "--events",
        nargs="+",
        metavar="NAME",
        help="these invocations instead of the automatic choice: events files (paths, e.g. written "
        "with --logger-eaglenest-jobs-path), or names under .snakemake/log or their first "
        "characters (2026-11-29T1049)",
    )
    return parser.parse_args()


def collect_invocations(args, workdir: Path, run_dir: str, bench: dict[str, dict]) -> list[Invocation]:
    given = [Path(x) for x in args.events or () if Path(x).is_file()]
    files = sorted(given) or event_files(workdir)
    if not files:
        raise SystemExit(
            f"no job events under {workdir}/.snakemake/log: the run did not use the eaglenest-jobs "
            "logger (profiles/default enables it; a --logger on the command line replaces it)"
        )
    named = args.events and not given
    chosen = [p for p in files if any(p.name.startswith(x) for x in args.events)] if named else files
    invocations = []
    for path in chosen:
        inv = read_invocation(path, len(invocations), run_dir, newest=path == files[-1])
        if inv is not None:
            invocations.append(inv)
    if not invocations:
        raise SystemExit(f"no invocation ran jobs for {run_dir} under {workdir}")
    if args.last_invocation:
        return invocations[-1:]
    if named:
        return invocations
    # The run: from the first invocation that made an output still on disk to the last.
    current = [
        k
        for k, inv in enumerate(invocations)
        if any(from_this_execution(j, bench.get(j.label)) for j in inv.jobs)
    ]
    return invocations[current[0] if current else len(invocations) - 1 :]


def report(invocations: list[Invocation], bench: dict[str, dict], workdir: Path, run_dir: str) -> None:
    t0 = invocations[0].start
    done = Path(workdir / run_dir / "eval" / "acceptance.json").exists()
    last = invocations[-1]
    if last.state != "ok":
        state = f"NO: the last invocation {'is' if last.state == 'running' else 'was'} {last.state}"
    else:
        state = "yes" + ("" if done else " (eval/acceptance.json since removed)")
    print(f"run {run_dir}: {len(invocations)} invocation(s); finished: {state}")
    print(
        f"{'inv':>3} {'job':<34} {'start':>8} {'end':>8} {'secs':>7}  {'GPU':<3} {'peak RSS':>9}  {'clock':<10} status"
    )
    for inv in invocations:
        for j in sorted(inv.jobs, key=lambda j: j.start):
            b = bench.get(j.label)
            rss = (
                f"{b['max_rss_mb']:.0f} MB"
                if from_this_execution(j, b) and b["max_rss_mb"] == b["max_rss_mb"]
                else "-"
            )
            print(
                f"{inv.index:>3} {j.label:<34} {j.start - t0:>+8.1f} {j.end - t0:>+8.1f} "
                f"{j.end - j.start:>7.1f}  {'GPU' if j.gpu else '-':<3} {rss:>9}  {fmt_clock(j.start):<10} {j.status}"
            )

    wall = sum(inv.end - inv.start for inv in invocations)
    gpu_busy = sum(
        union_length([(max(j.start, inv.start), min(j.end, inv.end)) for j in inv.jobs if j.gpu])
        for inv in invocations
    )
    between = sum(max(0.0, b.start - a.end) for a, b in itertools.pairwise(invocations))
    print()
    for inv in invocations:
        print(
            f"invocation {inv.index} ({inv.name}): +{inv.start - t0:.1f}s .. +{inv.end - t0:.1f}s, "
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
    bench = benchmark_records(workdir, run_dir)
    report(collect_invocations(args, workdir, run_dir, bench), bench, workdir, run_dir)


if __name__ == "__main__":
    main()
