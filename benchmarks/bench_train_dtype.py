"""bfloat16 autocast training against float32, on the same train_draft job, on a CPU that
computes bfloat16: steps/s, tokens/s, the share of the machine's matmul peak the trainer uses,
and whether the dtype changed what the draft learned.

`train.dtype` is the trainer's `--hidden-states-dtype`: speculators 0.9.0 loads the hidden
states in it and runs each training and validation step under `torch.autocast(<device>, dtype)`;
the weights and the optimizer stay float32 and every checkpoint is saved in bfloat16. On a CPU,
float32 autocast is refused by torch ("Disabling autocast"), so float32 is plain float32.

1. Matmul peak: torch.matmul, timed at the trainer's thread count, for large squares (1024,
   2048, 4096) and the draft's own shapes at one step's `total_seq_len` rows (the fc 3H -> H,
   q_proj 2H -> heads x head_dim, the MLP H -> I and I -> H, the LM head H -> draft vocabulary),
   in float32 and bfloat16 (bfloat16 inputs, as autocast runs them), the dtypes alternating,
   the best GFLOP/s of `--repeats` short windows (on shared cores the best is a moment they
   were free). A dtype's peak is its best over every shape.
2. Training: the train_draft stage's own code (`eaglenest.training.train.train_stage` under
   `run_logged`, as scripts/train_draft.py runs it for Snakemake) on a finished run's tokenized
   rows, shards, vocabulary mapping and draft config, with the run's `train` settings but
   `--epochs` epochs (default 1), `--data-fraction` of the training rows (a sweep's
   `data_fraction`: a subset seeded by the pass's seed, the validation rows whole; default
   0.25, so that a pass stays within minutes on two shared cores) and `train.dtype` float32
   or bfloat16, into a fresh scratch folder per pass (the run's own folder is only read).
   Passes alternate float32, bfloat16, float32, ..., one pair per seed in `--seeds`, so
   whatever else the cores run hits both dtypes alike; the load average is printed before and
   after each pass. From the trainer's own per-step profile (speculators logs each step's
   step_ms and tokens/s), the first `--skip-steps` steps left out: the median seconds per
   optimizer step and its 10th percentile (the steps the other work on the cores disturbed
   least), training tokens/s (the mean tokens a step trains on over the median step), and the
   FLOP/s of a median step:

       per position, each ttt step:  6 x (q, k, v, o, gate, up, down and LM head weights)
                                     + 12 x keys x heads x head_dim   (attention, dense)
       per position, once:           6 x fc weights (3H x H) + 2 x verifier LM head (H x V_draft)

   6 = forward 2 + backward 4 for a trained weight (the fc's input needs its gradient: the
   trained input norm comes before it); the verifier's LM head makes the soft targets under
   no_grad (forward only), once per step since its input does not change with the ttt step; the
   embeddings are a lookup. Attention: QK^T and PV, 4 x keys x heads x head_dim forward, 3x
   with backward; at ttt step s each query attends to (s + 1) x total_seq_len keys (the cached
   earlier steps), counted dense, as SDPA with an explicit mask is given them (the document
   and causal mask discards most). A step computes every one of its `total_seq_len` positions,
   padding included: "as computed" GFLOP/s counts those (what the hardware did: the fraction
   of peak); "real tokens" counts the tokens the step trained on (tokens/s x FLOPs per
   position).
3. What the draft learned: each pass's last validation loss and accuracy per position (the
   trainer's metrics; each arm validates under its own autocast), and unless
   `--no-acceptance`, each pass's draft exported (export_stage) and served on the run's held-out prompts
   with evaluation's own code (`method_spec`, `evaluate_prompts`, greedy, the run's vLLM flags and
   k): tokens per target step. Noise: the other seed's pass of the same dtype, and a paired
   bootstrap over prompts of the bfloat16 - float32 difference at the same seed.

Prints one markdown table per pass and per dtype (medians over its passes). With --record the
run (figures, tables) is added to the record `train_dtype` (benchmarks/records/, with date,
commit, machine, command, versions); `make docs` renders it.

Usage: python benchmarks/bench_train_dtype.py [--workdir .] [--configfile CONFIG [OVERLAY ...]]
         [--seeds 0 1] [--epochs 1] [--data-fraction 0.25] [--skip-steps 5] [--repeats 20]
         [--no-acceptance] [--scratch DIR] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from records import append_run, command_line, head_commit, repo_path

REPO = Path(__file__).resolve().parents[1]
DTYPES = ("float32", "bfloat16")
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
PROFILE_KEYS = ("fetch_ms", "fwd_ms", "bwd_ms", "opt_ms", "step_ms", "tokens_per_s")
SQUARES = (1024, 2048, 4096)
# Weights a ttt step runs (trained: 6 FLOPs per weight per position) and the fc (once).
STEP_WEIGHTS = re.compile(r"^(layers\.\d+\.(self_attn|mlp)\.\w+_proj|lm_head)\.weight$")
COLUMNS = [
    "pass", "dtype", "seed", "steps", "s/step median (10th percentile)", "fwd / bwd / opt ms (median)",
    "tokens/s", "est. GFLOP/s as computed (real tokens)", "matmul peak GFLOP/s",
    "fraction of peak", "val loss", "val acc per position", "tokens per target step",
    "wall s (pass)", "load avg before -> after",
]  # fmt: skip
SUMMARY_COLUMNS = [
    "dtype", "passes", "s/step median (10th percentile)", "tokens/s", "est. GFLOP/s as computed (real tokens)",
    "matmul peak GFLOP/s", "fraction of peak", "final val loss", "final val acc per position",
    "tokens per target step", "load avg (1 min) over passes",
]  # fmt: skip


# --------------------------------------------------------------------------------------------
# The machine


def cpu_info() -> dict:
    """The CPU model, the flags that decide bfloat16 matmuls, and the cores torch uses."""
    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {
        "model": model,
        "flags": {f: f in flags for f in FLAGS},
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def loadavg() -> tuple[float, float, float]:
    return tuple(round(x, 2) for x in os.getloadavg())


def fmt_load(before, after) -> str:
    return f"{before[0]:.2f} -> {after[0]:.2f}"


# --------------------------------------------------------------------------------------------
# 1. Matmul peak


def time_matmuls(m: int, k: int, n: int, repeats: int, window_s: float = 0.1) -> dict[str, float]:
    """Per dtype, the best GFLOP/s of `repeats` timed windows of (m x k) @ (k x n), the dtypes
    alternating window by window (so a busy moment on the cores hits both), each window at least
    `window_s` long: short windows, many of them, so the best is a moment the cores were free."""
    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    operands = {dt: (a32.to(TORCH_DTYPES[dt]), b32.to(TORCH_DTYPES[dt])) for dt in DTYPES}
    flops = 2 * m * k * n
    calls = {}
    for dt, (a, b) in operands.items():
        a @ b  # warm-up: oneDNN picks and packs its kernel on first use
        t = time.perf_counter()
        a @ b
        calls[dt] = max(1, int(window_s / max(time.perf_counter() - t, 1e-6)))
    best = dict.fromkeys(DTYPES, 0.0)
    for _ in range(repeats):
        for dt, (a, b) in operands.items():
            t = time.perf_counter()
            for _ in range(calls[dt]):
                a @ b
            best[dt] = max(best[dt], flops * calls[dt] / (time.perf_counter() - t) / 1e9)
    return {dt: round(v, 1) for dt, v in best.items()}


def draft_shapes(dcfg: dict, rows: int) -> dict[str, tuple[int, int, int]]:
    """The draft's matmuls at one training step's rows, as (m, k, n)."""
    h, inter = dcfg["hidden_size"], dcfg["intermediate_size"]
    heads = dcfg["num_attention_heads"] * dcfg.get("head_dim", h // dcfg["num_attention_heads"])
    aux = len(dcfg["eaglenest"]["aux_layer_ids"])
    vocab = dcfg["eaglenest"]["draft_vocab_size"]
    return {
        f"fc {rows}x{aux * h} @ {aux * h}x{h}": (rows, aux * h, h),
        f"q_proj {rows}x{2 * h} @ {2 * h}x{heads}": (rows, 2 * h, heads),
        f"MLP up {rows}x{h} @ {h}x{inter}": (rows, h, inter),
        f"MLP down {rows}x{inter} @ {inter}x{h}": (rows, inter, h),
        f"LM head {rows}x{h} @ {h}x{vocab}": (rows, h, vocab),
    }


def matmul_peaks(dcfg: dict, rows: int, threads: int, repeats: int) -> dict:
    """GFLOP/s per shape and dtype (dtypes interleaved per shape), and each dtype's peak."""
    torch.set_num_threads(threads)
    shapes = {f"square {s}": (s, s, s) for s in SQUARES} | draft_shapes(dcfg, rows)
    by_shape = {}
    before = loadavg()
    for name, (m, k, n) in shapes.items():
        by_shape[name] = time_matmuls(m, k, n, repeats)
        print(
            f"  {name:<36} float32 {by_shape[name]['float32']:>7.1f}  bfloat16 "
            f"{by_shape[name]['bfloat16']:>7.1f} GFLOP/s  (load {loadavg()[0]:.2f})",
            flush=True,
        )
    after = loadavg()
    draft = [s for s in shapes if not s.startswith("square")]
    peak = {dt: max(v[dt] for v in by_shape.values()) for dt in DTYPES}
    draft_peak = {dt: max(by_shape[s][dt] for s in draft) for dt in DTYPES}
    square_peak = {dt: max(v[dt] for s, v in by_shape.items() if s not in draft) for dt in DTYPES}
    return {
        "by_shape": by_shape,
        "peak": peak,
        "draft_peak": draft_peak,
        "square_peak": square_peak,
        "load": (before, after),
    }


