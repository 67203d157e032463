"""What the studies under benchmarks/ share: running Snakemake on a config and its overlays,
serving one run's draft on another run's prompts, and reading a run's figures and stage times.

A study (bench_agentic_ab.py, bench_data_study.py) is a few runs of the pipeline compared on
the same prompts; these are the steps each of them takes.
"""

from __future__ import annotations

import csv
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from records import cpu_model, head_commit

REPO = Path(__file__).resolve().parents[1]


def lscpu_model() -> str:
    """The CPU as `lscpu` names it (Model name), else as /proc/cpuinfo does."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return cpu_model()
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
    return names[0] if names else cpu_model()


def start(record: bool) -> tuple[str | None, str]:
    """A study's start: offline, with eaglenest's own progress logged (its HTTP client's line per
    request left out), the CPU printed. Returns the commit measured, taken before the long run
    (None when not recording), and the CPU."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("eaglenest").setLevel(logging.INFO)
    commit = head_commit() if record else None
    cpu = lscpu_model()
    print(f"CPU: {cpu} ({os.cpu_count()} cores)", flush=True)
    return commit, cpu


def merged_config(configfiles: list[str]) -> dict:
    """The config a Snakemake run of these files sees, with the schema's defaults filled in."""
    from snakemake.utils import validate

    from eaglenest.pipeline.run_config import load_config

    cfg = load_config(REPO, REPO / "Snakefile", configfiles, cwd=REPO)
    validate(cfg, str(REPO / "config" / "schemas" / "config.schema.yaml"))
    return cfg


def snakemake(label: str, configfiles: list[str], args: list[str], log: Path) -> float:
    """One Snakemake invocation (offline), its output appended to `log`; returns its wall seconds."""
    from eaglenest.engine.server import log_tail

    exe = Path(sys.executable).with_name("snakemake")
    # Targets and --until first: --configfile takes every word after it.
    cmd = [str(exe), *args, "--cores", "all", "--configfile", *configfiles]
    print(f"  $ snakemake {' '.join(args)} --cores all --configfile {' '.join(configfiles)}", flush=True)
    t0 = time.monotonic()
    with open(log, "ab") as f:
        rc = subprocess.run(
            cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        ).returncode
    wall = time.monotonic() - t0
    if rc:
        raise SystemExit(
            f"{label}: snakemake failed (exit {rc}) after {wall:.0f} s. Last lines of {log}:\n{log_tail(log)}"
        )
    print(f"    {wall:.0f} s", flush=True)
    return round(wall, 1)


def evaluate_draft_on(
    cfg: dict, draft_run: Path, judge_run: Path, out: Path, draft_dir: Path | None = None
) -> float:
    """A trained draft (`draft_dir`, default `draft_run`/draft; served with `draft_run`'s target
    record and token counts) asked the held-out prompts and benchmarks of another run
    (`judge_run`), in its modes, and compared with that run's no-speculation outputs, as a
    sweep's variant is; `cfg` is the judging run's config. Writes `out`/ (cleared first) and
    returns the wall seconds."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    from eaglenest.engine.server import engine_env

    os.environ.update({"HF_HUB_OFFLINE": "1", "HF_HOME": str(out / ".eaglenest" / "cache" / "hf")})
    os.environ.update(engine_env(out))
    from eaglenest.evaluation.evaluate import evaluate_stage
    from eaglenest.pipeline.workflow import vllm_base_args, vllm_env
    from eaglenest.target.resolve import keep_caches_in, load_target

    keep_caches_in(out)
    ev, vllm = cfg["evaluate"], cfg["vllm"]
    server_cfg = {
        "base_args": list(vllm_base_args(vllm, cfg["target"])),
        "env": dict(vllm_env(vllm)),
        "device": vllm["device"],
        "reuse": False,
        "startup_timeout_s": vllm["startup_timeout_s"],
        "stall_timeout_s": vllm["stall_timeout_s"],
    }
    t0 = time.monotonic()
    evaluate_stage(
        run_dir=out, target=load_target(draft_run / "target.json"), draft_dir=draft_dir or draft_run / "draft",
        prompts_path=judge_run / "prompts" / "eval_prompts.jsonl",
        benchmarks_path=judge_run / "prompts" / "benchmarks.jsonl",
        metadata_path=draft_run / "tokenized" / "metadata.json", server_cfg=server_cfg,
        k=ev["num_speculative_tokens"], max_tokens=ev["max_tokens"], concurrency=ev["concurrency"],
        ngram=ev["ngram"], out_json=out / "acceptance.json", out_csv=out / "acceptance.csv",
        out_png=out / "per_position_acceptance.png", out_outputs=out / "outputs.jsonl",
        out_sets=out / "benchmarks.csv", out_sets_png=out / "acceptance_by_set.png",
        out_requests=out / "requests.csv", out_request_png=out / "acceptance_by_request.png",
        methods=("draft",), reference_outputs=judge_run / "eval" / "outputs.jsonl", modes=cfg["modes"],
        reasoning_parser=cfg["target"]["reasoning_parser"], tool_call_parser=cfg["target"]["tool_call_parser"],
        max_tool_rounds=cfg["regenerate"]["max_tool_rounds"],
    )  # fmt: skip
    return round(time.monotonic() - t0, 1)


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def figure(rows: list[dict], method: str, **where) -> dict | None:
    """The benchmarks.csv row of `method` where every column in `where` matches (the rest "all")."""
    want = {"mode": "all", "category": "all", "traffic": "all", "span": "all", **where}
    for r in rows:
        if r["method"] == method and all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def tokens_per_step(row: dict | None) -> float | None:
    return round(float(row["mean_acceptance_length"]), 3) if row and row["mean_acceptance_length"] else None


def lossless(rows: list[dict], method: str) -> dict:
    """Each set's losslessness verdict for `method` (benchmarks.csv, all modes, classes, spans)."""
    return {
        r["set"]: r["lossless"]
        for r in rows
        if r["method"] == method and r["mode"] == "all" and r["category"] == "all"
        and r["traffic"] == "all" and r["span"] == "all"
    }  # fmt: skip


def stage_seconds(run_dir: Path) -> dict[str, float]:
    """Each stage's seconds, summed over its jobs, from Snakemake's benchmark files (as the
    run's stage_times.csv sums them); a sweep's variants apart, under `variants/NAME/STAGE`."""
    out: dict[str, float] = {}
    bench = run_dir / "benchmarks"
    for tsv in sorted(bench.rglob("*.tsv")):
        rel = tsv.relative_to(bench)
        if rel.parts[0] == "variants":
            stage = "/".join((*rel.parts[:-1], tsv.stem))
        else:
            stage = rel.parts[0] if len(rel.parts) > 1 else tsv.stem
        with open(tsv) as f:
            s = float(next(csv.DictReader(f, delimiter="\t"))["s"])
        out[stage] = round(out.get(stage, 0.0) + s, 1)
    return out


def seconds(value: float | None) -> str | None:
    return None if value is None else f"{value:.0f}"


def md_table(columns: list, rows: list[list]) -> str:
    def cell(v):
        return "" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(map(str, columns)) + " |", "|" + " --- |" * len(columns)]
    return "\n".join([*lines, *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows)])
