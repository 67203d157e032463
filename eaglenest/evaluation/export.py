"""Export the trained draft as a folder vLLM serves directly, after checking its contracts.

The trainer's checkpoint already is speculators' format (EAGLE-3, P-EAGLE or DFlash); export makes every field vLLM
reads explicit (aux layers, draft vocabulary size, norm flags, context length, verifier) and
refuses a checkpoint whose vocabulary mapping or layers disagree with the earlier stages.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import atomic_path, read_json
from eaglenest.draft.algorithms import SPECULATOR_TYPES, aux_layer_ids_of, draft_algorithm, is_parallel
from eaglenest.evaluation.model_card import model_card

log = logging.getLogger(__name__)

NORM_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def check_algorithm(cfg: dict, weights: dict, draft_config: dict, hp: dict, source) -> None:
    """The checkpoint is the drafter the draft config asked for: speculators' type and, for
    P-EAGLE, the mask token the run resolved, the trained embeddings and the learned masked-slot
    state it serves with, and the depth it was trained to (`hp`: the train settings). For
    DFlash: the mask token, the block size trained and the k it proposes (one less), and the
    block attention vLLM will serve it with (non-causal, not sampling from the anchor)."""
    algorithm = draft_algorithm(draft_config)
    problems = []
    if cfg.get("speculators_model_type") != SPECULATOR_TYPES[algorithm]:
        problems.append(
            f"speculators_model_type {cfg.get('speculators_model_type')!r}, not {SPECULATOR_TYPES[algorithm]!r} "
            f"(draft.algorithm {algorithm})"
        )
    if is_parallel(algorithm):
        mask = draft_config["eaglenest"]["mask_token"]["id"]
        if cfg.get("mask_token_id") != mask:
            problems.append(f"mask_token_id {cfg.get('mask_token_id')}, not the run's {mask}")
        # The k it was trained to propose (EAGLE-3's is the server's choice).
        tokens = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    if algorithm == "p_eagle":
        problems += [
            f"no {name} tensor" for name in ("embed_tokens.weight", "mask_hidden") if name not in weights
        ]
        if tokens != hp["p_eagle"]["num_depths"]:
            problems.append(
                f"speculative_tokens {tokens}, not draft.p_eagle.num_depths {hp['p_eagle']['num_depths']}"
            )
    if algorithm == "dflash":
        block = hp["dflash"]["block_size"]
        if cfg.get("block_size") != block:
            problems.append(f"block_size {cfg.get('block_size')}, not draft.dflash.block_size {block}")
        if tokens != cfg.get("block_size", 0) - 1:
            problems.append(
                f"speculative_tokens {tokens}, not block_size - 1 = {cfg.get('block_size', 0) - 1}"
            )
        if cfg.get("sliding_window_non_causal") is not True:
            problems.append("sliding_window_non_causal is not true: vLLM would serve the block causally")
        if cfg.get("sample_from_anchor"):
            problems.append("sample_from_anchor is true: vLLM's V1 runner drafts from mask slots only")
    if problems:
        raise EaglenestError(
            f"the checkpoint is not the {algorithm} draft trained for: " + "; ".join(problems), source
        )


def _check_aux_ids_and_vocab_size(cfg: dict, dcfg: dict, *, d2t, ckpt: Path, draft_config_path) -> None:
    """Refuse a checkpoint whose aux layer ids or draft vocabulary size are not the draft config's."""

    def mismatch(what, ours, theirs, other):
        raise EaglenestError(
            f"{what} {theirs} in the checkpoint differs from {ours} in {other}", ckpt / "config.json"
        )

    if aux_layer_ids_of(cfg) != dcfg["aux_layer_ids"]:
        mismatch("aux layer ids", dcfg["aux_layer_ids"], aux_layer_ids_of(cfg), draft_config_path)
    if cfg.get("draft_vocab_size") != dcfg["draft_vocab_size"] or len(d2t) != dcfg["draft_vocab_size"]:
        mismatch("draft_vocab_size", dcfg["draft_vocab_size"], cfg.get("draft_vocab_size"), draft_config_path)


