"""The model card (README.md) each export folder carries, as the Hugging Face hub reads one: YAML
metadata (base model, library, tags), then the target, the data, the training settings, the
library versions it was trained with, the command that serves the draft, and the acceptance
measured so far.

Export runs before evaluation, so the acceptance here is the trainer's own: each draft
position's accuracy on the held-out validation rows at the last epoch. The served figures
(tokens per target step, tokens/s, losslessness) come after, in the run's eval/acceptance.json
and run_summary.csv; the card says so rather than leaving the reader to guess.
"""

from __future__ import annotations

import json

from eaglenest.core.io import read_json
from eaglenest.draft.algorithms import (
    ALGORITHM_OF_TYPE,
    DISPLAY_NAMES,
    aux_layer_ids_of,
    position_accuracies,
    vllm_speculative_config,
)

ENGINE_LIBRARY = {"vllm": "vllm", "sglang": "sglang"}
LAYER_NAMES = {"llama": "Llama", "qwen3": "Qwen3"}  # the draft layer's model_type, as its family is written


def serve_command(engine: str, target: str, folder: str, k: int, algorithm: str = "eagle3") -> str:
    if engine == "vllm":
        spec = json.dumps(vllm_speculative_config(algorithm, folder, k))
        return f"vllm serve {target} --speculative-config '{spec}'"
    return (
        f"python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {folder} --speculative-num-steps {k} "
        f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"
    )


def validation_accuracy(metrics: dict, algorithm: str) -> list[tuple[int, float]]:
    """(draft position, accuracy) at the last epoch that validated, from train_metrics.json."""
    for epoch in reversed(metrics.get("per_epoch") or []):
        found = position_accuracies(epoch.get("val") or {}, algorithm)
        if found:
            return list(found.items())
    return []


def software_section(metrics: dict) -> list[str]:
    """The card's lines for the library versions the draft was trained with (train_metrics.json's
    "provenance"); none for metrics written before it was recorded."""
    versions = (metrics.get("provenance") or {}).get("versions") or {}
    if not versions:
        return []
    return ["## Software", "", *(f"- {name} {v}" for name, v in versions.items() if v), ""]


def _data_section(meta: dict, metrics: dict) -> list[str]:
    """The card's lines for the training data: tokenize's counts and the trainer's rows."""
    return [
        "## Data",
        "",
        f"- {meta['samples_out']:,} conversations, {meta['tokens_total']:,} tokens, "
        f"{meta['tokens_loss_masked']:,} of them trained on (the assistant's)",
        f"- training rows {metrics.get('train_rows')}, validation rows {metrics.get('val_rows')}",
        "",
    ]


def _training_section(hp: dict, draft_cfg: dict) -> list[str]:
    """The card's lines for the train settings the draft was trained with."""
    return [
        "## Training",
        "",
        *(
            f"- {key}: {hp[key]}"
            for key in ("epochs", "lr", "optimizer", "ttt_steps", "total_seq_len")
            if key in hp
        ),
        f"- norm_before_residual: {bool(draft_cfg.get('norm_before_residual', False))}",
        "",
    ]


def _acceptance_section(accuracy: list[tuple[int, float]]) -> list[str]:
    """The card's lines for the acceptance: the trainer's per-position accuracy, and where the
    served figures will be."""
    lines = ["## Acceptance", ""]
    if accuracy:
        lines.append("The trainer's validation accuracy per draft position at its last epoch:")
        lines.append("")
        lines += [f"- position {p}: {value:.3f}" for p, value in accuracy]
    else:
        lines.append("The trainer recorded no validation accuracy.")
    lines += [
        "",
        "The served acceptance (tokens per target step, output tokens/s against no speculation, "
        "losslessness) is measured after this export: the run's `eval/acceptance.json` and "
        "`run_summary.csv`.",
        "",
    ]
    return lines


def model_card(
    *, engine: str, target, draft_cfg: dict, metrics_path, metadata_path, coverage_path, hp: dict, k: int
) -> str:
    """`target`: the resolved target (eaglenest.target.resolve.Target); `draft_cfg`: the vLLM
    export's config.json (speculators' format: both exports come from it); `hp`: the train settings it was trained with; `k`: the draft tokens
    per target step the run evaluates."""
    metrics, meta, cov = read_json(metrics_path), read_json(metadata_path), read_json(coverage_path)
    base = target.hub_id or target.name
    layer = draft_cfg["transformer_layer_config"]
    aux = aux_layer_ids_of(draft_cfg)
    algorithm = ALGORITHM_OF_TYPE[draft_cfg["speculators_model_type"]]  # the export's own config
    accuracy = validation_accuracy(metrics, algorithm)
    name = DISPLAY_NAMES[algorithm]
    lines = [
        "---",
        f"base_model: {base}",
        f"library_name: {ENGINE_LIBRARY[engine]}",
        f"tags: [speculative-decoding, {draft_cfg['speculators_model_type']}, eaglenest]",
        "---",
        "",
        f"# {name} draft for {base}",
        "",
        f"A draft head for speculative decoding with {engine}, trained by eaglenest with speculators' "
        f"{name} trainer on the target's own regenerated answers.",
        "",
        "## Serve",
        "",
        "```bash",
        serve_command(engine, base, "<this folder>", k, algorithm),
        "```",
        "",
        "## Target and draft",
        "",
        f"- target: {base}" + (f" @ {target.commit}" if target.commit else ""),
        f"- draft: {layer['num_hidden_layers']} {LAYER_NAMES.get(layer.get('model_type'), 'Llama')} layer(s), "
        f"hidden {layer['hidden_size']}, "
        f"reading the target's hidden states {aux} (HF hidden_states indices)",
        f"- draft vocabulary: {cov['draft_vocab_size']:,} of the target's {cov['target_vocab_size']:,} tokens, "
        f"covering {cov['coverage']:.1%} of the training tokens",
        "",
        *_data_section(meta, metrics),
        *_training_section(hp, draft_cfg),
        *software_section(metrics),
        *_acceptance_section(accuracy),
    ]
    return "\n".join(lines)


def model_card_inputs(sm) -> dict:
    """What an export rule hands model_card, from its Snakemake object (inputs metrics,
    metadata, coverage; params hp, k): the export scripts' one shape for it."""
    return {
        "metrics_path": sm.input.metrics,
        "metadata_path": sm.input.metadata,
        "coverage_path": sm.input.coverage,
        "hp": dict(sm.params.hp),
        "k": sm.params.k,
    }
