"""Time `snakemake -n` on the Kimi-K2.5 config as the number of hidden-state shards grows.

Each point is a fresh `snakemake -n` subprocess on config/kimi-k2.5.yaml with
`hidden_states.num_shards` set to N (a temporary copy of the config), run in an empty working
directory (`--directory`), so it plans every job of the run. Prints seconds and seconds per
shard, and the growth exponent: the log-log slope of the wall time between the last two sizes,
and the same for the time above the smallest size's (which removes Python start-up, imports and
parsing, the fixed cost, and shows how the per-shard part grows).

One guarded run checks that planning never touches the network or loads a model: the socket
layer refuses every connection, and the modules an engine or a model would need (torch,
transformers, vllm, speculators) must not be imported.

The floor: Snakemake alone planning a workflow of the same shape with none of eaglenest's code
(benchmarks/planning_floor.smk), at the largest size, so the reader sees which part of the time
is the workflow's and which is Snakemake's own per-job cost.

Each size is timed --repeat times (3 by default) and the best counts, as timeit does: on a
shared machine the other runs measure the neighbours, not the plan.

With --record the run (its figures and the table of sizes) is added to the record `planning`
(benchmarks/records/planning.json, made by its first run; with date, commit, machine, command,
versions); `make docs` renders it.

Usage: python benchmarks/bench_planning.py [--shards 10 100 1000 4000] [--repeat 3]
                                            [--profile N] [--snakefile Snakefile] [--no-floor]
                                            [--record]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from records import append_run, command_line, head_commit, repo_path

REPO = Path(__file__).resolve().parents[1]
HEAVY_MODULES = ("torch", "transformers", "vllm", "speculators")
FLOOR_SNAKEFILE = REPO / "benchmarks" / "planning_floor.smk"
# The record's head, written by its first --record run.
RECORD = {
    "title": "Planning",
    "what": (
        "`snakemake -n` on config/kimi-k2.5.yaml with hidden_states.num_shards = N, in a fresh working "
        "directory, best of 3 by default: wall and CPU seconds per size, the growth exponent, Snakemake alone on "
        "a plan of the same shape (benchmarks/planning_floor.smk), and one plan with the network cut "
        "off that must import no engine or model module."
    ),
    "script": "benchmarks/bench_planning.py",
}
SIZE_COLUMNS = ["shards", "jobs", "seconds", "s/shard", "CPU s", "CPU ms/shard above N0"]

# Runs snakemake's CLI in-process with the network cut off, then reports heavy imports.
GUARD = r"""
import atexit, socket, sys
class Refused(OSError):
    pass
def refuse(*a, **k):
    print("GUARD: network access attempted: %r" % (a,), file=sys.stderr)
    raise Refused("network access is not allowed while planning")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
def report():
    heavy = [m for m in HEAVY if m in sys.modules]
    print("GUARD: heavy modules imported: %s" % (", ".join(heavy) or "none"), file=sys.stderr)
