"""The A/B the agentic work exists for, on the Kimi miniature: a draft trained the chat-only way
against one trained on agentic traffic, at the same optimizer-step budget, judged on the same
prompts in both modes and per traffic class.

Two arms, each a Snakemake run of config/kimi-mini.yaml with an overlay of
benchmarks/configs/, in a run folder of its own under results/bench-agentic-ab/ (one build of
the miniature shared by both, in results/bench-agentic-ab/hub):
- `chat_only` (agentic_ab_chat_only.yaml): the chat prompts alone (the `tools` source left out,
  so no tool loop trains) in thinking, the template's default mode, alone (instant stays
  configured with share 0: no training prompt is drawn for it, yet evaluation asks it);
- `agentic` (agentic_ab_agentic.yaml): the config as shipped: chat prompts and tool loops,
  thinking and instant half and half.

Steps:
1. Each arm up to `tokenize` (`snakemake --until tokenize`): the target, its prompts, the
   target's answers and the training rows.
2. The step budget. eaglenest's `train` section sets epochs, not steps (speculators' trainer has
   --max-steps, but the config passes no trainer flag of its own). An epoch's optimizer steps
   are those of speculators' packing sampler (MultipackDistributedBatchSamplerV2, its own
   per-epoch seed) over the lengths of the arm's training split (the first train_data_ratio of
   its tokenized rows); they are counted here with that sampler before training, and read back
   from each arm's train/train_metrics.json after it. The agentic arm keeps the shipped epochs
   unless no chat_only epoch count comes within --step-tolerance of its steps; then it takes the
   first count up to --max-extra-epochs more where one does (where none does, the shipped
   epochs, and the chat_only count closest to them: the gap is printed). Each arm's
   epochs go to Snakemake as a third config file, `results/bench-agentic-ab/<arm>.train.yaml`.
3. The agentic arm to the end (`snakemake --cores all`): its draft, evaluated by the pipeline
   itself beside no speculation, n-gram, suffix decoding and the untrained draft.
4. The chat_only arm to its exported draft (`snakemake ... <run_dir>/draft`).
5. The chat_only draft on the agentic arm's held-out prompts and benchmarks, in the same modes,
   with `eaglenest.evaluation.evaluate.evaluate_stage` (methods ("draft",), as a sweep's variant:
   losslessness against the agentic run's own no-speculation outputs, eval/outputs.jsonl). The
   arms' held-out splits are not the same set: the agentic run holds out 16 chat prompts and 4
   tool loops (the `tools` source's own eval_samples), the chat_only run the same 16 chat
   prompts alone (it has no tools source). So both drafts are judged on the agentic run's
   prompts; the script checks that the chat_only arm trained on none of them.

It prints the CPU, the arms' training data, steps and wall seconds per stage, and one markdown
table: a row per (set, mode, traffic class) of the held-out split and each benchmark, with tokens
per target step of each draft, n-gram and suffix decoding (eval/benchmarks.csv, span all); then
each draft's figures per span (reasoning, answer, tool call) on the held-out split. The figures
go to results/bench-agentic-ab/bench_agentic_ab.json; with --record the run is added to the record
`agentic_ab` (benchmarks/records/), which `make docs` renders.

Usage: .venv/bin/python benchmarks/bench_agentic_ab.py [--keep] [--step-tolerance 0.02]
           [--max-extra-epochs 3] [--report-only] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
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
    seconds,
    snakemake,
    stage_seconds,
    start,
    tokens_per_step,
)

BASE_CONFIG = "config/kimi-mini.yaml"
# The arms, in the order they are reported, and each one's overlay.
ARMS = {
    "chat_only": "benchmarks/configs/agentic_ab_chat_only.yaml",
    "agentic": "benchmarks/configs/agentic_ab_agentic.yaml",
}
# The stages in the order a run goes through them (Snakemake's benchmark files, <run_dir>/benchmarks/).
STAGES = (
    "resolve_target", "prepare_prompts", "regenerate_responses", "tokenize", "draft_config",
    "build_vocab_mapping", "plan_hidden_states", "extract_hidden_states", "train_draft", "export_draft",
    "export_draft_sglang", "prepare_benchmarks", "evaluate_acceptance", "run_summary",
)  # fmt: skip
CROSS_EVAL = "evaluate (draft only, on the agentic run's prompts)"
SPANS = ("reasoning", "answer", "tool_call")


def steps_per_epoch(tokenized_path: Path, hp: dict, epochs: int) -> list[int]:
    """The optimizer steps speculators' trainer takes in each of `epochs` epochs on one rank:
    its packing sampler over the lengths of its training split (the first train_data_ratio of
    the rows, as its ArrowDataset splits them), packed anew each epoch."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    from eaglenest.core.io import iter_jsonl

    lengths = [len(row["input_ids"]) for row in iter_jsonl(tokenized_path)]
    train = lengths[: int(len(lengths) * hp["train_data_ratio"])]
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=hp["total_seq_len"], lengths=train, num_replicas=1, rank=0, seed=hp["seed"]
    )
    counts = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        counts.append(len(sampler))
    return counts