def _make_fields_explicit(cfg: dict, draft_config: dict, max_model_len: int, target) -> None:
    """Write out in `cfg` what vLLM reads: a context of at least `max_model_len`, norm flags, verifier."""
    layer_cfg = cfg["transformer_layer_config"]
    layer_cfg["max_position_embeddings"] = max(layer_cfg.get("max_position_embeddings", 0), max_model_len)
    for flag in NORM_FLAGS if draft_algorithm(draft_config) != "dflash" else ():
        # Write every flag out: an absent one would fall back to an engine default. (EAGLE's
        # only: a DFlash layer has none of these.)
        cfg[flag] = bool(cfg.get(flag))
    # The hub id for a hub target (portable: `vllm serve DRAFT` resolves it on any machine),
    # else the local folder. Serving the target with --speculative-config never reads it.
    cfg["speculators_config"]["verifier"]["name_or_path"] = target.hub_id or target.path


def _write_draft_folder(out_dir, cfg: dict, *, ckpt: Path, target, card) -> None:
    """Write the folder vLLM serves: the checkpoint's weights, `cfg` and, given `card`, a README.md."""
    with atomic_path(out_dir, is_dir=True) as tmp:
        tmp.chmod(0o755)
        shutil.copy(ckpt / "model.safetensors", tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        if card is not None:
            (tmp / "README.md").write_text(model_card(engine="vllm", target=target, draft_cfg=cfg, **card))


def export_stage(
    checkpoint_dir,
    out_dir,
    *,
    t2d_pt,
    d2t_pt,
    draft_config_path,
    target,
    max_model_len: int,
    hp: dict,
    card=None,
) -> dict:
    """`target`: the resolved target (eaglenest.target.resolve.Target); `hp`: the train settings
    (training.sweep.train_settings); `card`: model_card's inputs (metrics, metadata and
    coverage paths, the train settings, k) for the folder's README.md."""
    from safetensors.torch import load_file

    ckpt = Path(checkpoint_dir)
    cfg = read_json(ckpt / "config.json")
    draft_config = read_json(draft_config_path)
    dcfg = draft_config["eaglenest"]
    weights = load_file(str(ckpt / "model.safetensors"))
    t2d = torch.load(t2d_pt, weights_only=True)
    d2t = torch.load(d2t_pt, weights_only=True)

    _check_aux_ids_and_vocab_size(cfg, dcfg, d2t=d2t, ckpt=ckpt, draft_config_path=draft_config_path)
    check_algorithm(cfg, weights, draft_config, hp, ckpt / "config.json")
    missing = [name for name in ("t2d", "d2t") if name not in weights]
    # speculators saves no mapping for a draft over the whole vocabulary (DFlash): nothing to
    # compare. A reduced one without it would be served on the wrong ids.
    if missing and dcfg["draft_vocab_size"] != dcfg["target_vocab_size"]:
        raise EaglenestError(
            f"no {' or '.join(missing)} tensor in the checkpoint, whose draft vocabulary of "
            f"{dcfg['draft_vocab_size']} ids is not the target's {dcfg['target_vocab_size']}",
            ckpt / "model.safetensors",
        )
    if not missing and not torch.equal(weights["t2d"].bool(), t2d.bool()):
        raise EaglenestError(f"t2d in the checkpoint differs from {t2d_pt}", ckpt)
    if not missing and not torch.equal(weights["d2t"].long(), d2t.long()):
        raise EaglenestError(f"d2t in the checkpoint differs from {d2t_pt}", ckpt)
    if int(t2d.sum()) != len(d2t):
        raise EaglenestError(f"t2d selects {int(t2d.sum())} ids but d2t has {len(d2t)}", t2d_pt)

    _make_fields_explicit(cfg, draft_config, max_model_len, target)
    _write_draft_folder(out_dir, cfg, ckpt=ckpt, target=target, card=card)
    log.info(
        "exported draft to %s (aux %s, draft vocab %d, context %d)",
        out_dir,
        aux_layer_ids_of(cfg),
        cfg["draft_vocab_size"],
        cfg["transformer_layer_config"]["max_position_embeddings"],
    )
    return cfg
