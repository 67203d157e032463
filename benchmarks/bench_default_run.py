"""A shipped config, unchanged, as a user's first run does it from a fresh clone: the docs' headline.

The test suite's default run (tests/conftest.py, `default_run`) trains on a cut of the default
config to keep CI short; this benchmark runs a shipped config itself, exactly as a user types it:
with no `--configfile`, `config/config.yaml` (`snakemake --cores all`, record `default_run`);
`--configfile config/kimi-mini.yaml`, the seed case's miniature (record `kimi_mini_run`);
`--configfile config/smollm2.yaml`, the real model (record `smollm2_run`, about two hours);
`--configfile config/smollm2.yaml benchmarks/configs/smollm2_study.yaml`, the real model at the
study's scale (record `smollm2_study`, about an hour).

Steps: `git clone` of this checkout's HEAD into WORKDIR (committed files only, as a user gets
them), then `snakemake --cores all [--configfile ...]` there with HF_HUB_OFFLINE=1. Prints the
wall time, each stage's wall seconds (the run's `stage_times.csv`), and every method's tokens per
target step (and vLLM's per drafting step), per-position acceptance and output tokens/s on the
held-out prompts and each benchmark. Then it compares the trained draft's held-out tokens per
target step with its record (benchmarks/records/): the median of the runs on CPUs that compute
bfloat16 as this one does (the tiny targets and their drafts are trained on the CPU, so their
weights follow its kernels), and exits 1 when it differs by more than --tolerance. With
--record the run is added to the record (date, commit, machine, command, versions); `make docs`
renders it.

Usage: python benchmarks/bench_default_run.py [--configfile CONFIG [OVERLAY ...]]
           [--workdir DIR] [--tolerance 0.15] [--record]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from records import append_run, read_record, this_machine

REPO = Path(__file__).resolve().parents[1]
# The shipped configs (with their overlays) this benchmark measures, and the record of each.
RECORD_OF = {
    (): "default_run",
    ("config/kimi-mini.yaml",): "kimi_mini_run",
    ("config/smollm2.yaml",): "smollm2_run",
    ("config/smollm2.yaml", "benchmarks/configs/smollm2_study.yaml"): "smollm2_study",
}
HEADLINE = "draft tokens per target step, held out"
METHODS = ("no_spec", "ngram", "untrained_draft", "draft")


def method_figures(prefix: str, m: dict) -> dict:
    """One method's figures on one set, named for the record."""
    out = {f"{prefix} tokens per target step": round(m["mean_acceptance_length"], 3)}
    if m.get("per_position_acceptance"):
        out[f"{prefix} tokens per drafting step (vLLM's)"] = round(m["mean_acceptance_length_per_draft"], 3)
        out[f"{prefix} per-position acceptance"] = " / ".join(
            f"{a:.2f}" for a in m["per_position_acceptance"]
        )
    out[f"{prefix} output tokens/s"] = m["output_tokens_per_s"]
    if "lossless" in m:
        out[f"{prefix} lossless"] = m["lossless"]
    return out


def run_figures(run_dir: Path, wall: float) -> tuple[dict, list[dict]]:
    """The record's figures (acceptance per method and set) and its stage-time table."""
    acc = json.loads((run_dir / "eval" / "acceptance.json").read_text())
    figures = {"end to end (s)": round(wall), HEADLINE: round(acc["draft"]["mean_acceptance_length"], 3)}
    for method in METHODS:
        figures |= method_figures(f"{method}, held out ({acc['prompts']} prompts):", acc[method])
    for name, bench in acc.get("benchmarks", {}).items():
        for method in ("ngram", "draft"):
            figures |= method_figures(
                f"{method}, {name} ({bench['conversations']} conversations):", bench[method]
            )
    with open(run_dir / "stage_times.csv") as f:
        stages = [[row["stage"], round(float(row["wall_s"]))] for row in csv.DictReader(f)]
    tables = [{"title": "Stage wall seconds", "columns": ["stage", "seconds"], "rows": stages}]
    return figures, tables + sweep_tables(run_dir)


