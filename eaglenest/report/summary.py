"""The run's key parameters and headline figures in one table, and each stage's time and memory
as Snakemake's `benchmark:` recorded them, for the report."""

from __future__ import annotations

import os
import time
from pathlib import Path

from eaglenest.core.io import atomic_path, iter_jsonl, read_json
from eaglenest.data.regenerate import row_generations
from eaglenest.evaluation.methods import BASELINES, DRAFTS
from eaglenest.pipeline.job_events import EVENTS_ENV, gpu_busy_seconds, read_events


def summary_stage(*, benchmark_files, responses_path, out_summary, out_stage_times, **run) -> dict:
    """The run_summary rule: the headline table (`run` holds summarize_run's inputs), the
    stage times, and each GPU stage's tokens/s."""
    tokens = gpu_stage_tokens(
        responses_path=responses_path,
        plan=read_json(run["plan_path"]),
        metrics=read_json(run["metrics_path"]),
        acceptance=read_json(run["acceptance_path"]),
        metadata=read_json(run["metadata_path"]),
    )
    times = summarize_stage_times(benchmark_files=benchmark_files, out_csv=out_stage_times, tokens=tokens)
    rows = summarize_run(**run, gpu_busy=gpu_busy_share(), out_csv=out_summary)
    return {"summary": dict(rows), "stage_times": times.reset_index().to_dict("records")}


def gpu_stage_tokens(*, responses_path, plan, metrics, acceptance, metadata) -> dict[str, tuple[int, str]]:
    """The tokens each GPU stage's jobs processed, and what they are: regeneration's output
    tokens, extraction's prefill tokens (offline), training's tokens times the epochs its job
    ran, evaluation's output tokens over its methods."""

    generated = sum(
        len(g["completion_token_ids"] or ()) for r in iter_jsonl(responses_path) for g in row_generations(r)
    )
    resumed = metrics.get("resumed_from_epoch")
    epochs_run = metrics["epochs"] - (resumed + 1 if resumed is not None else 0)
    methods = [m for m in ("no_spec", "ngram", "untrained_draft", "draft") if m in acceptance]
    tokens = {
        "regenerate_responses": (generated, "output tokens"),
        "train_draft": (metadata["tokens_total"] * epochs_run, f"tokens x {epochs_run} epochs"),
        "evaluate_acceptance": (
            sum(acceptance[m]["output_tokens"] for m in methods)
            + sum(b[m]["output_tokens"] for b in acceptance.get("benchmarks", {}).values() for m in methods),
            f"output tokens of {len(methods)} methods",
        ),
    }
    if plan.get("mode", "offline") == "offline":
        tokens["extract_hidden_states"] = (plan["tokens"], "prefill tokens")
    return tokens


def gpu_busy_share() -> float | None:
    """Share of this Snakemake invocation, so far, with a GPU job running: from its job events
    (eaglenest.pipeline.job_events), which local jobs find through EVENTS_ENV; None elsewhere."""

    path = os.environ.get(EVENTS_ENV)
    if not path or not Path(path).exists():
        return None
    inv, now = read_events(path), time.time()
    return gpu_busy_seconds(inv, now) / (now - inv.start) if now > inv.start else None


def _data_rows(target, cov: dict, meta: dict) -> list[tuple[str, object]]:
    """The table's first rows: the target, the draft vocabulary and the training data."""
    return [
        ("target", target.name + (f" @ {target.commit[:12]}" if target.commit else "")),
        ("target vocabulary", cov["target_vocab_size"]),
        ("draft vocabulary", cov["draft_vocab_size"]),
        ("draft vocabulary coverage", round(cov["coverage"], 4)),
        ("training samples", meta["samples_out"]),
        ("tokens (loss-masked)", f"{meta['tokens_total']} ({meta['tokens_loss_masked']})"),
        (
            "assistant turns trained",
            f"{meta['assistant_turns']['masked']} of "
            f"{meta['assistant_turns']['total']} ({meta['multi_turn']})",
        ),
        (
            "reasoning in the training text",
            f"{meta['reasoning']['rendered']} of "
            f"{meta['reasoning']['assistant_turns_with_reasoning']} turns "
            f"with reasoning",
        ),
    ]


def _method_rows(acc: dict) -> list[tuple[str, object]]:
    """Each method's acceptance, tokens/s and losslessness: on the held-out prompts, then on
    each benchmark."""
    methods = [m for m in ("no_spec", *BASELINES, *DRAFTS) if m in acc]
    rows = []
    sets = [("held-out", acc["prompts"], "prompts", {m: acc[m] for m in methods})]
    sets += [(name, b["conversations"], "conversations", b) for name, b in acc.get("benchmarks", {}).items()]
    for name, count, what, figures in sets:
        for method in methods:
            label = f"{method}: " if name == "held-out" else f"{name} ({count} {what}), {method}: "
            rows.append((label + ACCEPTANCE_COLUMNS, _acceptance_cells(figures[method])))
            # Each mode apart, where the run has several (acceptance.json's per_mode).
            for mode, by_mode in figures[method].get("per_mode", {}).items():
                rows.append((f"{name} [{mode}], {method}: {ACCEPTANCE_COLUMNS}", _acceptance_cells(by_mode)))
    return rows