def choose_epochs(agentic: list[int], chat: list[int], shipped: int, tolerance: float, extra: int) -> dict:
    """The arms' epochs: the chat_only count whose steps come closest to the agentic arm's at its
    shipped epochs. Where that misses by more than `tolerance`, the first agentic count up to
    `extra` more whose closest chat_only count is within it; where none is, the shipped epochs."""

    def match(ea: int) -> dict:
        budget = sum(agentic[:ea])
        ec = min(range(1, len(chat) + 1), key=lambda e: abs(sum(chat[:e]) - budget))
        return {"agentic": ea, "chat_only": ec, "gap": abs(sum(chat[:ec]) - budget) / budget}

    for ea in range(shipped, shipped + extra + 1):
        if match(ea)["gap"] <= tolerance:
            return match(ea)
    return match(shipped)


def ids(path: Path) -> list[str]:
    from eaglenest.core.io import iter_jsonl

    return [row["id"] for row in iter_jsonl(path)]


def check_prompts(dirs: dict[str, Path]) -> dict:
    """What each arm trains on and is judged on: its training rows by mode and class, and that
    the chat_only arm trained on no prompt the drafts are judged on, on no tool row and in
    thinking mode alone."""
    from eaglenest.core.io import iter_jsonl, read_json

    a, c = dirs["agentic"] / "prompts", dirs["chat_only"] / "prompts"
    a_train = list(iter_jsonl(a / "prompts.jsonl"))
    c_train = list(iter_jsonl(c / "prompts.jsonl"))
    judged = set(ids(a / "eval_prompts.jsonl"))
    chat_a = {r["id"] for r in a_train if "tools" not in r}
    checks = {
        "judged_prompts": len(judged),
        "judged_tool_prompts": sum("tools" in r for r in iter_jsonl(a / "eval_prompts.jsonl")),
        "chat_only_held_out_within_judged": set(ids(c / "eval_prompts.jsonl")) <= judged,
        "chat_only_trains_on_judged": len({r["id"] for r in c_train} & judged),
        "chat_only_tool_rows": sum("tools" in r for r in c_train),
        "chat_only_modes": sorted({r["mode"] for r in c_train}),
        "chat_only_same_chat_prompts_as_agentic": {r["id"] for r in c_train} == chat_a,
    }
    bad = (
        not checks["chat_only_held_out_within_judged"]
        or checks["chat_only_trains_on_judged"]
        or checks["chat_only_tool_rows"]
        or checks["chat_only_modes"] != ["thinking"]
    )
    if bad:
        raise SystemExit(f"the arms' prompts are not what the A/B needs: {checks}")
    data = {}
    for arm, d in dirs.items():
        stats = read_json(d / "prompts" / "prompts_stats.json")
        meta = read_json(d / "tokenized" / "metadata.json")
        data[arm] = {
            "training_prompts": stats["train"],
            "training_prompts_by_mode": stats["modes"]["train"],
            "training_prompts_with_tools": stats["with_tools"]["train"],
            "tokenized_rows": meta["samples_out"],
            "rows_by_class": meta["records"]["by_class"],
            "supervised_tokens_by_kind": meta["supervised_tokens"]["by_kind"],
        }
    return {"checks": checks, "data": data}


def write_epochs(root: Path, arm: str, epochs: int) -> str:
    path = root / f"{arm}.train.yaml"
    path.write_text(yaml.safe_dump({"train": {"epochs": epochs}}))
    return str(path.relative_to(REPO))


def trained_steps(run_dir: Path) -> dict:
    from eaglenest.core.io import read_json

    m = read_json(run_dir / "train" / "train_metrics.json")
    per_epoch = [row["train_steps"] for row in m["per_epoch"]]
    return {
        "epochs": m["epochs"],
        "train_rows": m["train_rows"],
        "per_epoch": per_epoch,
        "total": sum(per_epoch),
    }


