"""The run's key parameters and headline figures in one table, for the report."""

from __future__ import annotations

from eaglenest.io import atomic_path, read_json


def summarize_run(
    *, target, lr: float, acceptance_path, metrics_path, coverage_path, plan_path, metadata_path, out_csv
) -> list[tuple[str, object]]:
    import pandas as pd

    acc, metrics = read_json(acceptance_path), read_json(metrics_path)
    cov, plan, meta = read_json(coverage_path), read_json(plan_path), read_json(metadata_path)
    rows = [
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
        ("aux layer ids", plan["aux_layer_ids"]),
        ("hidden states", f"{plan['bytes'] / 1e6:.1f} MB {plan['dtype']} in {plan['num_shards']} shards"),
        ("epochs", metrics["epochs"]),
        ("learning rate", lr),
        ("num_speculative_tokens", acc["num_speculative_tokens"]),
        ("held-out prompts", acc["prompts"]),
    ]
    for method in ("no_spec", "ngram", "untrained_draft", "draft"):
        r = acc[method]
        rows.append(
            (
                f"{method}: mean acceptance length / tokens/s / lossless",
                f"{r['mean_acceptance_length']:.3f} / {r['output_tokens_per_s']} / {r['lossless']}",
            )
        )
    with atomic_path(out_csv) as tmp:
        pd.DataFrame(rows, columns=["parameter", "value"]).to_csv(tmp, index=False)
    return rows
