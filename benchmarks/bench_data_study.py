"""The real-model data study (issue 57): what data makes SmolLM2's draft pay, measured back to
back on one machine.

Two runs of the pipeline and two sweeps, each a Snakemake invocation:
1. The general run: config/smollm2.yaml (its recipe: the bundled prompts and ShareGPT's first
   questions, 300 answered by the target and 600 with ShareGPT's own answers) with
   benchmarks/configs/smollm2_data_study.yaml (a run folder of its own, seeded parts of the
   public benchmarks), to the end: its draft beside no speculation, n-gram, suffix decoding and
   the untrained draft. That is table (c).
2. Sweep A on that run's data (`sweep:` written to results/bench-data-study/sweep_a.yaml):
   every source at 25% and 50% of the training rows, and the bundled prompts and the
   target-answered ShareGPT rows alone. With the run's own draft, the data-scaling curve (b).
3. The off-policy arms of (a), sweep B: the ShareGPT rows with their own answers (`sharegpt`
   alone), at the fraction whose training tokens equal the on-policy arm's (the
   `sharegpt_target` rows), and at the fraction whose wall time does. The on-policy arm's wall
   time is regenerating its answers (a server start and its answer tokens at the regeneration
   job's measured rate), extracting its tokens (at the run's extraction seconds per token) and
   its training; an off-policy token costs the extraction's and the on-policy training's
   seconds per token, all measured in steps 1 and 2.
4. The in-domain run (d): config/smollm2.yaml with config/examples/smollm2-code.yaml, ShareGPT's questions
   about code, to the end; then the general run's draft asked that run's held-out prompts and
   benchmarks (benchmarks/study_runs.py `evaluate_draft_on`). A held-out prompt the general
   run trained on is left out of (d), for every method.

Every figure is tokens per target step (k from the config, greedy; eval/benchmarks.csv), per
set: the held-out split and each benchmark. It prints the CPU, each stage's seconds and the
four tables, draws the curve (results/bench-data-study/data_scaling.png) and writes everything
to results/bench-data-study/bench_data_study.json; with --record the run is added to the record
`smollm2_data_study` (benchmarks/records/), which `make docs` renders.

Usage: .venv/bin/python benchmarks/bench_data_study.py [--report-only] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import yaml
from records import append_run, command_line
from study_runs import (
    REPO,
    evaluate_draft_on,
    figure,
    lossless,
    md_table,
    merged_config,
    read_csv,
    snakemake,
    stage_seconds,
    start,
    tokens_per_step,
)

BASE_CONFIG = "config/smollm2.yaml"
STUDY = "benchmarks/configs/smollm2_data_study.yaml"
IN_DOMAIN = "config/examples/smollm2-code.yaml"
ROOT = REPO / "results" / "bench-data-study"
BUNDLED, ON_POLICY, OFF_POLICY = "default", "sharegpt_target", "sharegpt"
CURVE_FRACTIONS = [0.25, 0.5]
SETS = ("held_out", "mt_bench", "gsm8k", "alpaca_eval")
BASELINES = ("no_spec", "ngram", "suffix", "untrained_draft")
GENERAL_ON_CODE = "general_draft_on_code"
REACH_COLUMNS = [
    "set",
    "n-gram",
    "largest draft",
    "per doubling",
    "largest residual",
    "tokens to reach n-gram",
]


def sweep_file(name: str, sweep: dict) -> str:
    path = ROOT / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"sweep": sweep}, sort_keys=False))
    return str(path.relative_to(REPO))


def variants_of(files: list[str]) -> dict:
    from eaglenest.training.sweep import plan_variants

    cfg = merged_config(files)
    return {v.name: v for v in plan_variants(cfg)}


class Rows:
    """The run's tokenized rows: each one's source, tokens and supervised tokens, and the rows a
    variant trains on (the trainer's own split and subset)."""

    def __init__(self, run: Path, cfg: dict):
        from eaglenest.core.io import iter_jsonl
        from eaglenest.training.data_folder import row_sources

        self.cfg, self.run = cfg, run
        self.tokenized, self.prompts = (
            run / "tokenized" / "tokenized_data.jsonl",
            run / "prompts" / "prompts.jsonl",
        )
        self.source = row_sources(self.tokenized, self.prompts)
        rows = list(iter_jsonl(self.tokenized))
        self.ids = [r["id"] for r in rows]
        self.tokens = [len(r["input_ids"]) for r in rows]
        self.supervised = [sum(r["loss_mask"]) for r in rows]

    def trained(self, settings: dict | None = None, **overrides) -> list[int]:
        """The rows a draft trains on: a variant's `settings`, or the run's own with `overrides`."""
        from eaglenest.training.data_folder import data_fraction_rows
        from eaglenest.training.sweep import base_settings, train_hp

        hp = train_hp(self.cfg, {**(settings or base_settings(self.cfg)), **overrides})
        subset, hp, count = data_fraction_rows(self.tokenized, hp, self.prompts)
        picked = list(range(count)) if subset is None else subset
        return picked[: int(count * hp["train_data_ratio"])]

    def size(self, rows: list[int]) -> dict:
        return {
            "rows": len(rows),
            "tokens": sum(self.tokens[i] for i in rows),
            "supervised": sum(self.supervised[i] for i in rows),
        }

    def fraction_for(self, source: str, tokens: float) -> float:
        """The smallest fraction (to 0.001) of `source`'s training rows holding `tokens` tokens."""
        from eaglenest.training.sweep import training_subset

        n, ratio, seed = len(self.tokens), self.cfg["train"]["train_data_ratio"], self.cfg["train"]["seed"]
        split = int(n * ratio)
        for step in range(1, 1001):
            f = step / 1000
            rows, _ = training_subset(n, ratio, f, seed, eligible=lambda i: self.source[i] == source)
            if sum(self.tokens[i] for i in rows[: len(rows) - (n - split)]) >= tokens:
                return f
        return 1.0


def regeneration_rate(run: Path, rows: Rows) -> dict:
    """What the run's regeneration job measured: its server's start, and the answer tokens per
    second of the prompts it sent (the last `sent` answers of its progress file: a resumed job
    sends only what an earlier one left, so the job's seconds are not all answers')."""
    import datetime

    from eaglenest.core.io import iter_jsonl

    log = (run / "logs" / "regenerate_responses.log").read_text().splitlines()

    def at(pattern: str) -> tuple[datetime.datetime, str]:
        line = next((x for x in log if re.search(pattern, x)), None)
        if line is None:
            raise SystemExit(f"no line matching {pattern!r} in {run / 'logs' / 'regenerate_responses.log'}")
        return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f"), line

    healthy, line = at(r"vLLM server healthy after")
    startup = float(re.search(r"healthy after ([0-9.]+) s", line).group(1))
    done, line = at(r"regeneration done: ")
    sent = int(re.search(r"'sent': ([0-9]+)", line).group(1))
    (progress,) = (run / ".eaglenest" / "regenerate").glob("progress-*.jsonl")
    sent_ids = {r["id"] for r in list(iter_jsonl(progress))[-sent:]}
    answer_of = dict(zip(rows.ids, rows.supervised, strict=True))
    tokens = sum(answer_of.get(i, 0) for i in sent_ids)
    seconds = (done - healthy).total_seconds()
    return {"server_start_s": startup, "sent": sent, "answer_tokens": tokens, "seconds": seconds,
            "answer_tokens_per_s": tokens / seconds}  # fmt: skip


def equal_cost_fractions(rows: Rows, stages: dict, on_variant: str) -> dict:
    """(a)'s off-policy fractions: equal training tokens, and equal wall time, to the on-policy
    arm. Its wall time: regenerating its answers (a server start, then its answer tokens at the
    run's measured rate), extracting its tokens (the run's extraction seconds per token) and its
    training; an off-policy token costs extraction and training alone."""
    on = rows.size(rows.trained(sources=ON_POLICY))
    regen = regeneration_rate(rows.run, rows)
    on_answers = sum(a for a, s in zip(rows.supervised, rows.source, strict=True) if s == ON_POLICY)
    regen_s = regen["server_start_s"] + on_answers / regen["answer_tokens_per_s"]
    extract_per_token = stages["extract_hidden_states"] / sum(rows.tokens)
    train_s = stages[f"variants/{on_variant}/train_draft"]
    train_per_token = train_s / on["tokens"]
    # Every on-policy row is regenerated and extracted (its validation rows too); training
    # reads the training rows.
    on_tokens = sum(t for t, s in zip(rows.tokens, rows.source, strict=True) if s == ON_POLICY)
    on_wall = regen_s + extract_per_token * on_tokens + train_s
    time_tokens = on_wall / (extract_per_token + train_per_token)
    return {
        "on_policy": on,
        "regeneration": regen,
        "on_policy_wall_s": {
            "regeneration share": round(regen_s, 1),
            "extraction share": round(extract_per_token * on_tokens, 1),
            "training": train_s,
            "total": round(on_wall, 1),
        },
        "extraction_s_per_token": extract_per_token,
        "training_s_per_token": train_per_token,
        "equal_tokens_fraction": rows.fraction_for(OFF_POLICY, on["tokens"]),
        "equal_time_tokens": round(time_tokens),
        "equal_time_fraction": rows.fraction_for(OFF_POLICY, time_tokens),
    }


def run_all(cfg: dict, run: Path, code_cfg: dict, code_run: Path, logs: Path) -> dict:
    files = [BASE_CONFIG, STUDY]
    walls = {}
    print("\n1. the general run, to the end", flush=True)
    walls["general run"] = snakemake("general", files, [], logs / "general.log")
    print("\n2. sweep A: the curve's fractions and the sources alone", flush=True)
    a = sweep_file(
        "sweep_a",
        {"combine": "one_at_a_time", "data_fraction": CURVE_FRACTIONS, "sources": [[BUNDLED], [ON_POLICY]]},
    )
    walls["sweep A"] = snakemake("sweep A", [*files, a], [], logs / "general.log")
    print("\n3. sweep B: the off-policy arms at equal tokens and equal wall time", flush=True)
    on_variant = variant_name([*files, a], ON_POLICY, 1.0)
    cost = equal_cost_fractions(Rows(run, cfg), stage_seconds(run), on_variant)
    print(f"    {json.dumps(cost)}", flush=True)
    fractions = sorted({cost["equal_tokens_fraction"], cost["equal_time_fraction"]})
    b = sweep_file("sweep_b", {"combine": "grid", "data_fraction": fractions, "sources": [[OFF_POLICY]]})
    walls["sweep B"] = snakemake("sweep B", [*files, b], [], logs / "general.log")
    print("\n4. the in-domain run, to the end, and the general draft on its prompts", flush=True)
    walls["in-domain run"] = snakemake("in-domain", [BASE_CONFIG, IN_DOMAIN], [], logs / "in_domain.log")
    walls["general draft on the in-domain prompts"] = evaluate_draft_on(
        code_cfg, run, code_run, ROOT / GENERAL_ON_CODE
    )
    (ROOT / "ran.json").write_text(json.dumps({"walls": walls, "cost": cost, "sweeps": [a, b]}, indent=1))
    return {"walls": walls, "cost": cost, "sweeps": [a, b]}


def variant_name(files: list[str], sources: str, fraction: float) -> str:
    for name, v in variants_of(files).items():
        if v.settings["sources"] == sources and v.settings["data_fraction"] == fraction:
            return name
    raise SystemExit(f"no variant of {sources} at {fraction} in {files}")


def set_figures(rows: list[dict], method: str) -> dict:
    return {s: tokens_per_step(figure(rows, method, set=s)) for s in SETS}


def held_out_without(requests: list[dict], method: str, leave_out: set[str]) -> float | None:
    """Tokens per target step on the held-out split less the prompts in `leave_out`."""
    kept = [
        r for r in requests if r["method"] == method and r["set"] == "held_out" and r["id"] not in leave_out
    ]
    steps = sum(int(r["target_steps"]) for r in kept)
    return round(sum(int(r["output_tokens"]) for r in kept) / steps, 3) if steps else None


def fit(points: list[tuple[int, float]], k: int) -> dict | None:
    from eaglenest.report.variant_comparison import fit_data_scaling

    return fit_data_scaling([p[0] for p in points], [p[1] for p in points], ceiling=k + 1)


def tokens_to_reach(f: dict | None, goal: float | None) -> float | None:
    """Training tokens at which the fit reaches `goal` (an extrapolation), None if it never rises."""
    if not f or goal is None or f["per_doubling"] <= 0:
        return None
    return 2 ** ((goal - f["intercept"]) / f["per_doubling"])


def plot_curve(curve: list[dict], singles: list[dict], lines: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SETS), figsize=(4.2 * len(SETS), 4), sharey=True)
    for ax, s in zip(axes, SETS, strict=True):
        xs = [c["tokens"] for c in curve]
        ax.plot(xs, [c["sets"][s] for c in curve], marker="o", label="every source, 25/50/100%")
        for p, marker in zip(singles, "s^Dv", strict=False):
            ax.plot([p["tokens"]], [p["sets"][s]], marker=marker, linestyle="none", label=p["label"])
        for name, style in (("ngram", "--"), ("suffix", ":")):
            if lines[name].get(s) is not None:
                ax.axhline(lines[name][s], color="grey", linestyle=style, label=name)
        ax.set_xscale("log", base=2)
        ax.set(title=s, xlabel="training tokens")
    axes[0].set_ylabel("tokens per target step")
    axes[-1].legend(fontsize="x-small")
    fig.suptitle("SmolLM2-135M-Instruct: the draft against its training tokens (k = 3, greedy)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def report(cfg: dict, run: Path, code_run: Path, ran: dict, cpu: str) -> dict:
    from eaglenest.core.io import iter_jsonl

    k = cfg["evaluate"]["num_speculative_tokens"]
    rows = Rows(run, cfg)
    stages = stage_seconds(run)
    base_rows = read_csv(run / "eval" / "benchmarks.csv")
    a_file, b_file = ran["sweeps"]
    files = [BASE_CONFIG, STUDY]
    variants = {**variants_of([*files, a_file]), **variants_of([*files, b_file])}

    def variant(name: str) -> dict:
        v = variants[name]
        bench = base_rows if v.is_base else read_csv(run / "variants" / name / "eval" / "benchmarks.csv")
        key = "train_draft" if v.is_base else f"variants/{name}/train_draft"
        return {
            "name": name,
            **rows.size(rows.trained(v.settings)),
            "sources": v.settings["sources"],
            "fraction": v.settings["data_fraction"],
            "train_s": stages.get(key),
            "sets": set_figures(bench, "draft"),
            "lossless": lossless(bench, "draft"),
        }

    by_settings = {(v.settings["sources"], v.settings["data_fraction"]): n for n, v in variants.items()}
    cost = ran["cost"]
    on = variant(by_settings[(ON_POLICY, 1.0)])
    off_tok = variant(by_settings[(OFF_POLICY, cost["equal_tokens_fraction"])])
    off_time = variant(by_settings[(OFF_POLICY, cost["equal_time_fraction"])])
    ext = cost["extraction_s_per_token"]
    on_wall = cost["on_policy_wall_s"]
    table_a = [
        ["on-policy (target's answers)", ON_POLICY, on["rows"], on["tokens"], on["supervised"],
         on_wall["regeneration share"], on_wall["extraction share"], on["train_s"], on_wall["total"],
         *on["sets"].values()],
    ]  # fmt: skip
    for label, v in (("off-policy, equal tokens", off_tok), ("off-policy, equal wall time", off_time)):
        e = round(ext * v["tokens"], 1)
        table_a.append(
            [label, f"{OFF_POLICY} ({v['fraction']:g})", v["rows"], v["tokens"], v["supervised"], 0, e,
             v["train_s"], round(e + (v["train_s"] or 0), 1), *v["sets"].values()]
        )  # fmt: skip
    cols_a = ["arm", "rows from", "rows", "tokens", "answer tokens", "regeneration s", "extraction s",
              "training s", "wall s", *SETS]  # fmt: skip

    lines = {m: set_figures(base_rows, m) for m in BASELINES}
    curve = sorted(
        (variant(by_settings[("all", f)]) for f in (*CURVE_FRACTIONS, 1.0)), key=lambda c: c["tokens"]
    )
    singles = [
        {**variant(by_settings[(BUNDLED, 1.0)]), "label": "bundled prompts alone"},
        {**on, "label": "ShareGPT, target's answers alone"},
        {**off_tok, "label": "ShareGPT, own answers (equal tokens)"},
        {**off_time, "label": "ShareGPT, own answers (equal time)"},
    ]
    fits = {s: fit([(c["tokens"], c["sets"][s]) for c in curve], k) for s in SETS}
    largest = curve[-1]["tokens"]
    table_b = []
    for c in [*curve, *singles]:
        table_b.append(
            [c.get("label") or f"every source, {c['fraction']:g}", c["rows"], c["tokens"], c["train_s"],
             *c["sets"].values()]
        )  # fmt: skip
    reach = []
    for s in SETS:
        f = fits[s]
        need = tokens_to_reach(f, lines["ngram"][s])
        reach.append(
            [s, lines["ngram"][s], curve[-1]["sets"][s], round(f["per_doubling"], 3) if f else None,
             round(f["max_abs_residual"], 3) if f else None,
             f"{need / largest:.1f}x ({need / 1e6:.1f} M tokens)" if need else "not on this fit"]
        )  # fmt: skip
    ROOT.mkdir(parents=True, exist_ok=True)
    plot_curve(curve, singles, lines, ROOT / "data_scaling.png")

    table_c = []
    for m in (*BASELINES, "draft"):
        speeds = {s: figure(base_rows, m, set=s) for s in SETS}
        table_c.append(
            [m, *(f"{tokens_per_step(r):.3f} ({float(r['output_tokens_per_s']):.0f} tok/s)" if r else None
                  for r in speeds.values()), ",".join(s for s, ok in lossless(base_rows, m).items() if ok != "True") or "none"]
        )  # fmt: skip

    code_rows = read_csv(code_run / "eval" / "benchmarks.csv")
    code_requests = read_csv(code_run / "eval" / "requests.csv")
    general_rows = read_csv(ROOT / GENERAL_ON_CODE / "benchmarks.csv")
    general_requests = read_csv(ROOT / GENERAL_ON_CODE / "requests.csv")
    trained_ids = {r["id"] for r in iter_jsonl(run / "prompts" / "prompts.jsonl")}
    code_eval = [r["id"] for r in iter_jsonl(code_run / "prompts" / "eval_prompts.jsonl")]
    seen = trained_ids & set(code_eval)
    same_benchmarks = (code_run / "prompts" / "benchmarks.jsonl").read_text() == (
        run / "prompts" / "benchmarks.jsonl"
    ).read_text()
    table_d = []
    for label, bench, requests, m in (
        *((m, code_rows, code_requests, m) for m in ("no_spec", "ngram", "suffix")),
        ("in-domain draft", code_rows, code_requests, "draft"),
        ("general draft", general_rows, general_requests, "draft"),
    ):
        table_d.append(
            [label, held_out_without(requests, m, seen),
             *(tokens_per_step(figure(bench, m, set=s)) for s in SETS[1:])]
        )  # fmt: skip
    code_size = Rows(code_run, merged_config([BASE_CONFIG, IN_DOMAIN]))
    code_trained = code_size.size(code_size.trained())
    code_stages = stage_seconds(code_run)

    print(f"\nCPU: {cpu} ({os.cpu_count()} cores)")
    print(f"\nGeneral run stages (s): {json.dumps(stages)}")
    print(f"In-domain run stages (s): {json.dumps(code_stages)}")
    print(f"Snakemake walls (s): {json.dumps(ran['walls'])}")
    print(f"\n(a) on-policy against off-policy (tokens per target step at k = {k})")
    print(md_table(cols_a, table_a))
    print("\n(b) the data-scaling curve")
    print(md_table(["draft trained on", "rows", "tokens", "training s", *SETS], table_b))
    print("\n    the fit over every source's 25/50/100%, and where it would reach n-gram")
    print(md_table(REACH_COLUMNS, reach))
    print("\n(c) the run's draft against the baselines (tokens per target step, output tokens/s)")
    print(md_table(["method", *SETS, "not lossless on"], table_c))
    print(
        f"\n(d) in-domain: {code_trained['rows']} code rows ({code_trained['tokens']} tokens) against the general "
        f"draft ({curve[-1]['rows']} rows, {curve[-1]['tokens']} tokens); {len(code_eval)} held-out code prompts, "
        f"{len(seen)} left out (the general run trained on them); the benchmarks are "
        f"{'the same' if same_benchmarks else 'NOT the same'} conversations in both runs"
    )
    print(md_table(["method", "held-out code", *SETS[1:]], table_d))
    result = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "stages": {"general": stages, "in_domain": code_stages},
        "walls": ran["walls"],
        "cost": cost,
        "fits": fits,
        "tables": {
            "a": {"columns": cols_a, "rows": table_a},
            "b": {"columns": ["draft trained on", "rows", "tokens", "training s", *SETS], "rows": table_b},
            "b_fit": {"columns": REACH_COLUMNS, "rows": reach},
            "c": {"columns": ["method", *SETS, "not lossless on"], "rows": table_c},
            "d": {"columns": ["method", "held-out code", *SETS[1:]], "rows": table_d},
        },
        "in_domain": {
            "trained": code_trained,
            "held_out": len(code_eval),
            "left_out": sorted(seen),
            "same_benchmarks": same_benchmarks,
        },
    }
    (ROOT / "bench_data_study.json").write_text(json.dumps(result, indent=1))
    return result