# --------------------------------------------------------------------------------------------
# 2. Training


def run_inputs(run_dir: Path, cfg: dict) -> dict:
    """The finished run's inputs to train_draft; exits naming the run to make when one is missing."""
    num_shards = cfg["hidden_states"]["num_shards"]
    paths = {
        "target": run_dir / "target.json",
        "tokenized": run_dir / "tokenized" / "tokenized_data.jsonl",
        "t2d_npy": run_dir / "vocab" / "t2d.npy",
        "d2t_npy": run_dir / "vocab" / "d2t.npy",
        "t2d_pt": run_dir / "vocab" / "t2d.pt",
        "d2t_pt": run_dir / "vocab" / "d2t.pt",
        "draft_config": run_dir / "draft_config.json",
        "eval_prompts": run_dir / "prompts" / "eval_prompts.jsonl",
    }
    shards = [run_dir / "hidden_states" / f"shard_{k}" for k in range(num_shards)]
    missing = [p for p in paths.values() if not p.exists()]
    missing += [s / "manifest.json" for s in shards if not (s / "manifest.json").exists()]
    if missing:
        raise SystemExit(
            f"{run_dir} is not a finished offline run (missing: {', '.join(map(str, missing[:4]))}"
            f"{' ...' if len(missing) > 4 else ''}). Make it first: `snakemake --cores all` for the "
            "default config (or with the --configfile given here), from the working directory"
        )
    return {**paths, "shards": [str(s) for s in shards]}