def set_classes(requests: list[dict]) -> dict[str, list[str]]:
    """Each set's traffic classes, from the requests of the run's draft."""
    out: dict[str, set] = {}
    for r in requests:
        out.setdefault(r["set"], set()).add(r["traffic"])
    return {s: sorted(v) for s, v in out.items()}


def acceptance_rows(agentic: list[dict], chat: list[dict], classes: dict, modes: list[str]) -> list[list]:
    """A row per (set, mode, traffic): tokens per target step of each draft, n-gram and suffix
    decoding. A set of one class shows it on its "all" row; a set of several, each beside it."""
    rows = []
    sets = list(dict.fromkeys(r["set"] for r in agentic))
    for name in sets:
        kinds = classes.get(name, [])
        for mode in ("all", *modes):
            traffic = ["all", *kinds] if len(kinds) > 1 else ["all"]
            for t in traffic:
                where = {"set": name, "mode": mode, "traffic": t}
                label = kinds[0] if t == "all" and len(kinds) == 1 else t
                a = figure(agentic, "draft", **where)
                rows.append(
                    [
                        name, mode, label, int(a["requests"]) if a else None,
                        tokens_per_step(figure(chat, "draft", **where)), tokens_per_step(a),
                        tokens_per_step(figure(agentic, "ngram", **where)),
                        tokens_per_step(figure(agentic, "suffix", **where)),
                    ]
                )  # fmt: skip
    return rows


def span_rows(agentic: list[dict], chat: list[dict], modes: list[str]) -> list[list]:
    """Each draft's tokens per target step within each span on the held-out split, and the span's tokens."""
    rows = []
    for mode in ("all", *modes):
        for span in SPANS:
            where = {"set": "held_out", "mode": mode, "span": span}
            c, a = figure(chat, "draft", **where), figure(agentic, "draft", **where)
            if c is None and a is None:
                continue
            rows.append(
                [
                    mode, span, tokens_per_step(c), tokens_per_step(a),
                    int(float(c["span_tokens"])) if c else None, int(float(a["span_tokens"])) if a else None,
                ]
            )  # fmt: skip
    return rows


def run_arms(args, cfgs: dict, dirs: dict, root: Path, logs: Path) -> dict:
    """Steps 1 to 5: the data, the step budget, both drafts, the cross evaluation."""
    files = {arm: [BASE_CONFIG, overlay] for arm, overlay in ARMS.items()}
    walls: dict[str, dict[str, float]] = {arm: {} for arm in ARMS}
    print("\n1. each arm up to tokenize", flush=True)
    for arm in ("agentic", "chat_only"):  # the agentic run builds the shared miniature
        walls[arm]["snakemake --until tokenize"] = snakemake(
            arm, files[arm], ["--until", "tokenize"], logs / f"{arm}.snakemake.log"
        )
    prompts = check_prompts(dirs)

    print("\n2. the step budget", flush=True)
    hp = {arm: cfgs[arm]["train"] for arm in ARMS}
    shipped = hp["agentic"]["epochs"]
    horizon = 3 * (shipped + args.max_extra_epochs)
    predicted = {
        arm: steps_per_epoch(dirs[arm] / "tokenized" / "tokenized_data.jsonl", hp[arm], horizon)
        for arm in ARMS
    }
    epochs = choose_epochs(
        predicted["agentic"], predicted["chat_only"], shipped, args.step_tolerance, args.max_extra_epochs
    )
    for arm in ARMS:
        e = epochs[arm]
        print(
            f"  {arm}: {e} epochs of {predicted[arm][:e]} steps = {sum(predicted[arm][:e])} steps (predicted)"
        )
    if epochs["agentic"] != shipped:
        print(f"  NOTE: the agentic arm trains {epochs['agentic']} epochs, not the shipped {shipped}")
    print(f"  gap {epochs['gap']:.1%}", flush=True)
    epoch_files = {arm: write_epochs(root, arm, epochs[arm]) for arm in ARMS}

    print("\n3. the agentic arm to the end", flush=True)
    walls["agentic"]["snakemake (to the end)"] = snakemake(
        "agentic", [*files["agentic"], epoch_files["agentic"]], [], logs / "agentic.snakemake.log"
    )
    print("\n4. the chat_only arm to its draft", flush=True)
    walls["chat_only"]["snakemake (to the draft)"] = snakemake(
        "chat_only",
        [*files["chat_only"], epoch_files["chat_only"]],
        [str(dirs["chat_only"].relative_to(REPO) / "draft")],
        logs / "chat_only.snakemake.log",
    )
    print("\n5. the chat_only draft on the agentic run's prompts", flush=True)
    walls["chat_only"][CROSS_EVAL] = evaluate_draft_on(
        cfgs["agentic"], dirs["chat_only"], dirs["agentic"], root / "chat_only_eval"
    )
    print(f"    {walls['chat_only'][CROSS_EVAL]:.0f} s", flush=True)
    return {"prompts": prompts, "predicted": predicted, "epochs": epochs, "snakemake_walls": walls}


