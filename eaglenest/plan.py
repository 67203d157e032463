"""`eaglenest plan`: what a run will do, before anything runs.

The plan comes from Snakemake itself: one `snakemake -n` (dry run) in a subprocess, whose job
blocks say which rule runs, with which inputs and outputs, which resources, and why (the
`reason:` line). From those this module prints

- the stages that will run and why, in words: missing output, stale input (an input newer than
  the output), upstream rerun, changed params, changed code (the `code=code_hash(...)` param
  every rule carries), a changed set of inputs, forced;
- the hidden-state storage the extraction will write, ``tokens x 4 x hidden_size x dtype
  bytes``: measured from the tokenized data when it exists and is not about to be rebuilt,
  otherwise estimated from the config (samples x ``hidden_states.expected_tokens_per_sample``,
  hidden size from ``target.hidden_size``, the tiny target's shape or a local target's
  config.json);
- the GPU rules (those declaring a ``gpu`` resource) in the order they will run, and the CPU
  jobs each GPU stage has to wait for after the previous one (the GPU idles while they run).

Nothing here loads a model, starts a server or touches the network: the dry run is given
``HF_HUB_OFFLINE=1`` and the estimate reads the config and local files only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eaglenest.errors import EaglenestError
from eaglenest.snakemake_log import parse_jobs, requests_gpu, split_files
from eaglenest.target import cache_status, on_hub, read_shape

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
HIDDEN_LAYERS_STORED = 4  # three auxiliary layers and the final one, per token

# Reasons, in the order they are named when a job has several.
MISSING, INCOMPLETE, STALE, CODE, PARAMS, INPUT_SET, RULE_CODE, SOFTWARE, FORCED, UPSTREAM, OTHER = (
    "missing output", "incomplete output", "stale input", "changed code", "changed params",
    "changed input set", "changed rule code", "changed software env", "forced",
    "upstream rerun", "other",
)  # fmt: skip
REASON_ORDER = (
    MISSING,
    INCOMPLETE,
    STALE,
    CODE,
    PARAMS,
    INPUT_SET,
    RULE_CODE,
    SOFTWARE,
    FORCED,
    UPSTREAM,
    OTHER,
)

_REASON_PREFIXES = (
    ("Missing output files", MISSING),
    ("Incomplete output files", INCOMPLETE),
    ("Updated input files", STALE),
    ("Input files updated by another job", UPSTREAM),
    ("Set of input files has changed", INPUT_SET),
    ("Code has changed", RULE_CODE),
    ("Params have changed", PARAMS),
    ("Software environment definition has changed", SOFTWARE),
    ("Forced execution", FORCED),
)
_SEGMENT_SPLIT = re.compile(
    r"; (?=" + "|".join(re.escape(p) for p, _ in _REASON_PREFIXES) + r"|Rules with|Output file|Job provides)"
)
_CODE_HASH = re.compile(r"'[0-9a-f]{16}'")
_CONFIGFILE = re.compile(r"^configfile:\s*[\"']([^\"']+)[\"']", re.M)


@dataclass
class Job:
    rule: str
    jobid: int = -1
    wildcards: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    resources: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    reasons: list[tuple[str, str]] = field(default_factory=list)  # (category, detail)

    @property
    def gpu(self) -> bool:
        return requests_gpu(self.resources)

    @property
    def label(self) -> str:
        return f"{self.rule}[{self.wildcards}]" if self.wildcards else self.rule


# --------------------------------------------------------------------------------------------
# The dry run and its text
# --------------------------------------------------------------------------------------------


def dry_run(snakemake_args: list[str], cwd=None, env=None) -> str:
    """Run `snakemake -n ARGS` and return its output (stdout and stderr together)."""
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("HF_HUB_OFFLINE", "1")
    child_env.setdefault("TRANSFORMERS_OFFLINE", "1")
    cmd = [sys.executable, "-m", "snakemake", "-n", *snakemake_args]
    proc = subprocess.run(
        cmd, cwd=cwd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-25:])
        raise EaglenestError(f"snakemake -n failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def parse_dry_run(text: str) -> list[Job]:
    """The job blocks of a `snakemake -n` output, in printed order (`rule all` left out)."""
    return [
        Job(
            rule=r.rule,
            jobid=-1 if r.jobid is None else r.jobid,
            wildcards=r.wildcards,
            inputs=r.inputs,
            outputs=r.outputs,
            resources=r.resources,
            reason=r.reason,
            reasons=classify_reason(r.reason),
        )
        for r in parse_jobs(text)
        if r.outputs
    ]  # a target rule (`all`) has no outputs


def classify_reason(reason: str) -> list[tuple[str, str]]:
    """Snakemake's `reason:` text as (category, detail) pairs, in REASON_ORDER."""
    out: list[tuple[str, str]] = []
    for segment in _SEGMENT_SPLIT.split(reason.strip()):
        if not segment:
            continue
        for prefix, category in _REASON_PREFIXES:
            if segment.startswith(prefix):
                detail = segment[len(prefix) :].lstrip(" :")
                if category == PARAMS:
                    out.extend(_classify_params(detail))
                else:
                    out.append((category, detail))
                break
        else:
            out.append((OTHER, segment))
    return sorted(out, key=lambda c: REASON_ORDER.index(c[0]))