def step_profile(log_file: Path) -> list[dict]:
    """Each training step's profile as speculators' metric logger printed it into the log."""
    text = log_file.read_text(errors="replace")
    columns = {k: [float(v) for v in re.findall(rf"profile/{k}=([-+0-9.eE]+)", text)] for k in PROFILE_KEYS}
    counts = {len(v) for v in columns.values()}
    if len(counts) != 1 or not columns["step_ms"]:
        raise SystemExit(f"could not read the trainer's per-step profile from {log_file}: {counts}")
    return [dict(zip(PROFILE_KEYS, values)) for values in zip(*columns.values())]


def autocast_refused(log_file: Path) -> bool:
    return "Disabling autocast" in log_file.read_text(errors="replace")


def train_pass(index: int, dtype: str, seed: int, hp: dict, cfg: dict, inputs: dict, scratch: Path) -> dict:
    """One train_draft run, as the rule runs it, in its own fresh folder; its figures."""
    from eaglenest.pipeline.workflow import run_logged
    from eaglenest.target.resolve import load_target
    from eaglenest.training.train import train_stage

    run_dir = scratch / f"pass{index}-{dtype}-seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    for sub in ("train", "logs"):  # Snakemake makes its outputs' folders
        (run_dir / sub).mkdir(parents=True)
    log_file = run_dir / "logs" / "train_draft.log"
    hp = {**hp, "dtype": dtype, "seed": seed}
    before = loadavg()
    t = time.monotonic()
    summary = run_logged(
        log_file,
        train_stage,
        run_dir=run_dir,
        target=load_target(inputs["target"]),
        target_record=inputs["target"],
        shard_dirs=inputs["shards"],
        plan_path=None,
        tokenized_path=inputs["tokenized"],
        t2d_npy=inputs["t2d_npy"],
        d2t_npy=inputs["d2t_npy"],
        draft_config_path=inputs["draft_config"],
        hp=hp,
        gpus=cfg["gpus"],
        device=cfg["vllm"]["device"],
        hs_mode="offline",
        hs_dtype=cfg["hidden_states"]["dtype"],
        out_checkpoint=run_dir / "train" / "checkpoint",
        out_metrics=run_dir / "train" / "train_metrics.json",
        out_curves=run_dir / "train" / "train_curves.png",
        log_file=log_file,
    )
    wall = time.monotonic() - t
    after = loadavg()
    flags = summary["provenance"]["trainer_settings"]["hidden_states_dtype"]["value"]
    return {
        "index": index,
        "dtype": dtype,
        "seed": seed,
        "dir": run_dir,
        "wall_s": wall,
        "load": (before, after),
        "steps": step_profile(log_file),
        "val": summary["per_epoch"][-1]["val"],
        "train_steps": sum(e["train_steps"] for e in summary["per_epoch"]),
        "trainer_dtype_flag": flags,
        "autocast_refused": autocast_refused(log_file),
    }