def report(cfgs: dict, dirs: dict, root: Path, ran: dict, cpu: str) -> dict:
    """Prints the tables; returns everything as one JSON-able dict."""
    agentic = read_csv(dirs["agentic"] / "eval" / "benchmarks.csv")
    chat = read_csv(root / "chat_only_eval" / "benchmarks.csv")
    classes = set_classes(
        [r for r in read_csv(dirs["agentic"] / "eval" / "requests.csv") if r["method"] == "draft"]
    )
    modes = [m["name"] for m in cfgs["agentic"]["modes"]]
    steps = {arm: trained_steps(dirs[arm]) for arm in ARMS}
    for arm in ARMS:
        want = sum(ran["predicted"][arm][: ran["epochs"][arm]])
        if steps[arm]["total"] != want:
            print(f"  NOTE: {arm} trained {steps[arm]['total']} steps, {want} were predicted")
    stages = {arm: stage_seconds(dirs[arm]) for arm in ARMS}
    stages["chat_only"][CROSS_EVAL] = ran["snakemake_walls"]["chat_only"][CROSS_EVAL]

    columns = ["set", "mode", "traffic", "requests", "chat_only draft", "agentic draft", "ngram", "suffix"]
    main = acceptance_rows(agentic, chat, classes, modes)
    span_columns = [
        "mode",
        "span",
        "chat_only draft",
        "agentic draft",
        "chat_only span tokens",
        "agentic span tokens",
    ]
    spans = span_rows(agentic, chat, modes)
    arm_rows = [
        ["training prompts (by mode)", *(f"{d['training_prompts']} {d['training_prompts_by_mode']}" for d in ran["prompts"]["data"].values())],
        ["training prompts with tools", *(d["training_prompts_with_tools"] for d in ran["prompts"]["data"].values())],
        ["tokenized rows (by class)", *(f"{d['tokenized_rows']} {d['rows_by_class']}" for d in ran["prompts"]["data"].values())],
        ["supervised tokens by kind", *(str(d["supervised_tokens_by_kind"]) for d in ran["prompts"]["data"].values())],
        ["rows trained on (train split)", *(steps[a]["train_rows"] for a in ARMS)],
        ["epochs", *(steps[a]["epochs"] for a in ARMS)],
        ["optimizer steps per epoch", *(" ".join(map(str, steps[a]["per_epoch"])) for a in ARMS)],
        ["optimizer steps", *(steps[a]["total"] for a in ARMS)],
        *([f"{s} s", *(seconds(stages[a].get(s)) for a in ARMS)] for s in (*STAGES, CROSS_EVAL) if any(s in stages[a] for a in ARMS)),
        *([f"{w} (wall s)", *(seconds(ran["snakemake_walls"][a].get(w)) for a in ARMS)] for w in dict.fromkeys(k for a in ARMS for k in ran["snakemake_walls"][a]) if w != CROSS_EVAL),
    ]  # fmt: skip
    print(f"\nCPU: {cpu} ({os.cpu_count()} cores)")
    print(f"prompt checks: {ran['prompts']['checks']}")
    print("\nThe arms (seconds: each stage's jobs summed, Snakemake's benchmark files)\n")
    print(md_table(["", *ARMS], arm_rows))
    print(
        f"\nTokens per target step (k {cfgs['agentic']['evaluate']['num_speculative_tokens']}, greedy, "
        f"max_tokens {cfgs['agentic']['evaluate']['max_tokens']}), both drafts on the agentic run's "
        "held-out prompts and benchmarks; ngram and suffix from the agentic run\n"
    )
    print(md_table(columns, main))
    print("\nEach draft per span on the held-out split (tokens per target step within the span)\n")
    print(md_table(span_columns, spans))
    drafts_lossless = {"chat_only": lossless(chat, "draft"), "agentic": lossless(agentic, "draft")}
    print(f"\nlossless (greedy = no speculation), per set: {drafts_lossless}")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "configs": {arm: [BASE_CONFIG, overlay, str((root / f"{arm}.train.yaml").relative_to(REPO))] for arm, overlay in ARMS.items()},
        "run_dirs": {arm: str(d.relative_to(REPO)) for arm, d in dirs.items()},
        "chat_only_eval": str((root / "chat_only_eval").relative_to(REPO)),
        **ran,
        "trained": steps,
        "stage_seconds": stages,
        "tables": {
            "arms": {"columns": ["", *ARMS], "rows": arm_rows},
            "tokens_per_target_step": {"columns": columns, "rows": main},
            "held_out_per_span": {"columns": span_columns, "rows": spans},
        },
        "lossless": drafts_lossless,
    }  # fmt: skip