# Both definitions of acceptance (acceptance.json's "definitions"), then speed and losslessness.
ACCEPTANCE_COLUMNS = "tokens per target step / per drafting step (vLLM's) / tokens/s / lossless"


def _acceptance_cells(r: dict) -> str:
    return (
        f"{r['mean_acceptance_length']:.3f} / {r['mean_acceptance_length_per_draft']:.3f} / "
        f"{r['output_tokens_per_s']} / {r['lossless']}"
    )


def summarize_run(
    *,
    target,
    lr: float,
    acceptance_path,
    metrics_path,
    coverage_path,
    plan_path,
    metadata_path,
    out_csv,
    gpu_busy: float | None = None,
    sglang_export_path=None,
) -> list[tuple[str, object]]:
    """`sglang_export_path`: the SGLang export's record (eaglenest_export.json), when the run
    exports to SGLang too."""
    import pandas as pd

    acc, metrics = read_json(acceptance_path), read_json(metrics_path)
    cov, plan, meta = read_json(coverage_path), read_json(plan_path), read_json(metadata_path)
    rows = [
        *_data_rows(target, cov, meta),
        ("aux layer ids", plan["aux_layer_ids"]),
        ("hidden states", hidden_states_line(plan)),
        ("epochs", metrics["epochs"]),
        ("learning rate", lr),
        ("num_speculative_tokens", acc["num_speculative_tokens"]),
        ("held-out prompts", acc["prompts"]),
        ("exported for", exports_line(sglang_export_path)),
    ]
    rows += _method_rows(acc)
    rows.append(
        (
            "GPU-busy share of this invocation",
            f"{gpu_busy:.1%}" if gpu_busy is not None else "n/a (jobs ran outside Snakemake's process)",
        )
    )
    with atomic_path(out_csv) as tmp:
        pd.DataFrame(rows, columns=["parameter", "value"]).to_csv(tmp, index=False)
    return rows


def exports_line(sglang_export_path) -> str:
    """The engines the draft was exported for, with the checks each export passed."""
    line = "vllm (draft/, served by the evaluation above)"
    if sglang_export_path:
        record = read_json(sglang_export_path)
        checks = ", ".join(
            f"{name} {'passed' if check['ok'] else 'not run' if check['ok'] is None else 'FAILED'}"
            for name, check in record["checks"].items()
        )
        line += f"; sglang {record['sglang_version']} (draft_sglang/: {checks})"
    return line


def hidden_states_line(plan: dict) -> str:
    """What the hidden states were and where they lived, in the plan's mode."""
    size = f"{plan['bytes'] / 1e6:.1f} MB {plan['dtype']}"
    where = {
        "offline": f"stored in {plan['num_shards']} shards",
        "online": "extracted while training, none stored",
        "hybrid": "extracted in the first epoch and kept",
    }
    return f"{size}, {plan['mode']}: {where[plan['mode']]}"


def read_benchmark(path) -> dict:
    """One job's record from a Snakemake benchmark file (TSV, one row per repeat: the last is
    kept). Memory columns are MB, `NA` when the job ended before the first sample."""
    import pandas as pd

    row = pd.read_csv(path, sep="\t", na_values=["NA", "-"]).iloc[-1]
    return {"s": float(row["s"]), "max_rss_mb": row["max_rss"], "cpu_time_s": row["cpu_time"]}


def summarize_stage_times(*, benchmark_files, out_csv, tokens: dict | None = None):
    """Per stage, in the order given: jobs, wall seconds (all jobs, and the longest), CPU
    seconds and peak resident memory; for the stages in `tokens` (stage: (count, what they
    are)), the tokens and tokens per wall second. Below the files' common folder, a stage is a
    file's name, or its folder for rules with one file per job (extract_hidden_states/shard_0.tsv)."""
    import pandas as pd

    root = os.path.commonpath([str(Path(f).parent) for f in benchmark_files])
    rows = []
    for f in benchmark_files:
        rel = Path(f).relative_to(root)
        stage = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        rows.append({"stage": stage, **read_benchmark(f)})
    jobs = pd.DataFrame(rows)
    table = jobs.groupby("stage", sort=False).agg(
        jobs=("s", "size"),
        wall_s=("s", "sum"),
        longest_job_s=("s", "max"),
        cpu_s=("cpu_time_s", "sum"),
        peak_rss_mb=("max_rss_mb", "max"),
    )
    table = table.round({"wall_s": 1, "longest_job_s": 1, "cpu_s": 1, "peak_rss_mb": 0})
    tokens = tokens or {}
    table["tokens"] = [tokens[s][0] if s in tokens else None for s in table.index]
    table["tokens_are"] = [tokens[s][1] if s in tokens else "" for s in table.index]
    table["tokens_per_s"] = (table["tokens"] / table["wall_s"]).round(1)
    with atomic_path(out_csv) as tmp:
        table.reset_index().to_csv(tmp, index=False)
    return table