TITLES = {
    "a": "(a) On-policy against off-policy: ShareGPT's first questions answered by the target, against the same kind of rows with ShareGPT's own answers at equal training tokens and at equal wall time (tokens per target step)",
    "b": "(b) The data-scaling curve: drafts trained on parts of the recipe's rows (tokens per target step)",
    "b_fit": "(b) The log-linear fit over every source's 25, 50 and 100%, and the training tokens at which it would reach n-gram (an extrapolation)",
    "c": "(c) The recipe's draft against no speculation, n-gram, suffix decoding and the untrained draft (tokens per target step, output tokens/s)",
    "d": "(d) In-domain: a draft trained on ShareGPT's questions about code alone against the general draft, on held-out code questions and the public benchmarks (tokens per target step)",
}


def record_run(result: dict, commit: str) -> None:
    t = result["tables"]
    figures = {}
    for row in t["c"]["rows"]:
        for s, cell in zip(SETS, row[1:], strict=False):
            figures[f"{row[0]}, {s}"] = cell
    for row in t["a"]["rows"]:
        figures[f"(a) {row[0]}, held out"] = row[9]
    for row in t["d"]["rows"]:
        figures[f"(d) {row[0]}, held-out code"] = row[1]
    path = append_run(
        "smollm2_data_study",
        figures,
        command=command_line(),
        tables=[{"title": TITLES[key], **t[key]} for key in ("a", "b", "b_fit", "c", "d")],
        commit=commit,
        title="SmolLM2 data study",
        what=(
            "SmolLM2-135M-Instruct's draft on config/smollm2.yaml's recipe (the bundled prompts and ShareGPT's "
            "first questions, some answered by the target and more with ShareGPT's own answers), one epoch: "
            "(a) on-policy against off-policy rows at equal tokens and equal wall time, (b) the data-scaling "
            "curve with a log-linear fit, (c) the draft against no speculation, n-gram and suffix decoding on "
            "the held-out split and seeded parts of MT-Bench, GSM8K and AlpacaEval, (d) a draft trained on "
            "ShareGPT's questions about code alone against the general one on held-out code questions."
        ),
    )
    print(f"recorded in {path.relative_to(REPO)}; run `make docs`")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report-only", action="store_true", help="print the tables of the finished runs again")
    ap.add_argument("--record", action="store_true", help="add this run to the record `smollm2_data_study`")
    args = ap.parse_args()
    commit, cpu = start(args.record)
    cfg = merged_config([BASE_CONFIG, STUDY])
    code_cfg = merged_config([BASE_CONFIG, IN_DOMAIN])
    run, code_run = (REPO / cfg["run_dir"]).resolve(), (REPO / code_cfg["run_dir"]).resolve()
    ROOT.mkdir(parents=True, exist_ok=True)
    logs = ROOT / "logs"
    logs.mkdir(exist_ok=True)
    if args.report_only:
        ran = json.loads((ROOT / "ran.json").read_text())
    else:
        ran = run_all(cfg, run, code_cfg, code_run, logs)
    result = report(cfg, run, code_run, ran, cpu)
    if args.record:
        record_run(result, commit)


if __name__ == "__main__":
    main()