def _classify_params(detail: str) -> list[tuple[str, str]]:
    """Split a params change into the code hash (changed code) and the rest (changed params).

    Snakemake records params as the set of their reprs; its reason says which were only before
    and which only now. Every rule's `code` param is a 16-hex-digit hash in quotes.
    """
    m = re.search(r"before: (.*?) now: (.*?)\s*$", detail)
    if not m:
        return [(PARAMS, detail)]
    before, now = m.group(1), m.group(2)
    out = []
    if set(_CODE_HASH.findall(before)) != set(_CODE_HASH.findall(now)):
        out.append(
            (
                CODE,
                "package code hash "
                + " -> ".join(",".join(_CODE_HASH.findall(s)) or "-" for s in (before, now)),
            )
        )

    def rest(s: str) -> str:
        s = _CODE_HASH.sub("", s).replace("<nothing exclusive>", "")
        return s.strip(" ,")

    if rest(before) or rest(now):
        out.append((PARAMS, f"before: {_clip(rest(before)) or '-'}; now: {_clip(rest(now)) or '-'}"))
    return out or [(PARAMS, detail)]


def _clip(s: str, n: int = 120) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


# --------------------------------------------------------------------------------------------
# Order and the GPU path
# --------------------------------------------------------------------------------------------


def dependencies(jobs: list[Job]) -> dict[int, set[int]]:
    """For each job (by index), the indices of the planned jobs it needs."""
    producer = {}
    for i, j in enumerate(jobs):
        for f in j.outputs:
            producer[f] = i
    return {
        i: {producer[f] for f in j.inputs if f in producer and producer[f] != i} for i, j in enumerate(jobs)
    }