def flops_per_position(checkpoint: Path, dcfg: dict, hp: dict) -> dict:
    """Training FLOPs per position of a step (see the module's docstring), by part; the weights'
    shapes read from the trained checkpoint."""
    from safetensors import safe_open

    h = dcfg["hidden_size"]
    heads, head_dim = dcfg["num_attention_heads"], dcfg.get("head_dim", h // dcfg["num_attention_heads"])
    ttt, seq = hp["ttt_steps"], hp["total_seq_len"]
    step_weights = fc = vocab = 0
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        for name in f.keys():  # noqa: SIM118 -- safe_open is not a dict: keys() lists the tensors
            shape = f.get_slice(name).get_shape()
            if STEP_WEIGHTS.match(name):
                step_weights += shape[0] * shape[1]
            elif name == "fc.weight":
                fc = shape[0] * shape[1]
            if name == "lm_head.weight":
                vocab = shape[0]
    keys = sum((s + 1) * seq for s in range(ttt))  # keys per query, summed over the ttt steps
    parts = {
        "trained weights per ttt step": 6 * step_weights * ttt,
        "attention (dense)": 12 * keys * heads * head_dim,
        "fc": 6 * fc,
        "verifier LM head (forward)": 2 * h * vocab,
    }
    return {"parts": parts, "total": sum(parts.values()), "step_weights": step_weights, "fc": fc}


def pass_figures(p: dict, skip: int, flops: dict, seq: int) -> dict:
    """A pass's steps after the first `skip`: the median seconds per step, and from it tokens/s
    (the mean tokens a step trains on over the median step) and GFLOP/s. Medians, because a step
    the other work on the cores stalled would weigh on a sum far more than one it spared."""
    steps = p["steps"][skip:] or p["steps"]
    seconds = [s["step_ms"] / 1000 for s in steps]
    step_s = statistics.median(seconds)
    tokens = statistics.mean(s["tokens_per_s"] * s["step_ms"] / 1000 for s in steps)
    return {
        "s_per_step": step_s,
        # The fastest tenth's bound: the steps the other work on the cores disturbed least.
        "s_per_step_p10": statistics.quantiles(seconds, n=10)[0] if len(seconds) > 1 else step_s,
        "fwd_bwd_opt_ms": tuple(
            statistics.median(s[k] for s in steps) for k in ("fwd_ms", "bwd_ms", "opt_ms")
        ),
        "tokens_per_s": tokens / step_s,
        "gflops_computed": flops["total"] * seq / step_s / 1e9,
        "gflops_real": flops["total"] * tokens / step_s / 1e9,
        "real_share": tokens / seq,
    }


# --------------------------------------------------------------------------------------------
# 3. Acceptance


def acceptance(passes: list[dict], cfg: dict, inputs: dict, hp: dict, scratch: Path) -> None:
    """Each pass's draft exported and served on the held-out prompts: adds 'accept' to it."""
    from eaglenest.engine.server import start, stop_pid
    from eaglenest.evaluation.asking import evaluate_prompts, held_out_conversations
    from eaglenest.evaluation.export import export_stage
    from eaglenest.evaluation.methods import method_spec
    from eaglenest.pipeline.workflow import vllm_base_args, vllm_env
    from eaglenest.target.resolve import load_target

    target = load_target(inputs["target"])
    prompts = held_out_conversations(inputs["eval_prompts"])
    k = cfg["evaluate"]["num_speculative_tokens"]
    gen = {
        "max_tokens": cfg["evaluate"]["max_tokens"],
        "concurrency": cfg["evaluate"]["concurrency"],
        "stall_timeout_s": 600,
    }
    base, env = tuple(vllm_base_args(cfg["vllm"], cfg["target"])), vllm_env(cfg["vllm"])
    print(f"\nacceptance: {len(prompts)} held-out prompts, k = {k}, greedy, max_tokens {gen['max_tokens']}")
    for p in passes:
        draft = p["dir"] / "draft"
        export_stage(
            p["dir"] / "train" / "checkpoint", draft, t2d_pt=inputs["t2d_pt"], d2t_pt=inputs["d2t_pt"],
            draft_config_path=inputs["draft_config"], target=target,
            max_model_len=cfg["vllm"]["max_model_len"], hp={**hp, "dtype": p["dtype"], "seed": p["seed"]},
        )  # fmt: skip
        spec = method_spec(
            "draft", target.path, base, env, k=k, draft_dir=draft, ngram=cfg["evaluate"]["ngram"]
        )
        t = time.monotonic()
        server = start(
            spec, p["dir"], p["dir"] / "logs" / "serve.log", timeout_s=cfg["vllm"]["startup_timeout_s"]
        )
        try:
            result, outs = evaluate_prompts(server, prompts, k=k, spec_decoding=True, **gen)
        finally:
            stop_pid(server.pid)
        p["accept"] = result
        p["accept_requests"] = {o["id"]: o for o in outs}
        print(
            f"  pass {p['index']} {p['dtype']:<8} seed {p['seed']}: "
            f"{result['mean_acceptance_length']:.3f} tokens per target step, per position "
            f"{' / '.join(f'{x:.2f}' for x in result['per_position_acceptance'])} "
            f"({time.monotonic() - t:.0f} s with the server's start)",
            flush=True,
        )


def paired_bootstrap(a: dict, b: dict, k: int, resamples: int = 2000) -> tuple[float, float, float]:
    """b - a in tokens per target step over the same prompts, and its 95% bootstrap interval
    (prompts resampled, both arms together)."""
    from eaglenest.data.benchmarks import request_acceptance

    ids = sorted(set(a) & set(b))
    diff = (
        request_acceptance([b[i] for i in ids], k)["mean_acceptance_length"]
        - request_acceptance([a[i] for i in ids], k)["mean_acceptance_length"]
    )
    rng = random.Random(0)
    draws = []
    for _ in range(resamples):
        pick = [rng.choice(ids) for _ in ids]
        draws.append(
            request_acceptance([b[i] for i in pick], k)["mean_acceptance_length"]
            - request_acceptance([a[i] for i in pick], k)["mean_acceptance_length"]
        )
    draws.sort()
    return diff, draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1]