def record_figures(result: dict) -> dict:
    """The record's headline figures: each draft on the held-out split per mode and class, on
    BFCL, and the arms' steps."""
    figures = {}
    for s, mode, traffic, _, chat, agentic, *_ in result["tables"]["tokens_per_target_step"]["rows"]:
        if s in ("held_out", "bfcl") and (mode != "all" or traffic != "all"):
            figures[f"chat_only draft, {s} {mode} {traffic}: tokens per target step"] = chat
            figures[f"agentic draft, {s} {mode} {traffic}: tokens per target step"] = agentic
    for arm in ARMS:
        figures[f"{arm}: optimizer steps"] = result["trained"][arm]["total"]
    return figures


def record_run(result: dict, commit: str) -> None:
    tables = [{"title": t.replace("_", " "), **v} for t, v in result["tables"].items()]
    path = append_run(
        "agentic_ab",
        record_figures(result),
        command=command_line(),
        tables=tables,
        commit=commit,
        title="Agentic A/B",
        what=(
            "On the Kimi miniature, a draft trained on chat prompts in thinking mode alone (chat_only) against "
            "one trained on the shipped config's chat prompts and tool loops in thinking and instant modes "
            "(agentic), at the closest optimizer-step budget whole epochs give, both judged on the agentic run's "
            "held-out prompts and benchmarks in both modes: tokens per target step per set, mode and traffic "
            "class beside n-gram and suffix decoding, and per span on the held-out split."
        ),
    )
    print(f"recorded in {path.relative_to(REPO)}; run `make docs`")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--keep", action="store_true", help="keep the arms' run folders (resume), else start them afresh"
    )
    ap.add_argument("--step-tolerance", type=float, default=0.02, help="the arms' step gap accepted (share)")
    ap.add_argument("--max-extra-epochs", type=int, default=3, help="epochs the agentic arm may add to match")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="print the tables of the finished arms again, running nothing",
    )
    ap.add_argument("--record", action="store_true", help="add this run to the record `agentic_ab`")
    args = ap.parse_args()
    commit, cpu = start(args.record)

    cfgs = {arm: merged_config([BASE_CONFIG, overlay]) for arm, overlay in ARMS.items()}
    dirs = {arm: (REPO / cfg["run_dir"]).resolve() for arm, cfg in cfgs.items()}
    root = dirs["agentic"].parent
    if dirs["chat_only"].parent != root:
        raise SystemExit(f"the arms' run folders must share a parent: {dirs}")
    same = ("evaluate", "vllm", "regenerate", "tokenize", "target")
    differ = [k for k in same if cfgs["agentic"][k] != cfgs["chat_only"][k]]
    names = [[(m["name"], m.get("chat_template_kwargs")) for m in cfgs[a]["modes"]] for a in ARMS]
    if differ or names[0] != names[1]:
        raise SystemExit(f"the arms' configs differ beyond prompts and shares: {differ or 'modes'}")
    if not (args.keep or args.report_only):
        for d in dirs.values():
            shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(root / "chat_only_eval", ignore_errors=True)
        shutil.rmtree(root / "logs", ignore_errors=True)
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"arms in {root.relative_to(REPO)}: {', '.join(ARMS)}; Snakemake's output in {logs.relative_to(REPO)}"
    )

    saved = root / "bench_agentic_ab.runs.json"
    if args.report_only:
        ran = json.loads(saved.read_text())
        wall = ran.pop("wall_s")
    else:
        t0 = time.monotonic()
        ran = run_arms(args, cfgs, dirs, root, logs)
        wall = round(time.monotonic() - t0, 1)
        saved.write_text(json.dumps({**ran, "wall_s": wall}, indent=2, default=str) + "\n")
    result = report(cfgs, dirs, root, ran, cpu)
    result["wall_s"] = wall
    print(f"\nbenchmark wall: {wall:.0f} s")
    out = root / "bench_agentic_ab.json"
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"written: {out.relative_to(REPO)}")
    if args.record:
        record_run(result, commit)


if __name__ == "__main__":
    main()
