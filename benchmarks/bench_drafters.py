"""EAGLE-3, P-EAGLE and DFlash on one target and one dataset, back to back.

Runs the workflow with `sweep: {algorithm: [eagle3, p_eagle, dflash]}` on the given config (the
run itself is built first if it is missing), so the three drafts train on the same hidden
states; P-EAGLE is trained to `max(--k)` depths and DFlash on blocks of `max(--k) + 1` slots, so
each can be served at every k asked. Then each draft is served on the run's held-out prompts,
greedy, with evaluation's own code (`eaglenest.evaluation.evaluate`: the server a draft is
evaluated on, `method_spec`, and `evaluate_prompts`), at each k,
and the target alone and n-gram at k = 3 once. Prints one table: per algorithm the training wall
time (its `train_draft` benchmark file), tokens per target step at k = 3 and at its best k,
per-position acceptance at that k, output tokens/s against no speculation, and whether the
outputs equal no speculation's token for token. Where they do not all (a 16-bit real model on
CPU), the draft is judged as evaluation judges it: against n-gram's identical fraction, the
engine's own noise floor (n-gram drafts by table lookup, so what differs under it is noise).
With --record the run (its figures and the table) is added to the record `drafters`
(benchmarks/records/, with date, commit, machine, command, versions); `make docs` renders it.

A DFlash block trained on max(k) + 1 slots and served with fewer drafts holds fewer slots than
it was trained on (its attention spans the block), so its figures below max(k) are a lower
bound; a run's own evaluation trains the block it serves (`draft.dflash.block_size` null).

Usage: python benchmarks/bench_drafters.py --workdir DIR [--configfile CONFIG [OVERLAY ...]]
         [--k 1 2 3 5 7] [--epochs N] [--cores 2] [--passes 3] [--record]
The real model at the study's scale:
  --configfile config/smollm2.yaml benchmarks/configs/smollm2_study.yaml --k 1 2 3 --epochs 2
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from records import append_run, command_line, head_commit, repo_path

REPO = Path(__file__).resolve().parents[1]
ALGORITHMS = ("eagle3", "p_eagle", "dflash")
COLUMNS = [
    "drafter", "training s", "tokens/step k=3", "best k", "tokens/step",
    "per-position acceptance at best k", "tok/s k=3 (x no spec)", "tok/s best k (x no spec)",
    "outputs = no spec", "lossless",
]  # fmt: skip


def sweep_config(cfg: dict, ks: list[int], epochs: int | None) -> dict:
    """The config with the algorithm sweep, each drafter able to propose max(ks) tokens, and
    every draft (the run's own EAGLE-3 too) trained `epochs` epochs when given."""
    cfg = copy.deepcopy(cfg)
    cfg["sweep"] = {"algorithm": list(ALGORITHMS)}
    if epochs is not None:
        cfg["train"]["epochs"] = epochs
    cfg.setdefault("draft", {}).setdefault("p_eagle", {})["num_depths"] = max(max(ks), 2)
    cfg["draft"].setdefault("dflash", {})["block_size"] = max(ks) + 1
    return cfg


def per_position(result: dict) -> str:
    return " / ".join(f"{p:.2f}" for p in result["per_position_acceptance"])


def judged(by_k: dict, floor: float, margin: float) -> tuple[int, float, str]:
    """A drafter's best k, the least share of its outputs equal to no speculation's over every
    k, and whether it is lossless: exactly, or within n-gram's floor less the margin."""
    best = max(by_k, key=lambda k: by_k[k]["mean_acceptance_length"])
    equal = min(r["equal"] for r in by_k.values())
    if equal == 1:
        return best, equal, "yes (exact)"
    return best, equal, "yes" if equal >= floor - margin else "NO"


def drafter_rows(rows: list, speed: float, floor: float, margin: float, names: dict) -> list[list[str]]:
    """The printed table's rows (COLUMNS), one per drafter."""
    out = []
    for algorithm, seconds, by_k in rows:
        best, equal, verdict = judged(by_k, floor, margin)
        if equal < 1:
            verdict += f" (n-gram's floor {floor:.0%}, margin {margin:.0%})"
        at3, top = by_k[3], by_k[best]
        out.append([
            names[algorithm], f"{seconds:.0f}", f"{at3['mean_acceptance_length']:.2f}", str(best),
            f"{top['mean_acceptance_length']:.2f}", per_position(top),
            f"{at3['output_tokens_per_s']:.1f} ({at3['output_tokens_per_s'] / speed:.2f}x)",
            f"{top['output_tokens_per_s']:.1f} ({top['output_tokens_per_s'] / speed:.2f}x)",
            f"{equal:.0%} of prompts", verdict,
        ])  # fmt: skip
    return out


def drafter_figures(rows: list, speed: float, ngram: dict, floor: float, margin: float, names: dict) -> dict:
    """The record's figures, named as its earlier runs name them: each drafter's tokens per
    target step at k = 3 first (the docs list an earlier run by its first four figures)."""
    figures = {
        f"{names[a]} tokens per target step, k = 3": round(by_k[3]["mean_acceptance_length"], 3)
        for a, _, by_k in rows
    }
    figures["no speculation output tokens/s"] = round(speed, 1)
    for algorithm, seconds, by_k in rows:
        name = names[algorithm]
        best, equal, lossless = judged(by_k, floor, margin)
        for k in sorted(set(by_k) - {3}):
            figures[f"{name} tokens per target step, k = {k}"] = round(by_k[k]["mean_acceptance_length"], 3)
        figures[f"{name} best k"] = best
        figures[f"{name} per-position acceptance at best k"] = per_position(by_k[best])
        figures[f"{name} output tokens/s, k = 3"] = round(by_k[3]["output_tokens_per_s"], 1)
        figures[f"{name} outputs equal to no speculation (%)"] = round(equal * 100)
        figures[f"{name} lossless"] = lossless
        figures[f"{name} training (s)"] = round(seconds)
    figures["n-gram tokens per target step"] = round(ngram["mean_acceptance_length"], 3)
    figures["n-gram output tokens/s"] = round(ngram["output_tokens_per_s"], 1)
    figures["n-gram outputs equal to no speculation (%)"] = round(floor * 100)
    figures["losslessness floor, two binomial standard errors and one prompt (%)"] = round(margin * 100)
    return figures


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--workdir", type=Path, required=True, help="the run's working directory (built if missing)"
    )
    ap.add_argument(
        "--configfile",
        nargs="+",
        default=[str(REPO / "config" / "config.yaml")],
        help="config files, merged in order as snakemake --configfile merges them",
    )
    ap.add_argument(
        "--k", type=int, nargs="+", default=[1, 2, 3, 5, 7], help="draft tokens per step to serve"
    )
    ap.add_argument("--epochs", type=int, help="epochs of every draft (default: the config's train.epochs)")
    ap.add_argument("--cores", default="all")
    ap.add_argument(
        "--passes", type=int, default=3, help="passes over the prompts per server; tokens/s is their median"
    )
    ap.add_argument("--record", action="store_true", help="add this run to the record `drafters`")
    args = ap.parse_args()
    if args.passes < 1:
        ap.error("--passes must be at least 1")
    return args


