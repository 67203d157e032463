"""`eaglenest plan`: what a run will do, before anything runs.

The plan comes from Snakemake itself: one `snakemake -n` (dry run) in a subprocess, whose job
events (written by the eaglenest-jobs logger plugin, eaglenest/pipeline/job_events.py) say which rule
runs, with which inputs and outputs, which resources, and why. From those this module prints

- the stages that will run and why, in words (eaglenest/pipeline/rerun_reasons.py): missing output, stale
  input (an input newer than the output), upstream rerun, changed params, changed code (the
  `code=code_hash(...)` param every rule carries), a changed set of inputs, forced;
- the hidden-state storage the extraction will write and the target's download and GPU memory
  (eaglenest/planning/run_estimate.py);
- the GPU rules (those declaring a ``gpu`` resource) in the order they will run, and the CPU
  jobs each GPU stage has to wait for after the previous one (eaglenest/pipeline/job_order.py).

Nothing here loads a model, starts a server or touches the network: the dry run is given
``HF_HUB_OFFLINE=1`` and the estimates read the config and local files only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import human_bytes
from eaglenest.engine.dtypes import choose_dtypes
from eaglenest.pipeline.job_events import JobRecord, read_events
from eaglenest.pipeline.job_order import gpu_stages, topological_order
from eaglenest.pipeline.rerun_reasons import MISSING, OTHER, REASON_ORDER, UPSTREAM, classify_reason, clip
from eaglenest.pipeline.run_config import find_snakefile, load_config
from eaglenest.planning.run_estimate import (
    COMMON_GPUS,
    GPU_ENGINE_FALLBACK,
    HIDDEN_LAYERS_STORED,
    estimate_hidden_states,
    target_status,
)


@dataclass
class Job(JobRecord):
    """A planned job and its reasons as (category, detail) pairs, in REASON_ORDER."""

    reasons: list[tuple[str, str]] = field(default_factory=list)


def dry_run(snakemake_args: list[str], cwd=None, env=None) -> list[Job]:
    """Run `snakemake -n ARGS` and return the jobs it would run (the target rule `all`, which
    has no outputs, left out)."""
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("HF_HUB_OFFLINE", "1")
    child_env.setdefault("TRANSFORMERS_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="eaglenest-plan-") as tmp:
        events = Path(tmp) / "dry_run.jobs.jsonl"
        cmd = [sys.executable, "-m", "snakemake", "-n", *snakemake_args]
        cmd += ["--logger", "eaglenest-jobs", "--logger-eaglenest-jobs-path", str(events)]
        proc = subprocess.run(
            cmd, cwd=cwd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-25:])
            raise EaglenestError(f"snakemake -n failed (exit {proc.returncode}):\n{tail}")
        planned = read_events(events).jobs if events.exists() else []  # no file: nothing to do
    return [
        Job(**{k: v for k, v in asdict(j).items()}, reasons=classify_reason(j.reason))
        for j in planned
        if j.outputs
    ]


def stage_summary(jobs: list[Job]) -> list[dict]:
    """Per rule (in run order): job count, GPU, and reasons with how many jobs have each."""
    producer_rule = {f: j.rule for j in jobs for f in j.outputs}
    order = topological_order(jobs)
    stages: dict[str, dict] = {}
    for i in order:
        j = jobs[i]
        st = stages.setdefault(
            j.rule, {"rule": j.rule, "jobs": 0, "gpu": j.gpu, "reasons": {}, "details": {}, "upstream": set()}
        )
        st["jobs"] += 1
        for category, detail in j.reasons:
            st["reasons"][category] = st["reasons"].get(category, 0) + 1
            if category == UPSTREAM:
                st["upstream"].update(producer_rule.get(f, f) for f in _upstream_files(detail))
            elif detail and category not in (MISSING,):
                st["details"].setdefault(category, clip(detail, 200))
    out = []
    for st in stages.values():
        reasons = dict(sorted(st["reasons"].items(), key=lambda kv: REASON_ORDER.index(kv[0])))
        own = [r for r in reasons if r != UPSTREAM]
        out.append(
            {
                "rule": st["rule"],
                "jobs": st["jobs"],
                "gpu": st["gpu"],
                "why": own[0] if own else (UPSTREAM if reasons else OTHER),
                "reasons": reasons,
                "details": st["details"],
                "upstream": sorted(st["upstream"]),
            }
        )
    return out


def make_plan(
    *, snakefile=None, directory=None, configfiles=(), config_entries=(), extra_args=(), cwd=None
) -> dict:
    """Dry-run the workflow and build the plan (a JSON-able dict).

    The options mean what they mean to snakemake (-s, -d, --configfile, --config) and are
    passed on, with `extra_args` (targets, --forcerun, ...), to `snakemake -n`."""
    cwd = Path(cwd or ".").resolve()
    sf = Path(snakefile) if snakefile else find_snakefile(cwd)
    if sf is not None and not sf.is_absolute():
        sf = cwd / sf
    if sf is None or not sf.exists():
        raise EaglenestError("no Snakefile here (give --snakefile)", sf or cwd)
    workdir = Path(directory) if directory else cwd
    workdir = workdir if workdir.is_absolute() else cwd / workdir
    cfg = load_config(workdir, sf, configfiles, config_entries, cwd=cwd)  # fails fast
    args = list(extra_args)
    if snakefile:
        args += ["--snakefile", str(sf)]
    if directory:
        args += ["--directory", str(workdir)]
    if configfiles:
        args += ["--configfile", *map(str, configfiles)]
    if config_entries:
        args += ["--config", *config_entries]
    jobs = dry_run(args, cwd=cwd)
    stages = stage_summary(jobs)
    rebuilding = {s["rule"] for s in stages}
    return {
        "run_dir": cfg.get("run_dir"),
        "jobs": len(jobs),
        "nothing_to_do": not jobs,
        "stages": stages,
        "gpu_order": gpu_stages(jobs),
        "hidden_states": estimate_hidden_states(cfg, workdir, rebuilding, basedir=sf.parent),
        "target": target_status(cfg, workdir),
        "exports": cfg["export"]["engines"],
        "dtypes": choose_dtypes(cfg["vllm"]["dtype"], cfg["train"]["dtype"], cfg["vllm"]["device"]),
        "job_list": [asdict(j) | {"gpu": j.gpu} for j in jobs],
    }


def format_plan(plan: dict) -> str:
    lines = [f"eaglenest plan: run dir {plan['run_dir']}"]
    if plan["nothing_to_do"]:
        lines.append("Nothing to run: every output is present and up to date.")
    else:
        lines.append(f"Stages that will run ({plan['jobs']} jobs, in run order):")
        width = max(len(s["rule"]) for s in plan["stages"]) + 6
        for s in plan["stages"]:
            name = s["rule"] + (" [GPU]" if s["gpu"] else "")
            count = f"{s['jobs']} job" + ("s" if s["jobs"] != 1 else "")
            why = []
            for category, n in s["reasons"].items():
                tag = category if n == s["jobs"] else f"{category} ({n} of {s['jobs']})"
                if category == UPSTREAM and s["upstream"]:
                    tag += ": " + ", ".join(s["upstream"])
                elif category in s["details"]:
                    tag += f" [{s['details'][category]}]"
                why.append(tag)
            lines.append(f"  {name:<{width}} {count:>9}  {'; '.join(why)}")
    lines.append("")
    lines += format_target(plan["target"])
    lines.append(format_exports(plan["exports"]))
    if plan.get("dtypes"):  # absent from a plan written before dtypes were chosen
        lines.append(f"Dtypes: {plan['dtypes']['reason']}.")
    hs = plan["hidden_states"]
    lines.append("")
    if hs["bytes"] is None:
        lines.append(f"Hidden states: size unknown ({hs['basis']}; hidden size {hs['hidden_size_from']})")
    else:
        parts = (
            f"{hs['tokens']:,} tokens"
            if hs.get("tokens_per_sample") is None
            else f"{hs['samples']:,} samples x {hs['tokens_per_sample']:,} tokens"
        )
        lines.append(
            f"Hidden states: {human_bytes(hs['bytes'])} ({hs['bytes']:,} bytes = {parts} "
            f"x {HIDDEN_LAYERS_STORED} x hidden {hs['hidden_size']} x "
            f"{hs['dtype_bytes']} B {hs['dtype']}) in {hs['num_shards']} shards"
        )
        lines.append(f"  {hs['basis']}")
        lines += format_peak_disk(hs)
        if hs.get("free_bytes") is not None:
            need = hs["peak_disk"][hs["mode"]] + hs["disk_margin_bytes"]
            ok = "fits" if hs["free_bytes"] >= need else "DOES NOT FIT"
            lines.append(
                f"  free where the run dir lives: {human_bytes(hs['free_bytes'])}; "
                f"needed with the margin: {human_bytes(need)} ({ok} here)"
            )
    lines.append("")
    if plan["gpu_order"]:
        lines.append("GPU rules in run order:")
        for k, st in enumerate(plan["gpu_order"], 1):
            jobs = f" x{st['jobs']}" if st["jobs"] > 1 else ""
            wait = (
                f"   (GPU idle while CPU runs: {', '.join(st['waits_on_cpu'])})" if st["waits_on_cpu"] else ""
            )
            lines.append(f"  {k}. {st['rule']}{jobs}{wait}")
    else:
        lines.append("GPU rules: none will run.")
    return "\n".join(lines)


def format_exports(engines: list[str]) -> str:
    line = f"Exports: {', '.join(engines)}"
    if "sglang" in engines:
        line += (
            " (the draft trains with norm_before_residual false, the form sglang's forward computes; "
            "draft_sglang/ is checked against sglang's loader and forward)"
        )
    return line


MODE_STORES = {
    "offline": "every sample, stored by extract_hidden_states before training",
    "online": "the samples in flight only, extracted by the server every epoch",
    "hybrid": "every sample, kept while the first epoch extracts them",
}


def format_peak_disk(hs: dict) -> list[str]:
    """One line per hidden_states.mode: its peak bytes on disk and what they are."""
    lines = ["  peak disk per hidden_states.mode:"]
    for mode, peak in hs["peak_disk"].items():
        size = human_bytes(peak) if peak is not None else "unknown"
        chosen = "  <- this run" if mode == hs["mode"] else ""
        lines.append(f"    {mode:<8} {size:>10}  {MODE_STORES[mode]}{chosen}")
    return lines


def format_target(t: dict) -> list[str]:
    """The target lines of the plan: cache status, download size, the GPU-memory check."""
    rev = f" (revision {t['revision']})" if t.get("revision") else ""
    if t["source"] == "hub":
        if t["cached"]:
            head = f"cached in {t['cache_dir']} at commit {t['commit'][:12]}, {human_bytes(t['bytes'])}"
        elif t["built_here"]:
            head = (
                f"not in the hub cache {t['cache_dir']} yet: build_tiny_target builds and publishes it there"
            )
        else:
            size = (
                f"about {human_bytes(t['bytes'])} ({t['bytes_from']})"
                if t["bytes"]
                else "size unknown offline: set target.weights_gb"
            )
            head = f"NOT in the hub cache {t['cache_dir']}: download_target will fetch it, {size}"
    elif t["source"] == "local folder":
        head = f"local folder, {human_bytes(t['bytes'])}" if t["cached"] else "local folder"
    else:
        head = t["source"]
    lines = [f"Target: {t['name']}{rev}: {head}"]
    room = t.get("download_room")
    if room and t.get("bytes"):
        need = t["bytes"] + room["margin_bytes"]
        ok = "fits" if room["free_bytes"] >= need else "DOES NOT FIT: download_target will refuse"
        lines.append(
            f"  free in the hub cache: {human_bytes(room['free_bytes'])}; needed with the disk "
            f"margin: {human_bytes(need)} ({ok})"
        )
    if t.get("remote_code"):
        lines.append(f"  remote code: {t['remote_code']}")
    g = t.get("gpu_memory") or {}
    if g:
        if g["fits"] is None:  # no gpu_memory_gb: say which common GPUs hold it
            verdict = (
                "; "
                + ", ".join(
                    f"{gpu} {'holds' if gb * 1e9 >= g['min_gpu_bytes'] else 'does NOT hold'} it"
                    for gpu, gb in COMMON_GPUS
                )
                + " (set gpu_memory_gb to check yours)"
            )
        elif g["fits"]:
            verdict = f"; fits the configured {human_bytes(g['gpu_bytes'])} GPUs"
        else:
            verdict = f"; DOES NOT FIT the configured {human_bytes(g['gpu_bytes'])} GPUs"
        lines.append(
            f"  GPU memory: {human_bytes(g['weights_per_gpu_bytes'])} of weights per GPU "
            f"at tensor parallel {g['tensor_parallel_size']}; each GPU needs more than "
            f"{human_bytes(g['min_gpu_bytes'])} at memory utilisation "
            f"{g['memory_utilization']} (plus KV cache){verdict}"
        )
        lines.append(
            f"  If vLLM's GPU engine misbehaves on this target, {GPU_ENGINE_FALLBACK} "
            "in vllm.env selects its V1 model runner (the path the CPU tests run)."
        )
    return lines


def _upstream_files(detail: str) -> list[str]:
    """The files of an "Input files updated by another job: a, b" reason."""
    return [f for f in (s.strip() for s in detail.split(", ")) if f]


__all__ = ["Job", "dry_run", "format_plan", "make_plan", "stage_summary"]