# The sweep's comparison columns a record keeps (compare_variants' sweep/comparison.csv): the
# variant, its training rows and vocabulary coverage, what it served, the trainer's estimate, time.
SWEEP_COLUMNS = ("variant", "rows", "coverage", "tokens_per_step", "tokens_per_draft", "train_s")


def sweep_tables(run_dir: Path) -> list[dict]:
    """A sweep's comparison table, where the config has a sweep."""
    path = run_dir / "sweep" / "comparison.csv"
    if not path.exists():
        return []
    with open(path) as f:
        rows = list(csv.DictReader(f))
    columns = [c for c in rows[0] if any(key in c for key in SWEEP_COLUMNS)] if rows else []

    def cell(value: str):
        try:
            return round(float(value), 3)
        except ValueError:
            return value

    body = [[cell(r[c]) for c in columns] for r in rows]
    return [{"title": "The sweep (sweep/comparison.csv)", "columns": columns, "rows": body}]


def expected_headline(record: str) -> tuple[float | None, str]:
    """The record's headline for a CPU like this one: the median over its runs on CPUs that
    compute bfloat16 the same way (the stand-ins train on the CPU, so their weights follow its
    kernels), else over all its runs."""
    runs = [r for r in read_record(record)["runs"] if HEADLINE in r["figures"]]
    if not runs:
        return None, "no earlier run names it"
    native = this_machine()["bf16_native"]
    alike = [r for r in runs if r["machine"].get("bf16_native") == native]
    chosen = alike or runs
    basis = f"median of {len(chosen)} runs" + (" on CPUs like this one" if alike else "")
    return statistics.median(r["figures"][HEADLINE] for r in chosen), basis


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--configfile",
        nargs="+",
        default=[],
        help=f"a shipped config and its overlays (default: none): {', '.join(' '.join(c) for c in RECORD_OF if c)}",
    )
    ap.add_argument("--workdir", type=Path, help="where to clone (default: a new temporary folder)")
    ap.add_argument("--tolerance", type=float, default=0.15, help="against the record's newest headline")
    ap.add_argument("--record", action="store_true", help="add this run to the config's record")
    args = ap.parse_args()
    record = RECORD_OF.get(tuple(args.configfile))
    if record is None:
        sys.exit(
            f"--configfile {' '.join(args.configfile)}: no record measures it; give one of {list(RECORD_OF)}"
        )

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="eaglenest-default-run-"))
    if workdir.exists() and any(workdir.iterdir()):
        sys.exit(f"{workdir}: not empty; give a new folder")
    subprocess.run(["git", "clone", "-q", str(REPO), str(workdir)], check=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=workdir, capture_output=True, text=True
    )
    commit = commit.stdout.strip()
    print(f"{' '.join(args.configfile) or 'the default config'} at {commit} in {workdir}", flush=True)

    started = time.monotonic()
    command = [
        "snakemake",
        "--cores",
        "all",
        *(["--configfile", *args.configfile] if args.configfile else []),
    ]
    snakemake = Path(sys.executable).with_name("snakemake")
    proc = subprocess.run(
        [str(snakemake), *command[1:]], cwd=workdir, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    wall = time.monotonic() - started
    if proc.returncode != 0:
        print(f"snakemake failed ({proc.returncode}) after {wall:.0f} s; see {workdir}/.snakemake/log/")
        return 1

    run_dir = [
        yaml.safe_load((workdir / c).read_text()).get("run_dir")
        for c in args.configfile or ["config/config.yaml"]
    ]
    figures, tables = run_figures(workdir / [d for d in run_dir if d][-1], wall)
    for name, value in figures.items():
        print(f"  {name:<70} {value}")
    for row in tables[0]["rows"]:
        print(f"  {row[0]:<24} {row[1]:>7} s")
    expected, basis = expected_headline(record)
    got = figures[HEADLINE]
    holds = expected is None or abs(got - expected) <= args.tolerance
    print(f"\nheadline: {got:.2f} tokens per target step, record {record} {expected or float('nan'):.2f} ({basis}) "
          f"± {args.tolerance}: {'holds' if holds else 'DIFFERS'}")  # fmt: skip
    if args.record:
        path = append_run(record, figures, command=" ".join(command), tables=tables, commit=commit)
        print(f"recorded in {path.relative_to(REPO)}; run `make docs`")
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