def topological_order(jobs: list[Job]) -> list[int]:
    """Indices of `jobs` so that every job comes after what it needs (ties: printed order)."""
    deps = dependencies(jobs)
    users: dict[int, list[int]] = {i: [] for i in deps}
    for i, ds in deps.items():
        for d in ds:
            users[d].append(i)
    waiting = {i: len(ds) for i, ds in deps.items()}
    import heapq

    ready = [i for i, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(jobs):  # a cycle cannot come out of Snakemake; keep what we have
        order += [i for i in range(len(jobs)) if i not in set(order)]
    return order


def _ancestors(i: int, deps: dict[int, set[int]]) -> set[int]:
    seen: set[int] = set()
    stack = list(deps[i])
    while stack:
        d = stack.pop()
        if d not in seen:
            seen.add(d)
            stack.extend(deps[d])
    return seen


def gpu_stages(jobs: list[Job]) -> list[dict]:
    """GPU jobs in run order, grouped by rule, each with the CPU jobs it waits for after the
    previous GPU stage (CPU work between two GPU stages: the GPU idles while it runs)."""
    deps = dependencies(jobs)
    order = topological_order(jobs)
    stages: list[dict] = []
    for i in order:
        if not jobs[i].gpu:
            continue
        if stages and stages[-1]["rule"] == jobs[i].rule:
            stages[-1]["jobs"].append(i)
        else:
            stages.append({"rule": jobs[i].rule, "jobs": [i]})
    anc = {i: _ancestors(i, deps) for i in range(len(jobs))}
    prev: list[int] = []
    for st in stages:
        needed = set().union(*(anc[i] for i in st["jobs"]))
        between = [i for i in needed if not jobs[i].gpu and any(p in anc[i] for p in prev)]
        st["waits_on_cpu"] = sorted(
            {jobs[i].rule for i in between},
            key=lambda r: min(order.index(i) for i in between if jobs[i].rule == r),
        )
        prev = st["jobs"]
    return [
        {"rule": st["rule"], "jobs": len(st["jobs"]), "waits_on_cpu": st["waits_on_cpu"]} for st in stages
    ]


# --------------------------------------------------------------------------------------------
# Config and the hidden-state estimate
# --------------------------------------------------------------------------------------------


def parse_config_entries(entries: list[str]) -> dict:
    """`--config KEY=VALUE` entries, parsed by Snakemake's own command-line parser."""
    from snakemake.cli import parse_config

    try:
        return parse_config(list(entries))
    except ValueError as e:
        raise EaglenestError(f"--config {' '.join(entries)}: {e}") from None


SNAKEFILE_NAMES = ("Snakefile", "snakefile", "workflow/Snakefile", "workflow/snakefile")


def find_snakefile(cwd=".") -> Path | None:
    """The Snakefile snakemake would pick in `cwd` when none is given."""
    for name in SNAKEFILE_NAMES:
        if (Path(cwd) / name).exists():
            return Path(cwd) / name
    return None


def load_config(workdir, snakefile, configfiles=(), config_entries=(), cwd=".") -> dict:
    """The config the workflow will see: the Snakefile's `configfile:` (relative to the working
    directory, skipped when absent there and --configfile is given), then each --configfile
    (relative to where the command runs), then --config."""
    from snakemake.common.configfile import load_configfile
    from snakemake.utils import update_config

    workdir, cwd = Path(workdir), Path(cwd)
    config: dict = {}
    m = _CONFIGFILE.search(Path(snakefile).read_text()) if snakefile else None
    default = workdir / m.group(1) if m else None
    if default is not None and default.exists():
        update_config(config, load_configfile(default))
    elif not configfiles:
        raise EaglenestError(
            "no config: the Snakefile's configfile is missing and no --configfile was given", default
        )
    for cf in configfiles:
        path = Path(cf) if Path(cf).is_absolute() else cwd / cf
        if not path.exists():
            raise EaglenestError("config file does not exist", cf)
        update_config(config, load_configfile(path))
    update_config(config, parse_config_entries(list(config_entries)))
    if "run_dir" not in config:
        raise EaglenestError("the config has no run_dir", default)
    return config


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _count_lines(path: Path) -> int | None:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return None


def _local_target_folder(cfg: dict, workdir: Path) -> Path | None:
    """The target's folder on this machine without network: a local folder, or the cached
    snapshot of a hub id (None when neither exists yet)."""
    target = cfg.get("target", {})
    name = str(target.get("path", ""))
    if _on_hub(target, workdir):
        status = cache_status(name, target.get("revision"), _cache_dir(target, workdir))
        return Path(status["snapshot"]) if status["cached"] else None
    path = Path(name) if Path(name).is_absolute() else workdir / name
    return path if (path / "config.json").exists() else None


def _on_hub(target: dict, workdir: Path) -> bool:
    """The workflow's own test (rules/common.smk), with paths relative to `workdir`."""
    name, tiny = str(target.get("path", "")), target.get("build_tiny")
    built_as = (tiny.get("architecture") or "llama") if isinstance(tiny, dict) else None
    return on_hub(name, built_as) and (built_as is not None or not (workdir / name).exists())


def _cache_dir(target: dict, workdir: Path):
    cache = target.get("cache_dir")
    if not cache:
        return None
    return Path(cache) if Path(cache).is_absolute() else workdir / cache


def _hidden_size(cfg: dict, workdir: Path) -> tuple[int | None, str]:
    target = cfg.get("target", {})
    if target.get("hidden_size"):
        return int(target["hidden_size"]), "target.hidden_size"
    tiny = target.get("build_tiny")
    if isinstance(tiny, dict) and tiny.get("hidden_size"):
        return int(tiny["hidden_size"]), "target.build_tiny.hidden_size"
    folder = _local_target_folder(cfg, workdir)
    if folder is not None:
        try:
            return read_shape(folder).hidden_size, f"{folder / 'config.json'}"
        except EaglenestError:
            pass
    return None, "unknown: set target.hidden_size"


def target_status(cfg: dict, workdir=".") -> dict:
    """Where the target comes from, whether it is here already, its weight bytes, and whether
    those fit the GPUs the config asks for. Reads the local disk only."""
    workdir = Path(workdir)
    target = cfg.get("target", {})
    name = str(target.get("path", ""))
    out: dict = {"name": name, "revision": target.get("revision")}
    built = bool(target.get("build_tiny"))
    if _on_hub(target, workdir):
        status = cache_status(name, target.get("revision"), _cache_dir(target, workdir))
        out.update(source="hub", built_here=built, **status)
        if not status["cached"]:
            out["bytes"] = int(target["weights_gb"] * 1e9) if target.get("weights_gb") else None
            out["bytes_from"] = "target.weights_gb" if target.get("weights_gb") else "unknown"
    elif built:
        out.update(source="built by the workflow", cached=None, bytes=None)
    else:
        folder = _local_target_folder(cfg, workdir)
        out.update(
            source="local folder",
            cached=folder is not None,
            bytes=sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder else None,
        )
    out["gpu_memory"] = gpu_memory_check(cfg, out.get("bytes"))
    return out


#: vLLM 0.32 runs its V2 model runner on GPUs where Triton is present and the V1 runner on
#: CPU (the path the CPU tests exercise); this variable picks the V1 runner on a GPU as well.
GPU_ENGINE_FALLBACK = "VLLM_USE_V2_MODEL_RUNNER=0"


COMMON_GPUS = (("an 80 GB H100/A100", 80), ("a 141 GB H200", 141), ("a 192 GB B200", 192))


def gpu_memory_check(cfg: dict, weight_bytes: int | None) -> dict:
    """Weights per GPU under tensor parallelism, and the GPU memory that needs at vLLM's
    memory utilisation (weights only: the KV cache needs room on top)."""
    vcfg = cfg.get("vllm", {})
    if weight_bytes is None or vcfg.get("device") == "cpu":
        return {}
    tp = int(vcfg.get("tensor_parallel_size", 1) or 1)
    extra = list(vcfg.get("extra_args") or [])
    util = 0.9
    if "--gpu-memory-utilization" in extra[:-1]:
        util = float(extra[extra.index("--gpu-memory-utilization") + 1])
    per_gpu = weight_bytes / tp
    need = per_gpu / util
    have = cfg.get("gpu_memory_gb")
    return {
        "tensor_parallel_size": tp,
        "memory_utilization": util,
        "weights_per_gpu_bytes": per_gpu,
        "min_gpu_bytes": need,
        "gpu_bytes": have * 1e9 if have else None,
        "fits": None if not have else have * 1e9 >= need,
    }


def _train_samples(cfg: dict, workdir: Path, basedir: Path, rebuilding: set[str]) -> tuple[int | None, str]:
    run = workdir / cfg["run_dir"]
    stats = _read_json(run / "prompts" / "prompts_stats.json")
    if stats and "prepare_prompts" not in rebuilding and isinstance(stats.get("train"), int):
        return stats["train"], "prompts_stats.json"
    total, unknown = 0, []
    for src in cfg.get("prompts", {}).get("sources", []):
        if src.get("samples"):
            total += int(src["samples"])
            continue
        n = None
        if src.get("type") == "bundled":
            n = _count_lines(basedir / "data" / "prompts" / src.get("path", "default.jsonl"))
        elif src.get("type") == "jsonl" and src.get("path"):
            p = Path(src["path"])
            n = _count_lines(p if p.is_absolute() else workdir / p)
        if n is None:
            unknown.append(src.get("name", "?"))
        else:
            total += n
    if unknown:
        return None, f"unknown: set 'samples' on source(s) {', '.join(unknown)}"
    held_out = int(cfg.get("prompts", {}).get("eval_samples", 0) or 0)
    return max(total - held_out, 0), "config sources minus eval_samples"


def estimate_hidden_states(cfg: dict, workdir=".", rebuilding=(), basedir=None) -> dict:
    """Bytes the hidden-state shards will take, measured or estimated (see module doc).

    `rebuilding`: rules that will run (their outputs on disk are about to change); `basedir`:
    the Snakefile's folder (bundled prompts live under it)."""
    workdir = Path(workdir)
    basedir = Path(basedir) if basedir is not None else Path(__file__).resolve().parents[1]
    rebuilding = set(rebuilding)
    hs = cfg.get("hidden_states", {})
    dtype = hs.get("dtype", "bfloat16")
    dtype_bytes = DTYPE_BYTES.get(dtype)
    hidden, hidden_from = _hidden_size(cfg, workdir)
    run = workdir / cfg["run_dir"]
    est = {
        "dtype": dtype,
        "dtype_bytes": dtype_bytes,
        "hidden_size": hidden,
        "hidden_size_from": hidden_from,
        "num_shards": hs.get("num_shards"),
        "samples": None,
        "tokens_per_sample": None,
        "tokens": None,
        "bytes": None,
    }
    meta = _read_json(run / "tokenized" / "metadata.json")
    if meta and "tokenize" not in rebuilding and isinstance(meta.get("tokens_total"), int):
        est.update(
            tokens=meta["tokens_total"],
            samples=meta.get("samples_out"),
            basis="measured: tokenized/metadata.json",
        )
    else:
        samples, samples_from = _train_samples(cfg, workdir, basedir, rebuilding)
        max_len = cfg.get("tokenize", {}).get("max_seq_len")
        per = hs.get("expected_tokens_per_sample")
        if per:
            per, per_from = (
                min(int(per), int(max_len)) if max_len else int(per),
                "hidden_states.expected_tokens_per_sample",
            )
        elif max_len:
            per, per_from = int(max_len), "upper bound: tokenize.max_seq_len"
        else:
            per, per_from = None, "unknown"
        est.update(
            samples=samples,
            tokens_per_sample=per,
            basis=f"estimate: samples from {samples_from}; tokens/sample from {per_from}",
        )
        if samples is not None and per is not None:
            est["tokens"] = samples * per
    if est["tokens"] is not None and hidden and dtype_bytes:
        est["bytes"] = est["tokens"] * HIDDEN_LAYERS_STORED * hidden * dtype_bytes
    probe = run
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        est["free_bytes"] = shutil.disk_usage(probe).free
    except OSError:
        est["free_bytes"] = None
    est["disk_margin_bytes"] = int(float(hs.get("disk_margin_gb", 0) or 0) * 1e9)
    return est


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


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
                st["upstream"].update(producer_rule.get(f, f) for f in split_files(detail))
            elif detail and category not in (MISSING,):
                st["details"].setdefault(category, _clip(detail, 200))
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
    jobs = parse_dry_run(dry_run(args, cwd=cwd))
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
        "job_list": [asdict(j) | {"gpu": j.gpu} for j in jobs],
    }


def human_bytes(n) -> str:
    if n is None:
        return "unknown"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


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
        if hs.get("free_bytes") is not None:
            need = hs["bytes"] + hs["disk_margin_bytes"]
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


__all__ = [
    "Job",
    "classify_reason",
    "dry_run",
    "estimate_hidden_states",
    "find_snakefile",
    "format_plan",
    "gpu_stages",
    "load_config",
    "make_plan",
    "parse_dry_run",
    "stage_summary",
    "target_status",
    "topological_order",
]