def build_run(args: argparse.Namespace, ks: list[int]) -> dict:
    """The config with the algorithm sweep, and its run built in the working directory."""
    from snakemake.utils import validate

    from eaglenest.pipeline.run_config import load_config

    cfg = load_config(REPO, REPO / "Snakefile", args.configfile)
    validate(cfg, str(REPO / "config" / "schemas" / "config.schema.yaml"))  # fills the defaults
    cfg = sweep_config(cfg, ks, args.epochs)
    args.workdir.mkdir(parents=True, exist_ok=True)
    configfile = args.workdir / "bench_drafters.yaml"
    configfile.write_text(yaml.safe_dump(cfg, sort_keys=False))
    subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory",
         str(args.workdir), "--configfile", str(configfile), "--cores", str(args.cores)],
        check=True,
    )  # fmt: skip
    return cfg


def draft_folders(cfg: dict, run_dir: Path) -> dict:
    """Per algorithm, its draft folder and its training's benchmark file."""
    from eaglenest.draft.algorithms import folder_algorithm
    from eaglenest.training.sweep import plan_variants

    drafts = {}
    for variant in plan_variants(cfg):
        own = variant.settings["algorithm"] == cfg["draft"]["algorithm"]
        folder = run_dir if own else run_dir / "variants" / variant.name
        tsv = (
            run_dir
            / "benchmarks"
            / ("train_draft.tsv" if own else f"variants/{variant.name}/train_draft.tsv")
        )
        drafts[folder_algorithm(folder / "draft")] = (folder / "draft", tsv)
    return drafts


def equal_share(texts: dict, reference: dict) -> float:
    """The share of prompts whose output equals no speculation's, token for token."""
    return sum(texts[i] == reference[i] for i in reference) / len(reference)