# --------------------------------------------------------------------------------------------
# Report


def val_text(val: dict, ttt: int) -> tuple[float, str]:
    return val["loss_epoch"], " / ".join(f"{val[f'full_acc_{i}_epoch']:.3f}" for i in range(ttt))


def md_table(columns: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def pass_rows(passes: list[dict], peaks: dict, ttt: int) -> list[list]:
    rows = []
    for p in passes:
        f = p["fig"]
        loss, acc = val_text(p["val"], ttt)
        rows.append([
            p["index"], p["dtype"], p["seed"], len(p["steps"]),
            f"{f['s_per_step']:.4f} ({f['s_per_step_p10']:.4f})",
            " / ".join(f"{x:.1f}" for x in f["fwd_bwd_opt_ms"]), f"{f['tokens_per_s']:,.0f}",
            f"{f['gflops_computed']:.1f} ({f['gflops_real']:.1f})", f"{peaks[p['dtype']]:.1f}",
            f"{f['gflops_computed'] / peaks[p['dtype']]:.1%}", f"{loss:.4f}", acc,
            f"{p['accept']['mean_acceptance_length']:.3f}" if "accept" in p else "skipped",
            f"{p['wall_s']:.0f}", fmt_load(*p["load"]),
        ])  # fmt: skip
    return rows


def summary_rows(passes: list[dict], peaks: dict, ttt: int) -> tuple[list[list], dict]:
    rows, by_dtype = [], {}
    for dt in DTYPES:
        ps = [p for p in passes if p["dtype"] == dt]
        med = {
            key: statistics.median(p["fig"][key] for p in ps)
            for key in ("s_per_step", "s_per_step_p10", "tokens_per_s", "gflops_computed", "gflops_real")
        }
        med["loss"] = statistics.median(p["val"]["loss_epoch"] for p in ps)
        med["acc"] = [statistics.median(p["val"][f"full_acc_{i}_epoch"] for p in ps) for i in range(ttt)]
        accepts = [p["accept"]["mean_acceptance_length"] for p in ps if "accept" in p]
        med["accept"] = statistics.median(accepts) if accepts else None
        med["fraction"] = med["gflops_computed"] / peaks[dt]
        by_dtype[dt] = med
        loads = [f"{p['load'][0][0]:.2f}->{p['load'][1][0]:.2f}" for p in ps]
        rows.append([
            dt, len(ps), f"{med['s_per_step']:.4f} ({med['s_per_step_p10']:.4f})", f"{med['tokens_per_s']:,.0f}",
            f"{med['gflops_computed']:.1f} ({med['gflops_real']:.1f})", f"{peaks[dt]:.1f}",
            f"{med['fraction']:.1%}", f"{med['loss']:.4f}", " / ".join(f"{a:.3f}" for a in med["acc"]),
            f"{med['accept']:.3f}" if med["accept"] is not None else "skipped", ", ".join(loads),
        ])  # fmt: skip
    return rows, by_dtype


def noise_lines(passes: list[dict], ttt: int, k: int) -> list[str]:
    """Per seed, bfloat16 - float32 (val loss, acceptance with its paired bootstrap interval),
    and per dtype the spread between seeds."""
    lines = []
    seeds = sorted({p["seed"] for p in passes})
    pick = {(p["dtype"], p["seed"]): p for p in passes}
    for seed in seeds:
        a, b = pick.get(("float32", seed)), pick.get(("bfloat16", seed))
        if not (a and b):
            continue
        line = (
            f"seed {seed}: bfloat16 - float32 val loss {b['val']['loss_epoch'] - a['val']['loss_epoch']:+.4f}"
        )
        line += ", val acc " + " / ".join(
            f"{b['val'][f'full_acc_{i}_epoch'] - a['val'][f'full_acc_{i}_epoch']:+.3f}" for i in range(ttt)
        )
        if "accept" in a and "accept" in b:
            diff, lo, hi = paired_bootstrap(a["accept_requests"], b["accept_requests"], k)
            line += f", tokens per target step {diff:+.3f} (95% paired bootstrap over prompts {lo:+.3f} .. {hi:+.3f})"
        lines.append(line + ".")
    if len(seeds) > 1:
        for dt in DTYPES:
            ps = [p for p in passes if p["dtype"] == dt]
            losses = [p["val"]["loss_epoch"] for p in ps]
            line = f"{dt} across seeds: val loss {min(losses):.4f} .. {max(losses):.4f}"
            accepts = [p["accept"]["mean_acceptance_length"] for p in ps if "accept" in p]
            if accepts:
                line += f", tokens per target step {min(accepts):.3f} .. {max(accepts):.3f}"
            lines.append(line + ".")
    return lines


def record(args, info: dict, mm: dict, passes: list[dict], by_dtype: dict, flops: dict, tables: list, notes: list,
           commit: str) -> None:  # fmt: skip
    f32, b16 = by_dtype["float32"], by_dtype["bfloat16"]
    figures = {
        "bfloat16 / float32 steps/s (x)": round(f32["s_per_step"] / b16["s_per_step"], 2),
        "float32 s per optimizer step (median)": round(f32["s_per_step"], 4),
        "bfloat16 s per optimizer step (median)": round(b16["s_per_step"], 4),
        "bfloat16 / float32 steps/s, fastest tenth of steps (x)": round(
            f32["s_per_step_p10"] / b16["s_per_step_p10"], 2
        ),
        "float32 s per optimizer step (10th percentile)": round(f32["s_per_step_p10"], 4),
        "bfloat16 s per optimizer step (10th percentile)": round(b16["s_per_step_p10"], 4),
        "float32 training tokens/s": round(f32["tokens_per_s"]),
        "bfloat16 training tokens/s": round(b16["tokens_per_s"]),
        "float32 matmul peak (GFLOP/s)": mm["peak"]["float32"],
        "bfloat16 matmul peak (GFLOP/s)": mm["peak"]["bfloat16"],
        "float32 trainer GFLOP/s as computed": round(f32["gflops_computed"], 1),
        "bfloat16 trainer GFLOP/s as computed": round(b16["gflops_computed"], 1),
        "float32 fraction of its matmul peak (%)": round(100 * f32["fraction"], 1),
        "bfloat16 fraction of its matmul peak (%)": round(100 * b16["fraction"], 1),
        "float32 final val loss": round(f32["loss"], 4),
        "bfloat16 final val loss": round(b16["loss"], 4),
        "MFLOP per position per step": round(flops["total"] / 1e6, 2),
        "trainer threads": info["torch_threads"],
    }
    if f32["accept"] is not None and b16["accept"] is not None:
        figures["float32 tokens per target step"] = round(f32["accept"], 3)
        figures["bfloat16 tokens per target step"] = round(b16["accept"], 3)
    path = append_run(
        "train_dtype", figures, command=command_line(), tables=tables, note=" ".join(notes), commit=commit,
        title="Training dtype",
        what=(
            "bfloat16 autocast training against float32 on the same train_draft job (a finished run's "
            "data, one epoch on a seeded share of its rows a pass, the dtypes interleaved), on a CPU "
            "that computes bfloat16: seconds "
            "per optimizer step, training tokens/s, the trainer's FLOP/s against torch.matmul's measured "
            "peak for the same dtype, and each draft's validation loss and tokens per target step."
        ),
    )  # fmt: skip
    print(f"recorded in {repo_path(path)}; run `make docs`")


# --------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=REPO, help="the finished run's working directory")
    ap.add_argument(
        "--configfile", nargs="+", default=[], help="the run's config files (default: the Snakefile's own)"
    )
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1], help="one float32 and one bfloat16 pass per seed"
    )
    ap.add_argument("--epochs", type=int, default=1, help="epochs per pass (default 1)")
    ap.add_argument(
        "--data-fraction", type=float, default=0.25, help="share of the training rows a pass trains on"
    )
    ap.add_argument("--skip-steps", type=int, default=5, help="first steps of a pass left out of its timing")
    ap.add_argument("--repeats", type=int, default=20, help="timed windows per matmul shape and dtype")
    ap.add_argument(
        "--no-acceptance", dest="acceptance", action="store_false", help="skip serving the drafts"
    )
    ap.add_argument("--scratch", type=Path, help="where the passes train (default: a new folder under /tmp)")
    ap.add_argument("--record", action="store_true", help="add this run to the record `train_dtype`")
    return ap.parse_args()


