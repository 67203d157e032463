"""The draft's decoder config, derived from the target's.

EAGLE-3's draft layer works in the target's hidden space, so its shape comes from the target;
only the number of layers and the context length are choices. The file is a plain `LlamaConfig`
(what speculators' `--draft-config` reads; a `Qwen3Config` for DFlash, as speculators documents
it) with an `eaglenest` block recording the contract the later stages check: aux layer ids,
vocabulary sizes and the target's layer count.
"""

from __future__ import annotations

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import write_json
from eaglenest.draft.algorithms import draft_algorithm, is_parallel, trains_embeddings
from eaglenest.draft.aux_layers import resolve_aux_layer_ids
from eaglenest.draft.mask_token import resolve_mask_token_id
from eaglenest.draft.sglang import sglang_layer_ids
from eaglenest.target.resolve import load_tokenizer, read_config, read_shape, text_config


def draft_parameter_count(cfg: dict) -> int:
    """Parameters of speculators' draft for a draft config (draft_config.json). EAGLE-3: the
    target-vocabulary embedding, the fc layer that folds the three aux layers into one, the
    decoder layers (the first reads embedding and hidden state side by side, 2 x hidden), the
    norm over the aux layers before fc, the final norm and the draft-vocabulary head; a P-EAGLE
    draft has, in place of that norm, the learned state its masked slots read in place of the
    target's three layers. A DFlash draft keeps no embedding (it
    reads the target's), its fc output is normed and its layers are all one hidden wide, with
    per-head query and key norms."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * head, cfg["num_key_value_heads"] * head
    vocab, draft_vocab = cfg["eaglenest"]["target_vocab_size"], cfg["eaglenest"]["draft_vocab_size"]
    algorithm = draft_algorithm(cfg)
    total = 3 * h * h + h + draft_vocab * h
    if algorithm == "dflash":
        return total + h + layers * (h * (q + 2 * kv) + q * h + 3 * h * inter + 2 * h + 2 * head)
    total += vocab * h
    # Both read the three aux layers through 3 x hidden more: P-EAGLE's learned masked-slot
    # state, and EAGLE-3's norm over the aux layers before fc (speculators 0.9.0 trains with
    # norm_before_fc on by default; eaglenest never turns it off).
    if trains_embeddings(algorithm) or algorithm == "eagle3":
        total += 3 * h
    for layer in range(layers):
        width = 2 * h if layer == 0 else h
        total += width * (q + 2 * kv) + q * h + 3 * h * inter + width + h
    return total


def draft_rope_parameters(tcfg: dict, source) -> tuple[dict, str | None]:
    """The target's RoPE as the draft's one rope, in transformers 5's `rope_parameters` (from
    the legacy `rope_scaling` + `rope_theta` where the target's config.json has those), and
    what was derived. Like speculators' own draft builder, the legacy `type` alias and a
    partial rotary factor are dropped (the draft's layer rotates its whole head). Rope layouts a
    single Llama rope cannot carry are refused."""
    params = tcfg.get("rope_parameters")
    derived = None
    if params is None:
        legacy = dict(tcfg.get("rope_scaling") or {})
        kind = legacy.pop("rope_type", legacy.pop("type", "default"))
        params = {"rope_type": kind, "rope_theta": tcfg.get("rope_theta", 10000.0), **legacy}
        derived = "rope_scaling and rope_theta (the legacy keys) as rope_parameters"
        if "rope_theta" not in tcfg:
            derived += "; rope_theta 10000 (transformers' default: the target names none)"
    params = dict(params)
    if "rope_theta" not in params:
        raise EaglenestError(
            f"the target's rope_parameters differ per layer type ({', '.join(sorted(params))}): "
            "the draft's single rope cannot carry them",
            source,
        )
    if "mrope_section" in params:
        raise EaglenestError(
            "the target uses multimodal rope (mrope_section): the draft's Llama layer rotates plain positions",
            source,
        )
    params.pop("type", None)
    if params.pop("partial_rotary_factor", None) is not None:
        derived = (
            derived + "; " if derived else ""
        ) + "partial_rotary_factor dropped (the draft rotates its whole head)"
    params.setdefault("rope_type", "default")
    return params, derived


def check_sglang_target(target_dir, aux_layer_ids) -> list[int]:
    """A run that exports to SGLang, refused before any stage when SGLang's target could not hand
    the draft the layers it trains on (eaglenest.draft.sglang); returns SGLang's ids.
    `aux_layer_ids`: the config's (None: the default three)."""
    shape = read_shape(target_dir)
    _, config_path = read_config(target_dir)
    aux = resolve_aux_layer_ids(aux_layer_ids, shape.num_layers, config_path)
    return sglang_layer_ids(aux, next(iter(shape.architectures), None), config_path)


def _check_mappable(tcfg: dict, vocab: int, draft_vocab_size: int, config_path) -> None:
    """Refuse a draft vocabulary outside the target's, or a text config the draft cannot copy."""
    if not 1 <= draft_vocab_size <= vocab:
        raise EaglenestError(
            f"draft_vocab_size {draft_vocab_size} must be in 1..{vocab} (the target's vocabulary)",
            config_path,
        )
    missing = [k for k in ("num_attention_heads", "intermediate_size", "rms_norm_eps") if k not in tcfg]
    if missing:
        raise EaglenestError(
            f"the target's text config has no {', '.join(missing)}: the draft's layer cannot be "
            "shaped like it (a target whose shape cannot be mapped is refused, not approximated)",
            config_path,
        )


def _derived_keys(tcfg: dict, config_path) -> tuple[dict, dict]:
    """The keys the draft derives rather than copies (with why), and the draft's rope parameters."""
    # What the draft takes other than by copying the target's own key, and why.
    derived = {}
    if "head_dim" not in tcfg:
        derived["head_dim"] = "hidden_size / num_attention_heads: the target has no head_dim (MLA)"
    if "num_key_value_heads" not in tcfg:
        derived["num_key_value_heads"] = "num_attention_heads: the target has no num_key_value_heads"
    if "max_position_embeddings" not in tcfg:
        derived["max_position_embeddings"] = "vllm.max_model_len: the target has no max_position_embeddings"
    rope, rope_derived = draft_rope_parameters(tcfg, config_path)
    if rope_derived:
        derived["rope_parameters"] = rope_derived
    return derived, rope


def _decoder_config(
    tcfg: dict, hidden: int, vocab: int, draft_layers: int, max_position_embeddings: int | None, rope: dict
) -> dict:
    """The draft's Llama decoder keys, shaped like the target's layers."""
    heads = tcfg["num_attention_heads"]
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": tcfg["intermediate_size"],
        "num_hidden_layers": draft_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": tcfg.get("num_key_value_heads", heads),
        # MLA targets (DeepSeek-V3, Kimi) have no head_dim: the draft is a plain Llama layer.
        "head_dim": tcfg.get("head_dim", hidden // heads),
        "hidden_act": "silu",
        "rms_norm_eps": tcfg["rms_norm_eps"],
        "vocab_size": vocab,
        # The draft must cover the target's serving context.
        "max_position_embeddings": max(max_position_embeddings or 0, tcfg.get("max_position_embeddings", 0)),
        # The target's positions, scaling included (Kimi's YaRN): speculators' trainer and
        # vLLM's draft both read transformers 5's rope_parameters.
        "rope_parameters": rope,
        "tie_word_embeddings": False,
    }


def _apply_algorithm(cfg: dict, algorithm: str, draft_layers: int) -> None:
    """Record a drafter other than EAGLE-3 in `cfg`, and make a DFlash draft a Qwen3 decoder."""
    if algorithm != "eagle3":  # an EAGLE-3 draft's file stays what it was: no retraining
        cfg["eaglenest"]["algorithm"] = algorithm
    if algorithm == "dflash":
        # speculators reads a DFlash --draft-config as a Qwen3 decoder. Every layer full
        # attention: vLLM's V1 runner (the CPU build's) cannot serve mixed sliding and full
        # layers, and the block is trained and served non-causal (algorithms.trainer_flags).
        cfg.update(
            model_type="qwen3",
            architectures=["Qwen3ForCausalLM"],
            attention_bias=False,
            use_sliding_window=False,
            layer_types=["full_attention"] * draft_layers,
        )


def _mask_token(
    target_dir, mask_token_id, token_freq, vocab: int, draft_vocab_size: int, trust_remote_code: bool
) -> dict:
    """A parallel drafter's mask token, from the config's id, the tokenizer and the trained tokens' counts."""
    # Imported here: data.vocab loads torch, and rules/common.smk imports this module to plan.
    from eaglenest.data.vocab import load_token_counts

    return resolve_mask_token_id(
        mask_token_id,
        load_tokenizer(target_dir, trust_remote_code),
        load_token_counts(token_freq, vocab),
        draft_vocab_size,
        source=token_freq,
    )


def draft_config_stage(
    target_dir,
    out_path,
    *,
    aux_layer_ids: list[int],
    draft_vocab_size: int,
    draft_layers: int = 1,
    max_position_embeddings: int | None = None,
    sglang_export: bool = False,
    algorithm: str = "eagle3",
    mask_token_id: int | None = None,
    token_freq=None,
    trust_remote_code: bool = False,
) -> dict:
    """`sglang_export`: the draft is exported to SGLang too (export.engines), so its aux layers
    must be ones SGLang's target can capture (checked here, before extraction). `algorithm`
    (draft.algorithm): a parallel drafter (p_eagle, dflash) also gets its mask token, resolved from
    `mask_token_id` (the config's, or None), the target's tokenizer and the trained tokens'
    counts (`token_freq`, tokenize's)."""
    if sglang_export:
        check_sglang_target(target_dir, aux_layer_ids)
    shape = read_shape(target_dir)
    config, config_path = read_config(target_dir)
    tcfg = text_config(config)
    n, hidden, vocab = shape.num_layers, shape.hidden_size, shape.vocab_size
    aux = resolve_aux_layer_ids(aux_layer_ids, n, config_path)
    _check_mappable(tcfg, vocab, draft_vocab_size, config_path)
    derived, rope = _derived_keys(tcfg, config_path)
    cfg = _decoder_config(tcfg, hidden, vocab, draft_layers, max_position_embeddings, rope)
    cfg["eaglenest"] = {
        "aux_layer_ids": aux,
        "target_num_layers": n,
        "target_vocab_size": vocab,
        "draft_vocab_size": draft_vocab_size,
        "hidden_size": hidden,
        "derived": derived,
    }
    _apply_algorithm(cfg, algorithm, draft_layers)
    if is_parallel(algorithm):
        cfg["eaglenest"]["mask_token"] = _mask_token(
            target_dir, mask_token_id, token_freq, vocab, draft_vocab_size, trust_remote_code
        )
    write_json(out_path, cfg)
    return cfg