atexit.register(report)
sys.argv = ["snakemake"] + sys.argv[1:]
from snakemake.cli import main
main()
""".replace("HEAVY", repr(HEAVY_MODULES))


def write_config(base: Path, num_shards: int, out: Path) -> Path:
    cfg = yaml.safe_load(base.read_text())
    cfg["hidden_states"]["num_shards"] = num_shards
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def snakemake_cmd(snakefile: Path, configfile: Path, workdir: Path) -> list[str]:
    return ["-n", "-s", str(snakefile), "--configfile", str(configfile), "--directory", str(workdir)]


def child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def time_snakemake(args: list[str]) -> tuple[float, float, int]:
    """Wall and CPU seconds of one `snakemake ARGS` subprocess, and the jobs it planned.

    CPU seconds (user + system of the child) hardly change when other processes compete for
    the cores; wall seconds do."""
    cmd = [sys.executable, "-m", "snakemake", *args]
    cpu0, start = child_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - start, child_cpu() - cpu0
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"snakemake {' '.join(args)} failed:\n{out[-4000:]}")
    jobs = 0
    for line in out.splitlines():
        if line.startswith("total "):
            jobs = int(line.split()[-1])
    return seconds, cpu, jobs


def time_plan(snakefile: Path, base_config: Path, num_shards: int) -> tuple[float, float, int]:
    """One `snakemake -n` of the workflow with `num_shards` shards, in a fresh working directory."""
    with tempfile.TemporaryDirectory(prefix="bench_planning_") as tmp:
        tmp = Path(tmp)
        cfg = write_config(base_config, num_shards, tmp / "config.yaml")
        return time_snakemake(snakemake_cmd(snakefile, cfg, tmp / "wd"))


def time_floor(num_shards: int) -> tuple[float, float, int]:
    """The same for benchmarks/planning_floor.smk: Snakemake alone on a plan of this shape."""
    with tempfile.TemporaryDirectory(prefix="bench_planning_floor_") as tmp:
        args = ["-n", "-s", str(FLOOR_SNAKEFILE), "--directory", tmp, "--config", f"shards={num_shards}"]
        return time_snakemake(args)


def guarded_plan(snakefile: Path, base_config: Path, num_shards: int) -> tuple[str, list[str]]:
    """How a `snakemake -n` run with the network cut off ended, and its GUARD lines."""
    with tempfile.TemporaryDirectory(prefix="bench_planning_guard_") as tmp:
        tmp = Path(tmp)
        cfg = write_config(base_config, num_shards, tmp / "config.yaml")
        cmd = [sys.executable, "-c", GUARD, *snakemake_cmd(snakefile, cfg, tmp / "wd")]
        proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("GUARD:")]
    return "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})", lines


def profile_plan(snakefile: Path, base_config: Path, num_shards: int, top: int = 18) -> None:
    """cProfile one `snakemake -n` and print where the time goes."""
    import pstats

    with tempfile.TemporaryDirectory(prefix="bench_planning_prof_") as tmp:
        tmp = Path(tmp)
        cfg = write_config(base_config, num_shards, tmp / "config.yaml")
        prof = tmp / "plan.prof"
        snakemake_bin = Path(sys.executable).with_name("snakemake")
        cmd = [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(prof),
            str(snakemake_bin),
            *snakemake_cmd(snakefile, cfg, tmp / "wd"),
        ]
        subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, check=True)
        stats = pstats.Stats(str(prof))
        total = stats.total_tt
        print(f"\ncProfile of snakemake -n, {num_shards} shards: {total:.1f} s under the profiler")

        def short(func) -> str:
            path, line, name = func
            for marker in ("site-packages/", "lib/python3"):
                if marker in path:
                    path = path.split(marker, 1)[1]
                    break
            return f"{path}:{line}({name})"

        rows = sorted(stats.stats.items(), key=lambda kv: kv[1][3], reverse=True)
        print(
            f"{'cumulative s':>12} {'share':>6} {'calls':>10}  function (snakemake internals "
            f"and this workflow's code)"
        )
        shown = 0
        for func, (_cc, nc, _tt, ct, _callers) in rows:
            path = func[0]
            if "snakemake" not in path and str(REPO) not in path:
                continue
            if ct < 0.03 * total or ct > 0.9 * total:
                continue  # the entry points above everything, and the noise below
            print(f"{ct:>12.2f} {ct / total:>6.0%} {nc:>10}  {short(func)}")
            shown += 1
            if shown >= top:
                break
        by_self = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:6]
        print(f"{'self s':>12} {'share':>6} {'calls':>10}  function (most time in itself)")
        for func, (_cc, nc, tt, _ct, _callers) in by_self:
            print(f"{tt:>12.2f} {tt / total:>6.0%} {nc:>10}  {short(func)}")


def slope(n1: int, t1: float, n2: int, t2: float) -> float:
    if t1 <= 0 or t2 <= 0:
        return float("nan")
    return math.log(t2 / t1) / math.log(n2 / n1)


def snakemake_import_seconds() -> float:
    """What every plan pays before the Snakefile is read: Snakemake's own import (best of 3)."""
    code = "import time; t = time.perf_counter(); import snakemake.cli; print(time.perf_counter() - t)"
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for _ in range(3)
    ]
    return min(float(r.stdout) for r in runs)


def size_table(results: list) -> tuple[dict, list[list]]:
    """Prints each size's jobs, seconds and CPU seconds; returns its figures and the rows."""
    print(
        f"{'shards':>7} {'jobs':>6} {'seconds':>8} {'s/shard':>9} {'CPU s':>7} {'CPU ms/shard above N0':>22}"
    )
    figures, rows = {}, []
    n0, _, _t0, c0 = results[0]
    for n, jobs, t, c in results:
        above = f"{(c - c0) / (n - n0) * 1e3:.2f}" if n > n0 else "-"
        print(f"{n:>7} {jobs:>6} {t:>8.2f} {t / n:>9.4f} {c:>7.2f} {above:>22}")
        figures[f"snakemake -n, {n} shards (s)"] = round(t, 2)
        rows.append([n, jobs, round(t, 2), f"{t / n:.4f}", round(c, 2), float(above) if n > n0 else above])
    figures |= {f"snakemake -n, {n} shards, CPU (s)": round(c, 2) for n, _, _, c in results}
    return figures, rows