def load_run_config(args) -> dict:
    from snakemake.utils import validate

    from eaglenest.engine.dtypes import choose_dtypes
    from eaglenest.pipeline.run_config import load_config

    cfg = load_config(args.workdir, REPO / "Snakefile", args.configfile, cwd=Path.cwd())
    validate(cfg, str(REPO / "config" / "schemas" / "config.schema.yaml"))  # fills the defaults
    chosen = choose_dtypes(cfg["vllm"]["dtype"], cfg["train"]["dtype"], cfg["vllm"]["device"])
    cfg["vllm"]["dtype"], cfg["train"]["dtype"] = chosen["vllm"], chosen["train"]  # as rules/common.smk
    if cfg["draft"]["algorithm"] != "eagle3" or cfg["hidden_states"]["mode"] != "offline":
        raise SystemExit("this benchmark counts FLOPs for an offline EAGLE-3 run")
    return cfg


def main() -> None:
    args = parse_args()
    commit = head_commit() if args.record else None  # the commit measured, before the long run
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # the data folder's, per pass
    from eaglenest.core.io import read_json
    from eaglenest.target.resolve import keep_caches_in
    from eaglenest.training.sweep import train_settings

    cfg = load_run_config(args)
    run_dir = (args.workdir / cfg["run_dir"]).resolve()
    inputs = run_inputs(run_dir, cfg)
    dcfg = read_json(inputs["draft_config"])
    hp = {**train_settings(cfg), "epochs": args.epochs}
    if args.data_fraction < 1:
        hp["data_fraction"] = args.data_fraction
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="bench-train-dtype-", dir="/tmp"))
    scratch.mkdir(parents=True, exist_ok=True)
    keep_caches_in(scratch)

    info = cpu_info()
    threads = info["torch_threads"]  # the trainer child sets none: torch's default, as here
    print(f"CPU: {info['model']}, {info['cpus']} CPUs, torch {info['torch']} ({info['cpu_capability']}), "
          f"{threads} threads (the trainer's: torch's default, it sets none)")  # fmt: skip
    print("flags: " + ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in info["flags"].items()))
    print(
        f"run: {repo_path(run_dir)}; train settings {json.dumps({k: hp[k] for k in sorted(hp)})}; "
        f"seeds {args.seeds}; scratch {scratch}"
    )

    print(f"\nmatmul GFLOP/s, best of {args.repeats} ({threads} threads):")
    mm = matmul_peaks(dcfg, hp["total_seq_len"], threads, args.repeats)
    print(f"  load average before {mm['load'][0]}, after {mm['load'][1]}")

    passes = []
    order = [(seed, dt) for seed in args.seeds for dt in DTYPES]
    print(f"\ntraining: {len(order)} passes, {args.epochs} epoch(s) each, dtypes interleaved")
    for i, (seed, dt) in enumerate(order, 1):
        p = train_pass(i, dt, seed, hp, cfg, inputs, scratch)
        passes.append(p)
        print(
            f"  pass {i} {dt:<8} seed {seed}: {len(p['steps'])} steps, {p['wall_s']:.0f} s with start-up and "
            f"validation; load average before {p['load'][0]}, after {p['load'][1]}; trainer flag "
            f"--hidden-states-dtype {p['trainer_dtype_flag']}; torch disabled autocast: "
            f"{'yes' if p['autocast_refused'] else 'no'}",
            flush=True,
        )
    flops = flops_per_position(passes[0]["dir"] / "train" / "checkpoint", dcfg, hp)
    for p in passes:
        p["fig"] = pass_figures(p, args.skip_steps, flops, hp["total_seq_len"])
    print(
        f"\nFLOPs per position per optimizer step: {flops['total'] / 1e6:.2f} M = "
        + " + ".join(f"{v / 1e6:.2f} M {k}" for k, v in flops["parts"].items())
        + f" ({flops['step_weights']:,} weights run per ttt step x {hp['ttt_steps']} ttt steps, fc "
        f"{flops['fc']:,}); {hp['total_seq_len']} positions a step, real tokens "
        f"{statistics.median(p['fig']['real_share'] for p in passes):.0%} of them (median)"
    )

    if args.acceptance:
        acceptance(passes, cfg, inputs, hp, scratch)
    else:
        print("\nacceptance: skipped (--no-acceptance)")

    ttt, k = hp["ttt_steps"], cfg["evaluate"]["num_speculative_tokens"]
    rows = pass_rows(passes, mm["peak"], ttt)
    srows, by_dtype = summary_rows(passes, mm["peak"], ttt)
    print("\n" + md_table(COLUMNS, rows))
    print("\n" + md_table(SUMMARY_COLUMNS, srows))
    mm_rows = [[name, v["float32"], v["bfloat16"]] for name, v in mm["by_shape"].items()]
    print(
        "\n"
        + md_table(["matmul", "float32 GFLOP/s", "bfloat16 GFLOP/s"], [[str(c) for c in r] for r in mm_rows])
    )
    f32, b16 = by_dtype["float32"], by_dtype["bfloat16"]
    notes = [
        f"bfloat16 autocast ran {f32['s_per_step'] / b16['s_per_step']:.2f}x the float32 steps/s "
        f"(median s/step {b16['s_per_step']:.4f} against {f32['s_per_step']:.4f}); "
        f"{f32['s_per_step_p10'] / b16['s_per_step_p10']:.2f}x over the fastest tenth of the steps "
        f"(10th percentile {b16['s_per_step_p10']:.4f} against {f32['s_per_step_p10']:.4f} s).",
        f"torch.matmul's best: the draft's own shapes {mm['draft_peak']['float32']:.1f} (float32) and "
        f"{mm['draft_peak']['bfloat16']:.1f} (bfloat16) GFLOP/s, the large squares "
        f"{mm['square_peak']['float32']:.1f} and {mm['square_peak']['bfloat16']:.1f}.",
        *noise_lines(passes, ttt, k),
    ]
    print("\n" + "\n".join(notes))
    if args.record:
        tables = [
            {"title": "Per dtype (medians over its passes)", "columns": SUMMARY_COLUMNS, "rows": srows},
            {"title": "Each pass, in the order run", "columns": COLUMNS, "rows": rows},
            {"title": "torch.matmul, best of the repeats", "columns": ["matmul", "float32 GFLOP/s",
             "bfloat16 GFLOP/s"], "rows": mm_rows},
        ]  # fmt: skip
        record(args, info, mm, passes, by_dtype, flops, tables, notes, commit)


if __name__ == "__main__":
    main()