def report(rows: list, plain: dict, ngram: dict, floor: float, prompts: int) -> tuple[dict, dict]:
    """Prints the table and the baselines; returns the record's figures and the table."""
    from eaglenest.draft.algorithms import DISPLAY_NAMES
    from eaglenest.evaluation.figures import noise_floor_margin

    speed = plain["output_tokens_per_s"]
    margin = noise_floor_margin(floor, prompts)
    table = drafter_rows(rows, speed, floor, margin, DISPLAY_NAMES)
    print("\n| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in table:
        print("| " + " | ".join(row) + " |")
    print(
        f"no speculation: {speed:.1f} output tok/s; n-gram at k = 3: {ngram['mean_acceptance_length']:.2f} "
        f"tokens/step, {ngram['output_tokens_per_s']:.1f} tok/s, outputs equal {floor:.0%}"
    )
    figures = drafter_figures(rows, speed, ngram, floor, margin, DISPLAY_NAMES)
    return figures, {"columns": COLUMNS, "rows": table}


def record_run(args, epochs: int, prompts: int, figures: dict, table: dict, commit: str) -> None:
    """The run's figures and table, added to the record `drafters`."""
    title = (
        f"The three drafters on {' + '.join(map(repo_path, args.configfile))} ({epochs} epochs each, "
        f"{prompts} held-out prompts, tokens/s the median of {args.passes} passes)"
    )
    tables = [{"title": title, **table}]
    path = append_run("drafters", figures, command=command_line(), tables=tables, commit=commit)
    print(f"recorded in {repo_path(path)}; run `make docs`")


def main() -> None:
    args = parse_args()
    commit = head_commit() if args.record else None  # the commit measured, before the long run
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ks = sorted(set(args.k) | {3})

    from eaglenest.engine.server import start, stop_pid
    from eaglenest.evaluation.asking import evaluate_prompts, held_out_conversations
    from eaglenest.evaluation.methods import method_spec
    from eaglenest.pipeline.workflow import vllm_base_args, vllm_env
    from eaglenest.report.summary import read_benchmark
    from eaglenest.target.resolve import load_target

    cfg = build_run(args, ks)
    run_dir = args.workdir / cfg["run_dir"]
    drafts = draft_folders(cfg, run_dir)  # algorithm -> (draft folder, training benchmark file)
    target = load_target(run_dir / "target.json").path
    prompts = held_out_conversations(run_dir / "prompts" / "eval_prompts.jsonl")
    gen = {
        "max_tokens": cfg["evaluate"]["max_tokens"],
        "concurrency": cfg["evaluate"]["concurrency"],
        "stall_timeout_s": 600,
    }
    base, env = tuple(vllm_base_args(cfg["vllm"], cfg["target"])), vllm_env(cfg["vllm"])
    print(
        f"{len(prompts)} held-out prompts, max_tokens {gen['max_tokens']}, greedy, k in {ks}, "
        f"tokens/s the median of {args.passes} passes, "
        f"{cfg['train']['epochs']} epochs each"
    )

    def serve(method: str, draft: Path | None, k: int, tmp: Path, label: str) -> tuple[dict, dict]:
        """Evaluation's own server for `method` (no_spec, ngram or draft), then its answers."""
        spec = method_spec(method, target, base, env, k=k, draft_dir=draft, ngram=cfg["evaluate"]["ngram"])
        server = start(spec, tmp, tmp / f"{label}.log", timeout_s=cfg["vllm"]["startup_timeout_s"])
        try:
            result, outs = evaluate_prompts(server, prompts, k=k, spec_decoding=method != "no_spec", **gen)
            # Acceptance and outputs from the first pass; tokens/s the median of all passes, so
            # one pass slowed by something else on the machine does not decide it.
            speeds = [result["output_tokens_per_s"]]
            for _ in range(args.passes - 1):
                again, _answers = evaluate_prompts(
                    server, prompts, k=k, spec_decoding=method != "no_spec", **gen
                )
                speeds.append(again["output_tokens_per_s"])
            result["output_tokens_per_s"] = statistics.median(speeds)
            result["output_tokens_per_s_passes"] = speeds
        finally:
            stop_pid(server.pid)
        return result, {o["id"]: o["token_ids"] for o in outs}

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-drafters-", dir="/tmp") as tmp:
        tmp = Path(tmp)
        plain, reference = serve("no_spec", None, 1, tmp, "no_spec")
        print(
            f"no speculation: {plain['output_tokens_per_s']:.1f} output tok/s "
            f"(passes {plain['output_tokens_per_s_passes']})"
        )
        ngram, texts = serve("ngram", None, 3, tmp, "ngram-k3")
        floor = equal_share(texts, reference)
        print(
            f"n-gram k=3: {ngram['mean_acceptance_length']:.3f} tokens/step, "
            f"{ngram['output_tokens_per_s']:.1f} tok/s, outputs equal {floor:.0%} (the noise floor)"
        )
        for algorithm in ALGORITHMS:
            folder, tsv = drafts[algorithm]
            by_k = {}
            for k in ks:
                result, texts = serve("draft", folder, k, tmp, f"{algorithm}-k{k}")
                result["equal"] = equal_share(texts, reference)
                by_k[k] = result
                print(
                    f"{algorithm:<8} k={k}: {result['mean_acceptance_length']:.3f} tokens/step, per position "
                    f"{' / '.join(f'{p:.2f}' for p in result['per_position_acceptance'])}, "
                    f"{result['output_tokens_per_s']:.1f} tok/s (passes {result['output_tokens_per_s_passes']}), "
                    f"outputs equal {result['equal']:.0%}",
                    flush=True,
                )
            rows.append((algorithm, read_benchmark(tsv)["s"], by_k))

    figures, table = report(rows, plain, ngram, floor, len(reference))
    if args.record:
        record_run(args, cfg["train"]["epochs"], len(prompts), figures, table, commit)


if __name__ == "__main__":
    main()
