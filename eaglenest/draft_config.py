"""The draft's decoder config, derived from the target's.

EAGLE-3's draft layer works in the target's hidden space, so its shape comes from the target;
only the number of layers and the context length are choices. The file is a plain `LlamaConfig`
(what speculators' `--draft-config` reads) with an `eaglenest` block recording the contract the
later stages check: aux layer ids, vocabulary sizes and the target's layer count.
"""

from __future__ import annotations

from pathlib import Path

from eaglenest.errors import EaglenestError
from eaglenest.io import read_json, write_json


def target_text_config(target_dir) -> dict:
    """The target's language-model config (the `text_config` of a multimodal one)."""
    path = Path(target_dir) / "config.json"
    cfg = read_json(path)
    cfg = cfg.get("text_config", cfg)
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        if key not in cfg:
            raise EaglenestError(f"target config has no '{key}'", path)
    return cfg


def build_draft_config(target_dir, out_path, *, aux_layer_ids: list[int], draft_vocab_size: int,
                       draft_layers: int = 1, max_position_embeddings: int | None = None) -> dict:
    from eaglenest.hidden_states import resolve_aux_layer_ids

    tcfg = target_text_config(target_dir)
    n = tcfg["num_hidden_layers"]
    aux = resolve_aux_layer_ids(aux_layer_ids, n, Path(target_dir) / "config.json")
    if not 1 <= draft_vocab_size <= tcfg["vocab_size"]:
        raise EaglenestError(f"draft_vocab_size {draft_vocab_size} must be in 1.."
                             f"{tcfg['vocab_size']} (the target's vocabulary)",
                             Path(target_dir) / "config.json")
    heads = tcfg.get("num_attention_heads", max(1, tcfg["hidden_size"] // 128))
    cfg = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": tcfg["hidden_size"],
        "intermediate_size": tcfg.get("intermediate_size", 4 * tcfg["hidden_size"]),
        "num_hidden_layers": draft_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": tcfg.get("num_key_value_heads", heads),
        "head_dim": tcfg.get("head_dim", tcfg["hidden_size"] // heads),
        "hidden_act": "silu",
        "rms_norm_eps": tcfg.get("rms_norm_eps", 1e-6),
        "vocab_size": tcfg["vocab_size"],
        # The draft must cover the target's serving context.
        "max_position_embeddings": max(max_position_embeddings or 0,
                                       tcfg.get("max_position_embeddings", 2048)),
        "rope_theta": tcfg.get("rope_theta", (tcfg.get("rope_parameters") or {}).get(
            "rope_theta", 10000.0)),
        "tie_word_embeddings": False,
        "eaglenest": {
            "aux_layer_ids": aux,
            "target_num_layers": n,
            "target_vocab_size": tcfg["vocab_size"],
            "draft_vocab_size": draft_vocab_size,
            "hidden_size": tcfg["hidden_size"],
        },
    }
    write_json(out_path, cfg)
    return cfg