def growth_figures(results: list) -> dict:
    """Prints and returns the growth exponents between the last two sizes, and the goals at 1000
    shards (under 3 s, under 12 times 100 shards')."""
    if len(results) < 2:
        return {}
    n0, _, _t0, c0 = results[0]
    (na, _, ta, ca), (nb, _, tb, cb) = results[-2], results[-1]
    wall, cpu = slope(na, ta, nb, tb), slope(na, ca, nb, cb)
    print(f"growth exponent {na}->{nb} shards, log-log slope: wall {wall:.2f}, CPU {cpu:.2f}")
    figures = {f"growth exponent {na}->{nb} shards, wall": round(wall, 2)}
    figures[f"growth exponent {na}->{nb} shards, CPU"] = round(cpu, 2)
    if na > n0:
        above = slope(na - n0, ca - c0, nb - n0, cb - c0)
        print(
            f"growth exponent {na}->{nb} of the CPU time above {n0} shards (the per-shard "
            f"part; 1 = linear, 2 = quadratic): {above:.2f}"
        )
        figures[f"growth exponent {na}->{nb} shards, CPU above {n0} shards"] = round(above, 2)
    seconds = {n: t for n, _, t, _ in results}
    if 1000 in seconds:
        at_1000 = seconds[1000]
        figures["1000 shards, goal < 3 s"] = "met" if at_1000 < 3 else "MISSED"
        print(f"1000 shards: {at_1000:.2f} s (goal < 3 s: {figures['1000 shards, goal < 3 s']})")
        if 100 in seconds:
            ratio = at_1000 / seconds[100]
            figures["1000 / 100 shards (x)"] = round(ratio, 1)
            figures["1000 / 100 shards, goal < 12x"] = "met" if ratio < 12 else "MISSED"
            print(f"1000 / 100 shards: {ratio:.1f}x (goal < 12x: {figures['1000 / 100 shards, goal < 12x']})")
    return figures


def floor_figures(snakefile: Path, configfile: Path, n: int, repeat: int) -> dict:
    """Snakemake alone on a plan of this shape against the workflow, interleaved so that both
    meet the same neighbours; prints and returns the best of each and eaglenest's share."""
    runs = [(time_floor(n), time_plan(snakefile, configfile, n)) for _ in range(repeat)]
    floor, ours = min(r[0][0] for r in runs), min(r[1][0] for r in runs)
    print(
        f"{n} shards, Snakemake alone on a plan of this shape (benchmarks/planning_floor.smk, "
        f"{runs[0][0][2]} jobs): {floor:.2f} s; the workflow in the same minutes: {ours:.2f} s "
        f"(eaglenest's share {ours - floor:+.2f} s)"
    )
    return {
        f"Snakemake alone, {n} shards (s)": round(floor, 2),
        f"the workflow in the same minutes, {n} shards (s)": round(ours, 2),
        f"eaglenest's share, {n} shards (s)": round(ours - floor, 2),
    }


def guard_figures(snakefile: Path, configfile: Path, n: int) -> dict:
    """Prints and returns how the plan with the network cut off went."""
    status, lines = guarded_plan(snakefile, configfile, n)
    print("\n".join([f"guarded run ({n} shards): {status}", *lines]))
    heavy = "GUARD: heavy modules imported: "
    return {
        f"guarded plan, {n} shards": status,
        "guarded plan: network access attempted": any(ln.startswith("GUARD: network") for ln in lines),
        "guarded plan: heavy modules imported": next(
            (ln.removeprefix(heavy) for ln in lines if ln.startswith(heavy)), "not reported"
        ),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[10, 100, 1000, 4000])
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the best counts")
    parser.add_argument("--configfile", type=Path, default=REPO / "config" / "kimi-k2.5.yaml")
    parser.add_argument("--snakefile", type=Path, default=REPO / "Snakefile")
    parser.add_argument(
        "--profile", type=int, metavar="N", default=None, help="also cProfile one plan with N shards"
    )
    parser.add_argument("--no-guard", action="store_true", help="skip the network/model check")
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="skip Snakemake alone on a plan of the same shape (benchmarks/planning_floor.smk)",
    )
    parser.add_argument("--record", action="store_true", help="add this run to the record `planning`")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    commit = head_commit() if args.record else None  # the commit measured, before the runs
    shards = sorted(set(args.shards))
    snakefile, configfile = args.snakefile.resolve(), args.configfile.resolve()
    repeat = max(1, args.repeat)

    results = []
    for n in shards:
        runs = [time_plan(snakefile, configfile, n) for _ in range(repeat)]
        results.append((n, runs[0][2], min(r[0] for r in runs), min(r[1] for r in runs)))

    title = (
        f"snakemake -n, {repo_path(configfile)} with hidden_states.num_shards = N, fresh working "
        f"directory, Snakefile {repo_path(snakefile)}; best of {repeat}"
    )
    print(f"{title}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    figures, rows = size_table(results)
    figures |= growth_figures(results)
    import_s = snakemake_import_seconds()
    print(f"fixed cost outside the workflow: `import snakemake.cli` {import_s:.2f} s")
    figures["import snakemake.cli (s)"] = round(import_s, 2)
    if not args.no_floor:
        figures |= floor_figures(snakefile, configfile, shards[-1], repeat)
    if not args.no_guard:
        figures |= guard_figures(snakefile, configfile, 100)
    if args.profile:
        profile_plan(snakefile, configfile, args.profile)
    if args.record:
        tables = [{"title": title, "columns": SIZE_COLUMNS, "rows": rows}]
        path = append_run("planning", figures, command=command_line(), tables=tables, commit=commit, **RECORD)
        print(f"recorded in {repo_path(path)}; run `make docs`")


if __name__ == "__main__":
    main()
